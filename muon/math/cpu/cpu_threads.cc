#include "muon/math/cpu/cpu_threads.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

namespace muon {
namespace cpu {
namespace {

// The ranks that share the process and their core slots. Never destroyed:
// optimizers may outlive the static objects at exit.
struct Sharing {
  std::mutex mu;
  std::map<int, int> joined;  // world rank -> backends that joined with it
  int slots_used = 0;
  std::condition_variable slots_freed;
};
Sharing& Shared() {
  static auto* sharing = new Sharing();
  return *sharing;
}
std::atomic<int> distinct_ranks{0};  // Shared().joined.size(), read without the lock

// A positive integer from the environment, else 0.
int EnvCount(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n > 0 && n < (1 << 20)) ? static_cast<int>(n) : 0;
}

int Cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

int ThreadsPerRank(int cores, int ranks_in_process, int local_world_size, int override_threads,
                   int cap) {
  if (override_threads > 0) return override_threads;
  const int sharers = std::max(1, ranks_in_process) * std::max(1, local_world_size);
  const int share = std::max(1, cores / sharers);
  return cap > 0 ? std::min(share, cap) : share;
}

int ThreadsPerRankHere() {
  static const int cores = Cores();
  return ThreadsPerRank(cores, distinct_ranks.load(std::memory_order_relaxed),
                        EnvCount("LOCAL_WORLD_SIZE"), EnvCount("MUON_CPU_THREADS"),
                        EnvCount("OMP_NUM_THREADS"));
}

int NativeThreadsHere() {
  static const int cores = Cores();
  return ThreadsPerRank(cores, 1, EnvCount("LOCAL_WORLD_SIZE"), EnvCount("MUON_CPU_THREADS"),
                        EnvCount("OMP_NUM_THREADS"));
}

void RankShare::Join(int world_rank) {
  if (rank_ >= 0 || world_rank < 0) return;
  Sharing& s = Shared();
  std::lock_guard<std::mutex> lock(s.mu);
  rank_ = world_rank;
  if (++s.joined[world_rank] == 1) distinct_ranks.fetch_add(1, std::memory_order_relaxed);
}

RankShare::~RankShare() {
  if (rank_ < 0) return;
  Sharing& s = Shared();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.joined.find(rank_);
  if (--it->second == 0) {
    s.joined.erase(it);
    distinct_ranks.fetch_sub(1, std::memory_order_relaxed);
  }
}

namespace {
thread_local int slots_held_here = 0;  // CoreSlots alive on this thread
}  // namespace

CoreSlots::CoreSlots(int threads) {
  // Nested on a thread that holds slots: its work runs on those.
  if (slots_held_here++ > 0) return;
  if (distinct_ranks.load(std::memory_order_relaxed) < 2) return;
  static const int cores = Cores();
  const int want = std::max(1, std::min(threads, cores));
  Sharing& s = Shared();
  std::unique_lock<std::mutex> lock(s.mu);
  s.slots_freed.wait(lock, [&] { return s.slots_used + want <= cores; });
  s.slots_used += want;
  held_ = want;
}

CoreSlots::~CoreSlots() {
  --slots_held_here;
  if (held_ == 0) return;
  Sharing& s = Shared();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.slots_used -= held_;
  }
  s.slots_freed.notify_all();
}

namespace {
thread_local int tile_threads = 1;
}  // namespace

void UseThreads(int threads, int omp_threads) {
  omp_set_num_threads(omp_threads);
  tile_threads = std::max(threads, 1);
  // OpenBLAS runs one thread per call: blas_tiles.h runs its calls in
  // parallel, in tiles that do not follow the thread count.
  static std::once_flag single;
  std::call_once(single, [] { openblas_set_num_threads(1); });
}

int TileThreads() { return tile_threads; }

}  // namespace cpu
}  // namespace muon
