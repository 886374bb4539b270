// Non-finite gradients (NaN, +-Inf), through the C API: counted in the
// stats by the momentum pass; stepped as torch does by default (the
// momentum of that element turns non-finite); with skip_nonfinite, a step
// where any rank saw one is skipped on every rank with nothing changed, and
// the run then continues as if the step had never been asked for.
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"

namespace muon_test {
namespace {

constexpr int kRows = 6, kCols = 4, kN = kRows * kCols;

DLTensor Tensor(float* data, int64_t* shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

float Grad(int step, int i) { return std::sin(0.37f * static_cast<float>(i + 11 * step)); }

struct Outcome {
  std::vector<float> param, momentum;
  muon_stats_t stats{};
  std::vector<muon_status_t> statuses;
  int64_t step_count = -1;
};

// One process: steps with the gradients of `steps` (a NaN at element 5 and an
// Inf at element 9 on the steps listed in `bad`).
Outcome Single(int skip, const std::vector<int>& steps, const std::vector<int>& bad) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.lr = 0.02;
  o.ns_dtype = MUON_NS_DTYPE_FP32;
  o.skip_nonfinite = skip;
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_OK);
  Outcome r;
  r.param.assign(kN, 0.0f);
  for (int i = 0; i < kN; ++i) r.param[i] = 0.1f * static_cast<float>(i % 7);
  std::vector<float> grad(kN);
  int64_t shape[2] = {kRows, kCols};
  DLTensor v = Tensor(r.param.data(), shape), g = Tensor(grad.data(), shape);
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = "w";
  int64_t id = -1;
  EXPECT_EQ(muon_register_param(opt, &v, &g, &po, &id), MUON_OK);
  for (int s : steps) {
    for (int i = 0; i < kN; ++i) grad[i] = Grad(s, i);
    for (int b : bad) {
      if (b == s) {
        grad[5] = std::numeric_limits<float>::quiet_NaN();
        grad[9] = std::numeric_limits<float>::infinity();
      }
    }
    r.statuses.push_back(muon_step(opt, nullptr));
  }
  r.momentum.assign(kN, 0.0f);
  DLTensor m = Tensor(r.momentum.data(), shape);
  EXPECT_EQ(muon_get_state(opt, id, &m), MUON_OK);
  muon_stats_init(&r.stats, sizeof r.stats);
  muon_get_stats(opt, &r.stats);
  muon_step_count(opt, &r.step_count);
  muon_destroy(opt);
  return r;
}

TEST(NonFinite, CountedAndSteppedAsTorchByDefault) {
  const Outcome r = Single(0, {0, 1}, {1});
  EXPECT_EQ(r.statuses, (std::vector<muon_status_t>{MUON_OK, MUON_OK}));
  EXPECT_EQ(r.stats.nonfinite_grads, 2);  // the NaN and the Inf of the last step
  EXPECT_EQ(r.stats.steps_skipped, 0);
  EXPECT_TRUE(std::isnan(r.momentum[5]));  // lerp(m, NaN) stays NaN, as in torch
  EXPECT_TRUE(std::isinf(r.momentum[9]));
  EXPECT_TRUE(std::isfinite(r.momentum[0]));
  const Outcome clean = Single(0, {0}, {});
  EXPECT_EQ(clean.stats.nonfinite_grads, 0);
}

TEST(NonFinite, SkippedWithNothingChangedAndTheRunGoesOn) {
  // Steps 0, 1 (bad: skipped), 2 equal steps 0, 2 of a run never given step 1.
  const Outcome skipped = Single(1, {0, 1, 2}, {1});
  const Outcome without = Single(1, {0, 2}, {});
  EXPECT_EQ(skipped.statuses, (std::vector<muon_status_t>{MUON_OK, MUON_OK, MUON_OK}));
  EXPECT_EQ(skipped.stats.steps_skipped, 1);
  EXPECT_EQ(skipped.step_count, 2);  // the skipped step is not counted
  EXPECT_EQ(0, std::memcmp(skipped.param.data(), without.param.data(), kN * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(skipped.momentum.data(), without.momentum.data(), kN * sizeof(float)));
  const Outcome one = Single(1, {0, 1}, {1});
  EXPECT_EQ(one.stats.nonfinite_grads, 2);
}

TEST(NonFinite, OneRanksNanSkipsTheStepOnEveryRank) {
  const int n = 4;
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(n, &world), MUON_OK);
  std::vector<std::vector<float>> before(n), after(n);
  std::vector<muon_stats_t> stats(n);
  std::vector<std::string> errors(n);
  auto body = [&](int rank) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    o.skip_nonfinite = 1;
    o.ns_dtype = MUON_NS_DTYPE_FP32;
    muon_optimizer_t* opt = nullptr;
    muon_create(&o, &opt);
    muon_comm_t comm;
    muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    int32_t wid = -1;
    muon_set_world(opt, &comm, &wid);
    std::vector<float> param, grad;
    // Rank r holds rows [r * rows/n ...): kRows 6 over 4 ranks, chunked.
    const int64_t step = (kRows + n - 1) / n;
    const int64_t r0 = std::min<int64_t>(rank * step, kRows);
    const int64_t rows = std::min<int64_t>(step, kRows - r0);
    param.assign(static_cast<size_t>(rows * kCols), 0.25f);
    grad.assign(param.size(), 0.5f);
    if (rank == 2 && !grad.empty()) grad[1] = std::nanf("");
    int64_t local[2] = {rows, kCols}, global[2] = {kRows, kCols};
    DLTensor v = Tensor(param.data(), local), g = Tensor(grad.data(), local);
    muon_placement_t pl;
    std::memset(&pl, 0, sizeof pl);
    pl.kind = MUON_PLACEMENT_SHARD;
    pl.group = wid;
    pl.dim = 0;
    pl.split = MUON_SPLIT_CHUNK;
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = "w";
    po.global_ndim = 2;
    po.global_shape = global;
    po.num_placements = 1;
    po.placements = &pl;
    int64_t id = -1;
    muon_status_t st = muon_register_param(opt, &v, &g, &po, &id);
    before[rank] = param;
    if (st == MUON_OK) st = muon_step(opt, nullptr);
    if (st != MUON_OK) errors[rank] = muon_last_error_message();
    after[rank] = param;
    muon_stats_init(&stats[rank], sizeof stats[rank]);
    muon_get_stats(opt, &stats[rank]);
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
    EXPECT_EQ(stats[r].steps_skipped, 1) << "rank " << r;
    EXPECT_EQ(stats[r].nonfinite_grads, r == 2 ? 1 : 0) << "rank " << r;
    EXPECT_EQ(after[r], before[r]) << "rank " << r << ": nothing may change";
  }
}

