#include "muon/comm/inprocess_comm.h"

#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "muon/comm/codes.h"
#include "muon/comm/callback_error.h"
#include "muon/comm/ordered_sum.h"
#include "muon/comm/table.h"
#include "muon/common/dtype.h"
#include "muon/device/memory_ops.h"

namespace muon {
namespace {

const char* OpName(int op) {
  static const char* const kNames[] = {"all_gather", "all_to_all_v", "broadcast",
                                       "reduce_scatter", "barrier"};
  return op >= 0 && op < 5 ? kNames[op] : "unknown";
}

bool AddOverflows(size_t a, size_t b) { return a > std::numeric_limits<size_t>::max() - b; }

bool MulOverflows(size_t a, size_t b) {
  return a != 0 && b > std::numeric_limits<size_t>::max() / a;
}

// Copies n bytes; the source and destination may be the same or overlap
// (in-place variants of the collectives).
void CopyBytes(void* dst, const void* src, size_t n) {
  if (n == 0 || dst == src) return;
  std::memmove(dst, src, n);
}

}  // namespace

InProcessGroup::InProcessGroup(std::vector<int> world_ranks)
    : world_ranks_(std::move(world_ranks)),
      calls_(world_ranks_.size()),
      busy_(world_ranks_.size(), 0) {}

bool InProcessGroup::Rendezvous(std::unique_lock<std::mutex>& lock, bool abortable) {
  const uint64_t generation = generation_;
  if (++arrived_ == size()) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != generation || (abortable && aborted_); });
  if (generation_ != generation) return true;
  --arrived_;
  return false;
}

void InProcessGroup::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void InProcessWorld::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  for (auto& [list, inst] : groups_) {
    for (auto& g : inst.groups) g->Abort();
  }
}

absl::Status InProcessGroup::Run(int me, const Call& call) {
  if (me < 0 || me >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group rank ", me, " is outside the group of ", size()));
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (busy_[me]) {
      return absl::FailedPreconditionError(absl::StrCat(
          OpName(static_cast<int>(call.op)), " by group rank ", me,
          " overlaps another collective of the same rank on this communicator; calls on one "
          "communicator must not overlap"));
    }
    busy_[me] = 1;
  }
  // GPU buffers: this rank's send data must be complete before a peer reads it.
  const MemoryOps* ops = InstalledMemoryOps();
  absl::Status synced;
  if (ops != nullptr) synced = MemoryOpsError(*ops, ops->sync(call.stream), "waiting for the stream");
  {
    std::unique_lock<std::mutex> lock(mu_);
    calls_[me] = call;
    calls_[me].failed = !synced.ok();
    // Aborted before every member arrived: nobody read anything yet.
    if (aborted_ || !Rendezvous(lock, /*abortable=*/true)) {
      busy_[me] = 0;
      return absl::UnavailableError(absl::StrCat(
          OpName(static_cast<int>(call.op)), ": the in-process world was aborted"));
    }
  }
  // Between the two rendezvous nobody writes calls_, and every buffer posted
  // stays valid: the owners wait in the second rendezvous.
  // Nothing may leave before the second rendezvous: the others would wait.
  absl::Status verdict;
  try {
    verdict = synced.ok() ? Check(ops) : synced;
    if (verdict.ok()) verdict = Copy(me, ops);
  } catch (const std::bad_alloc&) {
    verdict = absl::ResourceExhaustedError(
        absl::StrCat(OpName(static_cast<int>(call.op)), ": out of host memory"));
  } catch (...) {
    verdict = absl::InternalError(
        absl::StrCat(OpName(static_cast<int>(call.op)), ": unexpected exception"));
  }
  {
    // Every member is past the first rendezvous and reaches this one: it
    // waits for no one outside, so an abort leaves it alone (a member still
    // copying may read this member's buffers).
    std::unique_lock<std::mutex> lock(mu_);
    Rendezvous(lock, /*abortable=*/false);
    busy_[me] = 0;
  }
  return verdict;
}

