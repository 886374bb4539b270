// The kernels of split Newton-Schulz's steps on the GPU (muon/math/split_ns.h
// runs them through CudaBackend), behind plain launch functions for host C++
// compiled without nvcc. Every launch is stream-ordered; every sum runs in a
// fixed order (the same bits at every run).
#ifndef MUON_MATH_CUDA_SPLIT_KERNELS_H_
#define MUON_MATH_CUDA_SPLIT_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace muon {
namespace cuda {

// The chunks RowSquares cuts a row of `cols` elements into: its `partials`
// hold rows * SquareChunks(cols) doubles.
int64_t SquareChunks(int64_t cols);

// out[0, out_rows) <- 0, then out[row0 + i] <- the sum of the squares of row
// i of x (rows x cols fp32, row-major) in double: each chunk's sum, then the
// chunks' in order. Two launches.
cudaError_t LaunchRowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                             int64_t out_rows, int64_t row0, double* partials,
                             cudaStream_t stream);

// *divisor <- the normalization's divisor from the sum of squares *squares:
// float(sqrt(s)), then for bf16 (`bf16` nonzero) rounded, clamped at eps and
// rounded again, as the CPU backend's DivisorOfSum. One thread.
cudaError_t LaunchNormDivisor(const double* squares, int bf16, float eps, float* divisor,
                              cudaStream_t stream);

// Row i of x (rows x cols fp32) <- round_to(ns_type, x_i / divisors[i])
// (ns_type numbered as ns_kernels.h's ElemType).
cudaError_t LaunchDivideRows(float* x, int64_t rows, int64_t cols, const float* divisors,
                             int ns_type, cudaStream_t stream);

// out[e] <- parts[0][e] + ... + parts[count - 1][e], added in that order, for
// e < len (`count` rows of `len` doubles when f64, else floats).
cudaError_t LaunchSumInOrder(int f64, const void* parts, int64_t count, int64_t len, void* out,
                             cudaStream_t stream);

}  // namespace cuda
}  // namespace muon

#endif  // MUON_MATH_CUDA_SPLIT_KERNELS_H_
