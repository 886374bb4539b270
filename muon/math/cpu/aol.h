// AOL pre-scaling (Prach & Lampert's almost-orthogonal layers, as
// flash-newton-schulz starts Newton-Schulz with it, arXiv/HAL 05390446):
// instead of dividing the matrix by its Frobenius norm, each row of its wide
// orientation W (m x n, m <= n) is scaled by
//   s_i = 1 / sqrt(max(sum_j |(W W^T)_ij|, eps)),
// which bounds the spectral norm of diag(s) W by 1 and leaves it closer to
// orthogonal than the Frobenius division does, so that four iterations of
// the "aol" schedule do the work of five. For a tall matrix (rows > cols) W
// is its transpose: its columns are scaled.
//
// The product W W^T that the scales need is also, scaled on both sides,
// the first iteration's gram: diag(s) (W W^T) diag(s) = X X^T for X =
// diag(s) W. As flash-newton-schulz does, the first iteration takes it from
// here instead of multiplying again, so AOL costs no product beyond its four
// iterations' (the gram of X as rounded would differ from it by that
// rounding only).
#ifndef MUON_MATH_CPU_AOL_H_
#define MUON_MATH_CPU_AOL_H_

#include <cstdint>

namespace muon {
namespace cpu {

// `gram` (m x m, both triangles) holds W W^T of x (rows x cols, row-major
// fp32) as given: for bf16, of x already rounded to bf16. x is W (m = rows)
// or, when `tall`, W^T (m = cols); a split Newton-Schulz block (rows x cols
// may then be either way round) is part of W's columns, and `gram` the
// whole's W W^T. Then
//   x    <- diag(s) W (its columns scaled when tall), and
//   gram <- diag(s) (W W^T) diag(s), the first iteration's gram,
// each value rounded to `round` (an ew:: type: the Newton-Schulz dtype's
// precision). The sums of |W W^T|, the scales and the scaled products in
// double, in a fixed order. `scales`: room for m doubles.
void AolScale(float* x, int64_t rows, int64_t cols, bool tall, double eps, int round,
              float* gram, double* scales);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_AOL_H_
