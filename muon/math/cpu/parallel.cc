#include "muon/math/cpu/parallel.h"

#include <omp.h>

#include <algorithm>

namespace muon {
namespace cpu {

void SplitIntoChunks(size_t count, absl::FunctionRef<int64_t(size_t)> size_of,
                     std::vector<Chunk>* chunks) {
  chunks->clear();
  for (size_t i = 0; i < count; ++i) {
    const int64_t n = size_of(i);
    for (int64_t begin = 0; begin < n; begin += kChunkElements) {
      chunks->push_back({i, begin, std::min(n, begin + kChunkElements)});
    }
  }
}

void RunChunks(const std::vector<Chunk>& chunks, int threads,
               absl::FunctionRef<void(const Chunk&)> fn) {
  int64_t total = 0;
  for (const Chunk& c : chunks) total += c.end - c.begin;
  const int64_t n = static_cast<int64_t>(chunks.size());
  if (threads <= 1 || n < 2 || total < kParallelElements) {
    for (const Chunk& c : chunks) fn(c);
    return;
  }
  const int team = static_cast<int>(std::min<int64_t>(threads, n));
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < n; ++i) fn(chunks[static_cast<size_t>(i)]);
}

}  // namespace cpu
}  // namespace muon
