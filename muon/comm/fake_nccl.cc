// A stand-in for libnccl.so.2 (same SONAME) for the NCCL adapter's tests: it
// exports the functions the adapter resolves, logs every call (per thread),
// and moves host memory.
//
// Communicators are FakeComm structs made by the tests. Without a clique a
// communicator is a lone rank that only logs (and copies where a 1-rank
// communicator would move data). With a clique (fake_nccl_clique_create),
// the ranks of the clique are threads of one process and the fake is at
// least as strict as NCCL:
//   - every collective is a rendezvous of all the clique's ranks that checks
//     they called the same collective with the same count, datatype, root
//     and reduction; a mismatch fails on every rank (ncclInvalidUsage)
//     instead of hanging or moving garbage;
//   - ncclSend/ncclRecv inside ncclGroupStart/End are queued per thread and
//     run at the outermost ncclGroupEnd; each receive is matched, in order,
//     with the peer's next send to this rank, and a byte count that differs
//     fails on both sides; a send returns only once it was received;
//   - reduce-scatter sums in rank order in fp32 (bf16/fp16 rounded once).
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "muon/common/dtype.h"

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kInvalidArgument = 4, kInvalidUsage = 5;
constexpr int kUint8 = 1, kFloat16 = 6, kFloat32 = 7, kBfloat16 = 9;

size_t ElemSize(int dtype) { return dtype == kFloat32 ? 4 : dtype == kFloat16 || dtype == kBfloat16 ? 2 : 1; }

// One rank's posted collective.
struct Call {
  std::string op;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  int dtype = 0, root = 0, red = 0;
};

// A send waiting for its receive.
struct Pending {
  const void* data = nullptr;
  size_t bytes = 0;
  bool taken = false;
  bool mismatch = false;
};

struct Clique {
  explicit Clique(int n) : size(n), calls(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<Call> calls;
  std::map<std::pair<int, int>, std::deque<Pending*>> channels;  // (from, to)
};

struct FakeComm {
  int rank;
  int size;
  Clique* clique;  // null: a lone, logging-only rank
};

struct Queued {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  FakeComm* comm;
};

thread_local std::string t_log;
thread_local int t_fail_next = 0;  // result the next data call returns instead of success
thread_local int t_in_progress_polls = 0;
thread_local const void* t_self_send = nullptr;  // lone rank: pending send to self
thread_local size_t t_self_bytes = 0;
thread_local int t_group_depth = 0;
thread_local std::vector<Queued> t_queued;
thread_local bool t_group_failed = false;  // a send or receive of the open group failed

int Take() {
  const int r = t_fail_next;
  t_fail_next = 0;
  if (r == 7) t_in_progress_polls = 2;  // ncclInProgress: settles after two polls
  return r;
}

void Log(const std::string& s) { t_log += s + ";"; }

// Waits until every rank of the clique arrived here; `lock` holds q.mu.
void Rendezvous(Clique& q, std::unique_lock<std::mutex>& lock) {
  const uint64_t generation = q.generation;
  if (++q.arrived == q.size) {
    q.arrived = 0;
    ++q.generation;
    q.cv.notify_all();
    return;
  }
  q.cv.wait(lock, [&] { return q.generation != generation; });
}

bool Matches(const Call& a, const Call& b) {
  return a.op == b.op && a.count == b.count && a.dtype == b.dtype && a.root == b.root &&
         a.red == b.red;
}

void Copy(void* dst, const void* src, size_t n) {
  if (n != 0 && dst != src) std::memmove(dst, src, n);
}

// Rank `me`'s part of a verified collective.
void Perform(const Clique& q, int me) {
  const Call& c = q.calls[me];
  const size_t bytes = c.count * ElemSize(c.dtype);
  if (c.op == "AllGather") {
    for (int r = 0; r < q.size; ++r) Copy(static_cast<char*>(c.recv) + r * bytes, q.calls[r].send, bytes);
  } else if (c.op == "Broadcast") {
    Copy(c.recv, q.calls[c.root].send, bytes);
  } else if (c.op == "ReduceScatter") {
    const muon::DType t = c.dtype == kFloat32 ? muon::DType::kF32
                          : c.dtype == kBfloat16 ? muon::DType::kBF16 : muon::DType::kF16;
    for (size_t i = 0; i < c.count; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < q.size; ++r) {
        acc += muon::LoadAsFloat(t, q.calls[r].send, static_cast<int64_t>(me * c.count + i));
      }
      muon::StoreFromFloat(t, c.recv, static_cast<int64_t>(i), acc);
    }
  }
}

