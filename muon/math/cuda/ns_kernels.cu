#include "muon/math/cuda/ns_kernels.h"
#include "muon/common/half4.h"
#include "muon/math/cuda/block_sum.cuh"
#include "muon/math/elementwise.h"

namespace muon {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// The element functions the CPU backend runs too (muon/math/elementwise.h).
using ew::Load;
using ew::Store;
__device__ __forceinline__ float Round(int type, float v) { return ew::RoundTo(type, v); }

using ew::Aligned4;
using ew::Load4;
using ew::Load4Rw;
using ew::Store4;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}
// The scaling's grid: a group of 4 elements per thread and pass, at most
// 4096 blocks (16 per SM of an H100: the grid-stride loop does the rest).
unsigned ScaleBlocks(int64_t elems) {
  const int64_t b = (elems + 4 * kThreads - 1) / (4 * kThreads);
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

// Multi-tensor launches: the tensors ride in the kernel's argument (up to
// kTensorsPerLaunch of them); block b works on chunk b - first_block of the
// tensor whose block range holds b.
constexpr int kTensorsPerLaunch = 40;
constexpr int64_t kChunk = int64_t{kThreads} * 4;  // a group of 4 elements per thread

struct MomentumEntry {
  const void* grad;
  void* buf;
  void* out;
  int64_t n;
  int64_t first_block;
  int grad_type;
  int buf_type;
  int out_type;
  bool vec;  // every pointer aligned for Load4 / Store4
};
struct MomentumLaunchArgs {
  MomentumEntry t[kTensorsPerLaunch];
  int count;
};

struct ApplyEntry {
  void* param;
  const void* update;
  int64_t n;
  int64_t first_block;
  double lr_ratio;
  double weight_decay_scale;  // 1 exactly: the step's weight decay as it is
  int param_type;
  int update_type;
  bool vec;       // both pointers aligned for Load4 / Store4
  bool cautious;  // the decay only where update * param >= 0 (in vec's padding)
};
struct ApplyLaunchArgs {
  ApplyEntry t[kTensorsPerLaunch];
  int count;
};

struct CountEntry {
  const void* x;
  int64_t n;
  int64_t first_block;
  int type;
};
struct CountLaunchArgs {
  CountEntry t[kTensorsPerLaunch];
  int count;
};

template <typename Args>
__device__ __forceinline__ int TensorOfBlock(const Args& a, int64_t block) {
  int i = 0;
  while (i + 1 < a.count && a.t[i + 1].first_block <= block) ++i;
  return i;
}

struct Bytes64 {
  unsigned char b[64];
};

__global__ void StoreBytesKernel(unsigned char* dst, Bytes64 value, int bytes) {
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = value.b[i];
}

__global__ void MomentumKernel(MomentumLaunchArgs a, const double* scalars, bool nesterov,
                               unsigned long long* nonfinite) {
  const int64_t block = blockIdx.x;
  const MomentumEntry& t = a.t[TensorOfBlock(a, block)];
  const float w_buf = ew::MomentumWeightOfBuf(scalars[2]);
  const float w_out = ew::MomentumWeightOfOut(scalars[2]);
  const int64_t begin = (block - t.first_block) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  unsigned long long bad = 0;  // counted in the same pass; one atomic per thread that saw one
  // A whole chunk is kThreads groups of 4: one per thread, in vector accesses.
  const int64_t i4 = begin + 4 * int64_t{threadIdx.x};
  if (t.vec && end - begin == kChunk) {
    float g[4], b[4], o[4];
    Load4(t.grad_type, t.grad, i4, g);
    Load4Rw(t.buf_type, t.buf, i4, b);
    for (int k = 0; k < 4; ++k) {
      bad += ew::IsFinite(g[k]) ? 0 : 1;
      o[k] = ew::MomentumElement(t.buf_type, g[k], &b[k], w_buf, w_out, nesterov);
    }
    Store4(t.out_type, t.out, i4, o);
    Store4(t.buf_type, t.buf, i4, b);
    if (bad != 0 && nonfinite != nullptr) atomicAdd(nonfinite, bad);
    return;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = Load(t.grad_type, t.grad, i);
    bad += ew::IsFinite(g) ? 0 : 1;
    float b = Load(t.buf_type, t.buf, i);
    Store(t.out_type, t.out, i, ew::MomentumElement(t.buf_type, g, &b, w_buf, w_out, nesterov));
    Store(t.buf_type, t.buf, i, b);
  }
  if (bad != 0 && nonfinite != nullptr) atomicAdd(nonfinite, bad);
}

__global__ void ApplyKernel(ApplyLaunchArgs a, const double* scalars, const int32_t* gate) {
  if (gate != nullptr && *gate != 0) return;  // the job's verdict: not applied
  const int64_t block = blockIdx.x;
  const ApplyEntry& t = a.t[TensorOfBlock(a, block)];
  // As the CPU backend: the product wd * scale only where the scale is not 1.
  const float decay = t.weight_decay_scale == 1.0
                          ? ew::DecayFactor(scalars[0], scalars[1])
                          : ew::DecayFactor(scalars[0], scalars[1] * t.weight_decay_scale);
  const float alpha = ew::UpdateAlpha(scalars[0], t.lr_ratio);
  const int64_t begin = (block - t.first_block) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  const int64_t i4 = begin + 4 * int64_t{threadIdx.x};
  if (t.vec && end - begin == kChunk) {  // one group of 4 per thread, as MomentumKernel
    float p[4], u[4];
    Load4Rw(t.param_type, t.param, i4, p);
    Load4(t.update_type, t.update, i4, u);
    for (int k = 0; k < 4; ++k) {
      const float d = t.cautious ? ew::CautiousDecay(p[k], u[k], decay) : decay;
      p[k] = ew::ApplyElement(t.param_type, p[k], u[k], d, alpha);
    }
    Store4(t.param_type, t.param, i4, p);
    return;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float p = Load(t.param_type, t.param, i), u = Load(t.update_type, t.update, i);
    const float d = t.cautious ? ew::CautiousDecay(p, u, decay) : decay;
    Store(t.param_type, t.param, i, ew::ApplyElement(t.param_type, p, u, d, alpha));
  }
}

// Packs tensors into launches of at most kTensorsPerLaunch tensors and
// kMaxGrid blocks; `fill(entry, tensor)` copies one tensor's fields.
constexpr int64_t kMaxGrid = int64_t{1} << 30;
template <typename LaunchArgs, typename Tensor, typename Fill, typename Launch>
cudaError_t PackAndLaunch(const Tensor* tensors, int64_t count, Fill fill, Launch launch) {
  LaunchArgs args;
  args.count = 0;
  int64_t blocks = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t need = (tensors[i].n + kChunk - 1) / kChunk;
    if (need == 0) continue;
    if (need > kMaxGrid) return cudaErrorInvalidValue;  // > 2^40 elements in one tensor
    if (args.count == kTensorsPerLaunch || blocks + need > kMaxGrid) {
      const cudaError_t e = launch(args, blocks);
      if (e != cudaSuccess) return e;
      args.count = 0;
      blocks = 0;
    }
    fill(args.t[args.count], tensors[i]);
    args.t[args.count].first_block = blocks;
    ++args.count;
    blocks += need;
  }
  return args.count == 0 ? cudaSuccess : launch(args, blocks);
}