std::string InProcessGroup::Who(int r) const {
  return absl::StrCat("group rank ", r, " (world rank ", world_ranks_[r], ")");
}

absl::Status InProcessGroup::Check(const MemoryOps* ops) const {
  const int n = size();
  for (int r = 0; r < n; ++r) {
    if (calls_[r].op != calls_[0].op) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mismatched collectives: ", Who(0), " called ", OpName(static_cast<int>(calls_[0].op)),
          ", ", Who(r), " called ", OpName(static_cast<int>(calls_[r].op))));
    }
  }
  for (int r = 0; r < n; ++r) {
    if (calls_[r].failed) {
      return absl::InternalError(absl::StrCat(Who(r), " could not finish its stream's work"));
    }
    if (calls_[r].stream != nullptr && ops == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          Who(r), " passed a non-NULL stream, but no GPU device is loaded in this process: "
                  "the in-process communicator then copies host memory only"));
    }
  }
  switch (calls_[0].op) {
    case Op::kBarrier:
      return absl::OkStatus();
    case Op::kAllGather:
      return CheckAllGather();
    case Op::kBroadcast:
      return CheckBroadcast();
    case Op::kReduceScatter:
      return CheckReduceScatter();
    case Op::kAllToAllV:
      return CheckAllToAllV();
  }
  return absl::InternalError("unknown collective");
}