// A collective on a clique: post, verify that every rank agrees, move, and
// leave together (no rank's buffers are released while another reads them).
int Collective(FakeComm* comm, const Call& call) {
  Clique& q = *comm->clique;
  {
    std::unique_lock<std::mutex> lock(q.mu);
    q.calls[comm->rank] = call;
    Rendezvous(q, lock);
  }
  bool agree = call.dtype == kUint8 || call.dtype == kFloat32 || call.dtype == kFloat16 ||
               call.dtype == kBfloat16;
  agree = agree && call.root >= 0 && call.root < q.size && call.red == 0;
  for (int r = 0; r < q.size; ++r) agree = agree && Matches(q.calls[r], q.calls[0]);
  if (agree) Perform(q, comm->rank);
  std::unique_lock<std::mutex> lock(q.mu);
  Rendezvous(q, lock);
  return agree ? 0 : kInvalidUsage;
}

// The queued sends and receives of this thread's group (one communicator).
int RunGroup() {
  std::vector<Queued> ops;
  ops.swap(t_queued);
  if (ops.empty()) return 0;
  Clique& q = *ops[0].comm->clique;
  const int me = ops[0].comm->rank;
  std::vector<Pending> sends;
  sends.reserve(ops.size());
  bool failed = false;
  std::unique_lock<std::mutex> lock(q.mu);
  for (const Queued& op : ops) {
    if (op.comm->clique != &q) failed = true;  // one communicator per group here
    if (!op.send) continue;
    sends.push_back({op.buf, op.bytes, false, false});
    q.channels[{me, op.peer}].push_back(&sends.back());
  }
  q.cv.notify_all();
  for (const Queued& op : ops) {
    if (op.send) continue;
    auto& channel = q.channels[{op.peer, me}];
    q.cv.wait(lock, [&] { return !channel.empty(); });
    Pending* p = channel.front();
    channel.pop_front();
    if (p->bytes == op.bytes) {
      std::memcpy(op.buf, p->data, op.bytes);
    } else {
      p->mismatch = failed = true;
    }
    p->taken = true;
    q.cv.notify_all();
  }
  for (Pending& s : sends) {
    q.cv.wait(lock, [&] { return s.taken; });
    failed = failed || s.mismatch;
  }
  return failed ? kInvalidUsage : 0;
}

}  // namespace

// Test controls.
FAKE_API const char* fake_nccl_log() { return t_log.c_str(); }
FAKE_API void fake_nccl_clear() { t_log.clear(); }
FAKE_API void fake_nccl_fail_next(int result) { t_fail_next = result; }
FAKE_API void* fake_nccl_clique_create(int size) { return new Clique(size); }
FAKE_API void fake_nccl_clique_destroy(void* clique) { delete static_cast<Clique*>(clique); }

FAKE_API int ncclGroupStart() {
  Log("GroupStart");
  ++t_group_depth;
  return 0;
}

FAKE_API int ncclGroupEnd() {
  Log("GroupEnd");
  if (--t_group_depth > 0) return Take();
  if (t_group_failed) t_queued.clear();  // an op of the group already failed: none runs
  t_group_failed = false;
  const int r = RunGroup();
  const int injected = Take();
  return injected != 0 ? injected : r;
}

