// ZeRO-2 replicated mode: each rank passes its own gradient; the engine
// averages them with one reduce-scatter per block of same-shape parameters,
// steps each parameter on one owner (keeping its momentum only there) and
// all-gathers the new values. Equal, bit for bit, to single-process Muon on
// the averaged gradient.
#include <dlpack/dlpack.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

struct P {
  std::string name;
  int64_t rows, cols;
};

const std::vector<P>& Model() {
  static const std::vector<P> m = {{"a", 8, 6}, {"b", 8, 6}, {"c", 8, 6}, {"d", 8, 6},
                                   {"e", 8, 6}, {"f", 8, 6}, {"g", 5, 7}, {"h", 5, 7},
                                   {"i", 5, 7}};
  return m;
}

// With `split`: "a" in two row blocks of 2 repeating (NorMuon and the lr
// adjustment per block), "g" in column blocks of 3 and 4.
void SplitSome(muon_param_options_t* po, const std::string& name, bool split) {
  static const int64_t rows[] = {2, 2}, cols[] = {3, 4};
  if (!split || (name != "a" && name != "g")) return;
  po->split_dim = name == "a" ? 0 : 1;
  po->num_split_sizes = 2;
  po->split_sizes = name == "a" ? rows : cols;
}

float RankGrad(const std::string& name, int64_t i, int step, int rank) {
  return GradValue(name, i, step) * (1.0f + 0.25f * rank) + 0.01f * rank;
}

constexpr int kSteps = 10;

DLTensor Matrix(float* data, int64_t* shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

// Single process, gradient = (sum over ranks in rank order) / n.
// Registers every Model() parameter as a ZeRO-2 replica over `group`: its
// value (the initial values) in (*w)[k], its gradient in (*g)[k], which the
// caller fills before each step; stops at the first failure.
muon_status_t RegisterModelZero2(muon_optimizer_t* opt, int32_t group,
                                 std::vector<std::vector<float>>* w,
                                 std::vector<std::vector<float>>* g,
                                 std::vector<std::vector<int64_t>>* shapes,
                                 bool split = false) {
  w->assign(Model().size(), {});
  g->assign(Model().size(), {});
  shapes->assign(Model().size(), {});
  for (size_t k = 0; k < Model().size(); ++k) {
    const P& p = Model()[k];
    (*w)[k].resize(p.rows * p.cols);
    (*g)[k].resize(p.rows * p.cols);
    for (int64_t i = 0; i < p.rows * p.cols; ++i) (*w)[k][i] = InitValue(p.name, i);
    (*shapes)[k] = {p.rows, p.cols};
    DLTensor wt = Matrix((*w)[k].data(), (*shapes)[k].data());
    DLTensor gt = Matrix((*g)[k].data(), (*shapes)[k].data());
    muon_placement_t rep{};
    rep.kind = MUON_PLACEMENT_REPLICATE;
    rep.group = group;
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = p.name.c_str();
    po.global_ndim = 2;
    po.global_shape = (*shapes)[k].data();
    po.num_placements = 1;
    po.placements = &rep;
    po.replicated_mode = MUON_REPLICATED_ZERO2;
    SplitSome(&po, p.name, split);
    int64_t id;
    const muon_status_t st = muon_register_param(opt, &wt, &gt, &po, &id);
    if (st != MUON_OK) return st;
  }
  return MUON_OK;
}

// The options of both sides: plain Muon, or NorMuon (whose moments live on
// each parameter's ZeRO-2 owner).
void Configure(muon_options_t* o, bool normuon, bool aol = false) {
  o->lr = 0.02;
  o->normuon = normuon ? 1 : 0;
  o->normuon_beta2 = 0.9;
  if (aol) {  // its pre-scaling on the owner's fp32 buffer, the reference's bf16 slots
    o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
    o->ns_steps = 4;
  }
}

std::vector<std::vector<float>> Reference(int n, bool normuon = false, bool split = false,
                                          bool aol = false) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  Configure(&o, normuon, aol);
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_OK);
  std::vector<std::vector<float>> w(Model().size()), g(Model().size());
  std::vector<std::vector<int64_t>> shapes(Model().size());
  for (size_t k = 0; k < Model().size(); ++k) {
    const P& p = Model()[k];
    w[k].resize(p.rows * p.cols);
    g[k].resize(p.rows * p.cols);
    for (int64_t i = 0; i < p.rows * p.cols; ++i) w[k][i] = InitValue(p.name, i);
    shapes[k] = {p.rows, p.cols};
    DLTensor wt = Matrix(w[k].data(), shapes[k].data()), gt = Matrix(g[k].data(), shapes[k].data());
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = p.name.c_str();
    SplitSome(&po, p.name, split);
    int64_t id;
    EXPECT_EQ(muon_register_param(opt, &wt, &gt, &po, &id), MUON_OK);
  }
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < Model().size(); ++k) {
      for (size_t i = 0; i < g[k].size(); ++i) {
        float sum = 0.0f;
        for (int r = 0; r < n; ++r) sum += RankGrad(Model()[k].name, i, s, r);
        g[k][i] = sum / static_cast<float>(n);
      }
    }
    EXPECT_EQ(muon_step(opt, nullptr), MUON_OK);
  }
  muon_destroy(opt);
  return w;
}

