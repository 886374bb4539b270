#include "muon/comm/ordered_sum.h"

#include <algorithm>

namespace muon {

void SumInRankOrder(DType t, const void* const* blocks, int n, size_t count, void* out) {
  if (n <= 0 || count == 0) return;
  // Chunks of an fp32 accumulator: all blocks are read for a chunk before
  // the chunk is stored, which makes `out` aliasing a block safe.
  constexpr size_t kChunk = 1024;
  float acc[kChunk];
  for (size_t base = 0; base < count; base += kChunk) {
    const size_t len = std::min(kChunk, count - base);
    for (size_t i = 0; i < len; ++i) {
      acc[i] = LoadAsFloat(t, blocks[0], static_cast<int64_t>(base + i));
    }
    for (int r = 1; r < n; ++r) {
      if (t == DType::kF32) {
        const float* b = static_cast<const float*>(blocks[r]) + base;
        for (size_t i = 0; i < len; ++i) acc[i] += b[i];
      } else {
        for (size_t i = 0; i < len; ++i) {
          acc[i] += LoadAsFloat(t, blocks[r], static_cast<int64_t>(base + i));
        }
      }
    }
    for (size_t i = 0; i < len; ++i) StoreFromFloat(t, out, static_cast<int64_t>(base + i), acc[i]);
  }
}

}  // namespace muon
