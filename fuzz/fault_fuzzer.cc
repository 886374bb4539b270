// Fuzzes a job under communicator faults and a lying link, over the C API:
// a world of 2 to 4 in-process ranks (threads) with a fuzzed small model
// (replicated, row-sharded, flat-range and ZeRO-2 parameters, some held by
// no rank of a kind), fuzzed options (prefetch, assignment, round size), and
// up to four fuzzed events on the ranks' collectives, counted from the start
// of the run (the first step's setup included): a collective that fails on
// one rank or on every rank after the data moved, or (the lying link) a
// collective whose received bytes arrive with one byte XORed.
//
// Every rank steps three times, then once more with the events switched off.
// Oracles:
//   - always: no crash, leak, undefined behaviour or allocation beyond
//     libFuzzer's malloc limit (sizes from the wire are capped before
//     allocation); every status a header code, with a message exactly when it
//     is not MUON_OK;
//   - failures only (an honest link): no rank waits forever (a watchdog
//     aborts the world after 10 s and fails the input), and every rank
//     returns the same status at every step, setup included, with the one
//     documented exception: ranks whose failure came after their verdict
//     left fail that step alone, and then every rank fails the next one.
// A damaged receive may leave the ranks disagreeing on what they received,
// as it would with NCCL: then the watchdog aborts the world (after 2 s) and
// every rank must return, without a memory error.
//
// MUON_FUZZ_VERBOSE=1 prints each job and every rank's statuses.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"
#include "fuzz/fuzz_util.h"

