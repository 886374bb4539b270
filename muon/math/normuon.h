// What NorMuon (arXiv 2510.05491) does to an orthogonalized update, defined
// once: the per-row second moment and the row normalization with the
// update's norm kept, on whole matrices at their owner. The host loop here
// is the CPU backend's, and the definition a GPU kernel must match.
//
// For a rows x cols update O (as Newton-Schulz left it) and its moments v
// (fp32, one per row, kept by the owner across steps):
//   s_i   = sum_j O_ij^2                      (double)
//   v_i  <- fp32(v_i + (1 - beta2) (s_i / cols - v_i))
//   d_i   = sqrt(v_i) + eps                   (double)
//   |O|   = sqrt(sum_i s_i),  |O'| = sqrt(sum_i s_i / d_i^2)
//   O_ij <- round(O_ij * fp32(|O| / (max(|O'|, eps) d_i)))
// where round keeps the Newton-Schulz dtype's precision (bf16 or fp32), so
// the update has the precision the plain Muon update has. This is Dion's
// NorMuon (rows of the parameter's matrix, eps added to the root, the
// rescale's norm clamped at eps) computed in double where Dion computes in
// the parameter's dtype; Emerging-Optimizers' normalizes the longer side and
// keeps no norm.
#ifndef MUON_MATH_NORMUON_H_
#define MUON_MATH_NORMUON_H_

#include <cstdint>

#include "absl/status/status.h"
#include "muon/math/backend.h"
#include "muon/math/ns_config.h"

namespace muon {

// The rows' factors of one matrix from its rows' sums of squares `row_sq`:
// updates `moments` (rows values) and writes factors[i] (the fp32 factor
// row i is multiplied by).
void NorMuonRowFactors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                       double eps, float* moments, float* factors);

// NorMuon on every matrix of `batch` in place (fp32 or bf16 values), the
// matrix k with the moments at moments[k] (NULL: matrix k is left as it is);
// results rounded to `ns_dtype`.
// Single-threaded per matrix, so the bits do not depend on threads.
absl::Status NorMuonHost(const MatrixBatch& batch, float* const* moments, const NorMuonStep& step);

}  // namespace muon

#endif  // MUON_MATH_NORMUON_H_
