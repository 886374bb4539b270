#include "muon/math/cuda/split_kernels.h"

#include "muon/common/half.h"
#include "muon/math/cuda/block_sum.cuh"

namespace muon {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;      // elements a block sums, at least
constexpr int64_t kMaxChunks = 1024;  // chunks of one row, at most

int64_t ChunkElems(int64_t cols) {
  const int64_t by_count = (cols + kMaxChunks - 1) / kMaxChunks;
  return by_count > kChunk ? by_count : kChunk;
}

// Block (row i, chunk c): partials[i * chunks + c] <- the squares of the
// chunk's elements, summed in double in a fixed order.
__global__ void ChunkSquaresKernel(const float* x, int64_t cols, int64_t chunk, int64_t chunks,
                                   double* partials) {
  const int64_t i = blockIdx.x, c = blockIdx.y;
  const int64_t begin = c * chunk;
  const int64_t end = begin + chunk < cols ? begin + chunk : cols;
  const float* row = x + i * cols;
  double acc = 0.0;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const double v = row[j];
    acc += v * v;
  }
  const double total = BlockSum<kThreads>(acc);
  if (threadIdx.x == 0) partials[i * chunks + c] = total;
}

// out[k] <- the chunks of row k - row0 added in order, or 0 outside the rows.
__global__ void RowTotalsKernel(const double* partials, int64_t rows, int64_t chunks,
                                double* out, int64_t out_rows, int64_t row0) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < out_rows; k += stride) {
    const int64_t i = k - row0;
    double total = 0.0;
    if (i >= 0 && i < rows) {
      for (int64_t c = 0; c < chunks; ++c) total += partials[i * chunks + c];
    }
    out[k] = total;
  }
}

__global__ void NormDivisorKernel(const double* squares, int bf16, float eps, float* divisor) {
  float norm = static_cast<float>(sqrt(*squares));
  if (bf16) norm = ew::RoundTo(ew::kBF16, norm);
  norm = norm > eps ? norm : eps;
  if (bf16) norm = ew::RoundTo(ew::kBF16, norm);
  *divisor = norm;
}

__global__ void DivideRowsKernel(float* x, int64_t rows, int64_t cols, const float* divisors,
                                 int ns_type) {
  const int64_t elems = rows * cols, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < elems; e += stride) {
    x[e] = ew::RoundTo(ns_type, x[e] / divisors[e / cols]);
  }
}

template <typename T>
__global__ void SumInOrderKernel(const T* parts, int64_t count, int64_t len, T* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < len; e += stride) {
    T total = parts[e];
    for (int64_t i = 1; i < count; ++i) total += parts[i * len + e];  // adds: none contracted
    out[e] = total;
  }
}

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

int64_t SquareChunks(int64_t cols) {
  if (cols <= 0) return 1;
  const int64_t chunk = ChunkElems(cols);
  return (cols + chunk - 1) / chunk;
}

cudaError_t LaunchRowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                             int64_t out_rows, int64_t row0, double* partials,
                             cudaStream_t stream) {
  if (out_rows <= 0) return cudaSuccess;
  if (rows > 2147483647) return cudaErrorInvalidValue;  // grid.x (chunks <= 1024: grid.y)
  const int64_t chunks = SquareChunks(cols);
  if (rows > 0 && cols > 0) {
    ChunkSquaresKernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks)),
                         kThreads, 0, stream>>>(x, cols, ChunkElems(cols), chunks, partials);
  }
  RowTotalsKernel<<<GridFor(out_rows), kThreads, 0, stream>>>(
      partials, cols > 0 ? rows : 0, chunks, out, out_rows, row0);
  return cudaGetLastError();
}

cudaError_t LaunchNormDivisor(const double* squares, int bf16, float eps, float* divisor,
                              cudaStream_t stream) {
  NormDivisorKernel<<<1, 1, 0, stream>>>(squares, bf16, eps, divisor);
  return cudaGetLastError();
}

cudaError_t LaunchDivideRows(float* x, int64_t rows, int64_t cols, const float* divisors,
                             int ns_type, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  DivideRowsKernel<<<GridFor(rows * cols), kThreads, 0, stream>>>(x, rows, cols, divisors,
                                                                  ns_type);
  return cudaGetLastError();
}

cudaError_t LaunchSumInOrder(int f64, const void* parts, int64_t count, int64_t len, void* out,
                             cudaStream_t stream) {
  if (len <= 0 || count <= 0) return cudaSuccess;
  if (f64) {
    SumInOrderKernel<double><<<GridFor(len), kThreads, 0, stream>>>(
        static_cast<const double*>(parts), count, len, static_cast<double*>(out));
  } else {
    SumInOrderKernel<float><<<GridFor(len), kThreads, 0, stream>>>(
        static_cast<const float*>(parts), count, len, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace muon
