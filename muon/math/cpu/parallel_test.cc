#include "muon/math/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace cpu {
namespace {

TEST(Parallel, ChunksCoverEveryElementOnceInOrder) {
  const std::vector<int64_t> sizes = {0, 1, kChunkElements, kChunkElements + 1, 3 * kChunkElements - 7};
  std::vector<Chunk> chunks;
  SplitIntoChunks(sizes.size(), [&](size_t i) { return sizes[i]; }, &chunks);
  // 0 + 1 + 1 + 2 + 3 chunks.
  ASSERT_EQ(chunks.size(), 7u);
  size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t next = 0;
    for (; at < chunks.size() && chunks[at].item == i; ++at) {
      EXPECT_EQ(chunks[at].begin, next);
      EXPECT_GT(chunks[at].end, chunks[at].begin);
      EXPECT_LE(chunks[at].end - chunks[at].begin, kChunkElements);
      next = chunks[at].end;
    }
    EXPECT_EQ(next, sizes[i]) << "range " << i;
  }
  EXPECT_EQ(at, chunks.size());
  // The vector is reused: a smaller list keeps its capacity.
  const size_t capacity = chunks.capacity();
  SplitIntoChunks(1, [](size_t) { return int64_t{5}; }, &chunks);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].end, 5);
  EXPECT_EQ(chunks.capacity(), capacity);
}

TEST(Parallel, EveryChunkRunsOnceWhateverTheThreads) {
  const int64_t n = kParallelElements + 3;  // in several chunks, run by a team
  for (int threads : {1, 2, 3, 8}) {
    std::vector<Chunk> chunks;
    SplitIntoChunks(2, [&](size_t i) { return i == 0 ? n : int64_t{9}; }, &chunks);
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n) + 9);
    std::atomic<int64_t> calls{0};
    std::mutex mu;
    std::set<std::thread::id> ran_on;
    RunChunks(chunks, threads, [&](const Chunk& c) {
      calls.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mu);
        ran_on.insert(std::this_thread::get_id());
      }
      for (int64_t e = c.begin; e < c.end; ++e) {
        seen[static_cast<size_t>(c.item == 0 ? e : n + e)].fetch_add(1);
      }
    });
    EXPECT_EQ(calls.load(), static_cast<int64_t>(chunks.size()));
    // A team of min(threads, chunks) threads, each with its static share.
    EXPECT_EQ(ran_on.size(), static_cast<size_t>(std::min<int64_t>(threads, chunks.size())))
        << threads << " threads";
    for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e].load(), 1) << e << ", " << threads;
  }
}

}  // namespace
}  // namespace cpu
}  // namespace muon