namespace {

bool verbose = false;

constexpr int kSteps = 3;

enum Kind { kReplicate, kShardRows, kFlatRange, kZero2, kKinds };

struct FParam {
  std::string name;
  int64_t rows = 1, cols = 1;
  Kind kind = kReplicate;
};

struct Event {
  int rank = -1;  // -1: every rank
  int call = 0;
  bool flip = false;   // else: fail after the data moved
  uint32_t offset = 0;  // flip: the byte, modulo what the call received
  uint8_t mask = 1;
};

struct Job {
  int n = 2;
  int prefetch = 1;
  int assignment = MUON_ASSIGNMENT_BALANCED;
  size_t round_bytes = 0;
  std::vector<FParam> params;
  std::vector<Event> events;
  bool lying() const {
    for (const Event& e : events) {
      if (e.flip) return true;
    }
    return false;
  }
};

// One rank's link: its collectives counted, the job's events applied.
struct Link {
  muon_comm_t inner;
  const Job* job;
  int rank;
  int* calls;                   // shared by the rank's world and groups
  std::atomic<bool>* enabled;   // events switched off for the last step
};

muon_status_t Apply(Link* l, muon_status_t st, void* recv, size_t recv_size) {
  if (st != MUON_OK) return st;
  const int call = (*l->calls)++;
  if (!l->enabled->load()) return st;
  muon_status_t out = st;
  for (const Event& e : l->job->events) {
    if (e.call != call || (e.rank >= 0 && e.rank != l->rank)) continue;
    if (e.flip) {
      if (recv_size > 0) static_cast<unsigned char*>(recv)[e.offset % recv_size] ^= e.mask;
    } else {
      muon_set_callback_error("injected link failure");
      out = MUON_UNAVAILABLE;
    }
  }
  return out;
}

muon_status_t LinkAllGather(void* ctx, const void* send, void* recv, size_t bytes, void* stream) {
  auto* l = static_cast<Link*>(ctx);
  const muon_status_t st = l->inner.all_gather(l->inner.ctx, send, recv, bytes, stream);
  return Apply(l, st, recv, bytes * static_cast<size_t>(l->inner.size));
}

muon_status_t LinkAllToAllV(void* ctx, const void* send, const size_t* sb, const size_t* so,
                            void* recv, const size_t* rb, const size_t* ro, void* stream) {
  auto* l = static_cast<Link*>(ctx);
  const muon_status_t st = l->inner.all_to_all_v(l->inner.ctx, send, sb, so, recv, rb, ro, stream);
  size_t extent = 0;
  for (int p = 0; p < l->inner.size; ++p) {
    if (rb[p] != 0) extent = std::max(extent, ro[p] + rb[p]);
  }
  return Apply(l, st, recv, extent);
}

muon_status_t LinkReduceScatter(void* ctx, const void* send, void* recv, size_t count,
                                int32_t dtype, void* stream) {
  auto* l = static_cast<Link*>(ctx);
  const muon_status_t st = l->inner.reduce_scatter(l->inner.ctx, send, recv, count, dtype, stream);
  return Apply(l, st, recv, count * 4);  // float32 gradients (the model's)
}

muon_status_t LinkBroadcast(void* ctx, void* buf, size_t bytes, int32_t root, void* stream) {
  auto* l = static_cast<Link*>(ctx);
  return l->inner.broadcast(l->inner.ctx, buf, bytes, root, stream);
}

muon_status_t LinkBarrier(void* ctx, void* stream) {
  auto* l = static_cast<Link*>(ctx);
  return l->inner.barrier(l->inner.ctx, stream);
}

void LinkRelease(void* ctx) {
  auto* l = static_cast<Link*>(ctx);
  if (l->inner.release != nullptr) l->inner.release(l->inner.ctx);
  delete l;
}

muon_comm_t Wrap(const muon_comm_t& inner, const Job* job, int rank, int* calls,
                 std::atomic<bool>* enabled) {
  muon_comm_t t = inner;
  t.ctx = new Link{inner, job, rank, calls, enabled};
  t.all_gather = LinkAllGather;
  t.all_to_all_v = LinkAllToAllV;
  t.reduce_scatter = LinkReduceScatter;
  t.broadcast = inner.broadcast != nullptr ? LinkBroadcast : nullptr;
  t.barrier = inner.barrier != nullptr ? LinkBarrier : nullptr;
  t.release = LinkRelease;
  return t;
}

float Value(size_t param, int64_t i, int step) {
  const uint32_t h = static_cast<uint32_t>(param * 2654435761u + i * 40503u + step * 97u);
  return static_cast<float>(static_cast<int32_t>(h % 2001u) - 1000) * 1e-3f;
}

struct RankRun {
  std::vector<muon_status_t> steps;  // kSteps + 1
  std::vector<std::string> errors;
  bool setup_ok = true;               // everything before the first step succeeded
};

// Rank `rank`'s whole run (the world already created).
void RunRank(const Job& job, muon_inprocess_world_t* world, int rank,
             std::atomic<bool>* enabled, RankRun* out) {
  muon_options_t o;
  CheckStatus(muon_options_init(&o, sizeof o));
  o.lr = 0.02;
  o.weight_decay = 0.1;
  o.ns_dtype = MUON_NS_DTYPE_FP32;
  o.ns_steps = 2;
  o.prefetch_count = job.prefetch;
  o.assignment = job.assignment;
  o.round_bytes = job.round_bytes;
  muon_optimizer_t* opt = nullptr;
  if (CheckStatus(muon_create(&o, &opt)) != MUON_OK) {
    out->setup_ok = false;
    return;
  }
  int calls = 0;
  muon_comm_t comm;
  int32_t world_id = -1;
  bool ok = CheckStatus(muon_inprocess_comm(world, nullptr, 0, rank, &comm)) == MUON_OK;
  if (ok) {
    comm = Wrap(comm, &job, rank, &calls, enabled);
    ok = CheckStatus(muon_set_world(opt, &comm, &world_id)) == MUON_OK;
  }
  // Every parameter's piece on this rank.
  const size_t np = job.params.size();
  std::vector<std::vector<float>> values(np), grads(np);
  std::vector<std::vector<int64_t>> global_index(np);
  std::vector<std::vector<int64_t>> local_shape(np);
  for (size_t k = 0; k < np && ok; ++k) {
    const FParam& p = job.params[k];
    const int64_t numel = p.rows * p.cols;
    int64_t first = 0, count = numel;
    muon_placement_t pl{};
    pl.group = world_id;
    switch (p.kind) {
      case kReplicate:
      case kZero2:
        pl.kind = MUON_PLACEMENT_REPLICATE;
        local_shape[k] = {p.rows, p.cols};
        break;
      case kShardRows: {  // torch.chunk over the rows: the tail short or empty
        const int64_t chunk = (p.rows + job.n - 1) / job.n;
        const int64_t r0 = std::min<int64_t>(p.rows, chunk * rank);
        const int64_t r1 = std::min<int64_t>(p.rows, chunk * (rank + 1));
        pl.kind = MUON_PLACEMENT_SHARD;
        pl.dim = 0;
        pl.split = MUON_SPLIT_CHUNK;
        first = r0 * p.cols;
        count = (r1 - r0) * p.cols;
        local_shape[k] = {r1 - r0, p.cols};
        break;
      }
      case kFlatRange:
      default:
        pl.kind = MUON_PLACEMENT_FLAT_RANGE;
        first = numel * rank / job.n;
        count = numel * (rank + 1) / job.n - first;
        pl.start = first;
        pl.length = count;
        local_shape[k] = {count};
        break;
    }
    values[k].resize(static_cast<size_t>(count));
    grads[k].resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      global_index[k].push_back(first + i);
      values[k][static_cast<size_t>(i)] = Value(k, first + i, -1);
    }
    DLTensor v{}, g{};
    v.data = values[k].data();
    g.data = grads[k].data();
    v.device = g.device = {kDLCPU, 0};
    v.ndim = g.ndim = static_cast<int32_t>(local_shape[k].size());
    v.dtype = g.dtype = {kDLFloat, 32, 1};
    v.shape = g.shape = local_shape[k].data();
    muon_param_options_t po;
    CheckStatus(muon_param_options_init(&po, sizeof po));
    po.name = p.name.c_str();
    const int64_t global[2] = {p.rows, p.cols};
    po.global_ndim = 2;
    po.global_shape = global;
    po.num_placements = 1;
    po.placements = &pl;
    po.replicated_mode = p.kind == kZero2 ? MUON_REPLICATED_ZERO2 : MUON_REPLICATED_HOST_AVERAGED;
    int64_t id = -1;
    ok = CheckStatus(muon_register_param(opt, &v, &g, &po, &id)) == MUON_OK;
  }
  out->setup_ok = ok;
  for (int s = 0; s <= kSteps && ok; ++s) {
    // The events off for the last step (read per collective: a rank still
    // in its previous step sees no more faults, which an honest link allows).
    if (s == kSteps) enabled->store(false);
    for (size_t k = 0; k < np; ++k) {
      for (size_t i = 0; i < grads[k].size(); ++i) grads[k][i] = Value(k, global_index[k][i], s);
    }
    const muon_status_t st = CheckStatus(muon_step(opt, nullptr));
    out->steps.push_back(st);
    out->errors.push_back(st == MUON_OK ? "" : muon_last_error_message());
  }
  muon_stats_t stats;
  muon_stats_init(&stats, sizeof stats);
  CheckStatus(muon_get_stats(opt, &stats));
  muon_destroy(opt);
}

