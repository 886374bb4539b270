#include "muon/comm/comm.h"

#include "absl/strings/str_cat.h"
#include "muon/comm/codes.h"
#include "muon/comm/struct_versions.h"
#include "muon/comm/callback_error.h"

namespace muon {

absl::StatusOr<std::shared_ptr<Comm>> Comm::Create(const muon_comm_t& table,
                                                   const std::string& what) {
  // A table of a size no header had is refused before any of it is read.
  absl::Status size_ok =
      capi::CheckStructSize(capi::kCommStruct, what, table.struct_size);
  if (!size_ok.ok()) return size_ok;
  if (table.size < 1 || table.rank < 0 || table.rank >= table.size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", table.rank, " and size ",
                                                   table.size, " are inconsistent"));
  }
  const char* missing = !table.all_gather       ? "all_gather"
                        : !table.all_to_all_v   ? "all_to_all_v"
                        : !table.reduce_scatter ? "reduce_scatter"
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
  const absl::StatusCode code = FromCStatus(st);
  return absl::Status(code, absl::StrCat(op, ": ", collective, " on ", name_, " (rank ", rank(),
                                         " of ", size(), ") failed with ",
                                         absl::StatusCodeToString(code),
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

absl::Status Comm::ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                 void* stream, const std::string& op) {
  const muon_dtype_t c = dtype == DType::kF32    ? MUON_DTYPE_FLOAT32
                         : dtype == DType::kBF16 ? MUON_DTYPE_BFLOAT16
                                                 : MUON_DTYPE_FLOAT16;
  const int64_t bytes = static_cast<int64_t>(count * SizeOf(dtype));
  counters_.bytes_sent += bytes * (size() - 1);
  counters_.bytes_received += bytes * (size() - 1);
  return Check(table_.reduce_scatter(table_.ctx, send, recv, count, c, stream), "reduce_scatter",
               op);
}

}  // namespace muon