void ExpectMatchesSingleProcess(bool normuon, bool split = false, bool aol = false) {
  const int n = 4;
  const auto ref = Reference(n, normuon, split, aol);
  if (aol) {
    ASSERT_NE(ref, Reference(n, normuon, split)) << "AOL changed nothing";
  }
  if (normuon) {
    ASSERT_NE(ref, Reference(n, false, split)) << "normuon changed nothing";
  }
  if (split) {
    ASSERT_NE(ref, Reference(n, normuon)) << "the split changed nothing";
  }
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(n, &world), MUON_OK);
  std::vector<std::string> errors(n);
  std::vector<std::vector<std::vector<float>>> finals(n);
  std::vector<muon_stats_t> stats(n);
  std::vector<int> state_refusals(n, 0);
  auto body = [&](int rank) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    Configure(&o, normuon, aol);
    muon_optimizer_t* opt = nullptr;
    muon_create(&o, &opt);
    muon_comm_t comm;
    int32_t world_id;
    muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    muon_set_world(opt, &comm, &world_id);
    auto& w = finals[rank];
    std::vector<std::vector<float>> g;
    std::vector<std::vector<int64_t>> shapes;
    muon_status_t st = RegisterModelZero2(opt, world_id, &w, &g, &shapes, split);
    for (int s = 0; s < kSteps && st == MUON_OK; ++s) {
      for (size_t k = 0; k < Model().size(); ++k) {
        for (size_t i = 0; i < g[k].size(); ++i) g[k][i] = RankGrad(Model()[k].name, i, s, rank);
      }
      st = muon_step(opt, nullptr);
    }
    if (st != MUON_OK) errors[rank] = muon_last_error_message();
    muon_stats_init(&stats[rank], sizeof stats[rank]);
    muon_get_stats(opt, &stats[rank]);
    // Momentum lives on owners only: the others refuse to hand it out.
    for (size_t k = 0; k < Model().size(); ++k) {
      std::vector<float> buf(g[k].size());
      DLTensor t = Matrix(buf.data(), shapes[k].data());
      if (muon_get_state(opt, static_cast<int64_t>(k), &t) == MUON_FAILED_PRECONDITION) {
        ++state_refusals[rank];
      }
    }
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);

  int64_t orthogonalized = 0;
  int refusals = 0;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
    orthogonalized += stats[r].matrices_orthogonalized;
    refusals += state_refusals[r];
    EXPECT_EQ(stats[r].matrices_total, static_cast<int64_t>(Model().size()));
    EXPECT_EQ(stats[r].matrices_owned, stats[r].matrices_orthogonalized);
    // Two blocks of 4 and one of 2 (8x6), one of 3 (5x7): one reduce-scatter
    // and one all-gather per block; and the step verdicts' all_gather.
    EXPECT_EQ(stats[r].collectives, 2 * 3 + 1) << "rank " << r;
    for (size_t k = 0; k < Model().size(); ++k) {
      ASSERT_EQ(0, std::memcmp(finals[r][k].data(), ref[k].data(), ref[k].size() * sizeof(float)))
          << "rank " << r << " param " << Model()[k].name;
    }
  }
  EXPECT_EQ(orthogonalized, static_cast<int64_t>(Model().size()));
  // Each parameter's momentum is held by exactly one of the four ranks.
  EXPECT_EQ(refusals, static_cast<int>(Model().size()) * (n - 1));
}

TEST(Zero2, MatchesSingleProcessOnAveragedGradients) { ExpectMatchesSingleProcess(false); }

TEST(Zero2, NorMuonMatchesSingleProcessOnAveragedGradients) { ExpectMatchesSingleProcess(true); }
TEST(Zero2, AolMatchesSingleProcessOnAveragedGradients) {
  ExpectMatchesSingleProcess(false, false, true);
  ExpectMatchesSingleProcess(true, true, true);
}
TEST(Zero2, SplitBlocksMatchSingleProcessOnAveragedGradients) {
  ExpectMatchesSingleProcess(false, true);
  ExpectMatchesSingleProcess(true, true);
}

