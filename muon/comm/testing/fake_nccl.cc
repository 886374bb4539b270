// A stand-in for libnccl.so.2 (same SONAME) for the NCCL adapter's tests: it
// exports the functions the adapter resolves, logs every call (per thread),
// and moves host memory. It declares NCCL's enum values itself, as NCCL's
// header has them, and shares no code with the adapter.
//
// Communicators are FakeComm structs made by the tests. Without a clique a
// communicator is a lone rank that only logs (and copies where a 1-rank
// communicator would move data). With a clique (fake_nccl_clique_create),
// the ranks of the clique are threads of one process and the fake is at
// least as strict as NCCL:
//   - every collective is a rendezvous of all the clique's ranks that checks
//     they called the same collective with the same count, datatype, root
//     and reduction, each with valid arguments (a known datatype, a root in
//     the clique, sum, buffers for a nonzero count, buffers that overlap only
//     in place); otherwise it fails on every rank (ncclInvalidArgument on a
//     rank whose own arguments are wrong, ncclInvalidUsage on the others)
//     instead of hanging or moving garbage;
//   - ncclSend/ncclRecv inside ncclGroupStart/End are queued per thread and
//     run at the outermost ncclGroupEnd (outside a group, each is a group of
//     its own); each receive is matched, in order, with the peer's next send
//     to this rank, and byte counts that differ fail on both sides; a send
//     returns only once it was received;
//   - when every rank of the clique waits on another (a receive nobody
//     sends, a collective some rank never calls while the others wait in
//     theirs), where NCCL would hang, the clique breaks: every waiting call
//     and every later call on it fails with ncclInvalidUsage;
//   - reduce-scatter sums in rank order in fp32 (bf16/fp16 rounded once).
// ncclGetLastError tells why a clique call failed.
//
// Device semantics (fake_nccl_set_device, for tests on the strict GPU of
// muon/device/testing): every buffer of a clique call must be device memory
// (the check callback says, else the call fails with ncclInvalidArgument
// naming the buffer), and nothing moves when the call returns: the call is
// enqueued on its stream (the enqueue callback) and runs, rendezvous
// included, when the stream reaches it, as NCCL's kernels do. A failure
// there is the stream's (the runtime reports it at the next wait). An
// enqueued call may run more than once (a CUDA graph's replays, as NCCL's
// captured kernels do): the enqueue callback owns it and releases it when it
// drops the work (or at once when it does not take it).
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
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
  std::string invalid;  // what is wrong with this rank's own arguments
};

// A send waiting for its receive.
struct Pending {
  const void* data = nullptr;
  size_t bytes = 0;
  int to = 0;
  bool taken = false;
  size_t expected = 0;  // a receive's byte count that differs (then `mismatch`)
  bool mismatch = false;
};

