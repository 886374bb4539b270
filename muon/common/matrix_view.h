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

  // The matrices that hold elements: `batch`, or 0 when rows or cols is 0.
  // Only those are orthogonalized (an empty matrix's update is empty: no
  // Newton-Schulz, no plan entry, nothing to move), so only those cost work.
  int64_t with_elements() const { return rows > 0 && cols > 0 ? batch : 0; }
};

// The most matrices with elements one parameter may declare (its matrix
// view's batch), and one job (every parameter of every rank, each once):
// the first step plans every such matrix (a unit, its holders, an owner), a
// few hundred bytes each on every rank, so a declaration (a global shape
// costs nothing to write) must not ask for more than a plan can hold. Empty
// matrices count in neither: any number of them costs nothing. muon.h
// documents both.
inline constexpr int64_t kMaxParamMatrices = int64_t{1} << 20;
inline constexpr int64_t kMaxJobMatrices = int64_t{1} << 22;

// `shape` under view `view` (a muon_matrix_view_t value):
//   2D               exactly 2 dims: one rows x cols matrix
//   FLATTEN_TRAILING (d0, d1, ..., dk): one d0 x (d1*...*dk) matrix
//   BATCHED_LEADING  (n, d1, ..., dk), k >= 2: n matrices of d1 x (d2*...*dk)
// Errors name `who` (e.g. "param 'w'") and the cause: fewer than 2 dims
// (those belong to AdamW), an unknown view, a shape the view does not fit.
absl::StatusOr<MatrixShape> ViewAsMatrices(const std::vector<int64_t>& shape, int view,
                                           const std::string& who);

// Refuses a parameter that declares more than kMaxParamMatrices matrices
// with elements; the error names `who` and `shape` (the declared one) and
// says why.
absl::Status CheckDeclaredMatrices(const MatrixShape& m, const std::vector<int64_t>& shape,
                                   const std::string& who);

}  // namespace muon

#endif  // MUON_COMMON_MATRIX_VIEW_H_
