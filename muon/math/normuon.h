// What NorMuon (arXiv 2510.05491) does to an orthogonalized update, defined
// once: the per-row second moment and the row normalization with the
// update's norm kept, on whole matrices at their owner. The CPU backend runs
// it (cpu_backend.cc); a GPU kernel must compute the same.
//
// For a rows x cols update O (as Newton-Schulz left it) and its moments v
// (fp32, one per row, kept by the owner across steps):
//   s_i   = sum_j O_ij^2                      (double)
//   v_i  <- fp32(v_i + (1 - beta2) (s_i / cols - v_i))
//   d_i   = sqrt(v_i) + eps                   (double)
//   |O|   = sqrt(sum_i s_i),  |O'| = sqrt(sum_i s_i / d_i^2)
//   O_ij <- round(O_ij / fp32(d_i max(|O'|, eps) / |O|))
// where round keeps the Newton-Schulz dtype's precision (bf16, fp16 or fp32),
// so the update has the precision the plain Muon update has. This is Dion's
// NorMuon (rows of the parameter's matrix, eps added to the root, the
// rescale's norm clamped at eps) computed in double where Dion computes in
// the parameter's dtype; Emerging-Optimizers' normalizes the longer side and
// keeps no norm.
#ifndef MUON_MATH_NORMUON_H_
#define MUON_MATH_NORMUON_H_

#include <cstdint>

namespace muon {

// One matrix's rows' divisors from its rows' sums of squares `row_sq`:
// updates `moments` (rows values) and writes divisors[i] (what row i is
// divided by; +inf for a zero matrix, whose rows stay zero).
void NorMuonRowDivisors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                        double eps, float* moments, float* divisors);

}  // namespace muon

#endif  // MUON_MATH_NORMUON_H_
