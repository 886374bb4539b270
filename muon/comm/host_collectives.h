// Collectives of host values (the setup's handshake, the step's verdicts and
// counts) over one communicator that may move device memory only (NCCL):
// with a device that is not the host, the values go through device buffers
// on the stream (copied in, moved, copied out; Device::ToHost waits for the
// stream, the one wait). The collective is issued even when the copy in
// failed, so that the ranks' collectives pair up. A world of one moves
// nothing. `op` names the collective in errors.
#ifndef MUON_COMM_HOST_COLLECTIVES_H_
#define MUON_COMM_HOST_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/comm/comm.h"
#include "muon/device/device.h"

namespace muon {

// Device buffers to stage through: `send` of at least the bytes a rank
// sends, `recv` of at least the communicator's size times that.
struct DeviceStaging {
  void* send = nullptr;
  void* recv = nullptr;
};

// One side of an all_to_all_v in host memory: what goes to (or comes from)
// rank p is bytes[p] bytes at data + offsets[p]; `total` bytes in all.
struct HostParts {
  const void* data = nullptr;  // the receive side writes it
  const std::vector<size_t>* bytes = nullptr;
  const std::vector<size_t>* offsets = nullptr;
  size_t total = 0;
};

class HostCollectives {
 public:
  // `device`: where the communicator wants its buffers (NULL or a host
  // device: host memory). Borrowed, as `comm`.
  HostCollectives(Comm& comm, Device* device, void* stream)
      : comm_(comm), device_(device), stream_(stream) {}

  // Every rank's `bytes` bytes of `mine` into all[rank * bytes, ...), host
  // memory both, staged through `staging`'s buffers when given (else
  // allocated for the call).
  absl::Status AllGather(const void* mine, void* all, size_t bytes, const std::string& op,
                         const DeviceStaging* staging = nullptr);
  // Every rank's `mine`, in rank order, into out[0 .. size).
  absl::Status GatherInt64(int64_t mine, int64_t* out, const std::string& op,
                           const DeviceStaging* staging = nullptr) {
    return AllGather(&mine, out, sizeof mine, op, staging);
  }
  // An all_to_all_v of host values (device buffers allocated for the call).
  absl::Status AllToAllV(const HostParts& send, const HostParts& recv, const std::string& op);

 private:
  bool OnHost() const { return device_ == nullptr || device_->is_host(); }

  Comm& comm_;
  Device* device_;
  void* stream_;
};

}  // namespace muon

#endif  // MUON_COMM_HOST_COLLECTIVES_H_
