// The GPU copy program: element-wise copies with dtype conversion, run as one
// launch over chunks prepared on the host (header for host C++; the kernel is
// in copy_kernels.cu).
#ifndef MUON_DEVICE_CUDA_COPY_KERNELS_H_
#define MUON_DEVICE_CUDA_COPY_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace muon {
namespace cuda {

// At most kChunkElems elements of one copy. Types are numbered like
// muon::DType (0 float32, 1 bfloat16, 2 float16).
struct CopyChunk {
  const void* src;
  void* dst;
  int32_t n;
  uint8_t src_type, dst_type, via;
  uint8_t pad;
};

inline constexpr int32_t kChunkElems = 8192;

// Runs `count` chunks (a device array), stream-ordered.
cudaError_t LaunchCopyChunks(const CopyChunk* chunks, int64_t count, cudaStream_t stream);

}  // namespace cuda
}  // namespace muon

#endif  // MUON_DEVICE_CUDA_COPY_KERNELS_H_
