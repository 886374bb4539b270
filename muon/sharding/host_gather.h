// The handshake's host collectives, as free functions over
// muon/comm/host_collectives.h (HostCollectives), which is their home.
#ifndef MUON_SHARDING_HOST_GATHER_H_
#define MUON_SHARDING_HOST_GATHER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/comm/comm.h"
#include "muon/comm/host_collectives.h"
#include "muon/device/device.h"

namespace muon {

inline absl::Status HostAllGather(Comm& comm, Device* device, const void* mine, void* all,
                                  size_t bytes, void* stream, const std::string& op,
                                  const DeviceStaging* staging = nullptr) {
  return HostCollectives(comm, device, stream).AllGather(mine, all, bytes, op, staging);
}

inline absl::Status HostAllToAllV(Comm& comm, Device* device, const void* send,
                                  const std::vector<size_t>& send_bytes,
                                  const std::vector<size_t>& send_offsets, size_t send_total,
                                  void* recv, const std::vector<size_t>& recv_bytes,
                                  const std::vector<size_t>& recv_offsets, size_t recv_total,
                                  void* stream, const std::string& op) {
  return HostCollectives(comm, device, stream)
      .AllToAllV({send, &send_bytes, &send_offsets, send_total},
                 {recv, &recv_bytes, &recv_offsets, recv_total}, op);
}

}  // namespace muon

#endif  // MUON_SHARDING_HOST_GATHER_H_
