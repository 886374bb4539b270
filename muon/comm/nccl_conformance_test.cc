// The NCCL adapter over the stand-in libnccl.so.2 at several ranks (threads
// of one clique): the conformance suite, and the stand-in's strictness (a
// call that does not pair up fails on every rank instead of hanging).
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
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

  // Runs body(rank, table) on n threads, each with its adapter table over
  // one rank of a fresh clique.
  template <typename Body>
  void OnClique(int n, Body body) {
    void* clique = create_(n);
    testranks::OnThreads(n, [&](int rank) {
      FakeComm comm{rank, n, clique};
      muon_comm_t table;
      const absl::Status made = MakeNcclComm(&comm, &table);
      ASSERT_TRUE(made.ok()) << made;
      body(rank, table);
      table.release(table.ctx);
    });
    destroy_(clique);
  }

 private:
  void* handle_ = nullptr;
  void* (*create_)(int) = nullptr;
  void (*destroy_)(void*) = nullptr;
};

TEST(NcclConformance, TheAdapterOverACliqueOfTwoToFour) {
  Fake fake;
  ASSERT_TRUE(fake.ok()) << "FAKE_NCCL names the stand-in libnccl.so.2";
  for (int n = 2; n <= 4; ++n) {
    std::vector<std::vector<std::string>> failures(n);
    fake.OnClique(n, [&](int rank, const muon_comm_t& table) {
      failures[rank] = RunConformance(table);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(failures[r].empty())
          << n << " ranks, rank " << r << ":\n" << absl::StrJoin(failures[r], "\n");
    }
  }
}

TEST(NcclConformance, CallsThatDoNotPairUpFailOnEveryRank) {
  Fake fake;
  ASSERT_TRUE(fake.ok());
  std::vector<muon_status_t> gather(3), a2a(2);
  fake.OnClique(3, [&](int rank, const muon_comm_t& table) {
    std::vector<char> send(8), recv(24);
    // Rank 2 gathers 8 bytes, the others 4.
    gather[rank] = table.all_gather(table.ctx, send.data(), recv.data(), rank == 2 ? 8 : 4,
                                    nullptr);
  });
  for (int r = 0; r < 3; ++r) EXPECT_NE(gather[r], MUON_OK) << "rank " << r;
  fake.OnClique(2, [&](int rank, const muon_comm_t& table) {
    // Rank 0 sends 3 bytes to rank 1, which expects 4.
    std::vector<char> send(8), recv(8);
    size_t sb[2] = {0, 3}, so[2] = {0, 0}, rb[2] = {rank == 1 ? size_t{4} : 0, 0}, ro[2] = {0, 0};
    if (rank == 1) sb[1] = 0;
    a2a[rank] = table.all_to_all_v(table.ctx, send.data(), sb, so, recv.data(), rb, ro, nullptr);
  });
  EXPECT_NE(a2a[0], MUON_OK);
  EXPECT_NE(a2a[1], MUON_OK);
}

}  // namespace
}  // namespace muon