absl::Status InProcessGroup::CheckAllGather() const {
  const int n = size();
  const Call& c0 = calls_[0];
  for (int r = 0; r < n; ++r) {
    const Call& c = calls_[r];
    if (c.bytes != c0.bytes) {
      return absl::InvalidArgumentError(absl::StrCat("all_gather byte counts differ: ", Who(0),
                                                     " sends ", c0.bytes, " bytes, ", Who(r),
                                                     " sends ", c.bytes));
    }
    if (c.bytes != 0 && (c.send == nullptr || c.recv == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_gather of ", c.bytes, " bytes: ", Who(r), " passed a NULL ",
          c.send == nullptr ? "send" : "recv", " buffer"));
    }
  }
  if (MulOverflows(c0.bytes, static_cast<size_t>(n))) {
    return absl::InvalidArgumentError(
        absl::StrCat("all_gather of ", c0.bytes, " bytes from ", n, " ranks overflows size_t"));
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::CheckBroadcast() const {
  const int n = size();
  const Call& c0 = calls_[0];
  for (int r = 0; r < n; ++r) {
    const Call& c = calls_[r];
    if (c.root != c0.root) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast roots differ: ", Who(0),
                                                     " names root ", c0.root, ", ", Who(r),
                                                     " names root ", c.root));
    }
    if (c.bytes != c0.bytes) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast byte counts differ: ", Who(0),
                                                     " passes ", c0.bytes, " bytes, ", Who(r),
                                                     " passes ", c.bytes));
    }
    if (c.bytes != 0 && c.recv == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast of ", c.bytes, " bytes: ", Who(r), " passed a NULL buffer"));
    }
  }
  if (c0.root < 0 || c0.root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", c0.root, " is outside the group of ", n));
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::CheckReduceScatter() const {
  const int n = size();
  const Call& c0 = calls_[0];
  DType t;
  if (!FromCDType(c0.dtype, &t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce_scatter dtype ", c0.dtype,
                     " is unknown; use MUON_DTYPE_FLOAT32 (0), BFLOAT16 (1) or FLOAT16 (2)"));
  }
  for (int r = 0; r < n; ++r) {
    const Call& c = calls_[r];
    if (c.dtype != c0.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("reduce_scatter dtypes differ: ", Who(0),
                                                     " passes ", c0.dtype, ", ", Who(r),
                                                     " passes ", c.dtype));
    }
    if (c.count != c0.count) {
      return absl::InvalidArgumentError(absl::StrCat("reduce_scatter counts differ: ", Who(0),
                                                     " passes ", c0.count, " elements, ", Who(r),
                                                     " passes ", c.count));
    }
    if (c.count != 0 && (c.send == nullptr || c.recv == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reduce_scatter of ", c.count, " elements: ", Who(r), " passed a NULL ",
          c.send == nullptr ? "send" : "recv", " buffer"));
    }
  }
  if (MulOverflows(c0.count, static_cast<size_t>(n) * SizeOf(t))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter of ", c0.count, " elements from ", n, " ranks overflows size_t"));
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::CheckAllToAllV() const {
  const int n = size();
  for (int r = 0; r < n; ++r) {
    const Call& c = calls_[r];
    if (c.send_bytes == nullptr || c.send_offsets == nullptr || c.recv_bytes == nullptr ||
        c.recv_offsets == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_to_all_v: ", Who(r), " passed a NULL ",
          c.send_bytes == nullptr     ? "send_bytes"
          : c.send_offsets == nullptr ? "send_offsets"
          : c.recv_bytes == nullptr   ? "recv_bytes"
                                      : "recv_offsets",
          " array"));
    }
  }
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      absl::Status paired = CheckAllToAllVPair(r, p);
      if (!paired.ok()) return paired;
    }
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::CheckAllToAllVPair(int r, int p) const {
  const Call& c = calls_[r];
  // What r receives from p is what p sends to r.
  if (c.recv_bytes[p] != calls_[p].send_bytes[r]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all_to_all_v counts do not pair up: ", Who(p), " sends ", calls_[p].send_bytes[r],
        " bytes to ", Who(r), ", which expects ", c.recv_bytes[p]));
  }
  if (c.send_bytes[p] != 0) {
    if (c.send == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("all_to_all_v: ", Who(r), " sends ",
                                                     c.send_bytes[p], " bytes to group rank ", p,
                                                     " from a NULL send buffer"));
    }
    if (AddOverflows(c.send_offsets[p], c.send_bytes[p])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_to_all_v: ", Who(r), "'s send offset ", c.send_offsets[p], " plus ",
          c.send_bytes[p], " bytes for group rank ", p, " overflows size_t"));
    }
  }
  if (c.recv_bytes[p] != 0) {
    if (c.recv == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("all_to_all_v: ", Who(r), " receives ",
                                                     c.recv_bytes[p], " bytes from group rank ",
                                                     p, " into a NULL recv buffer"));
    }
    if (AddOverflows(c.recv_offsets[p], c.recv_bytes[p])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_to_all_v: ", Who(r), "'s recv offset ", c.recv_offsets[p], " plus ",
          c.recv_bytes[p], " bytes from group rank ", p, " overflows size_t"));
    }
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::Copy(int me, const MemoryOps* ops) const {
  const int n = size();
  const Call& mine = calls_[me];
  // With GPU memory possible, copies are enqueued on this rank's stream and
  // finished before the second rendezvous (no peer reuses a buffer early).
  int error = 0;
  auto copy = [&](void* dst, const void* src, size_t bytes) {
    if (ops == nullptr) {
      CopyBytes(dst, src, bytes);
    } else if (error == 0 && bytes != 0 && dst != src) {
      error = ops->copy(dst, src, bytes, mine.stream);
    }
  };
  switch (mine.op) {
    case Op::kBarrier:
      break;
    case Op::kAllGather:
      for (int r = 0; r < n; ++r) {
        copy(static_cast<char*>(mine.recv) + static_cast<size_t>(r) * mine.bytes, calls_[r].send,
             mine.bytes);
      }
      break;
    case Op::kBroadcast:
      if (me != mine.root) copy(mine.recv, calls_[mine.root].recv, mine.bytes);
      break;
    case Op::kReduceScatter: {
      DType t = DType::kF32;
      FromCDType(mine.dtype, &t);
      const size_t block = mine.count * SizeOf(t);
      // Every rank's block (on the stack for the usual group sizes: a step
      // calls this).
      constexpr int kOnStack = 64;
      const void* on_stack[kOnStack];
      std::vector<const void*> on_heap(n > kOnStack ? n : 0);
      const void** blocks = n > kOnStack ? on_heap.data() : on_stack;
      for (int r = 0; r < n; ++r) {
        blocks[r] = static_cast<const char*>(calls_[r].send) + static_cast<size_t>(me) * block;
        if (ops != nullptr && mine.count != 0 &&
            (!ops->host_readable(blocks[r]) || !ops->host_readable(mine.recv))) {
          return absl::UnimplementedError(
              "reduce_scatter: the in-process communicator sums host memory only");
        }
      }
      SumInRankOrder(t, blocks, n, mine.count, mine.recv);
      break;
    }
    case Op::kAllToAllV:
      for (int p = 0; p < n; ++p) {
        const size_t bytes = mine.recv_bytes[p];
        if (bytes == 0) continue;
        const Call& from = calls_[p];
        copy(static_cast<char*>(mine.recv) + mine.recv_offsets[p],
             static_cast<const char*>(from.send) + from.send_offsets[me], bytes);
      }
      break;
  }
  if (ops == nullptr) return absl::OkStatus();
  if (error == 0) error = ops->sync(mine.stream);
  return MemoryOpsError(*ops, error, OpName(static_cast<int>(mine.op)));
}

