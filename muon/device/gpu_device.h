// The device of one GPU: its memory, the exchange's copies and the math,
// ordered on the step's stream. Written once against GpuRuntime: the CUDA
// plugin runs it over CUDA (with the cuBLAS backend as its math), the tests
// over StrictCpuRuntime, so that the host logic a GPU runs is the one CI
// checks. Every call makes the GPU the calling thread's current device for
// its duration (the host's threads keep their own choice); the math is
// called the same way, whichever thread calls.
#ifndef MUON_DEVICE_GPU_DEVICE_H_
#define MUON_DEVICE_GPU_DEVICE_H_

#include <memory>

#include "muon/device/device.h"
#include "muon/device/gpu_runtime.h"
#include "muon/math/backend.h"

namespace muon {

// `math` computes on `runtime`'s memory, ordered on the stream SetStream gives it.
std::unique_ptr<Device> MakeGpuDevice(std::shared_ptr<GpuRuntime> runtime, int ordinal,
                                      std::unique_ptr<MathBackend> math);

}  // namespace muon

#endif  // MUON_DEVICE_GPU_DEVICE_H_
