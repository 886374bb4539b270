// How an N-D parameter is seen as matrices (muon_matrix_view_t): the one
// place that turns a shape and a view into `batch` matrices of rows x cols.
#ifndef MUON_COMMON_MATRIX_VIEW_H_
#define MUON_COMMON_MATRIX_VIEW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muon {

enum class MatrixView { k2D = 0, kFlattenTrailing = 1, kBatchedLeading = 2 };

struct MatrixShape {
  int64_t batch = 1;  // matrices (BATCHED_LEADING: the leading dimension)
  int64_t rows = 0;
  int64_t cols = 0;
};

// `shape` under view `view` (a muon_matrix_view_t value):
//   2D               exactly 2 dims: one rows x cols matrix
//   FLATTEN_TRAILING (d0, d1, ..., dk): one d0 x (d1*...*dk) matrix
//   BATCHED_LEADING  (n, d1, ..., dk), k >= 2: n matrices of d1 x (d2*...*dk)
// Errors name `who` (e.g. "param 'w'") and the cause: fewer than 2 dims
// (those belong to AdamW), an unknown view, a shape the view does not fit.
absl::StatusOr<MatrixShape> ViewAsMatrices(const std::vector<int64_t>& shape, int view,
                                           const std::string& who);

}  // namespace muon

#endif  // MUON_COMMON_MATRIX_VIEW_H_