Job ReadJob(FuzzedDataProvider& in) {
  Job job;
  job.n = in.ConsumeIntegralInRange<int>(2, 4);
  job.prefetch = in.ConsumeIntegralInRange<int>(0, 2);
  job.assignment = in.ConsumeBool() ? MUON_ASSIGNMENT_SPLIT : MUON_ASSIGNMENT_BALANCED;
  job.round_bytes = in.ConsumeBool() ? 0 : static_cast<size_t>(in.ConsumeIntegralInRange<int>(64, 1024));
  const int np = in.ConsumeIntegralInRange<int>(1, 4);
  for (int k = 0; k < np; ++k) {
    FParam p;
    p.name = "p" + std::to_string(k);
    p.rows = in.ConsumeIntegralInRange<int64_t>(1, 10);
    p.cols = in.ConsumeIntegralInRange<int64_t>(1, 10);
    p.kind = static_cast<Kind>(in.ConsumeIntegralInRange<int>(0, kKinds - 1));
    job.params.push_back(p);
  }
  const int ne = in.ConsumeIntegralInRange<int>(0, 4);
  for (int e = 0; e < ne; ++e) {
    Event ev;
    ev.rank = in.ConsumeIntegralInRange<int>(-1, job.n - 1);
    ev.call = in.ConsumeIntegralInRange<int>(0, 40);
    ev.flip = in.ConsumeIntegralInRange<int>(0, 3) == 0;
    ev.offset = in.ConsumeIntegral<uint32_t>();
    ev.mask = in.ConsumeIntegralInRange<uint8_t>(1, 255);
    job.events.push_back(ev);
  }
  return job;
}

