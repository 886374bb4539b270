// Four consecutive elements in one vector access, for the CUDA kernels
// (copy_kernels.cu, ns_kernels.cu): 16 bytes of fp32, 8 of a 16-bit type.
// The conversions are half.h's, so the values are the scalar path's (and the
// host's) bit for bit. nvcc only.
#ifndef MUON_COMMON_HALF4_H_
#define MUON_COMMON_HALF4_H_

#include <cstdint>

#include "muon/common/half.h"

#if defined(__CUDACC__)

namespace muon {
namespace ew {

// i .. i + 3, i a multiple of 4 and `base` aligned to that access (Aligned4).
__host__ __device__ __forceinline__ bool Aligned4(int type, const void* base) {
  return reinterpret_cast<uintptr_t>(base) % (type == kF32 ? 16 : 8) == 0;
}
__device__ __forceinline__ float Half(int type, uint32_t bits) {
  return type == kBF16 ? Bf16BitsToFloat(static_cast<uint16_t>(bits))
                       : F16BitsToFloat(static_cast<uint16_t>(bits));
}
__device__ __forceinline__ uint32_t HalfBits(int type, float f) {
  return type == kBF16 ? FloatToBf16Bits(f) : FloatToF16Bits(f);
}
// Through the read-only cache: memory the kernel does not write.
__device__ __forceinline__ void Load4(int type, const void* base, int64_t i, float v[4]) {
  if (type == kF32) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(base) + i / 4);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return;
  }
  const uint2 q = __ldg(reinterpret_cast<const uint2*>(base) + i / 4);
  v[0] = Half(type, q.x & 0xffffu), v[1] = Half(type, q.x >> 16);
  v[2] = Half(type, q.y & 0xffffu), v[3] = Half(type, q.y >> 16);
}
// As Load4, for memory the same kernel writes too (no read-only cache).
__device__ __forceinline__ void Load4Rw(int type, const void* base, int64_t i, float v[4]) {
  if (type == kF32) {
    const float4 q = reinterpret_cast<const float4*>(base)[i / 4];
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return;
  }
  const uint2 q = reinterpret_cast<const uint2*>(base)[i / 4];
  v[0] = Half(type, q.x & 0xffffu), v[1] = Half(type, q.x >> 16);
  v[2] = Half(type, q.y & 0xffffu), v[3] = Half(type, q.y >> 16);
}
__device__ __forceinline__ void Store4(int type, void* base, int64_t i, const float v[4]) {
  if (type == kF32) {
    reinterpret_cast<float4*>(base)[i / 4] = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
  reinterpret_cast<uint2*>(base)[i / 4] =
      make_uint2(HalfBits(type, v[0]) | (HalfBits(type, v[1]) << 16),
                 HalfBits(type, v[2]) | (HalfBits(type, v[3]) << 16));
}

}  // namespace ew
}  // namespace muon

#endif  // __CUDACC__

#endif  // MUON_COMMON_HALF4_H_
