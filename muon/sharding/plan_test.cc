// The job-wide plan from every rank's description: holders and their pieces,
// one unit per matrix with its owner among the holders, rounds within the
// memory budget, the same plan (digest) on every rank, and errors that name
// the parameter and the ranks.
#include "muon/sharding/plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/sharding/testing/job.h"

namespace muon {
namespace {

using testjob::DescribeRank;
using testjob::Flat;
using testjob::ParamSpec;
using testjob::Replicate;
using testjob::Shard;

std::vector<RankDesc> World(int n, const std::vector<ParamSpec>& params) {
  std::vector<RankDesc> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(DescribeRank(r, n, {}, params));
  return ranks;
}

Plan MustBuild(const std::vector<RankDesc>& ranks, int me, const PlanOptions& o = PlanOptions()) {
  absl::StatusOr<Plan> p = BuildPlan(ranks, me, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : Plan();
}

std::string Error(const std::vector<RankDesc>& ranks, const PlanOptions& o = PlanOptions()) {
  absl::StatusOr<Plan> p = BuildPlan(ranks, 0, o);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  return std::string(p.status().message());
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Plan, TensorParallelRowsOneUnitOwnedByAHolder) {
  const auto ranks = World(2, {{"w", {8, 4}, {Shard(0, 0)}}});
  const Plan p0 = MustBuild(ranks, 0), p1 = MustBuild(ranks, 1);
  EXPECT_EQ(p0.digest, p1.digest);
  ASSERT_EQ(p0.params.size(), 1u);
  const PlanParam& w = p0.params[0];
  EXPECT_EQ(w.rows, 8);
  EXPECT_EQ(w.cols, 4);
  ASSERT_EQ(w.holders.size(), 2u);
  EXPECT_EQ(w.holders[0].rank, 0);
  EXPECT_EQ(w.holders[1].rank, 1);
  EXPECT_EQ(w.holders[1].piece.runs.front().offset, 16);  // rows 4.. of 8 x 4
  EXPECT_EQ(w.local, 0);
  EXPECT_EQ(p1.params[0].local_holder, 1);
  ASSERT_EQ(p0.units.size(), 1u);
  EXPECT_EQ(p0.units[0].senders, (std::vector<int>{0, 1}));
  EXPECT_EQ(p0.units[0].receivers, (std::vector<int>{0, 1}));
  EXPECT_TRUE(p0.units[0].owner == 0 || p0.units[0].owner == 1);
  EXPECT_EQ(p0.rounds, 1);
}

TEST(Plan, ReplicasReceiveButOnlyTheCanonicalCopySends) {
  const auto ranks = World(3, {{"w", {5, 5}, {Replicate(0)}}});
  const Plan p = MustBuild(ranks, 2);
  ASSERT_EQ(p.units.size(), 1u);
  EXPECT_EQ(p.units[0].senders, (std::vector<int>{0}));
  EXPECT_EQ(p.units[0].receivers, (std::vector<int>{0, 1, 2}));
}

TEST(Plan, ParamsAreOrderedByNameAndBatchedViewsGiveOneUnitPerMatrix) {
  ParamSpec experts{"b.experts", {3, 4, 6}, {Replicate(0)}};
  experts.view = 2;  // BATCHED_LEADING: 3 matrices of 4 x 6
  ParamSpec conv{"a.conv", {4, 2, 3}, {Replicate(0)}};
  conv.view = 1;  // FLATTEN_TRAILING: one 4 x 6 matrix
  const Plan p = MustBuild(World(2, {experts, conv}), 0);
  ASSERT_EQ(p.params.size(), 2u);
  EXPECT_EQ(p.params[0].name, "a.conv");
  EXPECT_EQ(p.params[0].batch, 1);
  EXPECT_EQ(p.params[0].cols, 6);
  EXPECT_EQ(p.params[1].name, "b.experts");
  EXPECT_EQ(p.params[1].batch, 3);
  EXPECT_EQ(p.params[0].local, 1);  // registration order on the rank
  ASSERT_EQ(p.units.size(), 4u);
  EXPECT_EQ(p.units[0].param, 0);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(p.units[1 + k].param, 1);
    EXPECT_EQ(p.units[1 + k].index, k);
  }
}

TEST(Plan, BalancedAssignmentSpreadsEqualMatricesAndRoundRobinCycles) {
  std::vector<ParamSpec> params;
  for (int i = 0; i < 6; ++i) params.push_back({"m" + std::to_string(i), {8, 8}, {Replicate(0)}});
  const auto ranks = World(3, params);
  std::vector<int> per_rank(3, 0);
  for (const Unit& u : MustBuild(ranks, 0).units) ++per_rank[u.owner];
  EXPECT_EQ(per_rank, (std::vector<int>{2, 2, 2}));
  PlanOptions rr;
  rr.assignment = Assignment::kRoundRobin;
  std::vector<int> owners;
  for (const Unit& u : MustBuild(ranks, 0, rr).units) owners.push_back(u.owner);
  EXPECT_EQ(owners, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(Plan, RoundsFollowTheBudgetOrOneMatrixEachWithoutAsync) {
  std::vector<ParamSpec> params;
  for (int i = 0; i < 4; ++i) params.push_back({"m" + std::to_string(i), {8, 8}, {Replicate(0)}});
  const auto ranks = World(1, params);
  PlanOptions o;
  o.round_bytes = 2 * 8 * 8 * 4;  // two fp32 matrices per round
  Plan p = MustBuild(ranks, 0, o);
  EXPECT_EQ(p.rounds, 2);
  o.async_parallelism = false;
  p = MustBuild(ranks, 0, o);
  EXPECT_EQ(p.rounds, 4);
  for (size_t i = 0; i < p.units.size(); ++i) EXPECT_EQ(p.units[i].round, static_cast<int>(i));
}

TEST(Plan, CustomAssignmentMustNameAHolder) {
  // TP 2 x DP 2: group 1 = TP pairs {0,1},{2,3}; each matrix held by all four.
  std::vector<RankDesc> ranks;
  const ParamSpec w{"w", {4, 4}, {Replicate(2), Shard(1, 0)}};
  const ParamSpec e{"expert", {4, 4}, {}};
  for (int r = 0; r < 4; ++r) {
    std::vector<ParamSpec> mine = {w};
    if (r == 3) mine.push_back(e);  // only rank 3 holds the expert
    ranks.push_back(DescribeRank(r, 4, {{r / 2 * 2, r / 2 * 2 + 1}, {r % 2, r % 2 + 2}}, mine));
  }
  PlanOptions o;
  o.assignment = Assignment::kCustom;
  o.custom = [](const std::vector<MatrixInfo>& infos, std::vector<int>* owners) {
    for (size_t i = 0; i < infos.size(); ++i) (*owners)[i] = 1;  // rank 1 for everything
    return absl::OkStatus();
  };
  const std::string msg = Error(ranks, o);
  EXPECT_TRUE(Has(msg, "custom assignment: matrix 0 of param 'expert' was given to rank 1, "
                       "which holds no piece of it (holders: 3)"))
      << msg;
  o.custom = [](const std::vector<MatrixInfo>&, std::vector<int>*) {
    return absl::UnavailableError("the host said no");
  };
  absl::StatusOr<Plan> p = BuildPlan(ranks, 0, o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
}

TEST(Plan, InconsistentRegistrationsNameTheParamAndRanks) {
  auto ranks = World(2, {{"w", {8, 4}, {Shard(0, 0)}}});
  ranks[1].params[0].global_shape = {8, 5};
  EXPECT_TRUE(Has(Error(ranks), "param 'w': rank 0 registered global shape [8, 4] (view 0) but "
                                "rank 1 registered [8, 5]"));
  ranks = World(2, {{"w", {8, 4}, {Shard(0, 0)}}});
  ranks[1].params[0].state_dtype = 1;
  EXPECT_TRUE(Has(Error(ranks), "param 'w': ranks 0 and 1 registered it with different dtypes"));
  // Flat ranges that leave a gap.
  ranks = World(2, {});
  ranks[0].params.push_back(testjob::DescribeParam({"f", {4, 4}, {Flat(0, 0, 7)}}));
  ranks[1].params.push_back(testjob::DescribeParam({"f", {4, 4}, {Flat(0, 8, 8)}}));
  EXPECT_TRUE(Has(Error(ranks), "param 'f' (registered on ranks 0, 1)"));
  // A group whose members disagree.
  ranks = World(3, {});
  ranks[0].groups.push_back({0, 1});
  ranks[1].groups.push_back({1, 2});
  ranks[2].groups.push_back({1, 2});
  EXPECT_TRUE(Has(Error(ranks), "group 1 of rank 0 has members [0, 1], but rank 1 has no group "
                                "with these members"));
}

TEST(Plan, ZeroTwoAndCustomPathParamsStayOutOfTheUnits) {
  std::vector<RankDesc> ranks = World(2, {{"dense", {4, 4}, {Replicate(0)}}});
  for (RankDesc& r : ranks) {
    RankParamDesc z = testjob::DescribeParam({"z", {3, 4, 4}, {Replicate(0)}, 2});
    z.zero2 = 1;
    r.params.push_back(z);
    RankParamDesc c = testjob::DescribeParam({"c", {6, 2}, {}});
    c.custom_owner = 1;
    r.params.push_back(c);
  }
  const Plan p = MustBuild(ranks, 0);
  EXPECT_EQ(p.units.size(), 1u);
  EXPECT_EQ(p.zero2_matrices, 3);
  ASSERT_EQ(p.custom.size(), 1u);
  EXPECT_EQ(p.custom[0].name, "c");
  EXPECT_EQ(p.custom[0].owner, 1);
  EXPECT_EQ(p.custom[0].rows, 6);
  EXPECT_EQ(p.custom[0].local, 2);
  // The custom owner is part of the digest.
  ranks[1].params[2].custom_owner = 0;
  ranks[0].params[2].custom_owner = 0;
  EXPECT_NE(MustBuild(ranks, 0).digest, p.digest);
}

}  // namespace
}  // namespace muon
