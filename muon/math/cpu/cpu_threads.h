// How many threads one rank's CPU math (OpenBLAS, oneDNN's OpenMP) may use.
//
// The rule (docs/cpu.md): the cores this process may run on
// (sched_getaffinity), divided among the ranks that share them, at least one:
//   threads per rank = max(1, cores / (ranks in this process x LOCAL_WORLD_SIZE))
// where the ranks in this process are the distinct world ranks of its live CPU
// backends that joined a world of more than one rank (in-process ranks each
// have one; an optimizer without such a world, e.g. one of several param
// groups' optimizers of one rank, which step one after another, divides
// nothing) and LOCAL_WORLD_SIZE (set by torchrun and most launchers) is
// the number of processes on this machine (1 when unset), capped by
// OMP_NUM_THREADS when that is a positive integer (the limit torch's own CPU
// ops keep; torchrun sets 1 with several processes). MUON_CPU_THREADS=n
// sets n per rank instead of all that. Without the division every rank's BLAS starts a
// thread per core, and N in-process ranks on C cores run N x C threads.
#ifndef MUON_MATH_CPU_CPU_THREADS_H_
#define MUON_MATH_CPU_CPU_THREADS_H_

namespace muon {
namespace cpu {

// The rule on given figures: `override_threads` (MUON_CPU_THREADS, 0 when
// unset) wins when positive; else `cap` (OMP_NUM_THREADS, 0 when unset)
// bounds the result when positive.
int ThreadsPerRank(int cores, int ranks_in_process, int local_world_size, int override_threads,
                   int cap = 0);

// The rule on this process: its cores, its joined ranks, the environment.
int ThreadsPerRankHere();
// oneDNN's threads (bf16 products on request): the rule without the in-process ranks
// (cores / LOCAL_WORLD_SIZE, capped by OMP_NUM_THREADS, or MUON_CPU_THREADS). oneDNN may split a
// product's sums by its thread count, so a count that changed with the
// number of optimizers alive would change results within one process; with
// OpenMP's own teams per rank thread, dividing gained nothing measurable.
int NativeThreadsHere();

// A CPU backend's place in the rule: counted from Join(world_rank) (the
// backend's optimizer is that rank of a world of more than one rank) until
// destroyed. Backends that joined with the same rank count once. Thread-safe.
class RankShare {
 public:
  RankShare() = default;
  ~RankShare();
  RankShare(const RankShare&) = delete;
  RankShare& operator=(const RankShare&) = delete;
  // Once; later calls change nothing.
  void Join(int world_rank);

 private:
  int rank_ = -1;
};

// While alive, holds `threads` of the process's core slots (as many as its
// cores) when ranks of a world share the process (more than one joined):
// waits until that many are free. Newton-Schulz holds them per matrix, so
// that N in-process ranks on C < N cores take turns instead of slicing the
// cores' time (and their caches) among N computing threads. Whoever holds
// slots only computes (no collective), so waiting for them cannot deadlock.
// With one rank or none joined it holds nothing; nested inside another on
// the same thread it holds nothing more (the outer one's slots serve).
class CoreSlots {
 public:
  explicit CoreSlots(int threads);
  ~CoreSlots();
  CoreSlots(const CoreSlots&) = delete;
  CoreSlots& operator=(const CoreSlots&) = delete;

 private:
  int held_ = 0;
};

// Makes the calling thread's CPU math use `blas_threads` for the OpenBLAS
// products (blas_tiles.h: tiles on an OpenMP team of that many; OpenBLAS
// itself is set to one thread per call, once for the process) and
// `omp_threads` for OpenMP on this thread (oneDNN).
void UseThreads(int blas_threads, int omp_threads);
// The calling thread's `blas_threads` from its last UseThreads (1 before).
int TileThreads();

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_CPU_THREADS_H_
