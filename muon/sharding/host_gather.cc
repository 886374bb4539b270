#include "muon/sharding/host_gather.h"

#include <cstring>
#include <memory>

#include "muon/common/status.h"

namespace muon {

absl::Status HostAllGather(Comm& comm, Device* device, const void* mine, void* all, size_t bytes,
                           void* stream, const std::string& op) {
  if (device == nullptr || device->is_host()) {
    return comm.AllGather(mine, all, bytes, stream, op);
  }
  if (comm.size() == 1) {  // a world of one: nothing to move
    if (bytes > 0) std::memcpy(all, mine, bytes);
    return absl::OkStatus();
  }
  const size_t n = static_cast<size_t>(comm.size());
  std::shared_ptr<Device> dev(device, [](Device*) {});  // not owned
  MUON_ASSIGN_OR_RETURN(DeviceBuffer send, DeviceBuffer::Make(dev, bytes, op));
  MUON_ASSIGN_OR_RETURN(DeviceBuffer recv, DeviceBuffer::Make(dev, n * bytes, op));
  MUON_RETURN_IF_ERROR(device->FromHost(send.data(), mine, bytes));
  MUON_RETURN_IF_ERROR(comm.AllGather(send.data(), recv.data(), bytes, stream, op));
  return device->ToHost(all, recv.data(), n * bytes);
}

}  // namespace muon
