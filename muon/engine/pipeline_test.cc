#include "muon/engine/pipeline.h"

#include <atomic>
#include <chrono>
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

// Rounds 1 and 4 of 6 communicate in their compute: each starts once every
// op before its scatter is done, no op runs while it does, and when compute
// is skipped the round runs `instead` in the same place.
struct Communicating {
  Recorder rec;
  std::atomic<bool> inside{false};
  std::atomic<bool> overlapped{false};
  std::vector<int> instead;
  Pipeline::Stages Stages(bool fail_compute_at_2 = false) {
    Pipeline::Stages s = rec.Stages();
    auto guard = [this](Pipeline::Stage inner) {
      return [this, inner](int r) {
        if (inside.load()) overlapped = true;
        return inner(r);
      };
    };
    s.gather = guard(s.gather);
    s.scatter = guard(s.scatter);
    Pipeline::Stage compute = s.compute;
    s.compute = [this, compute, fail_compute_at_2](int r) {
      if (fail_compute_at_2 && r == 2) return absl::UnavailableError("failed c2");
      const bool talks = r == 1 || r == 4;
      if (talks) inside = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(talks ? 5 : 0));
      absl::Status st = compute(r);
      if (talks) inside = false;
      return st;
    };
    s.communicates = [](int r) { return r == 1 || r == 4; };
    s.instead = [this](int r) {
      if (inside.load()) overlapped = true;
      rec.Note(&rec.compute, "i" + std::to_string(r), false);
      instead.push_back(r);
      return absl::OkStatus();
    };
    return s;
  }
};

// The position of `what` in `all`, or -1.
int At(const std::vector<std::string>& all, const std::string& what) {
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == what) return static_cast<int>(i);
  }
  return -1;
}

TEST(Pipeline, ACommunicatingComputeHasTheCommunicatorsToItself) {
  for (int lookahead : {0, 1, 2, 5}) {
    SCOPED_TRACE("lookahead " + std::to_string(lookahead));
    auto p = Pipeline::Create(lookahead);
    ASSERT_TRUE(p.ok());
    Communicating c;
    ASSERT_TRUE((*p)->Run(6, c.Stages()).ok());
    EXPECT_FALSE(c.overlapped) << "an op ran during a communicating compute";
    EXPECT_EQ(c.rec.comm, CommOrder(6, lookahead));
    const std::vector<std::string> order = CommOrder(6, lookahead);
    for (int r : {1, 4}) {
      const int compute_at = At(c.rec.all, "c" + std::to_string(r));
      const int scatter = At(order, "s" + std::to_string(r));
      // Every op before the scatter came before the compute; the scatter after.
      for (int i = 0; i < scatter; ++i) EXPECT_LT(At(c.rec.all, order[i]), compute_at) << order[i];
      EXPECT_GT(At(c.rec.all, "s" + std::to_string(r)), compute_at);
    }
    EXPECT_TRUE(c.instead.empty());
  }
}

TEST(Pipeline, ASkippedCommunicatingComputeRunsInsteadInItsPlace) {
  for (int lookahead : {0, 2}) {
    SCOPED_TRACE("lookahead " + std::to_string(lookahead));
    auto p = Pipeline::Create(lookahead);
    ASSERT_TRUE(p.ok());
    {
      Communicating c;  // this rank already failed: every communicating round runs instead
      EXPECT_TRUE((*p)->Run(6, c.Stages(), /*skip_compute=*/true).ok());
      EXPECT_EQ(c.instead, (std::vector<int>{1, 4}));
      EXPECT_EQ(c.rec.compute, (std::vector<std::string>{"i1", "i4"}));
      EXPECT_FALSE(c.overlapped);
    }
    {
      Communicating c;  // round 2 fails: 1 computes, 4 runs instead
      const absl::Status st = (*p)->Run(6, c.Stages(/*fail_compute_at_2=*/true));
      EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
      EXPECT_EQ(c.rec.compute, (std::vector<std::string>{"c0", "c1", "i4"}));
      EXPECT_EQ(c.rec.comm, CommOrder(6, lookahead));
      const std::vector<std::string> order = CommOrder(6, lookahead);
      const int scatter = At(order, "s4");
      for (int i = 0; i < scatter; ++i) EXPECT_LT(At(c.rec.all, order[i]), At(c.rec.all, "i4"));
      EXPECT_FALSE(c.overlapped);
    }
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
