#include "muon/math/cpu/cpu_threads.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace muon {
namespace cpu {
namespace {

std::atomic<int> live_backends{0};

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
  return ThreadsPerRank(cores, live_backends.load(std::memory_order_relaxed),
                        EnvCount("LOCAL_WORLD_SIZE"), EnvCount("MUON_CPU_THREADS"),
                        EnvCount("OMP_NUM_THREADS"));
}

int NativeThreadsHere() {
  static const int cores = Cores();
  return ThreadsPerRank(cores, 1, EnvCount("LOCAL_WORLD_SIZE"), EnvCount("MUON_CPU_THREADS"),
                        EnvCount("OMP_NUM_THREADS"));
}

RankShare::RankShare() { live_backends.fetch_add(1, std::memory_order_relaxed); }
RankShare::~RankShare() { live_backends.fetch_sub(1, std::memory_order_relaxed); }

void UseThreads(int threads, int omp_threads) {
  omp_set_num_threads(omp_threads);
  static std::mutex mu;
  static int blas_threads = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (blas_threads != threads) {
    openblas_set_num_threads(threads);
    blas_threads = threads;
  }
}

}  // namespace cpu
}  // namespace muon
