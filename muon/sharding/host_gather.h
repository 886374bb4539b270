// An all_gather of host values (the setup's handshake, the step verdicts)
// over a communicator that may move device memory only (NCCL).
#ifndef MUON_SHARDING_HOST_GATHER_H_
#define MUON_SHARDING_HOST_GATHER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/comm/comm.h"
#include "muon/device/device.h"

namespace muon {

// Device buffers to stage through: `send` of at least `bytes`, `recv` of at
// least the communicator's size times that.
struct DeviceStaging {
  void* send = nullptr;
  void* recv = nullptr;
};

// Every rank's `bytes` bytes of `mine` into all[rank * bytes, ...), host
// memory both. With a device that is not the host (`device` non-NULL and not
// is_host()), the values go through device buffers on `stream` (`staging`'s,
// else allocated for the call): copied in, gathered (issued even when the
// copy in failed, so that the ranks' collectives pair up), copied out
// (Device::ToHost waits for the stream, the one wait). `op` names the
// collective in errors.
absl::Status HostAllGather(Comm& comm, Device* device, const void* mine, void* all, size_t bytes,
                           void* stream, const std::string& op,
                           const DeviceStaging* staging = nullptr);

// An all_to_all_v of host values, staged through device buffers as
// HostAllGather does (allocated for the call): `send` holds what goes to each
// rank at send_offsets[p] (send_bytes[p] bytes), `recv` receives each rank's
// at recv_offsets[p]. The offsets index host buffers of send_total and
// recv_total bytes.
absl::Status HostAllToAllV(Comm& comm, Device* device, const void* send,
                           const std::vector<size_t>& send_bytes,
                           const std::vector<size_t>& send_offsets, size_t send_total, void* recv,
                           const std::vector<size_t>& recv_bytes,
                           const std::vector<size_t>& recv_offsets, size_t recv_total,
                           void* stream, const std::string& op);

}  // namespace muon

#endif  // MUON_SHARDING_HOST_GATHER_H_