// World 4, one ZeRO-2 group {0, 1} holding every Muon parameter; ranks 2 and
// 3 register none and add no group (the header allows parameters that live
// on some ranks only). Every rank steps with MUON_OK; ranks 0 and 1 end
// equal, bit for bit, to single-process Muon on their averaged gradients.
TEST(Zero2, RanksOutsideTheOnlyZero2GroupStepToo) {
  const int n = 4, holders = 2;
  const auto ref = Reference(holders);
  // A rank left waiting on a collective is a failure, not a hang.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; })) {
      std::fprintf(stderr, "ZeRO-2 job with parameter-less ranks hung: some rank waits on a "
                           "collective the others never issue\n");
      std::_Exit(1);
    }
  });
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(n, &world), MUON_OK);
  std::vector<std::string> errors(n);
  std::vector<std::vector<muon_status_t>> statuses(n);
  std::vector<std::vector<std::vector<float>>> finals(n);
  std::vector<muon_stats_t> stats(n);
  auto body = [&](int rank) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    o.lr = 0.02;
    muon_optimizer_t* opt = nullptr;
    muon_create(&o, &opt);
    muon_comm_t comm;
    int32_t world_id;
    muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    muon_status_t st = muon_set_world(opt, &comm, &world_id);
    const bool holder = rank < holders;
    int32_t group_id = -1;
    if (holder && st == MUON_OK) {
      const int32_t members[] = {0, 1};
      muon_comm_t group;
      st = muon_inprocess_comm(world, members, holders, rank, &group);
      if (st == MUON_OK) st = muon_add_group(opt, &group, &group_id);
    }
    auto& w = finals[rank];
    std::vector<std::vector<float>> g;
    std::vector<std::vector<int64_t>> shapes;
    if (holder && st == MUON_OK) st = RegisterModelZero2(opt, group_id, &w, &g, &shapes);
    if (st != MUON_OK) errors[rank] = muon_last_error_message();
    for (int s = 0; s < kSteps && st == MUON_OK; ++s) {
      for (size_t k = 0; holder && k < Model().size(); ++k) {
        for (size_t i = 0; i < g[k].size(); ++i) g[k][i] = RankGrad(Model()[k].name, i, s, rank);
      }
      st = muon_step(opt, nullptr);
      statuses[rank].push_back(st);
      if (st != MUON_OK) errors[rank] = muon_last_error_message();
    }
    muon_stats_init(&stats[rank], sizeof stats[rank]);
    muon_get_stats(opt, &stats[rank]);
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();

  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
    // Every rank took every step, and every step said the same on each.
    ASSERT_EQ(statuses[r], std::vector<muon_status_t>(kSteps, MUON_OK)) << "rank " << r;
    // The plan is the job's: nine ZeRO-2 matrices on every rank, stepped by
    // the group's two ranks only.
    EXPECT_EQ(stats[r].matrices_total, static_cast<int64_t>(Model().size())) << "rank " << r;
  }
  int64_t owned = 0;
  for (int r = 0; r < holders; ++r) {
    owned += stats[r].matrices_owned;
    EXPECT_EQ(stats[r].matrices_orthogonalized, stats[r].matrices_owned) << "rank " << r;
    // Blocks of two: three of 8x6, two of 5x7, a reduce-scatter and an
    // all-gather each; and the step verdicts' all_gather on the world.
    EXPECT_EQ(stats[r].collectives, 2 * 5 + 1) << "rank " << r;
    ASSERT_EQ(finals[r].size(), Model().size());
    for (size_t k = 0; k < Model().size(); ++k) {
      ASSERT_EQ(0, std::memcmp(finals[r][k].data(), ref[k].data(), ref[k].size() * sizeof(float)))
          << "rank " << r << " param " << Model()[k].name;
    }
  }
  EXPECT_EQ(owned, static_cast<int64_t>(Model().size()));
  for (int r = holders; r < n; ++r) {
    EXPECT_EQ(stats[r].matrices_owned, 0) << "rank " << r;
    EXPECT_EQ(stats[r].matrices_orthogonalized, 0) << "rank " << r;
    // Only the step verdicts' all_gather: these ranks agree on each step.
    EXPECT_EQ(stats[r].collectives, 1) << "rank " << r;
  }
}

}  // namespace
}  // namespace muon_test
