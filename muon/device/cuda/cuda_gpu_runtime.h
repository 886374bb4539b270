// GpuRuntime over the CUDA runtime API: each call is the CUDA call of the
// same name (cudaMemcpyAsync, cudaEventRecord, ...), its error a status
// naming the call. Linked only into the libmuon_cuda.so plugin.
#ifndef MUON_DEVICE_CUDA_CUDA_GPU_RUNTIME_H_
#define MUON_DEVICE_CUDA_CUDA_GPU_RUNTIME_H_

#include <memory>

#include "muon/device/gpu_runtime.h"

namespace muon {

std::shared_ptr<GpuRuntime> MakeCudaRuntime();

}  // namespace muon

#endif  // MUON_DEVICE_CUDA_CUDA_GPU_RUNTIME_H_