FAKE_API int ncclSend(const void* buf, size_t count, int dtype, int peer, void* comm, void*) {
  Log("Send(" + std::to_string(peer) + "," + std::to_string(count) + "," +
      std::to_string(dtype) + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->clique != nullptr) {
    if (t_group_depth == 0 || peer < 0 || peer >= c->size) return kInvalidUsage;
    t_queued.push_back({true, const_cast<void*>(buf), count * ElemSize(dtype), peer, c});
  } else if (peer == c->rank) {
    t_self_send = buf;
    t_self_bytes = count * ElemSize(dtype);
  }
  const int r = Take();
  t_group_failed = t_group_failed || r != 0;
  return r;
}

FAKE_API int ncclRecv(void* buf, size_t count, int dtype, int peer, void* comm, void*) {
  Log("Recv(" + std::to_string(peer) + "," + std::to_string(count) + "," +
      std::to_string(dtype) + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  const size_t bytes = count * ElemSize(dtype);
  if (c->clique != nullptr) {
    if (t_group_depth == 0 || peer < 0 || peer >= c->size) return kInvalidUsage;
    t_queued.push_back({false, buf, bytes, peer, c});
  } else if (peer == c->rank && t_self_send != nullptr && t_self_bytes == bytes) {
    std::memcpy(buf, t_self_send, bytes);
    t_self_send = nullptr;
  }
  const int r = Take();
  t_group_failed = t_group_failed || r != 0;
  return r;
}

FAKE_API int ncclAllGather(const void* send, void* recv, size_t count, int dtype, void* comm,
                           void* stream) {
  FakeComm* c = static_cast<FakeComm*>(comm);
  Log("AllGather(" + std::to_string(count) + "," + std::to_string(dtype) +
      (send == static_cast<char*>(recv) + c->rank * count * ElemSize(dtype) ? ",inplace" : "") +
      (stream != nullptr ? ",stream" : "") + ")");
  if (c->clique != nullptr) {
    const int r = Collective(c, {"AllGather", send, recv, count, dtype, 0, 0});
    return r != 0 ? r : Take();
  }
  if (c->size == 1) std::memmove(recv, send, count * ElemSize(dtype));
  return Take();
}

FAKE_API int ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root,
                           void* comm, void*) {
  Log("Broadcast(" + std::to_string(count) + "," + std::to_string(dtype) + ",root" +
      std::to_string(root) + (send == recv ? ",inplace" : "") + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->clique != nullptr) {
    const int r = Collective(c, {"Broadcast", send, recv, count, dtype, root, 0});
    return r != 0 ? r : Take();
  }
  return Take();
}

FAKE_API int ncclReduceScatter(const void* send, void* recv, size_t count, int dtype, int op,
                               void* comm, void*) {
  Log("ReduceScatter(" + std::to_string(count) + "," + std::to_string(dtype) + ",op" +
      std::to_string(op) + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->clique != nullptr) {
    if (dtype == kUint8) return kInvalidArgument;
    const int r = Collective(c, {"ReduceScatter", send, recv, count, dtype, 0, op});
    return r != 0 ? r : Take();
  }
  if (c->size == 1) std::memmove(recv, send, count * ElemSize(dtype));
  return Take();
}

FAKE_API int ncclCommCount(void* comm, int* count) {
  const FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->size <= 0) return kInvalidArgument;
  *count = c->size;
  return 0;
}

FAKE_API int ncclCommUserRank(void* comm, int* rank) {
  *rank = static_cast<FakeComm*>(comm)->rank;
  return 0;
}

FAKE_API const char* ncclGetErrorString(int result) {
  return result == kInvalidArgument ? "invalid argument" : "fake error string";
}

FAKE_API const char* ncclGetLastError(void*) { return "fake last error"; }

FAKE_API int ncclCommGetAsyncError(void*, int* state) {
  Log("GetAsyncError");
  *state = t_in_progress_polls > 0 ? 7 : 0;
  if (t_in_progress_polls > 0) --t_in_progress_polls;
  return 0;
}

FAKE_API int ncclMemAlloc(void** ptr, size_t size) {
  Log("MemAlloc(" + std::to_string(size) + ")");
  *ptr = std::malloc(size);
  return *ptr != nullptr ? 0 : 1;
}

FAKE_API int ncclMemFree(void* ptr) {
  Log("MemFree");
  std::free(ptr);
  return 0;
}
