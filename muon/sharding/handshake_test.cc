// The setup handshake over in-process ranks: every rank builds the same plan,
// and every problem, even one found by a single rank, fails every rank
// without leaving any waiting.
#include "muon/sharding/handshake.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/sharding/testing/job.h"
#include "muon/testing/ranks.h"

namespace muon {
namespace {

struct Outcome {
  absl::Status status;
  Plan plan;
  std::vector<std::vector<int>> members;
};

// Runs the handshake on n ranks; `tweak` may change a rank's description,
// fingerprint or local error before it takes part.
std::vector<Outcome> Handshake(
    int n, const std::vector<testjob::ParamSpec>& params,
    const std::function<void(int, RankDesc*, std::string*, absl::Status*)>& tweak = nullptr) {
  testranks::World world(n);
  std::vector<Outcome> out(n);
  testranks::OnThreads(n, [&](int rank) {
    std::shared_ptr<Comm> w = world.Join(rank);
    // A second group: the ranks of the same parity, in reverse order.
    std::vector<int> parity;
    for (int r = n - 1; r >= 0; --r) {
      if (r % 2 == rank % 2) parity.push_back(r);
    }
    std::shared_ptr<Comm> g = world.Join(rank, parity, "parity");
    ASSERT_TRUE(w && g);
    Outcome& o = out[rank];
    const absl::Status gathered = GatherGroupMembers(*w, {w, g}, nullptr, nullptr, &o.members);
    ASSERT_TRUE(gathered.ok()) << gathered;
    RankDesc me = testjob::DescribeRank(rank, n, {}, params);
    me.groups = o.members;
    std::string fingerprint = "same options";
    absl::Status local;
    if (tweak) tweak(rank, &me, &fingerprint, &local);
    absl::StatusOr<Plan> plan = AgreePlan(*w, me, fingerprint, PlanOptions(), local, nullptr, nullptr);
    o.status = plan.status();
    if (plan.ok()) o.plan = *std::move(plan);
  });
  return out;
}

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

const std::vector<testjob::ParamSpec> kModel = {{"a", {6, 4}, {testjob::Shard(0, 0, ShardSplit::kChunk)}},
                                       {"b", {3, 5}, {testjob::Replicate(0)}}};

TEST(Handshake, EveryRankAgreesOnOnePlan) {
  const auto out = Handshake(3, kModel);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].status.ok()) << "rank " << r << ": " << out[r].status;
    EXPECT_EQ(out[r].plan.digest, out[0].plan.digest);
    EXPECT_EQ(out[r].plan.units.size(), 2u);
    // Members in group-rank order: the world in order, parity reversed.
    EXPECT_EQ(out[r].members[0], (std::vector<int>{0, 1, 2}));
    const std::vector<int> parity = r % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{1};
    EXPECT_EQ(out[r].members[1], parity);
  }
}

TEST(Handshake, OneRanksOwnProblemFailsEveryRank) {
  const auto out = Handshake(3, kModel, [](int rank, RankDesc*, std::string*, absl::Status* e) {
    if (rank == 1) *e = absl::InvalidArgumentError("param 'c': assign_fn returned -1");
  });
  EXPECT_TRUE(Has(out[1].status, "assign_fn returned -1")) << out[1].status;
  for (int r : {0, 2}) {
    EXPECT_EQ(out[r].status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Has(out[r].status, "setup: rank 1 could not build the plan")) << out[r].status;
  }
}

TEST(Handshake, DifferentOptionsAreNamedWithBothValues) {
  const auto out = Handshake(2, kModel, [](int rank, RankDesc*, std::string* fp, absl::Status*) {
    if (rank == 1) *fp = "other options";
  });
  EXPECT_TRUE(Has(out[0].status, "setup: rank 1 runs with different optimizer options (other "
                                 "options) than rank 0 (same options)"))
      << out[0].status;
  EXPECT_TRUE(Has(out[1].status, "rank 0 runs with different optimizer options (same options) "
                                 "than rank 1 (other options)"))
      << out[1].status;
}

TEST(Handshake, InconsistentLayoutsFailEveryRankAlike) {
  // Rank 2 says the matrix is 7 x 4: every rank reports the same parameter.
  const auto out = Handshake(3, kModel, [](int rank, RankDesc* me, std::string*, absl::Status*) {
    if (rank == 2) me->params[0].global_shape = {7, 4};
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(Has(out[r].status, "param 'a': rank 0 registered global shape [6, 4]"))
        << "rank " << r << ": " << out[r].status;
  }
}

// Rank r's description as Handshake makes it, with a world-wide flat range
// of 'f' (20 elements; rank 1's spoiled to overlap rank 0's when asked).
RankDesc FlatRank(int r, int n, bool overlap) {
  RankDesc d = testjob::DescribeRank(r, n, {}, kModel);
  std::vector<int> parity;
  for (int q = n - 1; q >= 0; --q) {
    if (q % 2 == r % 2) parity.push_back(q);
  }
  d.groups.push_back(parity);
  const int64_t step = 20 / n;
  const int64_t start = r == 1 && overlap ? 1 : r * step;
  const int64_t end = r == n - 1 ? 20 : r * step + step;
  d.params.push_back(testjob::DescribeParam({"f", {4, 5}, {testjob::Flat(0, start, end - start)}}));
  d.params.back().custom_owner = -1;
  return d;
}

TEST(Handshake, RankSpecificRangesTravelAndGiveTheWholeMessagePlan) {
  for (bool overlap : {false, true}) {
    const int n = 4;
    const auto out = Handshake(n, kModel, [&](int rank, RankDesc* me, std::string*, absl::Status*) {
      RankDesc d = FlatRank(rank, n, overlap);
      d.groups = me->groups;
      *me = d;
    });
    std::vector<RankDesc> job;
    for (int r = 0; r < n; ++r) job.push_back(FlatRank(r, n, overlap));
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<Plan> direct = BuildPlan(job, r, PlanOptions());
      EXPECT_EQ(out[r].status, direct.status()) << "rank " << r;
      if (direct.ok() && out[r].status.ok()) {
        EXPECT_EQ(out[r].plan.digest, direct->digest);
        EXPECT_EQ(out[r].plan.params[0].holders.size(), 4u);
      }
    }
    EXPECT_EQ(out[0].status.ok(), !overlap) << out[0].status;
  }
}

TEST(Handshake, DescriptionsSurviveTheWire) {
  RankDesc d = testjob::DescribeRank(1, 2, {{1, 0}}, kModel);
  d.params[1].custom_owner = 1;
  d.params[1].zero2 = 1;
  d.params[0].layout.placements[0].sizes = {4, 2};
  const std::string bytes = SerializeRankDesc(d);
  absl::StatusOr<RankDesc> back = ParseRankDesc(bytes, "rank 1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SerializeRankDesc(*back), bytes);
  EXPECT_EQ(back->groups, d.groups);
  EXPECT_EQ(back->params[1].custom_owner, 1);
  EXPECT_EQ(back->params[0].layout.placements[0].sizes, (std::vector<int64_t>{4, 2}));
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    absl::StatusOr<RankDesc> bad = ParseRankDesc(bytes.substr(0, cut), "rank 1");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal) << cut;
    EXPECT_TRUE(Has(bad.status(), "rank 1: malformed handshake data")) << bad.status();
  }
  EXPECT_FALSE(ParseRankDesc(bytes + "x", "rank 1").ok());
}

}  // namespace
}  // namespace muon
