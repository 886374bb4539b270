// AOL's pre-scaling on the GPU (muon/math/cpu/aol.h defines what it
// computes), behind plain launch functions for host C++ compiled without
// nvcc.
#ifndef MUON_MATH_CUDA_AOL_KERNELS_H_
#define MUON_MATH_CUDA_AOL_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace muon {
namespace cuda {

// x[0, n) (x_type) <- u[0, n) (u_type) rounded to x_type: AOL's start is
// the matrix itself, not divided by its norm (fp32 or bf16 x_type).
cudaError_t LaunchAolInput(const void* u, int u_type, int64_t n, void* x, int x_type,
                           cudaStream_t stream);

// For each of `count` matrices: x[k] (rows x cols, x_type) is W, or W^T
// when `tall` (m = cols; else m = rows), and gram[k] (m x m, x_type, both
// triangles) holds W W^T. Then
//   s_i = 1 / sqrt(max(sum_j |gram_ij|, eps))   (a double sum in a fixed order)
//   gram_ij <- gram_ij * (s_i s_j),   x <- diag(s) W (columns when tall)
// in double, each value rounded to x_type. `scales`: count * m doubles of
// workspace. Three launches.
cudaError_t LaunchAolScale(int x_type, void* x, void* gram, int64_t count, int64_t rows,
                           int64_t cols, bool tall, double eps, double* scales,
                           cudaStream_t stream);

}  // namespace cuda
}  // namespace muon

#endif  // MUON_MATH_CUDA_AOL_KERNELS_H_