absl::Status InProcessGroup::AllGather(int me, const void* send, void* recv, size_t bytes,
                                       void* stream) {
  Call c;
  c.op = Op::kAllGather;
  c.send = send;
  c.recv = recv;
  c.bytes = bytes;
  c.stream = stream;
  return Run(me, c);
}

absl::Status InProcessGroup::AllToAllV(int me, const void* send, const size_t* send_bytes,
                                       const size_t* send_offsets, void* recv,
                                       const size_t* recv_bytes, const size_t* recv_offsets,
                                       void* stream) {
  Call c;
  c.op = Op::kAllToAllV;
  c.send = send;
  c.recv = recv;
  c.send_bytes = send_bytes;
  c.send_offsets = send_offsets;
  c.recv_bytes = recv_bytes;
  c.recv_offsets = recv_offsets;
  c.stream = stream;
  return Run(me, c);
}

absl::Status InProcessGroup::Broadcast(int me, void* buf, size_t bytes, int32_t root,
                                       void* stream) {
  Call c;
  c.op = Op::kBroadcast;
  c.recv = buf;  // the root's is read by the others
  c.bytes = bytes;
  c.root = root;
  c.stream = stream;
  return Run(me, c);
}

absl::Status InProcessGroup::ReduceScatter(int me, const void* send, void* recv, size_t count,
                                           int32_t dtype, void* stream) {
  Call c;
  c.op = Op::kReduceScatter;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dtype;
  c.stream = stream;
  return Run(me, c);
}

absl::Status InProcessGroup::Barrier(int me, void* stream) {
  Call c;
  c.op = Op::kBarrier;
  c.stream = stream;
  return Run(me, c);
}

absl::StatusOr<std::shared_ptr<InProcessWorld>> InProcessWorld::Create(int size) {
  if (size < 1 || size > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", size, " is outside [1, ", kMaxSize, "]"));
  }
  return std::shared_ptr<InProcessWorld>(new InProcessWorld(size));
}

