// Borrowed tensors: what the library keeps of a DLTensor after checking it.
#ifndef MUON_COMMON_TENSOR_H_
#define MUON_COMMON_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "muon/common/dtype.h"

namespace muon {

// A checked view of a contiguous tensor. `data` already includes the
// DLTensor's byte_offset. The storage is borrowed: the host keeps it alive.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Where the memory is: kDLCPU (host memory, pinned kDLCUDAHost included)
  // or kDLCUDA with its ordinal.
  DLDevice device = {kDLCPU, 0};

  bool on_host() const { return device.device_type == kDLCPU; }

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype); }
};

// Checks `t` and returns its view. Errors name `what` (e.g. "grad of
// 'layer0.w'") and say why: NULL pointer, a device other than kDLCPU,
// kDLCUDAHost and kDLCUDA, unsupported dtype, negative dims, or strides that
// are not row-major contiguous.
// The device code as the integer the host wrote: a value DLDeviceType does
// not list must not be loaded as the enum (undefined behaviour).
int32_t DeviceCode(const DLDevice& d);

absl::StatusOr<TensorView> ViewTensor(const DLTensor* t, const std::string& what);

// ViewTensor for tensors the host reads and writes itself: kDLCPU or
// kDLCUDAHost only.
absl::StatusOr<TensorView> ViewCpuTensor(const DLTensor* t, const std::string& what);

// Checks a shape that is not a tensor's own (a global shape, a matrix view's
// input): no negative dimension, and the product of its nonzero dimensions
// fits in int64_t, so that the product of any of its dimensions does. Errors
// start with `what` (e.g. "param 'w': global shape") and give the shape.
absl::Status CheckShape(const std::vector<int64_t>& shape, const std::string& what);

// "cpu" or "cuda:<ordinal>".
std::string DeviceString(const DLDevice& d);

// "[4, 8]".
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace muon

#endif  // MUON_COMMON_TENSOR_H_
