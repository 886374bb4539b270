// AOL pre-scaling (Prach & Lampert's almost-orthogonal layers, as
// flash-newton-schulz starts Newton-Schulz with it, arXiv/HAL 05390446):
// instead of dividing the matrix by its Frobenius norm, each row of its wide
// orientation W (m x n, m <= n) is scaled by
//   s_i = 1 / sqrt(max(sum_j |(W W^T)_ij|, eps)),
// which bounds the spectral norm of diag(s) W by 1 and leaves it closer to
// orthogonal than the Frobenius division does, so that four iterations of
// the "aol" schedule do the work of five. For a tall matrix (rows > cols) W
// is its transpose: its columns are scaled.
#ifndef MUON_MATH_CPU_AOL_H_
#define MUON_MATH_CPU_AOL_H_

#include <cstdint>

namespace muon {
namespace cpu {

// x (rows x cols, row-major fp32) <- x pre-scaled as above, each value then
// rounded to `round` (an ew:: type: the Newton-Schulz dtype's precision);
// with bf16 the input is rounded to bf16 first.
// `work`: room for AolWorkFloats(rows, cols) floats. The product runs on
// CBLAS (SYRK) on the caller's threads; the sums of |W W^T| and the scales
// in double, in a fixed order.
void AolPrescale(float* x, int64_t rows, int64_t cols, double eps, int round, float* work);
// m x m floats for W W^T and m doubles for the scales.
int64_t AolWorkFloats(int64_t rows, int64_t cols);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_AOL_H_