absl::StatusOr<std::shared_ptr<InProcessGroup>> InProcessWorld::Join(const std::vector<int>& ranks,
                                                                     int rank, int* group_rank) {
  std::vector<int> list = ranks;
  if (list.empty()) {
    list.resize(size_);
    for (int r = 0; r < size_; ++r) list[r] = r;
  }
  if (static_cast<int64_t>(list.size()) > size_) {
    return absl::InvalidArgumentError(absl::StrCat("the rank list has ", list.size(),
                                                   " entries, more than the world's ", size_));
  }
  std::vector<char> seen(size_, 0);
  int position = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    const int r = list[i];
    if (r < 0 || r >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks[", i, "] = ", r, " is not a rank of the world of ", size_));
    }
    if (seen[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("world rank ", r, " appears twice in the rank list [",
                       absl::StrJoin(list, ", "), "]"));
    }
    seen[r] = 1;
    if (r == rank) position = static_cast<int>(i);
  }
  if (position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in the rank list [",
                                                   absl::StrJoin(list, ", "), "]"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Instances& inst = groups_[list];
  if (inst.requests.empty()) inst.requests.assign(list.size(), 0);
  const size_t index = inst.requests[position];
  if (index == inst.groups.size()) {
    inst.groups.push_back(std::make_shared<InProcessGroup>(list));
  }
  std::shared_ptr<InProcessGroup> group = inst.groups[index];
  if (aborted_) group->Abort();
  ++inst.requests[position];
  *group_rank = position;
  return group;
}

namespace {

// What a table's ctx points to: the member's group, and the world, which
// the table keeps alive.
struct InProcessCtx {
  std::shared_ptr<InProcessWorld> world;
  std::shared_ptr<InProcessGroup> group;
  int me = 0;
};

template <typename Body>
muon_status_t Call(void* ctx, const char* what, Body&& body) {
  try {
    if (ctx == nullptr) {
      SetCallbackError(absl::StrCat(what, ": ctx is NULL").c_str());
      return MUON_INVALID_ARGUMENT;
    }
    const absl::Status s = body(*static_cast<InProcessCtx*>(ctx));
    if (s.ok()) return MUON_OK;
    SetCallbackError(std::string(s.message()).c_str());
    return ToCStatus(s.code());
  } catch (const std::bad_alloc&) {
    return MUON_RESOURCE_EXHAUSTED;
  } catch (...) {
    return MUON_INTERNAL;
  }
}

muon_status_t CAllGather(void* ctx, const void* send, void* recv, size_t bytes, void* stream) {
  return Call(ctx, "all_gather", [&](InProcessCtx& c) {
    return c.group->AllGather(c.me, send, recv, bytes, stream);
  });
}

muon_status_t CAllToAllV(void* ctx, const void* send, const size_t* send_bytes,
                         const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                         const size_t* recv_offsets, void* stream) {
  return Call(ctx, "all_to_all_v", [&](InProcessCtx& c) {
    return c.group->AllToAllV(c.me, send, send_bytes, send_offsets, recv, recv_bytes,
                              recv_offsets, stream);
  });
}

muon_status_t CBroadcast(void* ctx, void* buf, size_t bytes, int32_t root, void* stream) {
  return Call(ctx, "broadcast", [&](InProcessCtx& c) {
    return c.group->Broadcast(c.me, buf, bytes, root, stream);
  });
}

muon_status_t CReduceScatter(void* ctx, const void* send, void* recv, size_t count,
                             int32_t dtype, void* stream) {
  return Call(ctx, "reduce_scatter", [&](InProcessCtx& c) {
    return c.group->ReduceScatter(c.me, send, recv, count, dtype, stream);
  });
}

muon_status_t CBarrier(void* ctx, void* stream) {
  return Call(ctx, "barrier", [&](InProcessCtx& c) { return c.group->Barrier(c.me, stream); });
}

void CRelease(void* ctx) { delete static_cast<InProcessCtx*>(ctx); }

}  // namespace

absl::Status MakeInProcessComm(const std::shared_ptr<InProcessWorld>& world,
                               const std::vector<int>& ranks, int rank, muon_comm_t* out) {
  if (world == nullptr) return absl::InvalidArgumentError("world is NULL");
  if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
  int me = 0;
  auto group = world->Join(ranks, rank, &me);
  if (!group.ok()) return group.status();
  auto ctx = std::make_unique<InProcessCtx>();
  ctx->world = world;
  ctx->group = *std::move(group);
  ctx->me = me;
  const int rank_in_group = me, group_size = ctx->group->size();
  *out = MakeCommTable(ctx.release(), rank_in_group, group_size,
                       {CAllGather, CAllToAllV, CBroadcast, CReduceScatter, CBarrier, CRelease});
  return absl::OkStatus();
}

}  // namespace muon
