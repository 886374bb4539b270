#include "muon/dist/comm.h"

#include "muon/dist/comm_table.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

thread_local std::string t_callback_error;

absl::StatusCode FromMuonStatus(muon_status_t st) {
  const int c = static_cast<int>(st);
  if (c > 0 && c <= 16) return static_cast<absl::StatusCode>(c);
  return absl::StatusCode::kUnknown;
}

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

muon_status_t SelfBroadcast(void*, void*, size_t, int32_t, void*) { return MUON_OK; }

muon_status_t SelfReduceScatter(void*, const void* send, void* recv, size_t count, int32_t dtype,
                                void*) {
  const size_t bytes = count * (dtype == MUON_DTYPE_FLOAT32 ? 4 : 2);
  if (bytes) std::memmove(recv, send, bytes);
  return MUON_OK;
}

muon_status_t SelfBarrier(void*, void*) { return MUON_OK; }

}  // namespace

muon_comm_t SelfCommTable() {
  return MakeCommTable(nullptr, 0, 1,
                       {SelfAllGather, SelfAllToAllV, SelfBroadcast, SelfReduceScatter,
                        SelfBarrier, nullptr});
}

void SetCallbackError(const char* message) { t_callback_error = message ? message : ""; }

std::string TakeCallbackError() {
  std::string out;
  out.swap(t_callback_error);
  return out;
}

absl::StatusOr<std::shared_ptr<Comm>> Comm::Create(const muon_comm_t& table,
                                                   const std::string& what) {
  if (table.struct_size < sizeof(muon_comm_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": struct_size ", table.struct_size, " is smaller than sizeof(muon_comm_t) (",
        sizeof(muon_comm_t), ")"));
  }
  if (table.size < 1 || table.rank < 0 || table.rank >= table.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", table.rank, " and size ",
                                                   table.size, " are inconsistent"));
  }
  const char* missing = !table.all_gather      ? "all_gather"
                        : !table.all_to_all_v  ? "all_to_all_v"
                        : !table.broadcast     ? "broadcast"
                        : !table.reduce_scatter ? "reduce_scatter"
                        : !table.barrier       ? "barrier"
                                               : nullptr;
  if (missing != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the ", missing, " callback is NULL"));
  }
  return std::shared_ptr<Comm>(new Comm(table, what));
}

Comm::~Comm() {
  if (table_.release != nullptr) table_.release(table_.ctx);
}

absl::Status Comm::Check(muon_status_t st, const char* collective, const std::string& op) {
  ++counters_.collectives;
  std::string detail = TakeCallbackError();
  if (st == MUON_OK) return absl::OkStatus();
  return absl::Status(FromMuonStatus(st),
                      absl::StrCat(op, ": ", collective, " on ", name_, " (rank ", rank(), " of ",
                                   size(), ") failed with ",
                                   absl::StatusCodeToString(FromMuonStatus(st)),
                                   detail.empty() ? "" : ": ", detail));
}

absl::Status Comm::AllGather(const void* send, void* recv, size_t bytes, void* stream,
                             const std::string& op) {
  counters_.bytes_sent += static_cast<int64_t>(bytes) * (size() - 1);
  counters_.bytes_received += static_cast<int64_t>(bytes) * (size() - 1);
  return Check(table_.all_gather(table_.ctx, send, recv, bytes, stream), "all_gather", op);
}

absl::Status Comm::AllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                             const std::vector<size_t>& send_offsets, void* recv,
                             const std::vector<size_t>& recv_bytes,
                             const std::vector<size_t>& recv_offsets, void* stream,
                             const std::string& op) {
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    counters_.bytes_sent += static_cast<int64_t>(send_bytes[p]);
    counters_.bytes_received += static_cast<int64_t>(recv_bytes[p]);
  }
  return Check(table_.all_to_all_v(table_.ctx, send, send_bytes.data(), send_offsets.data(), recv,
                                   recv_bytes.data(), recv_offsets.data(), stream),
               "all_to_all_v", op);
}

absl::Status Comm::Broadcast(void* buf, size_t bytes, int root, void* stream,
                             const std::string& op) {
  if (rank() == root) {
    counters_.bytes_sent += static_cast<int64_t>(bytes) * (size() - 1);
  } else {
    counters_.bytes_received += static_cast<int64_t>(bytes);
  }
  return Check(table_.broadcast(table_.ctx, buf, bytes, root, stream), "broadcast", op);
}

absl::Status Comm::ReduceScatter(const void* send, void* recv, size_t count, muon_dtype_t dtype,
                                 void* stream, const std::string& op) {
  const size_t elem = dtype == MUON_DTYPE_FLOAT32 ? 4 : 2;
  counters_.bytes_sent += static_cast<int64_t>(count * elem) * (size() - 1);
  counters_.bytes_received += static_cast<int64_t>(count * elem) * (size() - 1);
  return Check(table_.reduce_scatter(table_.ctx, send, recv, count, dtype, stream),
               "reduce_scatter", op);
}

absl::Status Comm::Barrier(void* stream, const std::string& op) {
  return Check(table_.barrier(table_.ctx, stream), "barrier", op);
}

}  // namespace muon
