// The job-wide plan from every rank's description: holders and their pieces,
// one unit per matrix with its owner among the holders, rounds within the
// memory budget, the same plan (digest) on every rank, and errors that name
// the parameter and the ranks.
#include "muon/sharding/plan.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/matrix_view.h"
#include "muon/math/ns_config.h"
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
  EXPECT_EQ(w.Blocks(w.holders[1]).front().offset, 16);  // rows 4.. of 8 x 4
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

TEST(Plan, SpreadLevelsForcedOwnersWithinEachStageOnly) {
  // Two pipeline stages of 4 ranks. In each, every rank alone holds 8 experts
  // (8 x 8) and the stage holds one dense 16 x 16 matrix (Replicate over the
  // stage): 8 experts' work. BALANCED must leave each rank its own experts, so
  // the dense matrix's owner does 16 units where the others do 8.
  std::vector<RankDesc> ranks;
  for (int r = 0; r < 8; ++r) {
    const int stage = r / 4;
    const std::vector<int> members = {4 * stage, 4 * stage + 1, 4 * stage + 2, 4 * stage + 3};
    std::vector<ParamSpec> mine = {{"s" + std::to_string(stage) + ".dense", {16, 16}, {Replicate(1)}}};
    for (int e = 0; e < 8; ++e) {
      mine.push_back({"expert" + std::to_string(r) + "." + std::to_string(e), {8, 8}, {}});
    }
    ranks.push_back(DescribeRank(r, 8, {members}, mine));
  }
  auto loads = [](const Plan& p) {
    std::vector<double> load(8, 0);
    for (const Unit& u : p.units) load[u.owner] += u.flops;
    return load;
  };
  const Plan balanced = MustBuild(ranks, 0);
  const std::vector<double> b = loads(balanced);
  const double expert = b[1];  // 8 experts
  ASSERT_GT(expert, 0);
  EXPECT_EQ(*std::max_element(b.begin(), b.end()), 2 * expert);

  PlanOptions o;
  o.assignment = Assignment::kSpread;
  const Plan spread = MustBuild(ranks, 0, o);
  EXPECT_EQ(spread.digest, MustBuild(ranks, 5, o).digest);
  EXPECT_NE(spread.digest, balanced.digest);
  // Every rank does 10 experts' work: the dense owner hands 6 of its experts
  // to the other 3 ranks of its stage, 2 each, and nothing crosses stages.
  for (double l : loads(spread)) EXPECT_EQ(l, expert * 10 / 8);
  int moved = 0;
  for (const Unit& u : spread.units) {
    const PlanParam& pp = spread.params[u.param];
    const int holder = pp.holders.front().rank;
    EXPECT_EQ(u.owner / 4, holder / 4) << pp.name;
    if (pp.holders.size() == 1 && u.owner != holder) ++moved;
  }
  EXPECT_EQ(moved, 12);
}

TEST(Plan, SplitCutsTheMatrixThatBoundsTheBusiestRank) {
  // 4 ranks, replicated: one 32 x 512 matrix costs more than the other 15
  // (32 x 32) together; split, its parts go to ranks that take no other.
  std::vector<ParamSpec> params = {{"big", {32, 512}, {Replicate(0)}}};
  for (int i = 0; i < 15; ++i) {
    params.push_back({"small" + std::to_string(i), {32, 32}, {Replicate(0)}});
  }
  const auto ranks = World(4, params);
  auto loads = [](const Plan& p) {
    std::vector<double> load(4, 0);
    for (const Unit& u : p.units) load[u.owner] += u.flops;
    return load;
  };
  auto max_over_mean = [](const std::vector<double>& l) {
    double total = 0;
    for (double x : l) total += x;
    return *std::max_element(l.begin(), l.end()) / (total / l.size());
  };
  PlanOptions o;
  o.assignment = Assignment::kSpread;
  const Plan spread = MustBuild(ranks, 0, o);
  o.assignment = Assignment::kSplit;
  const Plan split = MustBuild(ranks, 0, o);
  EXPECT_EQ(split.digest, MustBuild(ranks, 3, o).digest);
  const double before = max_over_mean(loads(spread));
  const double after = max_over_mean(loads(split));
  EXPECT_GT(before, 1.5);
  EXPECT_LT(after, 1.2);  // 1.91 -> 1.17: the parts even, the small matrices where they were
  // The parts: consecutive units of the last round, distinct owners, widths
  // tiling the long side, each part's work its block's.
  std::vector<int> members;
  int64_t covered = 0;
  for (const Unit& u : split.units) {
    if (u.parts == 1) {
      EXPECT_LT(u.round, split.rounds - 1);
      continue;
    }
    EXPECT_EQ(split.params[u.param].name, "big");
    EXPECT_EQ(u.round, split.rounds - 1);
    EXPECT_EQ(u.first, covered);
    covered += u.width;
    EXPECT_EQ(u.flops, NewtonSchulzBlockFlops(32, u.width, 5));
    members.push_back(u.owner);
  }
  EXPECT_EQ(covered, 512);
  ASSERT_GE(members.size(), 2u);
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << "a rank with two parts";
  // No split where nothing bounds a rank: the small matrices alone.
  std::vector<ParamSpec> small(params.begin() + 1, params.end());
  const Plan even = MustBuild(World(4, small), 0, o);
  for (const Unit& u : even.units) EXPECT_EQ(u.parts, 1);
  // Nor with fewer than kSplitMinMatricesPerRank matrices per rank (15 of
  // the 16 here: 3.75 per rank).
  params.pop_back();
  const Plan few = MustBuild(World(4, params), 0, o);
  for (const Unit& u : few.units) EXPECT_EQ(u.parts, 1);
}

