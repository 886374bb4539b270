#include "muon/common/matrix_view.h"

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"

namespace muon {

absl::StatusOr<MatrixShape> ViewAsMatrices(const std::vector<int64_t>& s, int view,
                                           const std::string& who) {
  if (s.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": has ", s.size(), " dimension(s) ", ShapeString(s),
        "; Muon orthogonalizes matrices only, optimize 0-D and 1-D parameters "
        "(biases, norms) with AdamW"));
  }
  MUON_RETURN_IF_ERROR(CheckShape(s, absl::StrCat(who, ": shape")));
  if (view < 0 || view > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": matrix_view ", view,
        " is unknown; use MUON_MATRIX_VIEW_2D (0), FLATTEN_TRAILING (1) or BATCHED_LEADING (2)"));
  }
  auto prod = [&](size_t from) {
    int64_t n = 1;
    for (size_t i = from; i < s.size(); ++i) n *= s[i];
    return n;
  };
  MatrixShape m;
  switch (static_cast<MatrixView>(view)) {
    case MatrixView::k2D:
      if (s.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": shape ", ShapeString(s), " has ", s.size(),
            " dimensions; choose a matrix view: MUON_MATRIX_VIEW_FLATTEN_TRAILING (conv "
            "filters) or MUON_MATRIX_VIEW_BATCHED_LEADING (stacked experts)"));
      }
      m.rows = s[0];
      m.cols = s[1];
      break;
    case MatrixView::kFlattenTrailing:
      m.rows = s[0];
      m.cols = prod(1);
      break;
    case MatrixView::kBatchedLeading:
      if (s.size() < 3) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": MUON_MATRIX_VIEW_BATCHED_LEADING needs at least 3 dimensions, "
                              "shape is ",
                         ShapeString(s)));
      }
      m.batch = s[0];
      m.rows = s[1];
      m.cols = prod(2);
      break;
  }
  return m;
}

absl::Status CheckDeclaredMatrices(const MatrixShape& m, const std::vector<int64_t>& shape,
                                   const std::string& who) {
  if (m.with_elements() <= kMaxParamMatrices) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      who, ": shape ", ShapeString(shape), " declares ", m.with_elements(), " matrices of ",
      m.rows, " x ", m.cols, ", more than the ", kMaxParamMatrices,
      " one parameter may declare (the first step plans each matrix); register such a "
      "tensor as fewer, larger matrices (another matrix view) or split it over parameters"));
}

}  // namespace muon
