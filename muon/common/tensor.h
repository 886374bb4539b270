// Borrowed host tensors: what the library keeps of a DLTensor after checking it.
#ifndef MUON_COMMON_TENSOR_H_
#define MUON_COMMON_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/common/dtype.h"

namespace muon {

// A checked view of a contiguous CPU tensor. `data` already includes the
// DLTensor's byte_offset. The storage is borrowed: the host keeps it alive.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype); }
};

// Checks `t` and returns its view. Errors name `what` (e.g. "grad of
// 'layer0.w'") and say why: NULL pointer, non-CPU device, unsupported dtype,
// negative dims, or strides that are not row-major contiguous.
absl::StatusOr<TensorView> ViewCpuTensor(const DLTensor* t, const std::string& what);

// "[4, 8]".
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace muon

#endif  // MUON_COMMON_TENSOR_H_