TEST(Plan, SplitPricesPartsAsTheMatricesUnderGramNewtonSchulz) {
  // 2 ranks, replicated: one 32 x 4096 matrix and 7 small ones. Under Gram
  // Newton-Schulz the matrices cost Gram's FLOPs (8 m^2 n and the m x m
  // terms for the big one), and so must the parts the split weighs: priced
  // as the standard iteration (20 m^2 n for the whole), a half looks dearer
  // than the whole matrix and nothing is split.
  std::vector<ParamSpec> params = {{"big", {32, 4096}, {Replicate(0)}}};
  for (int i = 0; i < 7; ++i) {
    params.push_back({"small" + std::to_string(i), {32, 48}, {Replicate(0)}});
  }
  const auto ranks = World(2, params);
  PlanOptions o;
  o.ns.algorithm = NsAlgorithm::kGram;
  o.assignment = Assignment::kSplit;
  const Plan split = MustBuild(ranks, 0, o);
  std::vector<double> load(2, 0);
  int parts = 0;
  for (const Unit& u : split.units) {
    load[u.owner] += u.flops;
    if (u.parts == 1) continue;
    ++parts;
    EXPECT_EQ(u.flops, NewtonSchulzBlockFlops(o.ns, 32, u.width, 4096));
  }
  EXPECT_EQ(parts, 2);
  EXPECT_LT(std::max(load[0], load[1]) / ((load[0] + load[1]) / 2), 1.1);
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

// A matrix without elements has an empty update: nothing to orthogonalize or
// move, so it gets no unit (and no owner), whatever its batch; it still
// counts among the job's matrices. Before, every one was a unit, so that a
// [2^32, 0, 3] declaration planned 2^32 units (more than 27 s and 8 GiB).
TEST(Plan, MatricesWithoutElementsGetNoUnit) {
  ParamSpec stack{"a.empty_stack", {1000, 0, 3}, {Replicate(0)}, 2};
  ParamSpec experts{"b.experts", {3, 2, 2}, {Shard(0, 0, ShardSplit::kChunk)}, 2};
  ParamSpec rows0{"c.rows0", {0, 5}, {Replicate(0)}};
  ParamSpec cols0{"d.cols0", {4, 0}, {Shard(0, 0)}};
  const auto ranks = World(2, {stack, experts, rows0, cols0});
  const Plan p0 = MustBuild(ranks, 0), p1 = MustBuild(ranks, 1);
  EXPECT_EQ(p0.digest, p1.digest);
  ASSERT_EQ(p0.params.size(), 4u);  // every parameter is in the plan, with its holders
  EXPECT_EQ(p0.params[0].holders.size(), 2u);
  EXPECT_EQ(p0.empty_matrices, 1002);
  ASSERT_EQ(p0.units.size(), 3u);  // the experts' matrices only
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(p0.units[k].param, 1);
    EXPECT_EQ(p0.units[k].index, k);
  }
  EXPECT_EQ(p0.rounds, 1);

  // A job of empty matrices alone plans nothing, at once, however many.
  const int64_t huge = int64_t{1} << 32;
  const Plan none =
      MustBuild(World(2, {{"huge", {huge, 0, 3}, {Replicate(0)}, 2}, rows0}), 1);
  EXPECT_TRUE(none.units.empty());
  EXPECT_EQ(none.empty_matrices, huge + 1);
  EXPECT_EQ(none.rounds, 0);

  // Their count stays an int64_t: up to kMaxJobAllMatrices in the job, then
  // refused naming the parameter (a fuzzed job of two INT64_MAX-deep empty
  // stacks overflowed the stats' sum).
  const int64_t half = kMaxJobAllMatrices / 2;
  const Plan at_cap = MustBuild(World(2, {{"a", {half, 0, 3}, {Replicate(0)}, 2},
                                          {"b", {half, 0, 3}, {Replicate(0)}, 2}}), 0);
  EXPECT_EQ(at_cap.empty_matrices, kMaxJobAllMatrices);
  const std::string e = Error(World(2, {{"a", {half, 0, 3}, {Replicate(0)}, 2},
                                        {"b", {half, 0, 3}, {Replicate(0)}, 2},
                                        {"c", {1, 0, 3}, {Replicate(0)}, 2}}));
  EXPECT_TRUE(Has(e, "param 'c': with its 1 matrices the job declares more than "
                     "4611686018427387904 matrices, empty ones included"))
      << e;
  const int64_t deepest = std::numeric_limits<int64_t>::max();
  const std::string deep = Error(World(2, {{"z", {deepest, 0, 1}, {Replicate(0)}, 2}}));
  EXPECT_TRUE(Has(deep, "param 'z': with its 9223372036854775807 matrices")) << deep;
}

