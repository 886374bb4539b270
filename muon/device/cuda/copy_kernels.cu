#include "muon/device/cuda/copy_kernels.h"

#include <cstdint>

#include "muon/common/half.h"

namespace muon {
namespace cuda {
namespace {

// The element conversions are the host's (muon/common/half.h: the same
// rounding and the same NaN payloads as the CPU path).
__device__ __forceinline__ float Element(const CopyChunk& k, float v) {
  return ew::RoundTo(k.via, v);
}

// 4 consecutive elements in one access: 16 bytes of fp32, 8 of a 16-bit type.
__device__ __forceinline__ bool Aligned4(uint8_t type, const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (type == ew::kF32 ? 16 : 8) == 0;
}
__device__ __forceinline__ void Load4(uint8_t type, const void* p, int32_t i, float v[4]) {
  if (type == ew::kF32) {
    const float4 q = reinterpret_cast<const float4*>(p)[i / 4];
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return;
  }
  const uint2 q = reinterpret_cast<const uint2*>(p)[i / 4];
  const uint32_t h[4] = {q.x & 0xffffu, q.x >> 16, q.y & 0xffffu, q.y >> 16};
  for (int j = 0; j < 4; ++j) {
    v[j] = type == ew::kBF16 ? ew::Bf16BitsToFloat(static_cast<uint16_t>(h[j]))
                             : ew::F16BitsToFloat(static_cast<uint16_t>(h[j]));
  }
}
__device__ __forceinline__ void Store4(uint8_t type, void* p, int32_t i, const float v[4]) {
  if (type == ew::kF32) {
    reinterpret_cast<float4*>(p)[i / 4] = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
  uint32_t h[4];
  for (int j = 0; j < 4; ++j) {
    h[j] = type == ew::kBF16 ? ew::FloatToBf16Bits(v[j]) : ew::FloatToF16Bits(v[j]);
  }
  reinterpret_cast<uint2*>(p)[i / 4] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
}

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
        Load4(k.src_type, k.src, i, v);
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
