// The exchange-round stepper on in-process ranks: after a Run, every rank's
// update buffers hold its pieces of the orthogonalized global matrices
// (checked against the double-precision reference), whatever the layout,
// the number of rounds and the prefetch depth; each matrix is orthogonalized
// once in the job; a failing exchange is returned.
#include "muon/engine/exchange_stepper.h"

#include <atomic>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/engine/testing/host_job.h"
#include "muon/sharding/testing/job.h"
#include "muon/testing/ranks.h"

namespace muon {
namespace {

using testjob::DescribeRank;
using testjob::Flat;
using testjob::HostJob;
using testjob::ParamSpec;
using testjob::ReferenceOf;
using testjob::Replicate;
using testjob::Shard;
using testjob::ValueOf;

// The job on rank `rank` of `n`: rows and columns chunked, flat ranges cut
// unevenly (some empty), a replicated matrix and a batched one.
std::vector<ParamSpec> Model(int rank, int n) {
  const int64_t flat = 15, start = rank * flat / n, end = (rank + 1) * flat / n;
  ParamSpec batched{"batched", {3, 4, 3}, {Shard(0, 0, ShardSplit::kChunk)}, 2};
  return {{"cols", {4, 6}, {Shard(0, 1, ShardSplit::kChunk)}},
          {"flat", {5, 3}, {Flat(0, start, end - start)}},
          {"rep", {3, 7}, {Replicate(0)}},
          {"rows", {9, 5}, {Shard(0, 0, ShardSplit::kChunk)}},
          batched};
}

// The update (momentum output) of global element i of `name`.
float UpdateOf(const std::string& name, int64_t i) { return ValueOf(name, i, 3); }

struct Config {
  int prefetch = 1;
  int64_t round_bytes = int64_t{256} << 20;
  bool async = true;
};

struct RankOutcome {
  absl::Status status;
  int64_t orthogonalized = 0, total = 0, owned = 0;
  int rounds = 0;
};

std::vector<RankOutcome> RunJob(int n, const Config& cfg) {
  testranks::World world(n);
  std::vector<RankOutcome> out(n);
  testranks::OnThreads(n, [&](int rank) {
    std::shared_ptr<Comm> w = world.Join(rank);
    ASSERT_NE(w, nullptr);
    HostJob job;
    const std::vector<ParamSpec> mine = Model(rank, n);
    for (const ParamSpec& s : mine) {
      Layout layout{s.global_shape, s.placements};
      Param& p = job.Add(s.name, s.global_shape, s.view, &layout, {n}, {rank});
      int64_t k = 0;
      for (const Run& r : p.piece.runs) {
        for (int64_t i = 0; i < r.length; ++i) job.update(job.params().size() - 1)[k++] =
            UpdateOf(s.name, r.offset + i);
      }
    }
    std::vector<RankDesc> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(DescribeRank(r, n, {}, Model(r, n)));
    PlanOptions po;
    po.round_bytes = cfg.round_bytes;
    po.async_parallelism = cfg.async;
    absl::StatusOr<Plan> plan = BuildPlan(ranks, rank, po);
    ASSERT_TRUE(plan.ok()) << plan.status();
    Options o;
    o.ns.dtype = NsDtype::kFP32;
    o.dist.prefetch_count = cfg.prefetch;
    auto stepper = ExchangeStepper::Create(*plan, job.Context(&o), *w);
    ASSERT_TRUE(stepper.ok()) << stepper.status();
    RankOutcome& res = out[rank];
    res.rounds = (*stepper)->rounds();
    for (int step = 0; step < 2; ++step) {  // twice: the buffers are reused
      res.status = (*stepper)->Run(nullptr, false);
      if (!res.status.ok()) return;
    }
    res.orthogonalized = (*stepper)->stats().orthogonalized;
    res.total = (*stepper)->stats().matrices_total;
    res.owned = (*stepper)->stats().matrices_owned;
    // Every local element against the reference of its matrix. (The second
    // Run orthogonalized the first one's result, so compare with NS(NS(U)).)
    for (size_t j = 0; j < mine.size(); ++j) {
      const Param& p = job.params()[j];
      const int64_t per = p.rows * p.cols;
      std::vector<std::vector<double>> want(p.batch);
      for (int64_t b = 0; b < p.batch; ++b) {
        auto once = ReferenceOf(p.rows, p.cols, o.ns,
                                [&](int64_t k) { return UpdateOf(p.name, b * per + k); });
        want[b] = ReferenceOf(p.rows, p.cols, o.ns, [&](int64_t k) { return once[k]; });
      }
      int64_t k = 0;
      for (const Run& r : p.piece.runs) {
        for (int64_t i = 0; i < r.length; ++i, ++k) {
          const int64_t g = r.offset + i;
          ASSERT_NEAR(job.update(j)[k], want[g / per][g % per], 2e-5)
              << "rank " << rank << " param " << p.name << " global element " << g;
        }
      }
    }
  });
  return out;
}

void ExpectOrthogonalizedOnce(const std::vector<RankOutcome>& out) {
  int64_t sum = 0, owned = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    ASSERT_TRUE(out[r].status.ok()) << "rank " << r << ": " << out[r].status;
    EXPECT_EQ(out[r].total, 7) << "4 matrices and 3 batched ones";
    sum += out[r].orthogonalized;
    owned += out[r].owned;
  }
  EXPECT_EQ(sum, 7);
  EXPECT_EQ(owned, 7);
}

TEST(ExchangeStepper, OneToFourRanks) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    ExpectOrthogonalizedOnce(RunJob(n, Config()));
  }
}

