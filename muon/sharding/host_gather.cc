#include "muon/sharding/host_gather.h"

#include <cstring>
#include <memory>

#include "muon/common/status.h"

namespace muon {

absl::Status HostAllGather(Comm& comm, Device* device, const void* mine, void* all, size_t bytes,
                           void* stream, const std::string& op, const DeviceStaging* staging) {
  if (device == nullptr || device->is_host()) {
    return comm.AllGather(mine, all, bytes, stream, op);
  }
  if (comm.size() == 1) {  // a world of one: nothing to move
    if (bytes > 0) std::memcpy(all, mine, bytes);
    return absl::OkStatus();
  }
  const size_t n = static_cast<size_t>(comm.size());
  DeviceBuffer send, recv;  // for this call when no staging is given
  DeviceStaging use;
  if (staging != nullptr) {
    use = *staging;
  } else {
    std::shared_ptr<Device> dev(device, [](Device*) {});  // not owned
    MUON_ASSIGN_OR_RETURN(send, DeviceBuffer::Make(dev, bytes, op));
    MUON_ASSIGN_OR_RETURN(recv, DeviceBuffer::Make(dev, n * bytes, op));
    use = {send.data(), recv.data()};
  }
  absl::Status st = device->FromHost(use.send, mine, bytes);
  const absl::Status gathered = comm.AllGather(use.send, use.recv, bytes, stream, op);
  if (st.ok()) st = gathered;
  if (st.ok()) st = device->ToHost(all, use.recv, n * bytes);
  return st;
}

absl::Status HostAllToAllV(Comm& comm, Device* device, const void* send,
                           const std::vector<size_t>& send_bytes,
                           const std::vector<size_t>& send_offsets, size_t send_total, void* recv,
                           const std::vector<size_t>& recv_bytes,
                           const std::vector<size_t>& recv_offsets, size_t recv_total,
                           void* stream, const std::string& op) {
  // Never a NULL buffer, even with nothing to move (a communicator may
  // check its pointers).
  char none[1] = {0};
  const void* s = send_total > 0 ? send : none;
  void* r = recv_total > 0 ? recv : none;
  if (device == nullptr || device->is_host()) {
    return comm.AllToAllV(s, send_bytes, send_offsets, r, recv_bytes, recv_offsets, stream, op);
  }
  if (comm.size() == 1) {  // a world of one: its own bytes only
    if (send_bytes[0] > 0) {
      std::memcpy(static_cast<char*>(recv) + recv_offsets[0],
                  static_cast<const char*>(send) + send_offsets[0], send_bytes[0]);
    }
    return absl::OkStatus();
  }
  std::shared_ptr<Device> dev(device, [](Device*) {});  // not owned
  MUON_ASSIGN_OR_RETURN(DeviceBuffer dsend, DeviceBuffer::Make(dev, send_total + 1, op));
  MUON_ASSIGN_OR_RETURN(DeviceBuffer drecv, DeviceBuffer::Make(dev, recv_total + 1, op));
  absl::Status st = send_total > 0 ? device->FromHost(dsend.data(), send, send_total)
                                   : absl::OkStatus();
  const absl::Status moved = comm.AllToAllV(dsend.data(), send_bytes, send_offsets, drecv.data(),
                                            recv_bytes, recv_offsets, stream, op);
  if (st.ok()) st = moved;
  if (st.ok() && recv_total > 0) st = device->ToHost(recv, drecv.data(), recv_total);
  return st;
}

}  // namespace muon
