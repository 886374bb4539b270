// A GPU for tests that runs on the CPU: the real GPU device (gpu_device.h)
// over StrictCpuRuntime, with math that checks its pointers are the device's
// memory and runs the CPU backend's arithmetic as stream work. The host
// logic is the one the CUDA plugin runs; the arithmetic is the CPU
// backend's (so results equal a host run's bit for bit).
//
// libmuon_strict_gpu.so (strict_plugin.cc) serves it as the CUDA plugin
// (MUON_CUDA_PLUGIN=<its path>): kDLCUDA tensors then step on it, device i
// being strict-cpu device i. Tests allocate and read device memory through
// the runtime the plugin exports (muon_strict_gpu_runtime).
#ifndef MUON_DEVICE_TESTING_STRICT_GPU_H_
#define MUON_DEVICE_TESTING_STRICT_GPU_H_

#include <memory>

#include "muon/device/device.h"
#include "muon/device/testing/strict_cpu_runtime.h"

namespace muon {

std::unique_ptr<Device> MakeStrictGpuDevice(std::shared_ptr<StrictCpuRuntime> runtime, int ordinal);

// Fault injection: the next momentum update issued on device `ordinal`
// fails (as a kernel launch can), on whichever optimizer issues it.
void FailNextMomentum(int ordinal);

// The momentum, update and non-finite count launches issued on device
// `ordinal` so far.
struct StrictLaunches {
  int64_t momentum = 0;
  int64_t apply = 0;
  int64_t count = 0;
};
StrictLaunches LaunchesOn(int ordinal);

}  // namespace muon

#endif  // MUON_DEVICE_TESTING_STRICT_GPU_H_
