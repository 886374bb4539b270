#include "muon/device/cuda/copy_kernels.h"

#include <cstdint>

#include "muon/common/half4.h"

namespace muon {
namespace cuda {
namespace {

// The element conversions are the host's (muon/common/half.h: the same
// rounding and the same NaN payloads as the CPU path).
__device__ __forceinline__ float Element(const CopyChunk& k, float v) {
  return ew::RoundTo(k.via, v);
}

using ew::Aligned4;
using ew::Load4Rw;
using ew::Store4;

// One block per chunk (grid-stride over chunks when there are more); groups
// of 4 elements in vector accesses where both ends are aligned for them.
__global__ void CopyChunksKernel(const CopyChunk* chunks, int64_t count) {
  for (int64_t c = blockIdx.x; c < count; c += gridDim.x) {
    const CopyChunk k = chunks[c];
    int32_t done = 0;
    if (Aligned4(k.src_type, k.src) && Aligned4(k.dst_type, k.dst)) {
      done = k.n / 4 * 4;
      for (int32_t i = 4 * threadIdx.x; i < done; i += 4 * blockDim.x) {
        float v[4];
        Load4Rw(k.src_type, k.src, i, v);  // (a chunk may copy within one buffer)
        for (int j = 0; j < 4; ++j) v[j] = Element(k, v[j]);
        Store4(k.dst_type, k.dst, i, v);
      }
    }
    for (int32_t i = done + threadIdx.x; i < k.n; i += blockDim.x) {
      ew::Store(k.dst_type, k.dst, i, Element(k, ew::Load(k.src_type, k.src, i)));
    }
  }
}

}  // namespace

cudaError_t LaunchCopyChunks(const CopyChunk* chunks, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(count < 65535 ? count : 65535);
  CopyChunksKernel<<<blocks, 256, 0, stream>>>(chunks, count);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace muon
