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

}  // namespace muon
