#include "muon/math/cuda/aol_kernels.h"

#include "muon/math/cuda/block_sum.cuh"
#include "muon/math/elementwise.h"

namespace muon {
namespace cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

__global__ void AolInputKernel(const void* u, int u_type, int64_t n, void* x, int x_type) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    ew::Store(x_type, x, i, ew::Load(u_type, u, i));
  }
}

// One block per (row i, matrix k): s_i from row i's absolute values.
__global__ void AolScalesKernel(int x_type, const void* gram, int64_t m, double eps,
                                double* scales) {
  const int64_t i = blockIdx.x, k = blockIdx.y;
  const int64_t first = k * m * m + i * m;  // row i of a symmetric matrix: its column i
  double acc = 0.0;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    acc += fabs(static_cast<double>(ew::Load(x_type, gram, first + j)));
  }
  const double sum = BlockSum<kThreads>(acc);
  if (threadIdx.x == 0) scales[k * m + i] = 1.0 / sqrt(sum > eps ? sum : eps);
}

__global__ void AolGramKernel(int x_type, void* gram, int64_t count, int64_t m,
                              const double* scales) {
  const int64_t mm = m * m;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count * mm;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e / mm, at = e % mm, i = at % m, j = at / m;
    const double* s = scales + k * m;
    // s_i s_j first: the same product for (i, j) and (j, i).
    const double v = static_cast<double>(ew::Load(x_type, gram, e)) * (s[i] * s[j]);
    ew::Store(x_type, gram, e, static_cast<float>(v));
  }
}

__global__ void AolRowsKernel(int x_type, void* x, int64_t count, int64_t rows, int64_t cols,
                              bool tall, const double* scales) {
  const int64_t per = rows * cols, m = tall ? cols : rows;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count * per;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e / per, at = e % per;
    const double s = scales[k * m + (tall ? at % cols : at / cols)];
    ew::Store(x_type, x, e, static_cast<float>(static_cast<double>(ew::Load(x_type, x, e)) * s));
  }
}

}  // namespace

cudaError_t LaunchAolInput(const void* u, int u_type, int64_t n, void* x, int x_type,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AolInputKernel<<<Blocks(n), kThreads, 0, stream>>>(u, u_type, n, x, x_type);
  return cudaGetLastError();
}

cudaError_t LaunchAolScale(int x_type, void* x, void* gram, int64_t count, int64_t rows,
                           int64_t cols, bool tall, double eps, double* scales,
                           cudaStream_t stream) {
  const int64_t m = tall ? cols : rows;
  if (count == 0 || m == 0) return cudaSuccess;
  if (count > 65535 || m > 0x7fffffff) return cudaErrorInvalidValue;
  AolScalesKernel<<<dim3(static_cast<unsigned>(m), static_cast<unsigned>(count)), kThreads, 0,
                    stream>>>(x_type, gram, m, eps, scales);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  AolGramKernel<<<Blocks(count * m * m), kThreads, 0, stream>>>(x_type, gram, count, m, scales);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  AolRowsKernel<<<Blocks(count * rows * cols), kThreads, 0, stream>>>(x_type, x, count, rows,
                                                                      cols, tall, scales);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace muon
