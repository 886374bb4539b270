// Element-wise host work spread over a rank's threads: a list of ranges
// (tensors, copies) cut into chunks of whole elements, the chunks run on an
// OpenMP team. Each element is computed alone, so the results do not depend on
// the chunking or the threads.
#ifndef MUON_MATH_CPU_PARALLEL_H_
#define MUON_MATH_CPU_PARALLEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"

namespace muon {
namespace cpu {

// Elements [begin, end) of range `item`.
struct Chunk {
  size_t item;
  int64_t begin, end;
};

// Chunks of at most kChunkElements; below kParallelElements in all a list
// runs on the calling thread alone (a team's wake-up would cost more).
constexpr int64_t kChunkElements = int64_t{1} << 16;
constexpr int64_t kParallelElements = int64_t{1} << 20;

// *chunks = the chunks of `count` ranges of size_of(i) elements, in order
// (the vector keeps its capacity: no allocation once it has grown).
void SplitIntoChunks(size_t count, absl::FunctionRef<int64_t(size_t)> size_of,
                     std::vector<Chunk>* chunks);

// Runs fn on every chunk, on `threads` threads when there are several chunks
// and at least kParallelElements in all, else in order on the calling
// thread. fn must be safe to call concurrently on different chunks.
void RunChunks(const std::vector<Chunk>& chunks, int threads,
               absl::FunctionRef<void(const Chunk&)> fn);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_PARALLEL_H_
