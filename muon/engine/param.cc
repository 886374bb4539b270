#include "muon/engine/param.h"

#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {

absl::StatusOr<Param> MakeParam(const DLTensor* value, const DLTensor* grad, std::string name,
                                int view, bool momentum_fp32,
                                const std::vector<int64_t>* global_shape) {
  const std::string who = absl::StrCat("param '", name, "'");
  Param p;
  MUON_ASSIGN_OR_RETURN(p.value, ViewTensor(value, who));
  MUON_ASSIGN_OR_RETURN(p.grad, ViewTensor(grad, absl::StrCat("grad of ", who)));
  if (DeviceString(p.grad.device) != DeviceString(p.value.device)) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": grad is on ",
                                                   DeviceString(p.grad.device), ", param on ",
                                                   DeviceString(p.value.device)));
  }
  if (p.grad.shape != p.value.shape) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": grad shape ", ShapeString(p.grad.shape),
                                                   " differs from param shape ",
                                                   ShapeString(p.value.shape)));
  }
  if (p.grad.dtype != p.value.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": grad dtype ", DTypeName(p.grad.dtype),
                                                   " differs from param dtype ",
                                                   DTypeName(p.value.dtype)));
  }
  if (global_shape != nullptr) {
    // The global tensor is never a DLTensor: its shape gets the same checks here.
    int64_t numel = 1;
    for (int64_t d : *global_shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": global shape ", ShapeString(*global_shape), " has a negative dimension"));
      }
      if (d != 0 && numel > std::numeric_limits<int64_t>::max() / d) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": global shape ", ShapeString(*global_shape), " has too many elements"));
      }
      numel *= d;
    }
  }
  p.global_shape = global_shape ? *global_shape : p.value.shape;
  MUON_ASSIGN_OR_RETURN(const MatrixShape m, ViewAsMatrices(p.global_shape, view, who));
  MUON_RETURN_IF_ERROR(CheckDeclaredMatrices(m, p.global_shape, who));
  p.view = static_cast<MatrixView>(view);
  p.batch = m.batch;
  p.rows = m.rows;
  p.cols = m.cols;
  p.name = std::move(name);
  if (global_shape == nullptr) {
    p.layout.global_shape = p.global_shape;
    p.piece.shape = p.global_shape;
    p.piece.numel = p.value.numel();
    if (p.piece.numel > 0) p.piece.runs.push_back({0, p.piece.numel});
  }
  p.state_dtype = momentum_fp32 ? DType::kF32 : p.grad.dtype;
  return p;
}

}  // namespace muon