TEST(NonFinite, AnOlderCallersShorterStatsStructGetsTheFieldsItHas) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  muon_optimizer_t* opt = nullptr;
  ASSERT_EQ(muon_create(&o, &opt), MUON_OK);
  // The 0.3 struct ended after matrices_owned (80 bytes); what follows it in
  // the caller's memory must stay untouched.
  unsigned char buf[sizeof(muon_stats_t) + 16];
  std::memset(buf, 0xAB, sizeof buf);
  const size_t v1 = offsetof(muon_stats_t, nonfinite_grads);
  ASSERT_EQ(muon_stats_init(reinterpret_cast<muon_stats_t*>(buf), v1), MUON_OK);
  ASSERT_EQ(muon_get_stats(opt, reinterpret_cast<muon_stats_t*>(buf)), MUON_OK);
  for (size_t i = v1; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xAB) << "byte " << i;
  // Shorter than that is refused, naming the struct.
  muon_stats_t small;
  EXPECT_EQ(muon_stats_init(&small, v1 - 8), MUON_INVALID_ARGUMENT);
  EXPECT_NE(std::string(muon_last_error_message()).find("stats"), std::string::npos);
  muon_destroy(opt);
}

// Found by fuzz/api_sequence_fuzzer: with the option, a device code DLPack
// does not define was loaded as the enum (undefined behaviour) before the
// tensor was checked; it is refused like any unknown code. (CUDA parameters
// with the option: tests/distributed/strict_gpu_test.)
TEST(NonFinite, AnUnknownDeviceCodeIsRefusedWithTheOption) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.skip_nonfinite = 1;
  muon_optimizer_t* opt = nullptr;
  ASSERT_EQ(muon_create(&o, &opt), MUON_OK);
  float fake_value[kN], fake_grad[kN];  // never read: the registration stops first
  int64_t shape[2] = {kRows, kCols};
  DLTensor v = Tensor(fake_value, shape), g = Tensor(fake_grad, shape);
  int32_t unknown = 99;
  std::memcpy(&v.device.device_type, &unknown, sizeof unknown);
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = "w";
  int64_t id = -1;
  EXPECT_EQ(muon_register_param(opt, &v, &g, &po, &id), MUON_INVALID_ARGUMENT);
  const std::string msg = muon_last_error_message();
  EXPECT_NE(msg.find("DLPack device type 99"), std::string::npos) << msg;
  EXPECT_EQ(id, -1);
  muon_destroy(opt);
}

