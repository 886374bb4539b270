// In-process communicators: N ranks of one job as threads of one process
// (multi-rank tests, single-process multi-device hosts).
//
// A world of N ranks hands out groups over lists of world ranks. Members of
// a group meet on a rendezvous: each collective is (1) every member posts its
// arguments and waits until all have posted, (2) each member checks the
// posted arguments of all members (every member reaches the same verdict,
// so either all copy or none does) and pulls what it needs straight from the
// others' buffers, (3) a second rendezvous, so no member returns (and
// releases or reuses its send buffer) while another may still read it. A
// generation counter keeps consecutive collectives apart.
//
// Matching tables: the k-th request of a world rank for a given rank list
// joins the k-th group over that list, like communicators created in the
// same order on every rank (NCCL, MPI). A world communicator and a data
// parallel group over the same ranks are thus separate groups, and cannot
// mix their collectives.
//
// Inconsistent calls that can be seen from the posted arguments fail on every
// member with an error instead of touching memory: different collectives,
// all_gather byte counts or broadcast roots that differ, all_to_all_v counts
// that do not pair up, reduce_scatter counts or dtypes that differ, NULL
// buffers, a non-NULL stream while no GPU device is loaded (buffers must be
// host memory then; see muon/device/memory_ops.h for GPU buffers), and two
// overlapping calls by the same member. A member that never calls is a host
// bug: the others wait for it.
#ifndef MUON_COMM_INPROCESS_COMM_H_
#define MUON_COMM_INPROCESS_COMM_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmuon/muon.h"
#include "muon/device/memory_ops.h"

namespace muon {

class InProcessGroup {
 public:
  explicit InProcessGroup(std::vector<int> world_ranks);
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // The collectives of muon_comm_t, called by group rank `me` (0 <= me <
  // size()) with the semantics documented in include/libmuon/muon.h.
  absl::Status AllGather(int me, const void* send, void* recv, size_t bytes, void* stream);
  absl::Status AllToAllV(int me, const void* send, const size_t* send_bytes,
                         const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                         const size_t* recv_offsets, void* stream);
  absl::Status Broadcast(int me, void* buf, size_t bytes, int32_t root, void* stream);
  absl::Status ReduceScatter(int me, const void* send, void* recv, size_t count, int32_t dtype,
                             void* stream);
  absl::Status Barrier(int me, void* stream);

  // Releases every member waiting for the others to arrive, and fails every
  // later collective, with UNAVAILABLE (as ncclCommAbort does for NCCL): for
  // a host whose rank failed without entering a collective the others
  // entered. A collective every member had entered finishes as usual.
  void Abort();

 private:
  enum class Op { kAllGather, kAllToAllV, kBroadcast, kReduceScatter, kBarrier };
  struct Call {
    Op op = Op::kBarrier;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;  // all_gather, broadcast
    size_t count = 0;  // reduce_scatter
    int32_t dtype = 0;
    int32_t root = 0;
    const size_t* send_bytes = nullptr;
    const size_t* send_offsets = nullptr;
    const size_t* recv_bytes = nullptr;
    const size_t* recv_offsets = nullptr;
    void* stream = nullptr;
    bool failed = false;  // the rank could not finish its stream's work
  };

  // Posts `call` as member `me`, waits for all, checks the posted calls and
  // runs the copy of `me` when they are consistent, then waits for all again.
  absl::Status Run(int me, const Call& call);
  // The same verdict on every member: OK, or what is inconsistent.
  // `ops`: the installed GPU memory ops (memory_ops.h), or NULL.
  absl::Status Check(const MemoryOps* ops) const;
  // Check's verdict for each collective, once every member called it.
  absl::Status CheckAllGather() const;
  absl::Status CheckBroadcast() const;
  absl::Status CheckReduceScatter() const;
  absl::Status CheckAllToAllV() const;
  // What group rank r sends to and receives from group rank p (every
  // member passed its arrays).
  absl::Status CheckAllToAllVPair(int r, int p) const;
  // "group rank r (world rank w)", for errors.
  std::string Who(int r) const;
  absl::Status Copy(int me, const MemoryOps* ops) const;
  // Waits until all members have called it (a reusable barrier); `lock` holds
  // mu_. `abortable`: false (this member leaves, arrival taken back) when the
  // group is aborted before all arrived.
  bool Rendezvous(std::unique_lock<std::mutex>& lock, bool abortable);

  const std::vector<int> world_ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<Call> calls_;  // per member, valid between the two rendezvous
  std::vector<char> busy_;   // per member: inside a collective
  bool aborted_ = false;
};

class InProcessWorld {
 public:
  // A world of `size` ranks (1 <= size <= kMaxSize).
  static constexpr int kMaxSize = 1 << 16;
  static absl::StatusOr<std::shared_ptr<InProcessWorld>> Create(int size);

  int size() const { return size_; }

  // The group of world rank `rank` over `ranks` (world ranks, distinct, each
  // in [0, size()), `rank` among them; empty: the whole world in order).
  // Writes `rank`'s position in the list to *group_rank. See "Matching
  // tables" above.
  absl::StatusOr<std::shared_ptr<InProcessGroup>> Join(const std::vector<int>& ranks, int rank,
                                                       int* group_rank);

  // Aborts every group of the world, those joined later too (see
  // InProcessGroup::Abort).
  void Abort();

 private:
  explicit InProcessWorld(int size) : size_(size) {}

  struct Instances {
    std::vector<std::shared_ptr<InProcessGroup>> groups;
    std::vector<size_t> requests;  // per member of the list: tables handed out
  };

  const int size_;
  std::mutex mu_;
  std::map<std::vector<int>, Instances> groups_;
  bool aborted_ = false;
};

// Fills *out with world rank `rank`'s table over the group `ranks` (see
// Join). The table's ctx keeps the group and the world alive until its
// `release` is called. Callback errors carry detail through
// SetCallbackError (muon/comm/callback_error.h).
absl::Status MakeInProcessComm(const std::shared_ptr<InProcessWorld>& world,
                               const std::vector<int>& ranks, int rank, muon_comm_t* out);

}  // namespace muon

#endif  // MUON_COMM_INPROCESS_COMM_H_
