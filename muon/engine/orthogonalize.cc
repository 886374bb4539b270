#include "muon/engine/orthogonalize.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "muon/common/matrix_view.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"

namespace muon {

absl::Status OrthogonalizeTensor(const std::shared_ptr<Device>& backend, const NsConfig& config,
                                 const DLTensor* in, const DLTensor* out, int view,
                                 void* stream) {
  Device& device = *backend;
  MUON_ASSIGN_OR_RETURN(const TensorView src, ViewTensor(in, "in"));
  MUON_ASSIGN_OR_RETURN(const TensorView dst, ViewTensor(out, "out"));
  for (const TensorView* t : {&src, &dst}) {
    const std::string where = DeviceString(t->device);
    if (where != device.name() && !(device.is_host() && t->on_host())) {
      return absl::InvalidArgumentError(absl::StrCat(t == &src ? "in" : "out", ": is on ", where,
                                                     ", the backend on ", device.name()));
    }
  }
  if (src.shape != dst.shape) {
    return absl::InvalidArgumentError(absl::StrCat("out: shape ", ShapeString(dst.shape),
                                                   " differs from in's ", ShapeString(src.shape)));
  }
  const char* a = static_cast<const char*>(src.data);
  const char* b = static_cast<const char*>(dst.data);
  if (a != b && a < b + dst.nbytes() && b < a + src.nbytes()) {
    return absl::InvalidArgumentError("out: overlaps in without being the same tensor");
  }
  MUON_ASSIGN_OR_RETURN(const MatrixShape m, ViewAsMatrices(src.shape, view, "in"));
  const int64_t n = src.numel();
  if (n == 0) return absl::OkStatus();
  MUON_RETURN_IF_ERROR(device.SetStream(stream));
  MUON_RETURN_IF_ERROR(device.math().Reserve(config, m.batch, m.rows, m.cols));
  // One fp32 working copy on the device, then the matrices in place, then out.
  MUON_ASSIGN_OR_RETURN(
      DeviceBuffer work,
      DeviceBuffer::Make(backend, static_cast<size_t>(n) * sizeof(float), "the working copy of in"));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<CopyProgram> load,
                        device.Prepare({{src.data, work.data(), n, src.dtype, DType::kF32,
                                         DType::kF32}}));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<CopyProgram> store,
                        device.Prepare({{work.data(), dst.data, n, DType::kF32, dst.dtype,
                                         DType::kF32}}));
  MUON_RETURN_IF_ERROR(device.Run(*load));
  MUON_RETURN_IF_ERROR(
      device.math().Orthogonalize(config, {work.as<float>(), m.batch, m.rows, m.cols}));
  return device.Run(*store);
}

}  // namespace muon
