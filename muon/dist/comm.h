// The engine's view of a host communicator: a muon_comm_t table wrapped so
// every call returns absl::Status naming the operation, and counts what moved.
#ifndef MUON_DIST_COMM_H_
#define MUON_DIST_COMM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capi/muon.h"

namespace muon {

// Detail a callback attached with muon_set_callback_error on this thread.
void SetCallbackError(const char* message);
// Returns and clears it.
std::string TakeCallbackError();

// Traffic counters of one communicator (payload bytes to and from other ranks).
struct CommCounters {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t collectives = 0;
};

// Owns a copy of the table; calls `release` (once) when destroyed.
class Comm {
 public:
  // Checks the table (struct_size, size >= 1, 0 <= rank < size, the
  // collectives present); `what` names it in errors ("world", "group 2").
  static absl::StatusOr<std::shared_ptr<Comm>> Create(const muon_comm_t& table,
                                                      const std::string& what);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return table_.rank; }
  int size() const { return table_.size; }
  const std::string& name() const { return name_; }

  // Each error names `op` (e.g. "exchange for param 'w'") and the collective.
  absl::Status AllGather(const void* send, void* recv, size_t bytes, void* stream,
                         const std::string& op);
  absl::Status AllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                         const std::vector<size_t>& send_offsets, void* recv,
                         const std::vector<size_t>& recv_bytes,
                         const std::vector<size_t>& recv_offsets, void* stream,
                         const std::string& op);
  absl::Status Broadcast(void* buf, size_t bytes, int root, void* stream, const std::string& op);
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, muon_dtype_t dtype,
                             void* stream, const std::string& op);
  absl::Status Barrier(void* stream, const std::string& op);

  const CommCounters& counters() const { return counters_; }
  void ResetCounters() { counters_ = CommCounters(); }

 private:
  Comm(const muon_comm_t& table, std::string name) : table_(table), name_(std::move(name)) {}
  absl::Status Check(muon_status_t st, const char* collective, const std::string& op);

  muon_comm_t table_;
  std::string name_;
  CommCounters counters_;
};

// A communicator over this rank alone (size 1): the world of a
// single-process optimizer. Collectives copy send to receive.
muon_comm_t SelfCommTable();

}  // namespace muon

#endif  // MUON_DIST_COMM_H_
