// One chunk of the GPU copy kernel (copy_kernels.cu), shared by the kernel,
// the GPU device that prepares chunks and the strict CPU runtime that runs
// them: plain C++, no CUDA or Abseil, so nvcc compiles it too.
#ifndef MUON_DEVICE_GPU_COPY_CHUNK_H_
#define MUON_DEVICE_GPU_COPY_CHUNK_H_

#include <cstdint>

namespace muon {

// At most kGpuChunkElems elements of one CopyOp (device.h); dtypes numbered
// like muon::DType (0 float32, 1 bfloat16, 2 float16).
struct GpuCopyChunk {
  const void* src;
  void* dst;
  int32_t n;
  uint8_t src_type, dst_type, via;
  uint8_t pad;
};
inline constexpr int32_t kGpuChunkElems = 8192;

}  // namespace muon

#endif  // MUON_DEVICE_GPU_COPY_CHUNK_H_
