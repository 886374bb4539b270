#include "muon/engine/pipeline.h"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

std::string Show(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const PipelineOp& op : ops) s += (op.scatter ? "s" : "g") + std::to_string(op.round) + " ";
  return s;
}

TEST(PipelineSchedule, GathersRunAheadByTheLookahead) {
  EXPECT_EQ(Show(PipelineSchedule(0, 2)), "");
  EXPECT_EQ(Show(PipelineSchedule(1, 0)), "g0 s0 ");
  EXPECT_EQ(Show(PipelineSchedule(3, 0)), "g0 s0 g1 s1 g2 s2 ");
  EXPECT_EQ(Show(PipelineSchedule(4, 1)), "g0 g1 s0 g2 s1 g3 s2 s3 ");
  EXPECT_EQ(Show(PipelineSchedule(4, 2)), "g0 g1 g2 s0 g3 s1 s2 s3 ");
  // The lookahead is capped at rounds - 1.
  EXPECT_EQ(Show(PipelineSchedule(3, 9)), "g0 g1 g2 s0 s1 s2 ");
  EXPECT_EQ(Show(PipelineSchedule(2, -1)), "g0 s0 g1 s1 ");
}

// Records what ran, in which order and on which thread.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> comm, compute;  // per lane, in order
  std::vector<std::string> all;            // both lanes, in order
  std::thread::id caller = std::this_thread::get_id();
  bool comm_on_caller = false, compute_off_caller = false;
  std::atomic<int> gathered{0}, computed{0};
  bool compute_before_gather = false, scatter_before_compute = false;

  Pipeline::Stages Stages() {
    Pipeline::Stages s;
    s.gather = [this](int r) {
      Note(&comm, "g" + std::to_string(r), true);
      gathered = r + 1;
      return absl::OkStatus();
    };
    s.compute = [this](int r) {
      if (gathered.load() <= r) compute_before_gather = true;
      Note(&compute, "c" + std::to_string(r), false);
      computed = r + 1;
      return absl::OkStatus();
    };
    s.scatter = [this](int r) {
      if (computed.load() <= r) scatter_before_compute = true;
      Note(&comm, "s" + std::to_string(r), true);
      return absl::OkStatus();
    };
    return s;
  }
  void Note(std::vector<std::string>* lane, const std::string& what, bool is_comm) {
    std::lock_guard<std::mutex> lock(mu);
    lane->push_back(what);
    all.push_back(what);
    const bool on_caller = std::this_thread::get_id() == caller;
    if (is_comm && on_caller) comm_on_caller = true;
    if (!is_comm && !on_caller) compute_off_caller = true;
  }
};

std::vector<std::string> CommOrder(int rounds, int lookahead) {
  std::vector<std::string> out;
  for (const PipelineOp& op : PipelineSchedule(rounds, lookahead)) {
    out.push_back((op.scatter ? "s" : "g") + std::to_string(op.round));
  }
  return out;
}

TEST(Pipeline, WithoutLookaheadEverythingRunsInlineRoundAfterRound) {
  auto p = Pipeline::Create(0);
  ASSERT_TRUE(p.ok()) << p.status();
  Recorder rec;
  ASSERT_TRUE((*p)->Run(3, rec.Stages()).ok());
  EXPECT_EQ(rec.all, (std::vector<std::string>{"g0", "c0", "s0", "g1", "c1", "s1", "g2", "c2",
                                               "s2"}));
  EXPECT_TRUE(rec.comm_on_caller);  // inline: communication on the caller
}

TEST(Pipeline, WithLookaheadCommunicationRunsOnOneWorkerInTheFixedOrder) {
  for (int lookahead : {1, 2, 5}) {
    auto p = Pipeline::Create(lookahead);
    ASSERT_TRUE(p.ok()) << p.status();
    for (int step = 0; step < 3; ++step) {  // the worker is reused, step after step
      Recorder rec;
      ASSERT_TRUE((*p)->Run(6, rec.Stages()).ok());
      EXPECT_EQ(rec.comm, CommOrder(6, lookahead)) << "lookahead " << lookahead;
      EXPECT_EQ(rec.compute, (std::vector<std::string>{"c0", "c1", "c2", "c3", "c4", "c5"}));
      EXPECT_FALSE(rec.comm_on_caller) << "communication must run on the worker";
      EXPECT_FALSE(rec.compute_off_caller) << "compute must run on the calling thread";
      EXPECT_FALSE(rec.compute_before_gather);
      EXPECT_FALSE(rec.scatter_before_compute);
    }
  }
}

