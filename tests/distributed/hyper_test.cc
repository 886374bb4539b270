// Ranks that step with different hyper-parameters fail on every rank with
// both values named: at the first step's setup (created with different
// options) and at any later step (one rank's schedule moved on alone).
#include <dlpack/dlpack.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Hyper, RanksCreatedWithDifferentValuesFailTheFirstStep) {
  const std::vector<TParam> model = {
      {"w", {12, 8}, MUON_MATRIX_VIEW_2D, {Shard(0, 0), Flat(1)}, nullptr},
  };
  RunConfig cfg;
  cfg.steps = 1;
  cfg.mutate_options = [](int rank, muon_options_t* o) {
    if (rank == 2) o->lr = 0.01;         // the others: 0.02
    if (rank == 3) o->momentum = 0.9;    // the others: 0.95
  };
  const auto res = RunDistributed(model, Mesh{{2, 2}}, cfg);
  for (size_t r = 0; r < res.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(Has(res[r].error, "INVALID_ARGUMENT")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "different hyper-parameters")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "rank 0 has lr=0.02")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "rank 2 has lr=0.01")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "rank 3 has lr=0.02")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "momentum=0.9,")) << res[r].error;
    EXPECT_EQ(res[r].stats.steps, 0);  // refused before anything changed
  }
}

TEST(Hyper, OneRanksScheduleMovingAloneFailsThatStepOnEveryRank) {
  const int n = 3;
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(n, &world), MUON_OK);
  std::vector<std::vector<muon_status_t>> statuses(n);
  std::vector<std::string> messages(n);
  auto body = [&](int rank) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    o.lr = 0.02;
    o.ns_dtype = MUON_NS_DTYPE_FP32;
    muon_optimizer_t* opt = nullptr;
    muon_create(&o, &opt);
    muon_comm_t comm;
    muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    int32_t wid = -1;
    muon_set_world(opt, &comm, &wid);
    std::vector<float> value(2 * 5, 0.5f), grad(2 * 5, 0.25f);
    int64_t local[2] = {2, 5}, global[2] = {6, 5};
    DLTensor v{}, g{};
    for (DLTensor* t : {&v, &g}) {
      t->device = {kDLCPU, 0};
      t->ndim = 2;
      t->dtype = {kDLFloat, 32, 1};
      t->shape = local;
    }
    v.data = value.data();
    g.data = grad.data();
    muon_placement_t pl;
    std::memset(&pl, 0, sizeof pl);
    pl.kind = MUON_PLACEMENT_SHARD;
    pl.group = wid;
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = "w";
    po.global_ndim = 2;
    po.global_shape = global;
    po.num_placements = 1;
    po.placements = &pl;
    int64_t id = -1;
    muon_register_param(opt, &v, &g, &po, &id);
    statuses[rank].push_back(muon_step(opt, nullptr));
    if (rank == 1) muon_set_lr(opt, 0.005);  // this rank's schedule alone
    statuses[rank].push_back(muon_step(opt, nullptr));
    messages[rank] = muon_last_error_message();
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(statuses[r].size(), 2u);
    EXPECT_EQ(statuses[r][0], MUON_OK);
    EXPECT_EQ(statuses[r][1], MUON_INVALID_ARGUMENT);
    EXPECT_TRUE(Has(messages[r], "step 2: the ranks step with different hyper-parameters"))
        << messages[r];
    EXPECT_TRUE(Has(messages[r], "rank 0 has lr=0.02")) << messages[r];
    EXPECT_TRUE(Has(messages[r], "rank 1 has lr=0.005")) << messages[r];
  }
}

}  // namespace
}  // namespace muon_test
