#include "muon/engine/pipeline.h"

#include <algorithm>
#include <exception>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

// A stage's status; an exception it throws becomes an Internal error naming
// the lane.
absl::Status RunStage(const Pipeline::Stage& stage, int round, const char* lane) {
  try {
    return stage(round);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(lane, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(lane, ": unexpected exception"));
  }
}

constexpr char kCommLane[] = "exchange thread";
constexpr char kComputeLane[] = "compute";

}  // namespace

std::vector<PipelineOp> PipelineSchedule(int rounds, int lookahead) {
  std::vector<PipelineOp> ops;
  if (rounds <= 0) return ops;
  const int ahead = std::min(std::max(lookahead, 0), rounds - 1);
  for (int r = 0; r <= ahead; ++r) ops.push_back({false, r});
  for (int r = 0; r < rounds; ++r) {
    ops.push_back({true, r});
    if (r + ahead + 1 < rounds) ops.push_back({false, r + ahead + 1});
  }
  return ops;
}

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(int lookahead) {
  std::unique_ptr<Pipeline> p(new Pipeline(std::max(lookahead, 0)));
  if (p->lookahead_ > 0) {
    try {
      p->worker_ = std::thread([q = p.get()] { q->WorkerLoop(); });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("could not start the exchange thread (prefetch_count > 0): ", e.what()));
    }
  }
  return p;
}

Pipeline::~Pipeline() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

const std::vector<PipelineOp>& Pipeline::Schedule(int rounds, int lookahead) {
  if (rounds != ops_rounds_ || lookahead != ops_lookahead_) {
    ops_ = PipelineSchedule(rounds, lookahead);
    scatter_at_.assign(static_cast<size_t>(std::max(rounds, 0)), 0);
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].scatter) scatter_at_[static_cast<size_t>(ops_[i].round)] = static_cast<int>(i);
    }
    ops_rounds_ = rounds;
    ops_lookahead_ = lookahead;
  }
  return ops_;
}

absl::Status Pipeline::Compute(const Stages& stages, int r, bool skip) {
  if (!skip) return RunStage(stages.compute, r, kComputeLane);
  if (stages.communicates && stages.communicates(r)) {
    return RunStage(stages.instead, r, kComputeLane);
  }
  return absl::OkStatus();
}

absl::Status Pipeline::RunInline(int rounds, const Stages& stages, bool skip_compute) {
  absl::Status comm_error, compute_error;
  for (const PipelineOp& op : Schedule(rounds, 0)) {
    if (op.scatter) {
      // Every earlier op is done: a communicating compute has the
      // communicators to itself.
      const absl::Status st =
          Compute(stages, op.round, skip_compute || !compute_error.ok() || !comm_error.ok());
      if (compute_error.ok()) compute_error = st;
    }
    absl::Status st = RunStage(op.scatter ? stages.scatter : stages.gather, op.round, kCommLane);
    if (comm_error.ok()) comm_error = st;
  }
  return comm_error.ok() ? compute_error : comm_error;
}

absl::Status Pipeline::Run(int rounds, const Stages& stages, bool skip_compute) {
  if (lookahead_ == 0 || rounds <= 1) return RunInline(rounds, stages, skip_compute);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stages_ = &stages;
    Schedule(rounds, lookahead_);  // ops_, which the worker reads
    gathered_ = computed_ = issued_ = 0;
    comm_error_ = absl::OkStatus();
    job_ = true;
  }
  cv_.notify_all();
  absl::Status compute_error;
  for (int r = 0; r < rounds; ++r) {
    bool skip = skip_compute || !compute_error.ok();
    const bool communicates = stages.communicates && stages.communicates(r);
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (communicates) {
        // Every op before this round's scatter done (the worker issues every
        // op, failed or not): the worker waits for this compute now.
        cv_.wait(lock, [&] { return issued_ >= scatter_at_[static_cast<size_t>(r)]; });
      } else if (!skip) {
        cv_.wait(lock, [&] { return gathered_ > r || !comm_error_.ok(); });
      }
      skip = skip || !comm_error_.ok();
    }
    absl::Status st = Compute(stages, r, skip);
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok() && compute_error.ok()) compute_error = st;
    computed_ = r + 1;  // computed or skipped: its scatter may go
    cv_.notify_all();
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_; });
  stages_ = nullptr;
  if (!comm_error_.ok()) return comm_error_;
  return compute_error;
}

void Pipeline::WorkerLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return job_ || shutdown_; });
      if (shutdown_) return;
    }
    Communicate();
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = false;
    }
    cv_.notify_all();
  }
}

void Pipeline::Communicate() {
  // Every op is issued, failed or not (see the header).
  for (const PipelineOp& op : ops_) {
    if (op.scatter) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return computed_ > op.round; });
    }
    absl::Status st =
        RunStage(op.scatter ? stages_->scatter : stages_->gather, op.round, kCommLane);
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok() && comm_error_.ok()) comm_error_ = st;
    if (!op.scatter) gathered_ = op.round + 1;
    ++issued_;
    cv_.notify_all();
  }
}

}  // namespace muon
