// The CUDA device: GPU memory (cudaMalloc, once at setup), the copy program
// as one kernel launch, and the CUDA math backend, all ordered on the host's
// stream. Nothing here waits for the device except ToHost/FromHost (state
// save and load) and setup.
#ifndef MUON_DEVICE_CUDA_CUDA_DEVICE_H_
#define MUON_DEVICE_CUDA_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "muon/device/device.h"

namespace muon {

// Unavailable, saying why, when CUDA ordinal `ordinal` cannot be used.
absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal);

}  // namespace muon

#endif  // MUON_DEVICE_CUDA_CUDA_DEVICE_H_
