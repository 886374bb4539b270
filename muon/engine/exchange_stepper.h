// The exchange-round stepper: the matrices of parameters registered with a
// layout (and every matrix of a single-process optimizer, a world of one).
// Each round, every canonical holder sends its pieces of the round's
// matrices to their owners in one all_to_all_v, each owner orthogonalizes
// whole matrices (batched by shape), and a second all_to_all_v sends every
// holder its pieces of the results (sharding/exchange.h). Rounds run through
// the prefetch pipeline (pipeline.h): with prefetch_count > 0, the exchanges
// of later rounds overlap the math of earlier ones; on GPUs they also run
// on a stream of their own (the device's communication lane), ordered
// against the math by stream points, so that the GPU overlaps them too.
#ifndef MUON_ENGINE_EXCHANGE_STEPPER_H_
#define MUON_ENGINE_EXCHANGE_STEPPER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/comm/comm.h"
#include "muon/device/device.h"
#include "muon/engine/outcome.h"
#include "muon/engine/pipeline.h"
#include "muon/engine/stepper.h"
#include "muon/math/ns_program.h"
#include "muon/math/split_blocks.h"
#include "muon/sharding/exchange.h"
#include "muon/sharding/plan.h"

namespace muon {

class ExchangeStepper : public Stepper {
 public:
  // This rank's round tables from `plan` (whose job-wide pieces it then
  // frees: the tables hold every span this rank moves), the working memory
  // of the step on ctx.device, allocated once, and every round's exchange
  // bound to it. `world` carries the exchanges.
  // `carry_verdicts`: the step's last collective is this stepper's last
  // scatter (no custom-path or ZeRO-2 matrix in the job, at least one round,
  // more than one rank: the same on every rank); it then carries every
  // rank's 16-byte step verdict to every rank (outcome.h), so that agreeing
  // on the step adds no collective.
  static absl::StatusOr<std::unique_ptr<ExchangeStepper>> Create(Plan& plan,
                                                                 const StepContext& ctx,
                                                                 Comm& world,
                                                                 bool carry_verdicts = false);

  absl::Status Run(void* stream, bool failed) override;
  const StepperStats& stats() const override { return stats_; }
  int rounds() const { return static_cast<int>(tables_.size()); }

  bool carries_verdicts() const { return carry_; }
  // Before Run: what this rank's verdict says unless the stepper itself
  // fails first (the status code of a failure before it; 0 when none) and
  // the hyper-parameters' digest.
  void SetVerdict(int32_t code, uint64_t digest) {
    verdict_code_ = code;
    verdict_digest_ = digest;
  }
  // After Run: every rank's verdict, rank order (empty when not carried).
  // On a GPU they stay on the device: verdicts() is empty and
  // device_verdicts() holds them once the stream got there.
  const std::vector<unsigned char>& verdicts() const { return verdicts_; }
  const void* device_verdicts() const { return verdicts_on_device_.data(); }

 private:
  ExchangeStepper(const StepContext& ctx, Comm& world) : ctx_(ctx), world_(world) {}
  absl::Status Orthogonalize(int round);
  // NorMuon on the round's batch `batch` (its matrices just orthogonalized).
  absl::Status NorMuon(int round, size_t batch, const MatrixBatch& matrices);
  // The moments NorMuon takes for the round's batch `batch` (moment_ptrs_).
  float* const* MomentPointers(int round, size_t batch);
  // splits_ and the sums' buffers from the plan; InvalidArgument when a
  // round gives this rank parts of two split matrices.
  absl::Status PlanSplits(const Plan& plan);
  // Create's phases, after the tables and splits_: the working buffers of
  // owned matrices (one per round in flight, `lookahead` + 1), the exchange's
  // send and receive buffers and (carry_) the verdicts'; each round's
  // exchange bound to them; each shape batch's math reserved (and its
  // split's lr ratios); NorMuon's moments of every owned matrix.
  absl::Status MakeBuffers(int lookahead, bool carry_verdicts);
  absl::Status BindRounds();
  absl::Status ReserveBatches(const Plan& plan);
  void AddMoments(const Plan& plan);
  // The round's split matrices (Unit::parts > 1): this rank's part with the
  // other members, or (`skip`: this rank failed, or has no part) only the
  // sums the members expect, so that every rank issues the same collectives.
  absl::Status RunSplit(int round, bool skip);
  // One sum over the members of each split matrix of `round`, which every
  // rank calls in the same order: `values` (`count` elements) becomes the
  // element-wise sum of its members' values, the same bits on each (a
  // reduce-scatter, each member adding one chunk in member order, then an
  // all-gather, as two all_to_all_v calls over the world). NULL values: this
  // rank adds zeros and keeps nothing. A rank with no part sends nothing.
  // In the backend's memory; on a GPU the collectives run on the lane.
  template <typename T>
  absl::Status Sum(int round, T* values, int64_t count);
  // The sums' buffers (and on a GPU the block's workspace), sized by
  // PlanSplits.
  absl::Status MakeSplitBuffers();
  // On a GPU with a lane: the lane after the step's stream's work so far
  // (ToLane), the step's stream after the lane's (FromLane), at the sums'
  // stream point; nothing otherwise.
  absl::Status ToLane();
  absl::Status FromLane();
  // The signal the sums' stream points use on both streams (after the
  // rounds' own: Create reserves rounds() + 2).
  int sum_point() const { return rounds() + 1; }