struct Clique {
  explicit Clique(int n) : size(n), stuck(n, 0), calls(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  // Every change a waiting rank may wait for bumps `progress`; a waiting
  // rank notes in stuck[rank] the progress at which it found nothing to do.
  uint64_t progress = 1;
  std::vector<uint64_t> stuck;  // 0: not waiting
  bool broken = false;          // every rank waited on another
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
  void* stream;
};

// Device semantics (see the top); null: host memory, run at the call.
using CheckFn = int (*)(const void* ptr, size_t bytes, char* why, size_t why_size);
using WorkFn = int (*)(void* arg, char* why, size_t why_size);
using ReleaseFn = void (*)(void* arg);
using EnqueueFn = int (*)(void* stream, WorkFn work, ReleaseFn release, void* arg);
std::atomic<CheckFn> g_check{nullptr};
std::atomic<EnqueueFn> g_enqueue{nullptr};

thread_local std::string t_log;
thread_local std::string t_error;  // why the last clique call failed
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

int Failed(int result, const std::string& why) {
  t_error = why;
  return result;
}

void Changed(Clique& q) {
  ++q.progress;
  q.cv.notify_all();
}

// Waits as rank `me` until ready(); false when the clique is broken, or breaks
// it now because every rank is waiting with nothing left to happen.
template <typename Ready>
bool Wait(Clique& q, int me, std::unique_lock<std::mutex>& lock, Ready ready) {
  while (!ready()) {
    if (q.broken) return false;
    q.stuck[me] = q.progress;
    bool all = true;
    for (uint64_t s : q.stuck) all = all && s == q.progress;
    if (all) {
      q.broken = true;
      q.cv.notify_all();
      return false;
    }
    q.cv.wait(lock);
  }
  q.stuck[me] = 0;
  return true;
}

// Waits until every rank of the clique arrived here; `lock` holds q.mu.
bool Rendezvous(Clique& q, int me, std::unique_lock<std::mutex>& lock) {
  const uint64_t generation = q.generation;
  if (++q.arrived == q.size) {
    q.arrived = 0;
    ++q.generation;
    Changed(q);
    return true;
  }
  return Wait(q, me, lock, [&] { return q.generation != generation; });
}

const char* kBroken =
    "the clique is broken: every rank waited on another (a call without its counterpart)";

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

// What NCCL would refuse in rank `me`'s own arguments, or "".
std::string Invalid(const Call& c, int me, int n) {
  const bool known = c.dtype == kUint8 || c.dtype == kFloat32 || c.dtype == kFloat16 ||
                     c.dtype == kBfloat16;
  if (!known || (c.op == "ReduceScatter" && c.dtype == kUint8)) {
    return "datatype " + std::to_string(c.dtype) + " is not one the fake " + c.op + " takes";
  }
  if (c.root < 0 || c.root >= n) return "root " + std::to_string(c.root) + " is outside the clique";
  if (c.red != 0) return "reduction " + std::to_string(c.red) + " is not ncclSum";
  const size_t bytes = c.count * ElemSize(c.dtype);
  if (bytes == 0) return "";
  const bool reads = c.op != "Broadcast" || me == c.root;
  if (c.recv == nullptr || (reads && c.send == nullptr)) return "a NULL buffer";
  const char* send = static_cast<const char*>(c.send);
  char* recv = static_cast<char*>(c.recv);
  if (c.op == "AllGather" && send != recv + me * bytes && Overlap(send, bytes, recv, n * bytes)) {
    return "send and recv overlap, not in place";
  }
  if (c.op == "ReduceScatter" && recv != send + me * bytes && Overlap(send, n * bytes, recv, bytes)) {
    return "send and recv overlap, not in place";
  }
  if (c.op == "Broadcast" && reads && send != recv && Overlap(send, bytes, recv, bytes)) {
    return "send and recv overlap, not in place";
  }
  return "";
}

std::string Unpaired(int from, int to, size_t sent, size_t expected) {
  return "rank " + std::to_string(to) + " receives " + std::to_string(expected) +
         " bytes from rank " + std::to_string(from) + ", which sends " + std::to_string(sent);
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
int Collective(FakeComm* comm, Call call) {
  Clique& q = *comm->clique;
  const int me = comm->rank;
  t_error.clear();
  if (t_group_depth > 0) return Failed(kInvalidUsage, "the fake runs no collective inside a group");
  call.invalid = Invalid(call, me, q.size);
  std::unique_lock<std::mutex> lock(q.mu);
  if (q.broken) return Failed(kInvalidUsage, kBroken);
  q.calls[me] = call;
  if (!Rendezvous(q, me, lock)) return Failed(kInvalidUsage, kBroken);
  std::string why;
  for (int r = 0; r < q.size && why.empty(); ++r) {
    const Call& a = q.calls[r];
    const Call& b = q.calls[0];
    if (!a.invalid.empty()) {
      why = "rank " + std::to_string(r) + "'s " + a.op + ": " + a.invalid;
    } else if (a.op != b.op || a.count != b.count || a.dtype != b.dtype || a.root != b.root ||
               a.red != b.red) {
      why = "rank " + std::to_string(r) + " called " + a.op + "(count " + std::to_string(a.count) +
            ", datatype " + std::to_string(a.dtype) + ", root " + std::to_string(a.root) +
            ") while rank 0 called " + b.op + "(count " + std::to_string(b.count) + ", datatype " +
            std::to_string(b.dtype) + ", root " + std::to_string(b.root) + ")";
    }
  }
  lock.unlock();
  if (why.empty()) Perform(q, me);
  lock.lock();
  if (!Rendezvous(q, me, lock)) return Failed(kInvalidUsage, kBroken);
  if (!why.empty()) return Failed(call.invalid.empty() ? kInvalidUsage : kInvalidArgument, why);
  return 0;
}

// The sends and receives of one group (one communicator).
int RunGroupOps(const std::vector<Queued>& ops) {
  if (ops.empty()) return 0;
  Clique& q = *ops[0].comm->clique;
  const int me = ops[0].comm->rank;
  for (const Queued& op : ops) {
    if (op.comm->clique != &q) return Failed(kInvalidUsage, "the fake runs one communicator per group");
  }
  std::vector<Pending> sends;
  sends.reserve(ops.size());
  std::unique_lock<std::mutex> lock(q.mu);
  if (q.broken) return Failed(kInvalidUsage, kBroken);
  for (const Queued& op : ops) {
    if (!op.send) continue;
    sends.push_back({op.buf, op.bytes, op.peer, false, 0, false});
    q.channels[{me, op.peer}].push_back(&sends.back());
  }
  Changed(q);
  bool ok = true, mismatch = false;
  for (const Queued& op : ops) {
    if (op.send) continue;
    auto& channel = q.channels[{op.peer, me}];
    if (!(ok = Wait(q, me, lock, [&] { return !channel.empty(); }))) break;
    Pending* p = channel.front();
    channel.pop_front();
    if (p->bytes == op.bytes) {
      std::memcpy(op.buf, p->data, op.bytes);
    } else {
      p->mismatch = mismatch = true;
      p->expected = op.bytes;
      t_error = Unpaired(op.peer, me, p->bytes, op.bytes);
    }
    p->taken = true;
    Changed(q);
  }
  for (size_t k = 0; ok && k < sends.size(); ++k) {
    if (!(ok = Wait(q, me, lock, [&] { return sends[k].taken; }))) break;
    if (sends[k].mismatch) {
      mismatch = true;
      t_error = Unpaired(me, sends[k].to, sends[k].bytes, sends[k].expected);
    }
  }
  if (!ok) {  // broken: take back the sends nobody took (they point at this frame)
    for (auto& [pair, channel] : q.channels) {
      if (pair.first != me) continue;
      for (auto it = channel.begin(); it != channel.end();) {
        it = (*it >= sends.data() && *it < sends.data() + sends.size()) ? channel.erase(it) : it + 1;
      }
    }
    return Failed(kInvalidUsage, kBroken);
  }
  return mismatch ? kInvalidUsage : 0;
}

// A clique call deferred to its stream (device semantics).
struct Deferred {
  FakeComm* comm = nullptr;
  Call call;
  bool group = false;
  std::vector<Queued> ops;
};

// Runs a deferred call; it stays (a replay may run it again) until released.
int RunDeferred(void* arg, char* why, size_t why_size) {
  const Deferred* d = static_cast<const Deferred*>(arg);
  const int r = d->group ? RunGroupOps(d->ops) : Collective(d->comm, d->call);
  if (r != 0 && why != nullptr && why_size > 0) std::snprintf(why, why_size, "%s", t_error.c_str());
  return r;
}

void ReleaseDeferred(void* arg) { delete static_cast<Deferred*>(arg); }

// Runs `d` now, or enqueues it on `stream` under device semantics.
int RunOrEnqueue(std::unique_ptr<Deferred> d, void* stream) {
  const EnqueueFn enqueue = g_enqueue.load();
  if (enqueue == nullptr) return RunDeferred(d.get(), nullptr, 0);
  // The enqueue callback owns the call from here: it releases it, taken or not.
  if (enqueue(stream, &RunDeferred, &ReleaseDeferred, d.release()) != 0) {
    return Failed(kInvalidUsage, "the stream did not take the call");
  }
  return 0;
}

// The queued sends and receives of this thread's group.
int RunGroup() {
  auto d = std::make_unique<Deferred>();
  d->group = true;
  d->ops.swap(t_queued);
  if (d->ops.empty()) return 0;
  void* stream = d->ops[0].stream;
  return RunOrEnqueue(std::move(d), stream);
}

// Under device semantics: why [ptr, ptr + bytes) is not device memory, or "".
std::string NotDevice(const std::string& op, const char* which, const void* ptr, size_t bytes) {
  const CheckFn check = g_check.load();
  if (check == nullptr || bytes == 0) return "";
  char why[512] = {};
  if (check(ptr, bytes, why, sizeof why) == 0) return "";
  return op + ": " + which + " buffer: " + why;
}

// A collective on a clique, checked and run (or enqueued).
int CliqueCall(FakeComm* c, const Call& call, void* stream) {
  const size_t bytes = call.count * ElemSize(call.dtype);
  const size_t n = static_cast<size_t>(c->size);
  std::string bad;
  if (call.op == "AllGather") {
    bad = NotDevice("ncclAllGather", "send", call.send, bytes);
    if (bad.empty()) bad = NotDevice("ncclAllGather", "recv", call.recv, n * bytes);
  } else if (call.op == "Broadcast") {
    if (c->rank == call.root) bad = NotDevice("ncclBroadcast", "send", call.send, bytes);
    if (bad.empty()) bad = NotDevice("ncclBroadcast", "recv", call.recv, bytes);
  } else if (call.op == "ReduceScatter") {
    bad = NotDevice("ncclReduceScatter", "send", call.send, n * bytes);
    if (bad.empty()) bad = NotDevice("ncclReduceScatter", "recv", call.recv, bytes);
  }
  if (!bad.empty()) return Failed(kInvalidArgument, bad);
  auto d = std::make_unique<Deferred>();
  d->comm = c;
  d->call = call;
  return RunOrEnqueue(std::move(d), stream);
}

// A send or receive on a clique: queued in the open group, or a group of its own.
int PointToPoint(const Queued& op) {
  t_error.clear();
  if (op.peer < 0 || op.peer >= op.comm->size) {
    return Failed(kInvalidArgument, "peer " + std::to_string(op.peer) + " is outside the clique");
  }
  const std::string bad = NotDevice(op.send ? "ncclSend" : "ncclRecv", "the", op.buf, op.bytes);
  if (!bad.empty()) return Failed(kInvalidArgument, bad);
  t_queued.push_back(op);
  return t_group_depth > 0 ? 0 : RunGroup();
}

}  // namespace

// Test controls.
FAKE_API const char* fake_nccl_log() { return t_log.c_str(); }
FAKE_API void fake_nccl_clear() { t_log.clear(); }
FAKE_API void fake_nccl_fail_next(int result) { t_fail_next = result; }
FAKE_API void* fake_nccl_clique_create(int size) { return new Clique(size); }
FAKE_API void fake_nccl_clique_destroy(void* clique) { delete static_cast<Clique*>(clique); }
FAKE_API void fake_nccl_set_device(CheckFn check, EnqueueFn enqueue) {
  g_check.store(check);
  g_enqueue.store(enqueue);
}

FAKE_API int ncclGroupStart() {
  Log("GroupStart");
  ++t_group_depth;
  return 0;
}

FAKE_API int ncclGroupEnd() {
  Log("GroupEnd");
  if (t_group_depth == 0) return Failed(kInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return Take();
  if (t_group_failed) t_queued.clear();  // an op of the group already failed: none runs
  t_group_failed = false;
  const int r = RunGroup();
  const int injected = Take();
  return injected != 0 ? injected : r;
}

FAKE_API int ncclSend(const void* buf, size_t count, int dtype, int peer, void* comm,
                      void* stream) {
  Log("Send(" + std::to_string(peer) + "," + std::to_string(count) + "," +
      std::to_string(dtype) + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  int r = 0;
  if (c->clique != nullptr) {
    r = PointToPoint({true, const_cast<void*>(buf), count * ElemSize(dtype), peer, c, stream});
  } else if (peer == c->rank) {
    t_self_send = buf;
    t_self_bytes = count * ElemSize(dtype);
  }
  if (r == 0) r = Take();
  t_group_failed = t_group_failed || r != 0;
  return r;
}

FAKE_API int ncclRecv(void* buf, size_t count, int dtype, int peer, void* comm, void* stream) {
  Log("Recv(" + std::to_string(peer) + "," + std::to_string(count) + "," +
      std::to_string(dtype) + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  const size_t bytes = count * ElemSize(dtype);
  int r = 0;
  if (c->clique != nullptr) {
    r = PointToPoint({false, buf, bytes, peer, c, stream});
  } else if (peer == c->rank && t_self_send != nullptr && t_self_bytes == bytes) {
    std::memcpy(buf, t_self_send, bytes);
    t_self_send = nullptr;
  }
  if (r == 0) r = Take();
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
    const int r = CliqueCall(c, {"AllGather", send, recv, count, dtype, 0, 0, ""}, stream);
    return r != 0 ? r : Take();
  }
  if (c->size == 1) std::memmove(recv, send, count * ElemSize(dtype));
  return Take();
}

FAKE_API int ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root,
                           void* comm, void* stream) {
  Log("Broadcast(" + std::to_string(count) + "," + std::to_string(dtype) + ",root" +
      std::to_string(root) + (send == recv ? ",inplace" : "") + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->clique != nullptr) {
    const int r = CliqueCall(c, {"Broadcast", send, recv, count, dtype, root, 0, ""}, stream);
    return r != 0 ? r : Take();
  }
  return Take();
}

FAKE_API int ncclReduceScatter(const void* send, void* recv, size_t count, int dtype, int op,
                               void* comm, void* stream) {
  Log("ReduceScatter(" + std::to_string(count) + "," + std::to_string(dtype) + ",op" +
      std::to_string(op) + ")");
  FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->clique != nullptr) {
    const int r = CliqueCall(c, {"ReduceScatter", send, recv, count, dtype, 0, op, ""}, stream);
    return r != 0 ? r : Take();
  }
  if (c->size == 1) std::memmove(recv, send, count * ElemSize(dtype));
  return Take();
}

FAKE_API int ncclCommCount(void* comm, int* count) {
  const FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->size <= 0 || (c->clique != nullptr && c->clique->size != c->size)) return kInvalidArgument;
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

FAKE_API const char* ncclGetLastError(void*) {
  return t_error.empty() ? "fake last error" : t_error.c_str();
}

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