TEST(ExchangeStepper, ManyRoundsAtEveryPrefetchDepth) {
  for (int prefetch : {0, 1, 2, 8}) {
    for (bool async : {true, false}) {
      SCOPED_TRACE("prefetch " + std::to_string(prefetch) + (async ? " async" : " one by one"));
      Config cfg;
      cfg.prefetch = prefetch;
      cfg.async = async;
      cfg.round_bytes = 64;  // one matrix per round and owner
      const auto out = RunJob(3, cfg);
      ExpectOrthogonalizedOnce(out);
      EXPECT_GE(out[0].rounds, async ? 2 : 7);
    }
  }
}

// The world's all_to_all_v fails on one rank's `fail_at`-th call.
struct Flaky {
  muon_comm_t inner;
  std::atomic<int> calls{0};
  int fail_at;
};

muon_status_t FlakyAllGather(void* ctx, const void* s, void* r, size_t b, void* st) {
  auto* f = static_cast<Flaky*>(ctx);
  return f->inner.all_gather(f->inner.ctx, s, r, b, st);
}
muon_status_t FlakyAllToAllV(void* ctx, const void* s, const size_t* sb, const size_t* so,
                             void* r, const size_t* rb, const size_t* ro, void* st) {
  auto* f = static_cast<Flaky*>(ctx);
  const muon_status_t res = f->inner.all_to_all_v(f->inner.ctx, s, sb, so, r, rb, ro, st);
  return f->calls++ == f->fail_at ? MUON_UNAVAILABLE : res;
}
muon_status_t FlakyReduceScatter(void* ctx, const void* s, void* r, size_t c, int32_t d,
                                 void* st) {
  auto* f = static_cast<Flaky*>(ctx);
  return f->inner.reduce_scatter(f->inner.ctx, s, r, c, d, st);
}

TEST(ExchangeStepper, AFailingExchangeIsReturnedNamingTheRound) {
  // Two ranks; rank 1's world fails its last all_to_all_v (the scatter, after
  // the data moved), so rank 0 finishes and rank 1 reports the failure.
  auto in = InProcessWorld::Create(2);
  ASSERT_TRUE(in.ok());
  std::vector<absl::Status> status(2);
  testranks::OnThreads(2, [&](int rank) {
    muon_comm_t table;
    ASSERT_TRUE(MakeInProcessComm(*in, {}, rank, &table).ok());
    Flaky flaky{table, {}, rank == 1 ? 1 : -1};
    muon_comm_t t = table;
    t.ctx = &flaky;
    t.all_gather = FlakyAllGather;
    t.all_to_all_v = FlakyAllToAllV;
    t.reduce_scatter = FlakyReduceScatter;
    t.release = nullptr;
    auto w = Comm::Create(t, "world");
    ASSERT_TRUE(w.ok());
    HostJob job;
    job.Add("w", {4, 4}, 0, nullptr);
    const std::vector<RankDesc> ranks = {DescribeRank(0, 2, {}, {{"w", {4, 4}, {Replicate(0)}}}),
                                         DescribeRank(1, 2, {}, {{"w", {4, 4}, {Replicate(0)}}})};
    absl::StatusOr<Plan> plan = BuildPlan(ranks, rank, PlanOptions());
    ASSERT_TRUE(plan.ok());
    Options o;
    auto stepper = ExchangeStepper::Create(*plan, job.Context(&o), **w);
    ASSERT_TRUE(stepper.ok());
    status[rank] = (*stepper)->Run(nullptr, false);
    EXPECT_EQ(flaky.calls.load(), 2);
    w->reset();
    table.release(table.ctx);
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kUnavailable);
  const std::string msg(status[1].message());
  EXPECT_NE(msg.find("scattering round 0 (param 'w')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all_to_all_v on world (rank 1 of 2) failed with UNAVAILABLE"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace muon