  // A round's split matrices and this rank's part of one of them.
  struct SplitRound {
    std::vector<std::vector<int>> members;  // per split matrix: its parts' owners
    std::vector<std::string> names;         // per split matrix: its param, for errors
    int mine = -1;                          // the matrix this rank has a part of, or -1
    int place = -1;                         // this rank among its members
    BlockSlot block;                        // that part in the round's slots
    int64_t first = 0, n = 0;               // its columns of the whole's n (wide orientation)
    int64_t rows = 0;                       // the whole's rows (NorMuon's moments)
    int moments = -1;                       // its NorMuon moments (ctx_.moments), or -1
    // The sums its members make (BlockSums, then NorMuon's), and how many
    // every rank makes in this round: the most of any of its split matrices
    // (members of one with fewer make the rest without bytes).
    std::vector<MemberSum> sums;
    int calls = 0;
    std::string op;  // the sums' label, for errors (made once: no allocation per step)
  };

  StepContext ctx_;
  Comm& world_;
  bool carry_ = false;
  int32_t verdict_code_ = 0;
  uint64_t verdict_digest_ = 0;
  std::vector<unsigned char> verdicts_;
  // This rank's verdict, read by the stream: page-locked on a GPU (no host
  // wait for the copy), else mine_.
  unsigned char* mine() {
    return verdict_home_.size() != 0 ? verdict_home_.as<unsigned char>() : mine_;
  }
  unsigned char mine_[kVerdictBytes] = {};
  StagingBuffer verdict_home_;
  DeviceBuffer verdicts_on_device_;
  DeviceBuffer verdict_out_;  // on a GPU: this rank's verdict, for a captured step
  std::vector<RoundTable> tables_;
  // prefetch + 1 working buffers of owned matrices (round r uses r % size),
  // the exchange's send and receive buffers, and each round's bound exchange.
  std::vector<DeviceBuffer> slots_;
  DType slot_dtype_ = DType::kF32;  // the backend's SlotDtype
  DeviceBuffer send_, recv_;
  std::vector<BoundExchange> bound_;
  // On GPUs with more than one rank: the device's communication lane, where
  // the exchanges run (Device::CommLane); else none (device NULL).
  Device::Lane lane_;
  std::unique_ptr<Pipeline> pipeline_;
  StepperStats stats_;
  // Per round (empty when it has no split matrix); the sums' buffers in the
  // backend's memory and byte tables, sized once (the zeros a failed member
  // sends, when one does), and on a GPU the block's workspace
  // (muon/math/split_ns.h).
  std::vector<SplitRound> splits_;
  size_t sum_bytes_ = 0, split_work_bytes_ = 0;
  void* step_stream_ = nullptr;  // Run's stream (the sums' where there is no lane)
  DeviceBuffer sum_send_, sum_recv_, sum_zeros_, split_work_;
  // NorMuon (ctx.moments set): per round, per shape batch, the moments' ids
  // of its matrices in slot order, and their params here (or -1); the
  // pointers NorMuon takes, sized once for the largest batch (the rounds'
  // math runs one at a time).
  std::vector<std::vector<std::vector<int>>> moment_ids_;
  std::vector<std::vector<std::vector<int>>> moment_locals_;
  std::vector<float*> moment_ptrs_;
  // Per round, per shape batch: the split of its parameter (none for whole
  // matrices) and each block's lr ratio; the blocks' host copy.
  std::vector<std::vector<SplitBatch>> split_batches_;
  SplitOrthogonalizer split_blocks_;
  std::vector<size_t> sum_send_bytes_, sum_send_offsets_, sum_recv_bytes_, sum_recv_offsets_;
};

}  // namespace muon

#endif  // MUON_ENGINE_EXCHANGE_STEPPER_H_