// A declaration may not ask the plan for more than kMaxParamMatrices
// matrices with elements in one parameter, nor kMaxJobMatrices in the job:
// refused, naming the parameter and the cause, before anything is planned.
// Empty matrices count in neither.
TEST(Plan, DeclaredMatricesAreCappedPerParameterAndPerJob) {
  const int64_t per = kMaxParamMatrices;
  // One parameter over the cap: its global shape alone, whatever the pieces.
  std::string e = Error(World(2, {{"big", {per + 1, 1, 1}, {Flat(0, 0, 0)}, 2}}));
  EXPECT_TRUE(Has(e, "param 'big': shape [1048577, 1, 1] declares 1048577 matrices of 1 x 1, "
                     "more than the 1048576 one parameter may declare"))
      << e;
  // The same for a ZeRO-2 and a custom-path declaration (a custom one is a
  // single matrix: never over).
  std::vector<RankDesc> z = World(2, {});
  for (RankDesc& r : z) {
    RankParamDesc d = testjob::DescribeParam({"z", {per + 1, 2, 2}, {Replicate(0)}, 2});
    d.zero2 = 1;
    r.params.push_back(d);
  }
  e = Error(z);
  EXPECT_TRUE(Has(e, "param 'z': shape [1048577, 2, 2] declares 1048577 matrices")) << e;

  // The job: five parameters at the per-parameter cap cross the job's at
  // the fifth in name order. (Refused before pieces are computed: the empty
  // flat ranges here would not tile.)
  std::vector<ParamSpec> five;
  for (const char* name : {"p3", "p0", "p4", "p1", "p2"}) {
    five.push_back({name, {per, 1, 1}, {Flat(0, 0, 0)}, 2});
  }
  e = Error(World(2, five));
  EXPECT_TRUE(Has(e, "param 'p4': with its 1048576 matrices the job declares 5242880 matrices "
                     "with elements (parameters in name order), more than the 4194304 one job "
                     "may declare"))
      << e;
  // Empty matrices beside them count for nothing; four at the cap pass the
  // count (and go on to the pieces, which these empty ranges do not tile).
  five.pop_back();
  five.push_back({"p9", {int64_t{1} << 40, 0, 7}, {Replicate(0)}, 2});
  e = Error(World(2, five));
  EXPECT_TRUE(Has(e, "param 'p0'") && Has(e, "are held by no rank")) << e;
  EXPECT_FALSE(Has(e, "one job may declare")) << e;
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

// A pipeline job on inner x stages x fsdp ranks (rank = (f * stages + s) *
// inner + i), groups 1 = inner (TP or EP), 2 = FSDP, as the setup benchmark
// lays out Llama (TP: column and row parallel, a replicated router, one
// layer per stage) and DeepSeek (EP: dense matrices replicated over EP,
// experts on their EP rank only). Every matrix is sharded over FSDP.
std::vector<RankDesc> PipelineJob(bool expert_parallel, int inner, int stages, int fsdp) {
  const int world = inner * stages * fsdp;
  std::vector<RankDesc> ranks;
  for (int r = 0; r < world; ++r) {
    const int i = r % inner, s = (r / inner) % stages, f = r / (inner * stages);
    std::vector<int> in_group, fsdp_group;
    for (int k = 0; k < inner; ++k) in_group.push_back((f * stages + s) * inner + k);
    for (int k = 0; k < fsdp; ++k) fsdp_group.push_back((k * stages + s) * inner + i);
    std::vector<ParamSpec> params;
    const std::string layer = "layers." + std::to_string(s) + ".";
    const auto chunk = Shard(2, 0, ShardSplit::kChunk);
    if (!expert_parallel) {
      params.push_back({layer + "qkv", {24, 10}, {Shard(1, 0), chunk}});
      params.push_back({layer + "o_proj", {10, 8 * inner}, {Shard(1, 1), chunk}});
      params.push_back({layer + "down_proj", {13, 4 * inner}, {Shard(1, 1), chunk}});
      params.push_back({layer + "router", {5, 6}, {Replicate(1), chunk}});
    } else {
      params.push_back({layer + "attn", {9, 12}, {Replicate(1), chunk}});
      for (int e = 0; e < 2 * inner; ++e) {
        if (e / 2 != i) continue;  // two experts per EP rank
        const std::string x = layer + "experts." + std::to_string(e) + ".";
        params.push_back({x + "up", {7, 5}, {chunk}});
        params.push_back({x + "down", {5, 7}, {chunk}});
      }
    }
    ranks.push_back(DescribeRank(r, world, {in_group, fsdp_group}, params));
  }
  return ranks;
}

// Every holder's piece, kept in its parameter's flat arrays, is the piece
// ComputePieceBlocks gives that holder: boxes (one block each), replicas
// (not canonical), flat ranges of column halves (several blocks, 1-D, one
// of them empty).
TEST(Plan, HoldersKeepTheirPiecesInTheFlatArrays) {
  const int world = 4;
  // Ranks 0 and 2 split the left half's 30 elements, 1 and 3 the right half's.
  const int64_t start[] = {0, 0, 12, 30}, length[] = {12, 30, 18, 0};
  std::vector<RankDesc> ranks;
  for (int r = 0; r < world; ++r) {
    const std::vector<int> pair = {r / 2 * 2, r / 2 * 2 + 1}, cross = {r % 2, r % 2 + 2};
    ranks.push_back(DescribeRank(
        r, world, {pair, cross},
        {{"box", {8, 12}, {Shard(0, 1)}},
         {"copies", {8, 6}, {Shard(1, 0), Replicate(2)}},
         {"flat", {6, 10}, {Shard(1, 1), Flat(2, start[r], length[r])}}}));
  }
  const Plan p = MustBuild(ranks, 1);
  ASSERT_EQ(p.params.size(), 3u);
  int64_t blocks = 0;
  for (const PlanParam& pp : p.params) {
    SCOPED_TRACE(pp.name);
    ASSERT_EQ(pp.holders.size(), 4u);
    for (const Holder& h : pp.holders) {
      const RankDesc& r = ranks[h.rank];
      std::vector<int> sizes, coords;
      for (const auto& g : r.groups) {
        sizes.push_back(static_cast<int>(g.size()));
        coords.push_back(static_cast<int>(std::find(g.begin(), g.end(), h.rank) - g.begin()));
      }
      const RankParamDesc* d = nullptr;
      for (const RankParamDesc& q : r.params) {
        if (q.name == pp.name) d = &q;
      }
      ASSERT_NE(d, nullptr);
      const absl::StatusOr<Piece> want = ComputePieceBlocks(d->layout, sizes, coords, "");
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(std::vector<RunBlock>(pp.Blocks(h).begin(), pp.Blocks(h).end()), want->blocks);
      EXPECT_EQ(std::vector<int64_t>(pp.Shape(h).begin(), pp.Shape(h).end()), want->shape);
      EXPECT_EQ(h.canonical, want->canonical);
      blocks += h.num_blocks;
    }
  }
  EXPECT_FALSE(p.params[1].holders[2].canonical);  // "copies": ranks 2, 3 are the replicas
  const PlanParam& flat = p.params[2];
  EXPECT_EQ(flat.holders[3].num_blocks, 0);  // rank 3 holds nothing
  EXPECT_EQ(flat.holders[0].num_blocks, 2);  // rows 0, 1 of its half, then 2 of row 2
  EXPECT_EQ(flat.Shape(flat.holders[2]).size(), 1u);
  EXPECT_EQ(flat.Shape(flat.holders[2]).front(), 18);
  // The arrays hold the holders' blocks and nothing else.
  EXPECT_EQ(blocks, static_cast<int64_t>(p.params[0].blocks.size() + p.params[1].blocks.size() +
                                         p.params[2].blocks.size()));
}

// Pieces from boxes give the plan that pieces row by row gave: the same
// holders and runs, units, owners, rounds and digest, on every rank.
TEST(Plan, BoxedPiecesGiveTheRowByRowPlan) {
  struct Case {
    bool ep;
    int inner, stages, fsdp;
  };
  for (const Case& c : {Case{false, 2, 2, 3}, Case{false, 4, 3, 2}, Case{false, 2, 1, 5},
                        Case{true, 4, 2, 2}, Case{true, 2, 3, 3}}) {
    const auto ranks = PipelineJob(c.ep, c.inner, c.stages, c.fsdp);
    PlanOptions old_way;
    old_way.pieces_row_by_row = true;
    old_way.round_bytes = 512;  // several rounds
    PlanOptions new_way = old_way;
    new_way.pieces_row_by_row = false;
    for (int me = 0; me < static_cast<int>(ranks.size()); ++me) {
      const Plan a = MustBuild(ranks, me, old_way), b = MustBuild(ranks, me, new_way);
      SCOPED_TRACE(testing::Message() << (c.ep ? "EP " : "TP ") << c.inner << " x PP "
                                      << c.stages << " x FSDP " << c.fsdp << ", rank " << me);
      EXPECT_EQ(a.digest, b.digest);
      EXPECT_EQ(a.rounds, b.rounds);
      ASSERT_EQ(a.params.size(), b.params.size());
      for (size_t p = 0; p < a.params.size(); ++p) {
        EXPECT_EQ(a.params[p].name, b.params[p].name);
        EXPECT_EQ(a.params[p].local, b.params[p].local);
        EXPECT_EQ(a.params[p].local_holder, b.params[p].local_holder);
        ASSERT_EQ(a.params[p].holders.size(), b.params[p].holders.size());
        for (size_t h = 0; h < a.params[p].holders.size(); ++h) {
          const Holder &x = a.params[p].holders[h], &y = b.params[p].holders[h];
          EXPECT_EQ(x.rank, y.rank);
          EXPECT_EQ(ExpandBlocks(a.params[p].Blocks(x)), ExpandBlocks(b.params[p].Blocks(y)));
          EXPECT_EQ(a.params[p].Shape(x), b.params[p].Shape(y));
          EXPECT_EQ(x.canonical, y.canonical);
        }
      }
      ASSERT_EQ(a.units.size(), b.units.size());
      for (size_t u = 0; u < a.units.size(); ++u) {
        EXPECT_EQ(a.units[u].param, b.units[u].param);
        EXPECT_EQ(a.units[u].index, b.units[u].index);
        EXPECT_EQ(a.units[u].owner, b.units[u].owner);
        EXPECT_EQ(a.units[u].round, b.units[u].round);
        EXPECT_EQ(a.units[u].senders, b.units[u].senders);
        EXPECT_EQ(a.units[u].receivers, b.units[u].receivers);
      }
    }
  }
}

// An inconsistent layout fails with the same error both ways.
TEST(Plan, BoxedPiecesGiveTheRowByRowErrors) {
  auto ranks = PipelineJob(false, 2, 2, 3);
  // Rank 5 shards o_proj's rows where the others shard its columns.
  for (RankParamDesc& d : ranks[5].params) {
    if (d.name.find("o_proj") != std::string::npos) d.layout.placements[0].dim = 0;
  }
  PlanOptions old_way;
  old_way.pieces_row_by_row = true;
  const std::string want = Error(ranks, old_way);
  EXPECT_EQ(Error(ranks, PlanOptions()), want);
  EXPECT_TRUE(Has(want, "o_proj")) << want;
}

}  // namespace
}  // namespace muon