// Every matrix's sum of squares is split over a fixed number of blocks, each
// a fixed chunk (a multiple of 4 elements, so float4 loads stay aligned), each
// reduced in a fixed tree: the same bits on every run.
constexpr int kMaxNormBlocks = 256;
constexpr int64_t kPerNormBlock = int64_t{kThreads} * 16;

__host__ __device__ int64_t NormChunk(int64_t elems, int blocks) {
  const int64_t chunk = (elems + blocks - 1) / blocks;
  return (chunk + 3) / 4 * 4;
}

// bf16 rounds the input (and the norm) first, as torch's bf16 Newton-Schulz
// does; fp16, whose range a bf16's or fp32's value may pass, normalizes in
// fp32 and rounds the quotient, as gram-newton-schulz does (and the CPU
// backend: CpuBackend::Normalize); fp32 rounds nothing.
__device__ __forceinline__ float RoundFirst(int x_type, float v) {
  return x_type == ew::kBF16 ? Round(x_type, v) : v;
}
__device__ __forceinline__ float Normalized(int x_type, float v, float norm) {
  return x_type == ew::kBF16 ? Round(x_type, v) / norm : Round(x_type, v / norm);
}

// partials[k * gridDim.x + b] = the sum of squares of chunk b of matrix k
// (u_type elements), each element first rounded to x_type. The groups of 4
// are summed in the same order whatever u_type, so an fp32 matrix and its
// bf16 copy (already rounded) give the same bits.
__global__ void SumSquaresKernel(const void* u, int u_type, int64_t elems, int x_type, bool vec4,
                                 float* partials) {
  const int64_t chunk = NormChunk(elems, gridDim.x);
  const int64_t m = blockIdx.y * elems;
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = begin + chunk < elems ? begin + chunk : elems;
  float acc = 0.0f;
  if (vec4) {  // elems % 4 == 0 and u aligned: begin and end are multiples of 4 too
    for (int64_t i = begin / 4 + threadIdx.x; i < end / 4; i += blockDim.x) {
      float v[4];
      Load4(u_type, u, m + 4 * i, v);
      const float a = RoundFirst(x_type, v[0]), b = RoundFirst(x_type, v[1]),
                  c = RoundFirst(x_type, v[2]), d = RoundFirst(x_type, v[3]);
      acc += a * a + b * b + c * c + d * d;
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = RoundFirst(x_type, Load(u_type, u, m + i));
      acc += v * v;
    }
  }
  const float total = BlockSum<kThreads>(acc);
  if (threadIdx.x == 0) partials[blockIdx.y * gridDim.x + blockIdx.x] = total;
}

