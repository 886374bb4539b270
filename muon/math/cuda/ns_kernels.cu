#include "muon/math/cuda/ns_kernels.h"
#include "muon/math/elementwise.h"

namespace muon {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// The element functions the CPU backend runs too (muon/math/elementwise.h).
using ew::Load;
using ew::Store;
__device__ __forceinline__ float Round(int type, float v) { return ew::RoundTo(type, v); }

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

__global__ void MomentumKernel(int grad_type, const void* grad, int buf_type, void* buf,
                               int64_t n, float w_buf, float w_out, bool nesterov, float* out,
                               unsigned long long* nonfinite) {
  unsigned long long bad = 0;  // counted in the same pass; one atomic per thread that saw one
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = Load(grad_type, grad, i);
    bad += ew::IsFinite(g) ? 0 : 1;
    float b = Load(buf_type, buf, i);
    out[i] = ew::MomentumElement(buf_type, g, &b, w_buf, w_out, nesterov);
    Store(buf_type, buf, i, b);
  }
  if (bad != 0 && nonfinite != nullptr) atomicAdd(nonfinite, bad);
}

__global__ void ApplyKernel(int param_type, void* param, int64_t n, const float* update,
                            float decay, float alpha, const int32_t* gate) {
  if (gate != nullptr && *gate != 0) return;  // the job's verdict: not applied
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(param_type, param, i,
          ew::ApplyElement(param_type, Load(param_type, param, i), update[i], decay, alpha));
  }
}

__global__ void PrepareKernel(const float* u, int64_t count, int64_t rows, int64_t cols,
                              int x_type, void* x) {
  const bool t = rows > cols;
  const int64_t m = t ? cols : rows, n = t ? rows : cols, per = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count * per;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e / per, r = (e % per) / n, c = e % n;  // x[k][r][c]
    const float v = t ? u[k * per + c * cols + r] : u[k * per + r * cols + c];
    Store(x_type, x, e, v);
  }
}

__global__ void FinishKernel(int x_type, const void* x, int64_t count, int64_t rows, int64_t cols,
                             float* u) {
  const bool t = rows > cols;
  const int64_t m = t ? cols : rows, n = t ? rows : cols, per = m * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count * per;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e / per, r = (e % per) / n, c = e % n;
    const float v = Load(x_type, x, e);
    if (t) {
      u[k * per + c * cols + r] = v;
    } else {
      u[k * per + r * cols + c] = v;
    }
  }
}

// One block per matrix: a fixed-order reduction, then the division.
__global__ void NormalizeKernel(int x_type, void* x, int64_t elems, float eps) {
  __shared__ float partial[kThreads];
  const int64_t base = blockIdx.x * elems;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < elems; i += blockDim.x) {
    const float v = Load(x_type, x, base + i);
    acc += v * v;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  float norm = Round(x_type, sqrtf(partial[0]));
  norm = Round(x_type, fmaxf(norm, eps));
  for (int64_t i = threadIdx.x; i < elems; i += blockDim.x) {
    Store(x_type, x, base + i, Load(x_type, x, base + i) / norm);
  }
}

}  // namespace

cudaError_t LaunchMomentum(int grad_type, const void* grad, int buf_type, void* buf, int64_t n,
                           float w_buf, float w_out, bool nesterov, float* out,
                           int64_t* nonfinite, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MomentumKernel<<<Blocks(n), kThreads, 0, stream>>>(
      grad_type, grad, buf_type, buf, n, w_buf, w_out, nesterov, out,
      reinterpret_cast<unsigned long long*>(nonfinite));
  return cudaGetLastError();
}

cudaError_t LaunchApply(int param_type, void* param, int64_t n, const float* update, float decay,
                        float alpha, const int32_t* gate, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ApplyKernel<<<Blocks(n), kThreads, 0, stream>>>(param_type, param, n, update, decay, alpha,
                                                   gate);
  return cudaGetLastError();
}

__global__ void CountNonFiniteKernel(int type, const void* x, int64_t n,
                                     unsigned long long* counter) {
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    bad += ew::IsFinite(Load(type, x, i)) ? 0 : 1;
  }
  if (bad != 0) atomicAdd(counter, bad);
}

cudaError_t LaunchCountNonFinite(int type, const void* x, int64_t n, int64_t* counter,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CountNonFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(
      type, x, n, reinterpret_cast<unsigned long long*>(counter));
  return cudaGetLastError();
}

__global__ void VerdictGateKernel(const unsigned char* verdicts, int64_t n, uint32_t magic,
                                  int32_t* flag) {
  __shared__ int bad;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  unsigned long long digest0;
  memcpy(&digest0, verdicts + 8, 8);
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    uint32_t m;
    int32_t code;
    unsigned long long digest;
    memcpy(&m, verdicts + 16 * r, 4);
    memcpy(&code, verdicts + 16 * r + 4, 4);
    memcpy(&digest, verdicts + 16 * r + 8, 8);
    if (m != magic || code != 0 || digest != digest0) atomicOr(&bad, 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) *flag = bad;
}

cudaError_t LaunchVerdictGate(const void* verdicts, int64_t n, uint32_t magic, int32_t* flag,
                              cudaStream_t stream) {
  VerdictGateKernel<<<1, kThreads, 0, stream>>>(static_cast<const unsigned char*>(verdicts), n,
                                                magic, flag);
  return cudaGetLastError();
}

cudaError_t LaunchPrepare(const float* u, int64_t count, int64_t rows, int64_t cols, int x_type,
                          void* x, cudaStream_t stream) {
  const int64_t n = count * rows * cols;
  if (n == 0) return cudaSuccess;
  PrepareKernel<<<Blocks(n), kThreads, 0, stream>>>(u, count, rows, cols, x_type, x);
  return cudaGetLastError();
}

cudaError_t LaunchNormalize(int x_type, void* x, int64_t count, int64_t elems, float eps,
                            cudaStream_t stream) {
  if (count == 0 || elems == 0) return cudaSuccess;
  NormalizeKernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(x_type, x, elems, eps);
  return cudaGetLastError();
}

cudaError_t LaunchFinish(int x_type, const void* x, int64_t count, int64_t rows, int64_t cols,
                         float* u, cudaStream_t stream) {
  const int64_t n = count * rows * cols;
  if (n == 0) return cudaSuccess;
  FinishKernel<<<Blocks(n), kThreads, 0, stream>>>(x_type, x, count, rows, cols, u);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace muon
