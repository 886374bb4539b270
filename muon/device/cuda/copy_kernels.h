// The GPU copy program: element-wise copies with dtype conversion, run as one
// launch over chunks prepared on the host (header for host C++; the kernel is
// in copy_kernels.cu).
#ifndef MUON_DEVICE_CUDA_COPY_KERNELS_H_
#define MUON_DEVICE_CUDA_COPY_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "muon/device/gpu_copy_chunk.h"

namespace muon {
namespace cuda {

using CopyChunk = GpuCopyChunk;
inline constexpr int32_t kChunkElems = kGpuChunkElems;

// Runs `count` chunks (a device array), stream-ordered.
cudaError_t LaunchCopyChunks(const CopyChunk* chunks, int64_t count, cudaStream_t stream);

}  // namespace cuda
}  // namespace muon

#endif  // MUON_DEVICE_CUDA_COPY_KERNELS_H_