// x[k] <- round(u[k]) / max(||round(u[k])||_F, eps), the norm rounded to
// x_type as torch's is; every block sums matrix k's partials in the same order.
__global__ void ScaleKernel(const void* u, int u_type, int64_t elems, int x_type,
                            const float* partials, int parts, float eps, void* x) {
  __shared__ float norm;
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int p = 0; p < parts; ++p) sum += partials[blockIdx.y * parts + p];
    float v = RoundFirst(x_type, sqrtf(sum));
    norm = RoundFirst(x_type, fmaxf(v, eps));
  }
  __syncthreads();
  const int64_t base = blockIdx.y * elems;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  // Groups of 4 in vector accesses when every matrix's start is aligned
  // (elems % 4 == 0 and both buffers aligned), else one element at a time.
  if (elems % 4 == 0 && Aligned4(u_type, u) && Aligned4(x_type, x)) {
    for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < elems / 4; g += stride) {
      float v[4];
      Load4(u_type, u, base + 4 * g, v);
      for (int k = 0; k < 4; ++k) v[k] = Normalized(x_type, v[k], norm);
      Store4(x_type, x, base + 4 * g, v);
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < elems; i += stride) {
    Store(x_type, x, base + i, Normalized(x_type, Load(u_type, u, base + i), norm));
  }
}

__global__ void FinishKernel(int x_type, const void* x, int64_t n, float* u) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if (Aligned4(x_type, x) && Aligned4(ew::kF32, u)) {  // groups of 4, then the tail
    for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < n / 4; g += stride) {
      float v[4];
      Load4(x_type, x, 4 * g, v);
      Store4(ew::kF32, u, 4 * g, v);
    }
    for (int64_t e = n / 4 * 4 + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
         e += stride) {
      u[e] = Load(x_type, x, e);
    }
    return;
  }
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += stride) {
    u[e] = Load(x_type, x, e);
  }
}

}  // namespace

cudaError_t LaunchStoreBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (bytes > sizeof(Bytes64)) return cudaErrorInvalidValue;
  Bytes64 value;
  memcpy(value.b, src, bytes);
  StoreBytesKernel<<<1, 64, 0, stream>>>(static_cast<unsigned char*>(dst), value,
                                         static_cast<int>(bytes));
  return cudaGetLastError();
}

cudaError_t LaunchMomentum(const MomentumTensor* tensors, int64_t count, const void* scalars,
                           bool nesterov, int64_t* nonfinite, cudaStream_t stream) {
  auto fill = [](MomentumEntry& e, const MomentumTensor& t) {
    e.grad = t.grad;
    e.buf = t.buf;
    e.out = t.out;
    e.n = t.n;
    e.grad_type = t.grad_type;
    e.buf_type = t.buf_type;
    e.out_type = t.out_type;
    e.vec = Aligned4(t.grad_type, t.grad) && Aligned4(t.buf_type, t.buf) &&
            Aligned4(t.out_type, t.out);
  };
  auto launch = [&](const MomentumLaunchArgs& args, int64_t blocks) {
    MomentumKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        args, static_cast<const double*>(scalars), nesterov,
        reinterpret_cast<unsigned long long*>(nonfinite));
    return cudaGetLastError();
  };
  return PackAndLaunch<MomentumLaunchArgs>(tensors, count, fill, launch);
}

