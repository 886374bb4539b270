// NorMuon's kernels (muon/math/normuon.h defines what they compute), behind
// one plain launch function for host C++ compiled without nvcc.
#ifndef MUON_MATH_CUDA_NORMUON_KERNELS_H_
#define MUON_MATH_CUDA_NORMUON_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace muon {
namespace cuda {

// For each of `count` rows x cols matrices at x (type: fp32 or bf16, as
// ns_kernels.h numbers them) whose moments[k] (device memory, `rows` fp32;
// a host array of device pointers) is not NULL: the rows' sums of squares
// in double, the moments and the divisors as NorMuonRowDivisors computes
// them, then x[k][i][j] <- round(x / divisor_i) to ns_type's precision,
// stored as `type`. Every sum is in a fixed order (deterministic). The
// workspace: row_sq, count * rows doubles; divisors, count * rows floats.
// Three launches per 128 matrices.
cudaError_t LaunchNorMuon(int type, void* x, int64_t count, int64_t rows, int64_t cols,
                          float* const* moments, double beta2, double eps, int ns_type,
                          double* row_sq, float* divisors, cudaStream_t stream);

// One matrix's moments and divisors from its rows' sums of squares row_sq
// (device memory, `rows` doubles): NorMuonRowDivisors as LaunchNorMuon's
// second launch computes it (a split matrix's, whose sums the members
// added). One launch.
cudaError_t LaunchNorMuonRowDivisors(const double* row_sq, int64_t rows, int64_t cols,
                                     double beta2, double eps, float* moments, float* divisors,
                                     cudaStream_t stream);

}  // namespace cuda
}  // namespace muon

#endif  // MUON_MATH_CUDA_NORMUON_KERNELS_H_
