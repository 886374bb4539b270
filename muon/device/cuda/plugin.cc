// libmuon_cuda.so's one exported function (see muon/device/cuda_loader.h):
// makes the CUDA device libmuon.so asks for. No exception leaves it.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "muon/device/cuda/cuda_device.h"
#include "muon/device/cuda_loader.h"

namespace {

int Fail(absl::StatusCode code, const std::string& message, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
  return static_cast<int>(code);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int muon_cuda_plugin_create_device(
    int abi, int ordinal, muon::Device** device, char* error, size_t error_size) {
  if (abi != muon::kCudaPluginAbi) {
    return Fail(absl::StatusCode::kFailedPrecondition,
                "libmuon_cuda.so was built for another libmuon.so (plugin interface " +
                    std::to_string(muon::kCudaPluginAbi) + ", asked for " + std::to_string(abi) +
                    "); use the two libraries of one build",
                error, error_size);
  }
  try {
    absl::StatusOr<std::unique_ptr<muon::Device>> d = muon::MakeCudaDevice(ordinal);
    if (!d.ok()) return Fail(d.status().code(), std::string(d.status().message()), error, error_size);
    *device = d->release();
    return 0;
  } catch (const std::exception& e) {
    return Fail(absl::StatusCode::kInternal, e.what(), error, error_size);
  } catch (...) {
    return Fail(absl::StatusCode::kInternal, "unexpected exception", error, error_size);
  }
}

namespace {

int Sync(void* stream) { return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

int Copy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return 0;
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

int HostReadable(const void* ptr) {
  const cudaError_t pending = cudaPeekAtLastError();  // an earlier call's: left for its caller
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    // Clear this call's error (an unknown pointer is plain host memory),
    // never one that was pending before it.
    if (pending == cudaSuccess) cudaGetLastError();
    return 1;
  }
  return a.type == cudaMemoryTypeDevice ? 0 : 1;
}

const char* ErrorString(int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); }

const muon::MemoryOps kOps = {&Sync, &Copy, &HostReadable, &ErrorString};

}  // namespace

extern "C" __attribute__((visibility("default"))) const muon::MemoryOps*
muon_cuda_plugin_memory_ops(int abi) {
  return abi == muon::kCudaPluginAbi ? &kOps : nullptr;
}
