// The NCCL adapter over the stand-in libnccl.so.2 at several ranks (threads
// of one clique): the conformance suite, and the stand-in's strictness (calls
// that do not pair up fail on every rank instead of hanging or moving
// garbage, and the clique serves on after a refused call).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "muon/comm/callback_error.h"
#include "muon/comm/nccl_comm.h"
#include "muon/comm/testing/conformance.h"
#include "muon/testing/ranks.h"

namespace muon {
namespace {

struct FakeComm {  // as in fake_nccl.cc
  int rank;
  int size;
  void* clique;
};

class Fake {
 public:
  Fake() {
    const char* path = std::getenv("FAKE_NCCL");
    std::string lib = path != nullptr ? path : "";
    if (lib.find('/') == std::string::npos) lib = "./" + lib;
    handle_ = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) return;
    create_ = reinterpret_cast<void* (*)(int)>(dlsym(handle_, "fake_nccl_clique_create"));
    destroy_ = reinterpret_cast<void (*)(void*)>(dlsym(handle_, "fake_nccl_clique_destroy"));
  }
  bool ok() const { return create_ != nullptr && destroy_ != nullptr; }

  // Runs body(thread, table) on one thread per entry of `cliques`, each a
  // list of threads: thread cliques[c][k] gets rank k of clique c, through
  // the adapter's table over it.
  template <typename Body>
  void OnCliques(const std::vector<std::vector<int>>& cliques, Body body) {
    int threads = 0;
    std::vector<void*> made;
    std::vector<FakeComm> comms;
    for (const std::vector<int>& members : cliques) {
      made.push_back(create_(static_cast<int>(members.size())));
      threads += static_cast<int>(members.size());
    }
    comms.resize(threads);
    for (size_t c = 0; c < cliques.size(); ++c) {
      for (size_t k = 0; k < cliques[c].size(); ++k) {
        comms[cliques[c][k]] = {static_cast<int>(k), static_cast<int>(cliques[c].size()), made[c]};
      }
    }
    testranks::OnThreads(threads, [&](int thread) {
      muon_comm_t table;
      const absl::Status status = MakeNcclComm(&comms[thread], &table);
      ASSERT_TRUE(status.ok()) << status;
      body(thread, table);
      table.release(table.ctx);
    });
    for (void* clique : made) destroy_(clique);
  }

  // One clique of n ranks, thread k being rank k.
  template <typename Body>
  void OnClique(int n, Body body) {
    std::vector<int> members;
    for (int k = 0; k < n; ++k) members.push_back(k);
    OnCliques({members}, body);
  }

 private:
  void* handle_ = nullptr;
  void* (*create_)(int) = nullptr;
  void (*destroy_)(void*) = nullptr;
};

void ExpectConforms(Fake& fake, const std::vector<std::vector<int>>& cliques, int threads) {
  std::vector<std::vector<std::string>> failures(threads);
  fake.OnCliques(cliques, [&](int thread, const muon_comm_t& table) {
    failures[thread] = RunConformance(table);
  });
  for (int k = 0; k < threads; ++k) {
    EXPECT_TRUE(failures[k].empty()) << "thread " << k << ":\n" << absl::StrJoin(failures[k], "\n");
  }
}

TEST(NcclConformance, TheAdapterOverACliqueOfOneToFive) {
  Fake fake;
  ASSERT_TRUE(fake.ok()) << "FAKE_NCCL names the stand-in libnccl.so.2";
  for (int n = 1; n <= 5; ++n) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    std::vector<int> members;
    for (int k = 0; k < n; ++k) members.push_back(k);
    ExpectConforms(fake, {members}, n);
  }
}

TEST(NcclConformance, TwoCliquesSideBySide) {
  Fake fake;
  ASSERT_TRUE(fake.ok());
  // Threads 4, 1, 3 are ranks 0, 1, 2 of one clique; threads 2, 0 of another.
  ExpectConforms(fake, {{4, 1, 3}, {2, 0}}, 5);
}

