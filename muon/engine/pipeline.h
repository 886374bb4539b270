// The prefetch pipeline: a step's rounds, each gather(r) -> compute(r) ->
// scatter(r), with the communication of later rounds overlapping the
// computation of earlier ones.
//
// Communication (gathers and scatters) is issued in one fixed order, the
// same on every rank, so that collectives pair up:
//   gather 0 .. L, then for each round r: scatter r, gather r + L + 1
// where L is the lookahead (prefetch_count, capped at rounds - 1). compute(r)
// starts once gather(r) is done, and scatter(r) once compute(r) is. With
// L > 0 the communication runs on one worker thread, started once for the
// pipeline's lifetime (never per step), while the calling thread computes;
// with L == 0 everything runs on the calling thread, round after round.
//
// A failure stops the computation, not the communication: every gather and
// scatter of the schedule is still issued (so the other ranks' collectives
// pair up and none waits for ever), while no later round is computed; Run
// returns the first failure (a communication error before a compute error).
// A Run told to skip_compute from the start (this rank already failed its
// step) only communicates. Exceptions thrown by a stage become Internal
// errors; none escapes a thread.
#ifndef MUON_ENGINE_PIPELINE_H_
#define MUON_ENGINE_PIPELINE_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muon {

// One communication op of the schedule.
struct PipelineOp {
  bool scatter = false;  // false: gather
  int round = 0;
  bool operator==(const PipelineOp& o) const { return scatter == o.scatter && round == o.round; }
};

// The communication order for `rounds` rounds with lookahead `lookahead`
// (see above; lookahead is capped at rounds - 1).
std::vector<PipelineOp> PipelineSchedule(int rounds, int lookahead);

class Pipeline {
 public:
  using Stage = std::function<absl::Status(int round)>;
  struct Stages {
    Stage gather, compute, scatter;
    // Rounds whose compute communicates too (the sums of a matrix split over
    // ranks): for a round where `communicates` says so, compute starts only
    // once every op of the schedule before its scatter is done, so that it
    // has the communicators to itself and every rank issues its collectives
    // between the same two ops; and when its compute is skipped (a failure),
    // `instead` runs there, and must issue the same collectives. Unset: no
    // round communicates.
    std::function<bool(int round)> communicates;
    Stage instead;
  };

  // A pipeline with lookahead `lookahead` (>= 0); starts the worker thread
  // when it is positive (ResourceExhausted when the thread cannot start).
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(int lookahead);
  ~Pipeline();  // stops and joins the worker
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int lookahead() const { return lookahead_; }

  // Runs `rounds` rounds of `stages`; not reentrant.
  absl::Status Run(int rounds, const Stages& stages, bool skip_compute = false);

 private:
  explicit Pipeline(int lookahead) : lookahead_(lookahead) {}
  absl::Status RunInline(int rounds, const Stages& stages, bool skip_compute);
  // Round r's compute, or when `skip`, what communicating rounds run instead.
  static absl::Status Compute(const Stages& stages, int r, bool skip);
  // ops_ for `rounds` rounds with `lookahead`.
  const std::vector<PipelineOp>& Schedule(int rounds, int lookahead);
  void WorkerLoop();
  void Communicate();  // one step's communication lane (on the worker)

  const int lookahead_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool shutdown_ = false;
  // The schedule, made again only when rounds or lookahead change (the same
  // every step: a step allocates nothing); read by the worker during a Run.
  std::vector<PipelineOp> ops_;
  std::vector<int> scatter_at_;  // per round: its scatter's index in ops_
  int ops_rounds_ = -1, ops_lookahead_ = -1;
  // The step in flight (guarded by mu_).
  bool job_ = false;
  const Stages* stages_ = nullptr;
  int gathered_ = 0;  // rounds whose gather is done
  int computed_ = 0;  // rounds whose compute is done (or skipped)
  int issued_ = 0;    // ops of the schedule done
  absl::Status comm_error_;
};

}  // namespace muon

#endif  // MUON_ENGINE_PIPELINE_H_
