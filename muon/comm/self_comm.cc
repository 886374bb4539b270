#include "muon/comm/self_comm.h"

#include <cstring>

#include "muon/comm/codes.h"
#include "muon/comm/table.h"
#include "muon/common/dtype.h"
#include "muon/device/memory_ops.h"

namespace muon {
namespace {

// A copy within this rank: host memory by memmove; GPU memory (once a GPU
// device is loaded) stream-ordered through the device's copies, as a
// device communicator would move it.
muon_status_t SelfCopy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return MUON_OK;
  const MemoryOps* ops = InstalledMemoryOps();
  if (ops != nullptr && (!ops->host_readable(dst) || !ops->host_readable(src))) {
    return ops->copy(dst, src, bytes, stream) == 0 ? MUON_OK : MUON_INTERNAL;
  }
  std::memmove(dst, src, bytes);
  return MUON_OK;
}

muon_status_t SelfAllGather(void*, const void* send, void* recv, size_t bytes, void* stream) {
  return SelfCopy(recv, send, bytes, stream);
}

muon_status_t SelfAllToAllV(void*, const void* send, const size_t* send_bytes,
                            const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                            const size_t* recv_offsets, void* stream) {
  if (send_bytes[0] != recv_bytes[0]) return MUON_INTERNAL;
  return SelfCopy(static_cast<char*>(recv) + recv_offsets[0],
                  static_cast<const char*>(send) + send_offsets[0], send_bytes[0], stream);
}

muon_status_t SelfBroadcast(void*, void*, size_t, int32_t root, void*) {
  return root == 0 ? MUON_OK : MUON_INVALID_ARGUMENT;
}

muon_status_t SelfReduceScatter(void*, const void* send, void* recv, size_t count, int32_t dtype,
                                void* stream) {
  DType t;
  if (!FromCDType(dtype, &t)) return MUON_INVALID_ARGUMENT;
  return SelfCopy(recv, send, count * SizeOf(t), stream);
}

muon_status_t SelfBarrier(void*, void*) { return MUON_OK; }

}  // namespace

muon_comm_t SelfCommTable() {
  return MakeCommTable(nullptr, 0, 1,
                       {SelfAllGather, SelfAllToAllV, SelfBroadcast, SelfReduceScatter,
                        SelfBarrier, nullptr});
}

}  // namespace muon