// Runs `call` on every rank of an n-rank clique and returns each rank's
// status, then checks that the clique still serves (or, when `broken`, that
// it refuses every later call).
std::vector<muon_status_t> OnEveryRank(
    Fake& fake, int n, const std::function<muon_status_t(int, const muon_comm_t&)>& call,
    bool broken = false) {
  std::vector<muon_status_t> status(n), after(n);
  std::vector<std::string> why(n);
  fake.OnClique(n, [&](int rank, const muon_comm_t& table) {
    status[rank] = call(rank, table);
    why[rank] = TakeCallbackError();
    char send = static_cast<char>(rank), recv[8] = {};
    after[rank] = table.all_gather(table.ctx, &send, recv, 1, nullptr);
    if (after[rank] == MUON_OK) {
      for (int r = 0; r < n; ++r) EXPECT_EQ(recv[r], r);
    }
  });
  for (int r = 0; r < n; ++r) {
    std::printf("  rank %d: %s\n", r, why[r].c_str());
    EXPECT_NE(status[r], MUON_OK) << "rank " << r;
    EXPECT_FALSE(why[r].empty()) << "rank " << r;
    EXPECT_EQ(after[r] == MUON_OK, !broken) << "rank " << r << ": " << why[r];
  }
  return status;
}

TEST(NcclConformance, CollectivesThatDoNotMatchFailOnEveryRank) {
  Fake fake;
  ASSERT_TRUE(fake.ok());
  // all_gather: rank 2 gathers 8 bytes, the others 4.
  OnEveryRank(fake, 3, [](int rank, const muon_comm_t& t) {
    std::vector<char> send(8), recv(24);
    return t.all_gather(t.ctx, send.data(), recv.data(), rank == 2 ? 8 : 4, nullptr);
  });
  // broadcast: the ranks name different roots.
  OnEveryRank(fake, 3, [](int rank, const muon_comm_t& t) {
    char buf[4] = {};
    return t.broadcast(t.ctx, buf, 4, rank == 1 ? 1 : 0, nullptr);
  });
  // reduce_scatter: rank 0 float32, rank 1 bfloat16 (the same count).
  OnEveryRank(fake, 2, [](int rank, const muon_comm_t& t) {
    std::vector<char> send(32), recv(16);
    return t.reduce_scatter(t.ctx, send.data(), recv.data(), 2,
                            rank == 0 ? MUON_DTYPE_FLOAT32 : MUON_DTYPE_BFLOAT16, nullptr);
  });
  // all_gather whose send overlaps the receive buffer other than in place.
  OnEveryRank(fake, 2, [](int rank, const muon_comm_t& t) {
    std::vector<char> recv(16);
    return t.all_gather(t.ctx, recv.data() + (rank == 0 ? 1 : 8), recv.data(), 8, nullptr);
  });
}

TEST(NcclConformance, SendsAndReceivesThatDoNotPairUpFailOnBothSides) {
  Fake fake;
  ASSERT_TRUE(fake.ok());
  // Rank 0 sends 3 bytes to rank 1, which expects 4.
  OnEveryRank(fake, 2, [](int rank, const muon_comm_t& t) {
    std::vector<char> send(8), recv(8);
    size_t sb[2] = {0, rank == 0 ? size_t{3} : 0}, so[2] = {0, 0};
    size_t rb[2] = {rank == 1 ? size_t{4} : 0, 0}, ro[2] = {0, 0};
    return t.all_to_all_v(t.ctx, send.data(), sb, so, recv.data(), rb, ro, nullptr);
  });
}

TEST(NcclConformance, CallsWithoutACounterpartBreakTheCliqueInsteadOfHanging) {
  Fake fake;
  ASSERT_TRUE(fake.ok());
  // Rank 0 gathers while rank 1 exchanges with it.
  OnEveryRank(
      fake, 2,
      [](int rank, const muon_comm_t& t) {
        std::vector<char> send(8), recv(16);
        if (rank == 0) return t.all_gather(t.ctx, send.data(), recv.data(), 8, nullptr);
        size_t sb[2] = {4, 0}, so[2] = {0, 0}, rb[2] = {4, 0}, ro[2] = {0, 0};
        return t.all_to_all_v(t.ctx, send.data(), sb, so, recv.data(), rb, ro, nullptr);
      },
      /*broken=*/true);
  // Rank 1 expects bytes that rank 0 never sends (rank 0 moves nothing, so
  // its all_to_all_v returns at once; its barrier then meets rank 1 waiting).
  OnEveryRank(
      fake, 2,
      [](int rank, const muon_comm_t& t) {
        std::vector<char> send(8), recv(8);
        size_t sb[2] = {0, 0}, so[2] = {0, 0}, rb[2] = {rank == 1 ? size_t{4} : 0, 0}, ro[2] = {0, 0};
        const muon_status_t st = t.all_to_all_v(t.ctx, send.data(), sb, so, recv.data(), rb, ro, nullptr);
        return rank == 1 ? st : t.barrier(t.ctx, nullptr);
      },
      /*broken=*/true);
}

}  // namespace
}  // namespace muon
