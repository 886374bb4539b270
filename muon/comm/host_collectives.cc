#include "muon/comm/host_collectives.h"

#include <cstring>
#include <memory>

#include "muon/common/status.h"

namespace muon {

absl::Status HostCollectives::AllGather(const void* mine, void* all, size_t bytes,
                                        const std::string& op, const DeviceStaging* staging) {
  if (OnHost()) return comm_.AllGather(mine, all, bytes, stream_, op);
  if (comm_.size() == 1) {  // a world of one: nothing to move
    if (bytes > 0) std::memcpy(all, mine, bytes);
    return absl::OkStatus();
  }
  const size_t n = static_cast<size_t>(comm_.size());
  DeviceBuffer send, recv;  // for this call when no staging is given
  DeviceStaging use;
  if (staging != nullptr) {
    use = *staging;
  } else {
    std::shared_ptr<Device> dev(device_, [](Device*) {});  // not owned
    MUON_ASSIGN_OR_RETURN(send, DeviceBuffer::Make(dev, bytes, op));
    MUON_ASSIGN_OR_RETURN(recv, DeviceBuffer::Make(dev, n * bytes, op));
    use = {send.data(), recv.data()};
  }
  absl::Status st = device_->FromHost(use.send, mine, bytes);
  const absl::Status gathered = comm_.AllGather(use.send, use.recv, bytes, stream_, op);
  if (st.ok()) st = gathered;
  if (st.ok()) st = device_->ToHost(all, use.recv, n * bytes);
  return st;
}

absl::Status HostCollectives::AllToAllV(const HostParts& send, const HostParts& recv,
                                        const std::string& op) {
  // Never a NULL buffer, even with nothing to move (a communicator may
  // check its pointers).
  char none[1] = {0};
  const void* s = send.total > 0 ? send.data : none;
  void* r = recv.total > 0 ? const_cast<void*>(recv.data) : none;
  const std::vector<size_t>& send_bytes = *send.bytes;
  const std::vector<size_t>& recv_offsets = *recv.offsets;
  if (OnHost()) {
    return comm_.AllToAllV(s, send_bytes, *send.offsets, r, *recv.bytes, recv_offsets, stream_,
                           op);
  }
  if (comm_.size() == 1) {  // a world of one: its own bytes only
    if (send_bytes[0] > 0) {
      std::memcpy(static_cast<char*>(r) + recv_offsets[0],
                  static_cast<const char*>(s) + (*send.offsets)[0], send_bytes[0]);
    }
    return absl::OkStatus();
  }
  std::shared_ptr<Device> dev(device_, [](Device*) {});  // not owned
  MUON_ASSIGN_OR_RETURN(DeviceBuffer dsend, DeviceBuffer::Make(dev, send.total + 1, op));
  MUON_ASSIGN_OR_RETURN(DeviceBuffer drecv, DeviceBuffer::Make(dev, recv.total + 1, op));
  absl::Status st = send.total > 0 ? device_->FromHost(dsend.data(), send.data, send.total)
                                   : absl::OkStatus();
  const absl::Status moved = comm_.AllToAllV(dsend.data(), send_bytes, *send.offsets,
                                             drecv.data(), *recv.bytes, recv_offsets, stream_, op);
  if (st.ok()) st = moved;
  if (st.ok() && recv.total > 0) st = device_->ToHost(r, drecv.data(), recv.total);
  return st;
}

}  // namespace muon