cudaError_t LaunchApply(const ApplyTensor* tensors, int64_t count, const void* scalars,
                        const int32_t* gate, cudaStream_t stream) {
  auto fill = [](ApplyEntry& e, const ApplyTensor& t) {
    e.param = t.param;
    e.update = t.update;
    e.n = t.n;
    e.lr_ratio = t.lr_ratio;
    e.weight_decay_scale = t.weight_decay_scale;
    e.param_type = t.param_type;
    e.update_type = t.update_type;
    e.vec = Aligned4(t.param_type, t.param) && Aligned4(t.update_type, t.update);
    e.cautious = t.cautious != 0;
  };
  auto launch = [&](const ApplyLaunchArgs& args, int64_t blocks) {
    ApplyKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        args, static_cast<const double*>(scalars), gate);
    return cudaGetLastError();
  };
  return PackAndLaunch<ApplyLaunchArgs>(tensors, count, fill, launch);
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

__global__ void ScaleRoundedKernel(int type, void* x, int64_t n, float factor, int precision) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(type, x, i, ew::RoundTo(precision, Load(type, x, i) * factor));
  }
}

cudaError_t LaunchScaleRounded(int type, void* x, int64_t n, float factor, int precision,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleRoundedKernel<<<Blocks(n), kThreads, 0, stream>>>(type, x, n, factor, precision);
  return cudaGetLastError();
}

// Block b counts chunk b - first_block of its tensor: one atomic per
// thread that saw a non-finite element.
__global__ void CountNonFiniteAllKernel(CountLaunchArgs a, unsigned long long* counter) {
  const int64_t block = blockIdx.x;
  const CountEntry& t = a.t[TensorOfBlock(a, block)];
  const int64_t begin = (block - t.first_block) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  unsigned long long bad = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    bad += ew::IsFinite(Load(t.type, t.x, i)) ? 0 : 1;
  }
  if (bad != 0) atomicAdd(counter, bad);
}

cudaError_t LaunchCountNonFiniteAll(const CountTensor* tensors, int64_t count, int64_t* counter,
                                    cudaStream_t stream) {
  auto fill = [](CountEntry& e, const CountTensor& t) {
    e.x = t.x;
    e.n = t.n;
    e.type = t.type;
  };
  auto launch = [&](const CountLaunchArgs& args, int64_t blocks) {
    CountNonFiniteAllKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        args, reinterpret_cast<unsigned long long*>(counter));
    return cudaGetLastError();
  };
  return PackAndLaunch<CountLaunchArgs>(tensors, count, fill, launch);
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

int NormBlocks(int64_t elems) {
  const int64_t b = (elems + kPerNormBlock - 1) / kPerNormBlock;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxNormBlocks ? kMaxNormBlocks : b));
}

cudaError_t LaunchPrepare(const void* u, int u_type, int64_t count, int64_t elems, int x_type,
                          float eps, float* partials, void* x, cudaStream_t stream) {
  if (count == 0 || elems == 0) return cudaSuccess;
  const int parts = NormBlocks(elems);
  const size_t x_size = x_type == ew::kF32 ? 4 : 2;
  const size_t u_size = u_type == ew::kF32 ? 4 : 2;
  // A grid's y extent is at most 65,535: more matrices go in several launches.
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t first = 0; first < count; first += kMaxGridY) {
    const int64_t n = count - first < kMaxGridY ? count - first : kMaxGridY;
    const void* uk = static_cast<const char*>(u) + static_cast<size_t>(first * elems) * u_size;
    float* pk = partials + first * parts;
    void* xk = static_cast<char*>(x) + static_cast<size_t>(first * elems) * x_size;
    const bool vec4 = elems % 4 == 0 && Aligned4(u_type, uk);
    const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(n));
    SumSquaresKernel<<<grid, kThreads, 0, stream>>>(uk, u_type, elems, x_type, vec4, pk);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    // The scaling's own grid: enough blocks to fill the GPU (a group of 4
    // elements per thread and pass), whatever the norm's split.
    const dim3 scale_grid(ScaleBlocks(elems), static_cast<unsigned>(n));
    ScaleKernel<<<scale_grid, kThreads, 0, stream>>>(uk, u_type, elems, x_type, pk, parts, eps,
                                                     xk);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchFinish(int x_type, const void* x, int64_t n, void* u, int u_type,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (u_type == x_type) {
    return cudaMemcpyAsync(u, x, static_cast<size_t>(n) * (x_type == ew::kF32 ? 4 : 2),
                           cudaMemcpyDeviceToDevice, stream);
  }
  if (u_type != ew::kF32) return cudaErrorInvalidValue;  // (a bf16 slot takes bf16 results)
  FinishKernel<<<Blocks(n), kThreads, 0, stream>>>(x_type, x, n, static_cast<float*>(u));
  return cudaGetLastError();
}

