// The CPU device: host memory and the CPU backend (OpenBLAS, oneDNN, the
// AMX kernel). A target of its own, so that the CUDA plugin, which links the
// device interface, links none of the CPU's libraries.
#ifndef MUON_DEVICE_HOST_DEVICE_H_
#define MUON_DEVICE_HOST_DEVICE_H_

#include <memory>
#include <vector>

#include "muon/device/device.h"

namespace muon {

std::shared_ptr<Device> MakeHostDevice();

// Runs `ops` on host memory (the host device's program, also the reference
// the GPU copy kernel is tested against).
void RunCopiesOnHost(const std::vector<CopyOp>& ops);

}  // namespace muon

#endif  // MUON_DEVICE_HOST_DEVICE_H_
