#include "muon/engine/param.h"

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
  p.global_shape = global_shape ? *global_shape : p.value.shape;
  const std::vector<int64_t>& s = p.global_shape;
  if (s.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": has ", s.size(), " dimension(s) ", ShapeString(s),
        "; Muon orthogonalizes matrices only, optimize 0-D and 1-D parameters "
        "(biases, norms) with AdamW"));
  }
  if (view < 0 || view > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": matrix_view ", view,
        " is unknown; use MUON_MATRIX_VIEW_2D (0), FLATTEN_TRAILING (1) or BATCHED_LEADING (2)"));
  }
  p.view = static_cast<MatrixView>(view);
  auto prod = [&](size_t from) {
    int64_t n = 1;
    for (size_t i = from; i < s.size(); ++i) n *= s[i];
    return n;
  };
  switch (p.view) {
    case MatrixView::k2D:
      if (s.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": shape ", ShapeString(s), " has ", s.size(),
            " dimensions; choose a matrix view: MUON_MATRIX_VIEW_FLATTEN_TRAILING (conv "
            "filters) or MUON_MATRIX_VIEW_BATCHED_LEADING (stacked experts)"));
      }
      p.rows = s[0];
      p.cols = s[1];
      break;
    case MatrixView::kFlattenTrailing:
      p.rows = s[0];
      p.cols = prod(1);
      break;
    case MatrixView::kBatchedLeading:
      if (s.size() < 3) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": MUON_MATRIX_VIEW_BATCHED_LEADING needs at least 3 dimensions, "
                              "shape is ",
                         ShapeString(s)));
      }
      p.batch = s[0];
      p.rows = s[1];
      p.cols = prod(2);
      break;
  }
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
