// Opens a CUDA device through the libmuon_cuda.so plugin, so that libmuon.so
// itself never links CUDA: a CPU-only host loads it without the CUDA
// libraries, and the plugin is loaded only when the first CUDA tensor is
// registered.
//
// The plugin is looked for, in order: at the path in the environment variable
// MUON_CUDA_PLUGIN; beside the library holding this code (libmuon.so); by the
// dynamic loader's search path. It stays loaded for the life of the process.
#ifndef MUON_DEVICE_CUDA_LOADER_H_
#define MUON_DEVICE_CUDA_LOADER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "muon/device/device.h"
#include "muon/device/memory_ops.h"

namespace muon {

// The plugin's one entry point. `abi` must be kCudaPluginAbi; on success
// *device receives a Device the caller deletes; on failure the message is
// written to error[0, error_size) and a nonzero absl::StatusCode returned.
// The Device class crosses the boundary: any change to it (device.h,
// backend.h) bumps this number (2: the communication lane, stream points,
// allocation through the host's allocator, multi-tensor math; 3: page-locked
// staging memory; 4: the math's CopyRuns and ScaleRounded (split blocks, 0.7)
// and split Newton-Schulz's steps (RowSquares ... SumInOrder); 5: its
// AddIdentity and AolScale steps, and Supports).
inline constexpr int kCudaPluginAbi = 5;
inline constexpr char kCudaPluginEntry[] = "muon_cuda_plugin_create_device";
using CudaPluginEntry = int (*)(int abi, int ordinal, Device** device, char* error,
                                size_t error_size);
// Its memory ops (memory_ops.h), installed once a CUDA device opens.
inline constexpr char kCudaPluginMemoryOps[] = "muon_cuda_plugin_memory_ops";
using CudaPluginMemoryOps = const MemoryOps* (*)(int abi);

// The device for CUDA ordinal `ordinal`. Unavailable, saying why, when the
// plugin cannot be loaded or no usable GPU is present.
absl::StatusOr<std::shared_ptr<Device>> OpenCudaDevice(int ordinal);

}  // namespace muon

#endif  // MUON_DEVICE_CUDA_LOADER_H_
