// The engine's port to a host communicator: a muon_comm_t table, checked once,
// whose calls return absl::Status naming the operation and count what moved.
// The engine talks to every communicator through this class alone; the
// adapters in this folder (in-process, NCCL, MPI, the world of one) only fill
// tables, as a host could.
#ifndef MUON_COMM_COMM_H_
#define MUON_COMM_COMM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmuon/muon.h"
#include "muon/common/dtype.h"

namespace muon {

// Traffic counters of one communicator (payload bytes to and from other ranks).
struct CommCounters {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t collectives = 0;
};

// Owns a copy of the table; calls `release` (once) when destroyed.
class Comm {
 public:
  // Checks the table (struct_size one a header published, capi/
  // struct_versions.h; size >= 1, 0 <= rank < size, the
  // collectives the engine calls present: all_gather, all_to_all_v,
  // reduce_scatter; broadcast and barrier may be NULL); `what` names it in
  // errors ("world", "group 2").
  static absl::StatusOr<std::shared_ptr<Comm>> Create(const muon_comm_t& table,
                                                      const std::string& what);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return table_.rank; }
  int size() const { return table_.size; }
  const std::string& name() const { return name_; }

  // Each error names `op` (e.g. "gathering round 0 (param 'w')"), the
  // collective, this communicator and the callback's detail.
  absl::Status AllGather(const void* send, void* recv, size_t bytes, void* stream,
                         const std::string& op);
  absl::Status AllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                         const std::vector<size_t>& send_offsets, void* recv,
                         const std::vector<size_t>& recv_bytes,
                         const std::vector<size_t>& recv_offsets, void* stream,
                         const std::string& op);
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                             void* stream, const std::string& op);

  const CommCounters& counters() const { return counters_; }
  void ResetCounters() { counters_ = CommCounters(); }

 private:
  Comm(const muon_comm_t& table, std::string name) : table_(table), name_(std::move(name)) {}
  absl::Status Check(muon_status_t st, const char* collective, const std::string& op);

  muon_comm_t table_;
  std::string name_;
  CommCounters counters_;
};

}  // namespace muon

#endif  // MUON_COMM_COMM_H_
