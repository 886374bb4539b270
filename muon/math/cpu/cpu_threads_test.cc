#include "muon/math/cpu/cpu_threads.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace cpu {
namespace {

TEST(CpuThreads, TheRule) {
  EXPECT_EQ(ThreadsPerRank(2, 1, 1, 0), 2);   // one rank: every core
  EXPECT_EQ(ThreadsPerRank(2, 4, 1, 0), 1);   // more ranks than cores: one each
  EXPECT_EQ(ThreadsPerRank(16, 4, 1, 0), 4);  // divided
  EXPECT_EQ(ThreadsPerRank(16, 3, 1, 0), 5);  // rounded down
  EXPECT_EQ(ThreadsPerRank(64, 1, 8, 0), 8);  // 8 processes on the machine
  EXPECT_EQ(ThreadsPerRank(64, 2, 8, 0), 4);
  EXPECT_EQ(ThreadsPerRank(64, 0, 0, 0), 64);  // nothing counted: the whole machine
  EXPECT_EQ(ThreadsPerRank(2, 4, 1, 6), 6);    // MUON_CPU_THREADS wins
  EXPECT_EQ(ThreadsPerRank(2, 4, 1, 6, 1), 6);  // over OMP_NUM_THREADS too
  EXPECT_EQ(ThreadsPerRank(16, 1, 1, 0, 4), 4);  // OMP_NUM_THREADS caps the share
  EXPECT_EQ(ThreadsPerRank(16, 4, 1, 0, 8), 4);  // and never raises it
  EXPECT_EQ(ThreadsPerRank(64, 1, 8, 0, 1), 1);  // torchrun's default of 1
}

TEST(CpuThreads, JoinedRanksAndTheEnvironmentDivide) {
  ::unsetenv("MUON_CPU_THREADS");
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::unsetenv("OMP_NUM_THREADS");
  const int alone = ThreadsPerRankHere();
  EXPECT_GE(alone, 1);
  {
    std::vector<std::unique_ptr<RankShare>> ranks;
    for (int i = 0; i < 2 * alone + 1; ++i) ranks.push_back(std::make_unique<RankShare>());
    EXPECT_EQ(ThreadsPerRankHere(), alone);  // backends that joined no world divide nothing
    for (int i = 0; i < 2 * alone + 1; ++i) ranks[i]->Join(i);
    EXPECT_EQ(ThreadsPerRankHere(), 1);  // more ranks than cores
  }
  EXPECT_EQ(ThreadsPerRankHere(), alone);  // they left when destroyed
  {
    // One rank's several optimizers (one per param group) count once.
    std::vector<std::unique_ptr<RankShare>> groups;
    for (int i = 0; i < 2 * alone + 1; ++i) {
      groups.push_back(std::make_unique<RankShare>());
      groups.back()->Join(7);
    }
    EXPECT_EQ(ThreadsPerRankHere(), alone);
    RankShare other;
    other.Join(8);
    other.Join(9);  // a second Join changes nothing
    EXPECT_EQ(ThreadsPerRankHere(), std::max(1, alone / 2));
    groups.pop_back();
    EXPECT_EQ(ThreadsPerRankHere(), std::max(1, alone / 2));  // rank 7 has others left
  }
  RankShare one;
  one.Join(0);
  EXPECT_EQ(ThreadsPerRankHere(), alone);
  {
    RankShare two, three;  // oneDNN's count does not follow the ranks
    two.Join(1);
    three.Join(2);
    EXPECT_EQ(NativeThreadsHere(), alone);
  }
  ::setenv("LOCAL_WORLD_SIZE", "1000", 1);
  EXPECT_EQ(ThreadsPerRankHere(), 1);
  ::setenv("LOCAL_WORLD_SIZE", "garbage", 1);  // not a count: ignored
  EXPECT_EQ(ThreadsPerRankHere(), alone);
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::setenv("OMP_NUM_THREADS", "1", 1);  // the cap, on both
  EXPECT_EQ(ThreadsPerRankHere(), 1);
  EXPECT_EQ(NativeThreadsHere(), 1);
  ::setenv("MUON_CPU_THREADS", "3", 1);
  EXPECT_EQ(ThreadsPerRankHere(), 3);
  EXPECT_EQ(NativeThreadsHere(), 3);
  ::unsetenv("MUON_CPU_THREADS");
  ::unsetenv("OMP_NUM_THREADS");
}

// OpenBLAS stays at one thread per call (blas_tiles.h runs the tiles on
// the thread count given, per calling thread).
TEST(CpuThreads, UseThreadsSetsOpenMpAndTheTilesThreads) {
  UseThreads(3, 2);
  EXPECT_EQ(omp_get_max_threads(), 2);
  EXPECT_EQ(TileThreads(), 3);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  int other = 0;
  std::thread([&] { other = TileThreads(); }).join();
  EXPECT_EQ(other, 1) << "another thread's count follows this one's";
  UseThreads(1, 1);
  EXPECT_EQ(omp_get_max_threads(), 1);
  EXPECT_EQ(TileThreads(), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

// Core slots make joined ranks take turns: a rank that wants slots waits
// while others hold all the cores; with fewer than two ranks joined nothing
// is held or waited for.
TEST(CpuThreads, CoreSlotsTakeTurnsOnlyAmongJoinedRanks) {
  {
    CoreSlots a(1 << 20), b(1 << 20);  // no ranks joined: neither waits
    RankShare lone;
    lone.Join(0);
    CoreSlots c(1 << 20);  // one rank: still nothing held
  }
  RankShare r0, r1;
  r0.Join(0);
  r1.Join(1);
  auto all = std::make_unique<CoreSlots>(1 << 20);  // every core of the process
  std::atomic<bool> entered{false};
  std::thread other([&] {
    const CoreSlots one(1);
    entered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(entered.load());  // waits while every slot is held
  all.reset();
  other.join();
  EXPECT_TRUE(entered.load());
}

}  // namespace
}  // namespace cpu
}  // namespace muon