TEST(Pipeline, OneRoundRunsInlineEvenWithLookahead) {
  auto p = Pipeline::Create(2);
  ASSERT_TRUE(p.ok());
  Recorder rec;
  ASSERT_TRUE((*p)->Run(1, rec.Stages()).ok());
  EXPECT_EQ(rec.all, (std::vector<std::string>{"g0", "c0", "s0"}));
  Recorder none;
  ASSERT_TRUE((*p)->Run(0, none.Stages()).ok());
  EXPECT_TRUE(none.all.empty());
}

// A stage that fails (or throws) at `round`; the others record.
Pipeline::Stages Failing(Recorder* rec, char which, int round, bool throws) {
  Pipeline::Stages s = rec->Stages();
  Pipeline::Stage* target = which == 'g' ? &s.gather : which == 'c' ? &s.compute : &s.scatter;
  Pipeline::Stage inner = *target;
  *target = [inner, round, throws, which](int r) -> absl::Status {
    if (r == round) {
      if (throws) throw std::runtime_error(std::string("boom in ") + which);
      return absl::UnavailableError(std::string("failed ") + which + std::to_string(r));
    }
    return inner(r);
  };
  return s;
}

TEST(Pipeline, AFailureStopsTheComputationButEveryCollectiveIsIssued) {
  for (int lookahead : {0, 1, 3}) {
    for (char which : {'g', 'c', 's'}) {
      for (bool throws : {false, true}) {
        SCOPED_TRACE(std::string("lookahead ") + std::to_string(lookahead) + " stage " + which +
                     (throws ? " throws" : " fails"));
        auto p = Pipeline::Create(lookahead);
        ASSERT_TRUE(p.ok());
        Recorder rec;
        const absl::Status st = (*p)->Run(6, Failing(&rec, which, 2, throws));
        ASSERT_FALSE(st.ok());
        if (throws) {
          EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
          EXPECT_NE(std::string(st.message()).find(std::string("boom in ") + which),
                    std::string::npos)
              << st;
        } else {
          EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
          EXPECT_EQ(st.message(), std::string("failed ") + which + "2");
        }
        // Every gather and scatter of the schedule is issued, in its order, so
        // that the other ranks' collectives pair up...
        // (the failing stage records nothing of its own round)...
        std::vector<std::string> want;
        for (const std::string& op : CommOrder(6, lookahead)) {
          if (op != std::string(1, which) + "2") want.push_back(op);
        }
        EXPECT_EQ(rec.comm, want);
        // ...but no round after the failure is computed.
        if (which == 'c') {
          EXPECT_EQ(rec.compute, (std::vector<std::string>{"c0", "c1"}));
        }
        if (which == 'g') {
          for (const std::string& c : rec.compute) EXPECT_LT(std::stoi(c.substr(1)), 2) << c;
        }
        // The pipeline is usable again after a failure.
        Recorder again;
        EXPECT_TRUE((*p)->Run(4, again.Stages()).ok());
        EXPECT_EQ(again.compute.size(), 4u);
      }
    }
  }
}

TEST(Pipeline, ARankThatAlreadyFailedOnlyCommunicates) {
  for (int lookahead : {0, 2}) {
    auto p = Pipeline::Create(lookahead);
    ASSERT_TRUE(p.ok());
    Recorder rec;
    EXPECT_TRUE((*p)->Run(5, rec.Stages(), /*skip_compute=*/true).ok());
    EXPECT_TRUE(rec.compute.empty());
    EXPECT_EQ(rec.comm.size(), 10u);  // 5 gathers, 5 scatters
  }
}

TEST(Pipeline, DestroyingAnIdlePipelineJoinsItsWorker) {
  for (int i = 0; i < 20; ++i) {
    auto p = Pipeline::Create(1);
    ASSERT_TRUE(p.ok());
    if (i % 2 == 0) {
      Recorder rec;
      ASSERT_TRUE((*p)->Run(3, rec.Stages()).ok());
    }
  }
}

}  // namespace
}  // namespace muon
