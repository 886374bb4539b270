#include "muon/device/cuda/copy_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace muon {
namespace cuda {
namespace {

__device__ __forceinline__ float Load(uint8_t type, const void* p, int32_t i) {
  switch (type) {
    case 1:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case 2:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ float Round(uint8_t type, float v) {
  switch (type) {
    case 1:
      return __bfloat162float(__float2bfloat16_rn(v));
    case 2:
      return __half2float(__float2half_rn(v));
    default:
      return v;
  }
}

__device__ __forceinline__ void Store(uint8_t type, void* p, int32_t i, float v) {
  switch (type) {
    case 1:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case 2:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// One block per chunk (grid-stride over chunks when there are more).
__global__ void CopyChunksKernel(const CopyChunk* chunks, int64_t count) {
  for (int64_t c = blockIdx.x; c < count; c += gridDim.x) {
    const CopyChunk k = chunks[c];
    for (int32_t i = threadIdx.x; i < k.n; i += blockDim.x) {
      Store(k.dst_type, k.dst, i, Round(k.via, Load(k.src_type, k.src, i)));
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