// skip_nonfinite_updates: finite gradients, an update that overflows on its
// owner only (coefficients that blow up every matrix but a zero one), and
// every rank keeps its parameters; without the guard the overflow lands.
struct GuardRun {
  std::vector<std::vector<float>> a, b;  // per rank, after the step
  std::vector<muon_stats_t> stats;
  std::vector<std::string> errors;
};

GuardRun RunGuard(int guard) {
  const int n = 2;
  muon_inprocess_world_t* world = nullptr;
  EXPECT_EQ(muon_inprocess_world_create(n, &world), MUON_OK);
  GuardRun run;
  run.a.resize(n);
  run.b.resize(n);
  run.stats.resize(n);
  run.errors.resize(n);
  auto body = [&](int rank) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    o.ns_dtype = MUON_NS_DTYPE_FP32;
    o.ns_a = 1e30;  // X grows by 1e30 an iteration: inf by the second
    o.ns_b = 0.0;
    o.ns_c = 0.0;
    o.ns_steps = 3;
    o.skip_nonfinite_updates = guard;
    muon_optimizer_t* opt = nullptr;
    muon_create(&o, &opt);
    muon_comm_t comm;
    muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    int32_t wid = -1;
    muon_set_world(opt, &comm, &wid);
    std::vector<float>& a = run.a[rank];
    std::vector<float>& b = run.b[rank];
    a.assign(kN, 0.25f);
    b.assign(kN, 0.25f);
    std::vector<float> ga(kN, 0.0f), gb(kN);
    for (int i = 0; i < kN; ++i) gb[i] = Grad(0, i);
    int64_t shape[2] = {kRows, kCols};
    muon_placement_t pl;
    std::memset(&pl, 0, sizeof pl);
    pl.kind = MUON_PLACEMENT_REPLICATE;
    pl.group = wid;
    muon_status_t st = MUON_OK;
    for (auto [name, v, g] : {std::make_tuple("a", &a, &ga), std::make_tuple("b", &b, &gb)}) {
      DLTensor vt = Tensor(v->data(), shape), gt = Tensor(g->data(), shape);
      muon_param_options_t po;
      muon_param_options_init(&po, sizeof po);
      po.name = name;
      po.global_ndim = 2;
      po.global_shape = shape;
      po.num_placements = 1;
      po.placements = &pl;
      int64_t id = -1;
      if (st == MUON_OK) st = muon_register_param(opt, &vt, &gt, &po, &id);
    }
    if (st == MUON_OK) st = muon_step(opt, nullptr);
    if (st != MUON_OK) run.errors[rank] = muon_last_error_message();
    muon_stats_init(&run.stats[rank], sizeof run.stats[rank]);
    muon_get_stats(opt, &run.stats[rank]);
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  return run;
}

TEST(NonFiniteUpdates, OneOwnersOverflowSkipsTheUpdateOnEveryRank) {
  const GuardRun off = RunGuard(0);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(off.errors[r].empty()) << off.errors[r];
    EXPECT_FALSE(std::all_of(off.b[r].begin(), off.b[r].end(),
                             [](float x) { return std::isfinite(x); }))
        << "the premise: without the guard the overflow lands";
    EXPECT_TRUE(std::all_of(off.a[r].begin(), off.a[r].end(),
                            [](float x) { return std::isfinite(x); }));
    EXPECT_EQ(off.stats[r].matrices_owned, 1) << "each rank owns one of the two";
  }
  const GuardRun on = RunGuard(1);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(on.errors[r].empty()) << "rank " << r << ": " << on.errors[r];
    EXPECT_EQ(on.stats[r].steps_skipped, 1) << "rank " << r;
    EXPECT_EQ(on.stats[r].steps, 1) << "the momentum stepped: the step counts";
    EXPECT_EQ(on.a[r], std::vector<float>(kN, 0.25f)) << "rank " << r;
    EXPECT_EQ(on.b[r], std::vector<float>(kN, 0.25f)) << "rank " << r;
  }
}

}  // namespace
}  // namespace muon_test
