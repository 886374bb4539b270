#include "muon/common/tensor.h"

#include <dlpack/dlpack.h>

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "muon/common/status.h"

namespace muon {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status CheckShape(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t product = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", ShapeString(shape), " has a negative dimension"));
    }
    if (d == 0) continue;
    if (product > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", ShapeString(shape), " has more elements than a 64-bit count holds"));
    }
    product *= d;
  }
  return absl::OkStatus();
}

std::string DeviceString(const DLDevice& d) {
  return d.device_type == kDLCUDA ? absl::StrCat("cuda:", d.device_id) : "cpu";
}

absl::StatusOr<TensorView> ViewCpuTensor(const DLTensor* t, const std::string& what) {
  MUON_ASSIGN_OR_RETURN(TensorView v, ViewTensor(t, what));
  if (!v.on_host()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor is on ", DeviceString(v.device),
        "; pass host memory (kDLCPU or kDLCUDAHost) here"));
  }
  return v;
}

int32_t DeviceCode(const DLDevice& d) {
  static_assert(sizeof(d.device_type) == sizeof(int32_t), "DLDeviceType is 32-bit");
  int32_t code;
  std::memcpy(&code, &d.device_type, sizeof(code));
  return code;
}

absl::StatusOr<TensorView> ViewTensor(const DLTensor* t, const std::string& what) {
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": DLTensor pointer is NULL"));
  const int32_t code = DeviceCode(t->device);
  if (code != kDLCPU && code != kDLCUDAHost && code != kDLCUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor is on DLPack device type ", code,
        "; libmuon accepts kDLCPU (1), kDLCUDA (2) and kDLCUDAHost (3) tensors"));
  }
  const DLDeviceType type = static_cast<DLDeviceType>(code);
  if (type == kDLCUDA && t->device.device_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": CUDA device ordinal ", t->device.device_id, " is negative"));
  }
  if (t->ndim < 0 || t->ndim > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ndim ", t->ndim, " is out of range (0..16)"));
  }
  if (t->ndim > 0 && t->shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape pointer is NULL"));
  }
  TensorView v;
  MUON_ASSIGN_OR_RETURN(v.dtype, FromDLDataType(t->dtype, what));
  v.shape.assign(t->shape, t->shape + t->ndim);
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; ++i) {
    if (v.shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dimension ", i, " has negative size ", v.shape[i]));
    }
    if (v.shape[i] != 0 && numel > std::numeric_limits<int64_t>::max() / v.shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", ShapeString(v.shape),
                                                     " has too many elements"));
    }
    numel *= v.shape[i];
  }
  if (t->strides != nullptr && numel > 0) {
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (v.shape[i] != 1 && t->strides[i] != expected) {
        std::vector<int64_t> strides(t->strides, t->strides + t->ndim);
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": strides ", ShapeString(strides), " for shape ", ShapeString(v.shape),
            " are not row-major contiguous; pass a contiguous tensor (e.g. .contiguous())"));
      }
      expected *= v.shape[i];
    }
  }
  if (numel > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(SizeOf(v.dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shape ", ShapeString(v.shape), " of ", DTypeName(v.dtype),
        " elements is more bytes than a 64-bit size holds"));
  }
  if (t->data == nullptr) {
    if (numel > 0) return absl::InvalidArgumentError(absl::StrCat(what, ": data pointer is NULL"));
    if (t->byte_offset != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": data pointer is NULL with byte_offset ", t->byte_offset,
          " (an empty tensor without data needs byte_offset 0)"));
    }
    v.data = nullptr;
  } else {
    v.data = static_cast<char*>(t->data) + t->byte_offset;
  }
  if (type == kDLCUDA) v.device = t->device;
  return v;
}

}  // namespace muon