void Print(const Job& job, const std::vector<RankRun>& runs) {
  std::fprintf(stderr, "job: %d ranks, prefetch %d, assignment %d, round_bytes %zu\n", job.n,
               job.prefetch, job.assignment, job.round_bytes);
  for (const FParam& p : job.params) {
    std::fprintf(stderr, "  %s %lld x %lld kind %d\n", p.name.c_str(),
                 static_cast<long long>(p.rows), static_cast<long long>(p.cols), p.kind);
  }
  for (const Event& e : job.events) {
    std::fprintf(stderr, "  event: rank %d call %d %s offset %u mask %u\n", e.rank, e.call,
                 e.flip ? "flip" : "fail", e.offset, e.mask);
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    for (size_t s = 0; s < runs[r].steps.size(); ++s) {
      std::fprintf(stderr, "  rank %zu step %zu: %s %s\n", r, s,
                   muon_status_string(runs[r].steps[s]), runs[r].errors[s].c_str());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  verbose = std::getenv("MUON_FUZZ_VERBOSE") != nullptr;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const Job job = ReadJob(in);
  muon_inprocess_world_t* world = nullptr;
  FUZZ_CHECK(muon_inprocess_world_create(job.n, &world) == MUON_OK);
  std::vector<RankRun> runs(static_cast<size_t>(job.n));
  std::atomic<bool> enabled{true};
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < job.n; ++r) {
    threads.emplace_back([&, r] {
      RunRank(job, world, r, &enabled, &runs[static_cast<size_t>(r)]);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    });
  }
  bool waited_forever = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    const auto limit = std::chrono::seconds(job.lying() ? 2 : 10);
    if (!cv.wait_for(lock, limit, [&] { return done == job.n; })) {
      waited_forever = true;
      muon_inprocess_world_abort(world);  // releases every waiting rank
    }
  }
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  if (verbose) Print(job, runs);
  if (job.lying()) return 0;  // the lying link: memory safety and bounded allocation only
  if (waited_forever) Print(job, runs);
  FUZZ_CHECK(!waited_forever);
  // An honest link: the same status on every rank at every step, but for a
  // step some ranks failed alone, which every rank then fails next.
  for (const RankRun& run : runs) {
    if (!run.setup_ok) return 0;  // refused before stepping (no comm): nothing to agree on
  }
  for (size_t s = 0; s <= kSteps; ++s) {
    bool any_ok = false, any_failed = false;
    for (const RankRun& run : runs) {
      if (s >= run.steps.size()) continue;
      (run.steps[s] == MUON_OK ? any_ok : any_failed) = true;
    }
    if (!(any_ok && any_failed)) {
      if (any_failed) {  // all failed: with the same code
        for (const RankRun& run : runs) {
          if (s < run.steps.size() && run.steps[s] != runs[0].steps[s]) {
            Print(job, runs);
            FUZZ_CHECK(run.steps[s] == runs[0].steps[s]);
          }
        }
      }
      continue;
    }
    // Some failed alone: every rank fails the next step.
    for (const RankRun& run : runs) {
      if (s + 1 >= run.steps.size() || run.steps[s + 1] == MUON_OK) {
        Print(job, runs);
        FUZZ_CHECK(s + 1 < run.steps.size() && run.steps[s + 1] != MUON_OK);
      }
    }
  }
  return 0;
}
