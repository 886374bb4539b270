#include "muon/math/cuda/normuon_kernels.h"

#include <cmath>

#include "muon/math/cuda/block_sum.cuh"
#include "muon/math/elementwise.h"

namespace muon {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 128;  // matrices per launch (their moments ride in the argument)

struct Group {
  float* moments[kGroup];
  int64_t first;  // the group's first matrix
};

// Block (row i, matrix y of the group): row_sq = sum_j x_ij^2 in double.
__global__ void RowSumsKernel(int type, const void* x, int64_t rows, int64_t cols, Group g,
                              double* row_sq) {
  if (g.moments[blockIdx.y] == nullptr) return;
  const int64_t k = g.first + blockIdx.y, i = blockIdx.x;
  const int64_t base = (k * rows + i) * cols;
  double acc = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double v = ew::Load(type, x, base + j);
    acc += v * v;
  }
  const double total = BlockSum<kThreads>(acc);
  if (threadIdx.x == 0) row_sq[k * rows + i] = total;
}

// Block (matrix y of the group): the moments and the divisors
// (NorMuonRowDivisors, muon/math/normuon.cc).
__global__ void DivisorsKernel(int64_t rows, int64_t cols, double beta2, double eps, Group g,
                               const double* row_sq, float* divisors) {
  float* const moments = g.moments[blockIdx.x];
  if (moments == nullptr) return;
  const int64_t k = g.first + blockIdx.x;
  const double* s = row_sq + k * rows;
  double norm_sq = 0.0, normalized_sq = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const double v = moments[i];
    moments[i] = static_cast<float>(v + (1.0 - beta2) * (s[i] / static_cast<double>(cols) - v));
    const double d = sqrt(static_cast<double>(moments[i])) + eps;
    norm_sq += s[i];
    normalized_sq += s[i] / (d * d);
  }
  const double norm = sqrt(BlockSum<kThreads>(norm_sq));
  const double normalized = sqrt(BlockSum<kThreads>(normalized_sq));
  const double clamped = normalized > eps ? normalized : eps;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {  // the moments this thread set
    const double d = sqrt(static_cast<double>(moments[i])) + eps;
    divisors[k * rows + i] = norm > 0 ? static_cast<float>(d * clamped / norm) : INFINITY;
  }
}

// x_ij <- round(x_ij / divisor_i) to ns_type, stored as type; grid-stride
// over matrix y's elements.
__global__ void DivideRowsKernel(int type, void* x, int64_t rows, int64_t cols, int ns_type,
                                 Group g, const float* divisors) {
  if (g.moments[blockIdx.y] == nullptr) return;
  const int64_t k = g.first + blockIdx.y, elems = rows * cols;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < elems; e += stride) {
    const float d = divisors[k * rows + e / cols];
    const int64_t at = k * elems + e;
    ew::Store(type, x, at, ew::RoundTo(ns_type, ew::Load(type, x, at) / d));
  }
}

}  // namespace

cudaError_t LaunchNorMuon(int type, void* x, int64_t count, int64_t rows, int64_t cols,
                          float* const* moments, double beta2, double eps, int ns_type,
                          double* row_sq, float* divisors, cudaStream_t stream) {
  if (count == 0 || rows == 0 || cols == 0) return cudaSuccess;
  if (rows > 2147483647) return cudaErrorInvalidValue;
  const int64_t blocks = (rows * cols + kThreads - 1) / kThreads;
  const unsigned divide_blocks = static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
  for (int64_t first = 0; first < count; first += kGroup) {
    Group g{};
    g.first = first;
    const int n = static_cast<int>(count - first < kGroup ? count - first : kGroup);
    bool any = false;
    for (int y = 0; y < n; ++y) {
      g.moments[y] = moments[first + y];
      any = any || g.moments[y] != nullptr;
    }
    if (!any) continue;
    RowSumsKernel<<<dim3(static_cast<unsigned>(rows), n), kThreads, 0, stream>>>(
        type, x, rows, cols, g, row_sq);
    DivisorsKernel<<<n, kThreads, 0, stream>>>(rows, cols, beta2, eps, g, row_sq, divisors);
    DivideRowsKernel<<<dim3(divide_blocks, n), kThreads, 0, stream>>>(type, x, rows, cols,
                                                                      ns_type, g, divisors);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchNorMuonRowDivisors(const double* row_sq, int64_t rows, int64_t cols,
                                     double beta2, double eps, float* moments, float* divisors,
                                     cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  Group g{};
  g.moments[0] = moments;
  g.first = 0;
  DivisorsKernel<<<1, kThreads, 0, stream>>>(rows, cols, beta2, eps, g, row_sq, divisors);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace muon