// The upper tiles of `count` symmetric m x m matrices (column-major, stride
// m * m) from their lower tiles: element (r, c) with r / b < c / b takes
// (c, r)'s bits. A 32 x 32 block of the output per thread block, through
// shared memory, so that both the reads and the writes are coalesced.
template <typename T>
__global__ void MirrorTilesKernel(T* d, int64_t count, int64_t m, int64_t b) {
  __shared__ T tile[32][33];
  const int64_t r0 = int64_t{blockIdx.y} * 32, c0 = int64_t{blockIdx.x} * 32;
  if (r0 / b >= (c0 + 31 < m ? c0 + 31 : m - 1) / b) return;  // no upper tile here
  for (int64_t k = blockIdx.z; k < count; k += gridDim.z) {
    T* mat = d + k * m * m;
    // Read: tile[y][x] = (c0 + x, r0 + y), the source of output (r0 + y, c0 + x).
    for (int y = threadIdx.y; y < 32; y += blockDim.y) {
      const int64_t r = r0 + y, c = c0 + threadIdx.x;
      if (r < m && c < m && r / b < c / b) tile[y][threadIdx.x] = mat[c + r * m];
    }
    __syncthreads();
    // Write: output (r0 + x, c0 + y) = tile[x][y].
    for (int y = threadIdx.y; y < 32; y += blockDim.y) {
      const int64_t r = r0 + threadIdx.x, c = c0 + y;
      if (r < m && c < m && r / b < c / b) mat[r + c * m] = tile[threadIdx.x][y];
    }
    __syncthreads();
  }
}

cudaError_t LaunchMirrorTiles(int x_type, void* d, int64_t count, int64_t m, int64_t b,
                              cudaStream_t stream) {
  if (count == 0 || m == 0 || b >= m) return cudaSuccess;
  const unsigned tiles = static_cast<unsigned>((m + 31) / 32);
  const dim3 grid(tiles, tiles, static_cast<unsigned>(count < 65535 ? count : 65535));
  const dim3 block(32, 8);
  if (x_type == ew::kF32) {
    MirrorTilesKernel<<<grid, block, 0, stream>>>(static_cast<float*>(d), count, m, b);
  } else {
    MirrorTilesKernel<<<grid, block, 0, stream>>>(static_cast<uint16_t*>(d), count, m, b);
  }
  return cudaGetLastError();
}

// q[k] <- z[k] + a I, each matrix m x m at stride m * m: a copy, then the
// diagonal in fp32, rounded to x_type (as the CPU's Gram program rounds Q).
__global__ void AddToDiagonalKernel(int x_type, void* q, int64_t count, int64_t m, float a) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count * m; e += stride) {
    const int64_t k = e / m, j = e % m;
    const int64_t at = k * m * m + j * m + j;
    Store(x_type, q, at, Round(x_type, Load(x_type, q, at) + a));
  }
}

cudaError_t LaunchAddIdentity(int x_type, const void* z, void* q, int64_t count, int64_t m,
                              float a, cudaStream_t stream) {
  if (count == 0 || m == 0) return cudaSuccess;
  const size_t bytes = static_cast<size_t>(count * m * m) * (x_type == ew::kF32 ? 4 : 2);
  const cudaError_t e = cudaMemcpyAsync(q, z, bytes, cudaMemcpyDeviceToDevice, stream);
  if (e != cudaSuccess) return e;
  AddToDiagonalKernel<<<Blocks(count * m), kThreads, 0, stream>>>(x_type, q, count, m, a);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace muon
