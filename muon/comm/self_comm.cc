#include "muon/comm/self_comm.h"

#include <cstring>

#include "capi/codes.h"
#include "muon/comm/table.h"
#include "muon/common/dtype.h"

namespace muon {
namespace {

muon_status_t SelfAllGather(void*, const void* send, void* recv, size_t bytes, void*) {
  if (bytes) std::memmove(recv, send, bytes);
  return MUON_OK;
}

muon_status_t SelfAllToAllV(void*, const void* send, const size_t* send_bytes,
                            const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                            const size_t* recv_offsets, void*) {
  if (send_bytes[0] != recv_bytes[0]) return MUON_INTERNAL;
  if (send_bytes[0]) {
    std::memmove(static_cast<char*>(recv) + recv_offsets[0],
                 static_cast<const char*>(send) + send_offsets[0], send_bytes[0]);
  }
  return MUON_OK;
}

muon_status_t SelfBroadcast(void*, void*, size_t, int32_t root, void*) {
  return root == 0 ? MUON_OK : MUON_INVALID_ARGUMENT;
}

muon_status_t SelfReduceScatter(void*, const void* send, void* recv, size_t count, int32_t dtype,
                                void*) {
  DType t;
  if (!FromCDType(dtype, &t)) return MUON_INVALID_ARGUMENT;
  if (count) std::memmove(recv, send, count * SizeOf(t));
  return MUON_OK;
}

muon_status_t SelfBarrier(void*, void*) { return MUON_OK; }

}  // namespace

muon_comm_t SelfCommTable() {
  return MakeCommTable(nullptr, 0, 1,
                       {SelfAllGather, SelfAllToAllV, SelfBroadcast, SelfReduceScatter,
                        SelfBarrier, nullptr});
}

}  // namespace muon
