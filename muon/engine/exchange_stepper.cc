#include "muon/engine/exchange_stepper.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "muon/common/dtype.h"
#include "muon/common/status.h"
#include "muon/engine/outcome.h"

namespace muon {

absl::StatusOr<std::unique_ptr<ExchangeStepper>> ExchangeStepper::Create(Plan& plan,
                                                                          const StepContext& ctx,
                                                                          Comm& world,
                                                                          bool carry_verdicts) {
  std::unique_ptr<ExchangeStepper> s(new ExchangeStepper(ctx, world));
  const Options& options = *ctx.options;
  const int me = world.rank();
  // The results' precision on the wire (bf16 and fp16 results are exact there).
  const DType ns_wire = options.ns.dtype == NsDtype::kBF16   ? DType::kBF16
                        : options.ns.dtype == NsDtype::kFP16 ? DType::kF16
                                                             : DType::kF32;
  s->tables_ = BuildRoundTables(plan, me, world.size(), ns_wire);
  // The job-wide pieces (every rank's blocks) are not needed any more.
  for (PlanParam& pp : plan.params) {
    for (Holder& h : pp.holders) h.first_block = h.num_blocks = 0;
    std::vector<muon::RunBlock>().swap(pp.blocks);
  }
  // A matrix split over ranks counts once in the job and on each member; an
  // empty matrix (no unit: nothing to orthogonalize) in the job only.
  s->stats_.matrices_total = plan.empty_matrices;
  for (const Unit& u : plan.units) {
    s->stats_.matrices_total += u.part == 0;
    s->stats_.matrices_owned += u.owner == me;
  }
  MUON_RETURN_IF_ERROR(s->PlanSplits(plan));

  const int rounds = s->rounds();
  // A world of one only copies: nothing to run ahead, and one slot.
  const int lookahead = world.size() == 1
                            ? 0
                            : std::min(options.dist.prefetch_count, std::max(0, rounds - 1));
  MUON_RETURN_IF_ERROR(s->MakeBuffers(lookahead, carry_verdicts));
  MUON_RETURN_IF_ERROR(s->BindRounds());
  MUON_RETURN_IF_ERROR(s->ReserveBatches(plan));
  if (ctx.moments != nullptr) s->AddMoments(plan);
  // On GPUs with more than one rank, the exchanges run on the device's
  // communication lane (a stream of their own) so that a round's exchange
  // overlaps another's math; stream points order the two (a world of one
  // only copies: it stays on the step's stream).
  const std::shared_ptr<Device>& device = ctx.device;
  if (!device->is_host() && world.size() > 1 && rounds > 0) {
    MUON_ASSIGN_OR_RETURN(s->lane_, device->CommLane());
    // Step stream: 0 the momentum done, 1 + r round r's math done. Lane: r
    // round r's gather done, rounds its last scatter done. Both: rounds + 1
    // the split matrices' sums' point (sum_point).
    MUON_RETURN_IF_ERROR(device->ReserveSignals(rounds + 2));
    MUON_RETURN_IF_ERROR(s->lane_.device->ReserveSignals(rounds + 2));
  }
  MUON_ASSIGN_OR_RETURN(s->pipeline_, Pipeline::Create(lookahead));
  return s;
}

absl::Status ExchangeStepper::MakeBuffers(int lookahead, bool carry_verdicts) {
  const std::shared_ptr<Device>& device = ctx_.device;
  const int rounds = this->rounds();
  int64_t most_slots = 0;
  for (const RoundTable& t : tables_) most_slots = std::max(most_slots, t.slot_floats);
  // The owned matrices in the dtype the backend orthogonalizes with the least
  // work (bf16 for the CPU's AMX products: no rounding and widening passes);
  // fp32 when a round holds a part of a split matrix (OrthogonalizeBlock's).
  const bool any_split = std::any_of(splits_.begin(), splits_.end(),
                                     [](const SplitRound& r) { return !r.members.empty(); });
  slot_dtype_ = any_split ? DType::kF32 : device->math().SlotDtype(ctx_.options->ns);
  MUON_RETURN_IF_ERROR(MakeSplitBuffers());
  for (int k = 0; k <= lookahead; ++k) {
    MUON_ASSIGN_OR_RETURN(
        DeviceBuffer b,
        DeviceBuffer::Make(device, static_cast<size_t>(most_slots) * SizeOf(slot_dtype_),
                           "the working buffer of owned matrices"));
    slots_.push_back(std::move(b));
  }
  carry_ = carry_verdicts && rounds > 0 && world_.size() > 1;
  const size_t trailers = carry_ ? kVerdictBytes * static_cast<size_t>(world_.size()) : 0;
  const size_t exchange_bytes = MaxExchangeBytes(tables_) + trailers;
  MUON_ASSIGN_OR_RETURN(send_, DeviceBuffer::Make(device, exchange_bytes, "the send buffer"));
  if (world_.size() > 1) {  // a world of one unpacks from the send buffer
    MUON_ASSIGN_OR_RETURN(recv_, DeviceBuffer::Make(device, exchange_bytes, "the receive buffer"));
  }
  if (carry_ && !device->is_host()) {
    MUON_ASSIGN_OR_RETURN(verdicts_on_device_,
                          DeviceBuffer::Make(device, trailers, "the step verdicts"));
    MUON_ASSIGN_OR_RETURN(verdict_out_,
                          DeviceBuffer::Make(device, kVerdictBytes, "this rank's step verdict"));
    MUON_ASSIGN_OR_RETURN(verdict_home_,
                          StagingBuffer::Make(device, kVerdictBytes, "this rank's step verdict"));
  }
  return absl::OkStatus();
}

absl::Status ExchangeStepper::BindRounds() {
  const int rounds = this->rounds();
  for (int r = 0; r < rounds; ++r) {
    MUON_ASSIGN_OR_RETURN(
        BoundExchange b,
        BindExchange(tables_[r], *ctx_.device, *ctx_.updates,
                     LocalBuffer{slots_[r % slots_.size()].data(), slot_dtype_},
                     send_.as<unsigned char>(), recv_.as<unsigned char>(), world_.size() == 1,
                     carry_ && r == rounds - 1 ? kVerdictBytes : 0));
    bound_.push_back(std::move(b));
  }
  return absl::OkStatus();
}

absl::Status ExchangeStepper::ReserveBatches(const Plan& plan) {
  const Options& options = *ctx_.options;
  for (const RoundTable& t : tables_) {
    auto& splits = split_batches_.emplace_back();
    for (const ShapeBatch& b : t.batches) {
      SplitBatch& sb = splits.emplace_back();
      if (b.split_param < 0) {
        MUON_RETURN_IF_ERROR(ctx_.device->math().Reserve(options.ns, b.count, b.rows, b.cols));
        continue;
      }
      const PlanParam& pp = plan.params[static_cast<size_t>(b.split_param)];
      sb.split = pp.split;
      sb.factors = BlockLrRatios(options.adjust_lr, pp.split, b.rows, b.cols);
      MUON_RETURN_IF_ERROR(split_blocks_.Reserve(ctx_.device->math(),
                                                 MemorySourceOf(ctx_.device.get()), options.ns,
                                                 pp.split, b.count, b.rows, b.cols,
                                                 slot_dtype_));
    }
  }
  return absl::OkStatus();
}

void ExchangeStepper::AddMoments(const Plan& plan) {
  for (const RoundTable& t : tables_) {
    auto& ids = moment_ids_.emplace_back();
    auto& locals = moment_locals_.emplace_back();
    for (const ShapeBatch& b : t.batches) {
      auto& batch = ids.emplace_back();
      auto& local = locals.emplace_back();
      for (int i : b.units) {
        const Unit& u = plan.units[static_cast<size_t>(i)];
        const PlanParam& pp = plan.params[u.param];
        batch.push_back(
            ctx_.moments->Add(pp.name, u.index, SplitMomentCount(pp.split, b.rows, b.cols)));
        local.push_back(plan.params[u.param].local);
      }
      moment_ptrs_.resize(std::max(moment_ptrs_.size(), batch.size()));
    }
  }
}

float* const* ExchangeStepper::MomentPointers(int round, size_t batch) {
  const std::vector<int>& ids = moment_ids_[static_cast<size_t>(round)][batch];
  const std::vector<int>& locals = moment_locals_[static_cast<size_t>(round)][batch];
  std::vector<float*>& ptrs = moment_ptrs_;
  // A parameter skipped this step (no gradient bound: a world of one only)
  // keeps its moments: NorMuon passes over its matrix.
  const std::vector<Param>& params = *ctx_.params;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int local = locals[i];
    ptrs[i] = local >= 0 && !params[static_cast<size_t>(local)].active ? nullptr
                                                                        : ctx_.moments->data(ids[i]);
  }
  return ptrs.data();
}

absl::Status ExchangeStepper::NorMuon(int round, size_t batch, const MatrixBatch& matrices) {
  const Options& o = *ctx_.options;
  return ctx_.device->math().NorMuon({o.normuon_beta2, o.normuon_eps, o.ns.dtype}, matrices,
                                     MomentPointers(round, batch));
}

absl::Status ExchangeStepper::Orthogonalize(int round) {
  Device& device = *ctx_.device;
  Device* lane = lane_.device;
  if (lane != nullptr) MUON_RETURN_IF_ERROR(device.AwaitSignal(*lane, round));  // gathered
  void* slots = slots_[round % slots_.size()].data();
  absl::Status st;
  const std::vector<ShapeBatch>& batches = tables_[round].batches;
  for (size_t k = 0; k < batches.size() && st.ok(); ++k) {
    const ShapeBatch& b = batches[k];
    const MatrixBatch matrices{ElementAt(slots, slot_dtype_, b.offset), b.count, b.rows, b.cols,
                               slot_dtype_};
    const SplitBatch& split = split_batches_[static_cast<size_t>(round)][k];
    if (!split.split.none()) {
      const Options& o = *ctx_.options;
      const NorMuonStep normuon{o.normuon_beta2, o.normuon_eps, o.ns.dtype};
      const bool with = ctx_.moments != nullptr;
      st = split_blocks_.Run(ctx_.device->math(), o.ns, split.split, split.factors,
                             with ? &normuon : nullptr, with ? MomentPointers(round, k) : nullptr,
                             matrices);
    } else {
      st = ctx_.device->math().Orthogonalize(ctx_.options->ns, matrices);
      if (st.ok() && ctx_.moments != nullptr) st = NorMuon(round, k, matrices);
    }
    if (st.ok() && ctx_.options->skip_nonfinite_updates) {
      int64_t* counter = ctx_.nonfinite_updates != nullptr ? ctx_.nonfinite_updates
                                                           : &stats_.nonfinite_updates;
      st = ctx_.device->math().CountNonFinite(slot_dtype_, matrices.data,
                                              b.count * b.rows * b.cols, counter);
    }
  }
  // The split matrices' sums are collectives: issued even after a failure.
  if (!splits_[static_cast<size_t>(round)].members.empty()) {
    const absl::Status split = RunSplit(round, /*skip=*/!st.ok());
    if (st.ok()) st = split;
  }
  MUON_RETURN_IF_ERROR(st);
  return lane != nullptr ? device.Signal(1 + round) : absl::OkStatus();
}

absl::Status ExchangeStepper::Run(void* stream, bool failed) {
  step_stream_ = stream;
  stats_.orthogonalized = 0;
  stats_.ns_flops = 0;
  stats_.nonfinite_updates = 0;
  // The first failure of this step so far (both lanes note theirs), for the
  // verdict the last scatter carries.
  std::mutex mu;
  absl::Status first;
  auto note = [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(mu);
    if (first.ok() && !st.ok()) first = st;
    return st;
  };
  if (ctx_.nonfinite_updates != nullptr) {  // the GPU's count, zeroed on the stream
    (void)note(ctx_.device->ZeroAsync(ctx_.nonfinite_updates, sizeof(int64_t)));
  }
  // The exchanges' device and stream: the communication lane when there is
  // one, ordered after the step's momentum (and the step's stream after the
  // lane's last scatter, below).
  Device* lane = lane_.device;
  Device& on = lane != nullptr ? *lane : *ctx_.device;
  void* comm_stream = lane != nullptr ? lane_.stream : stream;
  // A step being captured into a CUDA graph copies no host memory: its
  // verdict (no failure so far, the hyper-parameters' digest; a replay
  // carries the same) goes into device memory first, on the step's stream.
  const bool captured = carry_ && !ctx_.device->is_host() && ctx_.device->Capturing();
  if (captured) {
    WriteVerdict(verdict_code_, verdict_digest_, mine_);
    (void)note(ctx_.device->math().StoreBytes(verdict_out_.data(), mine_, kVerdictBytes));
  }
  if (lane != nullptr) {
    absl::Status st = ctx_.device->Signal(0);
    if (st.ok()) st = lane->AwaitSignal(*ctx_.device, 0);
    (void)note(st);
  }
  auto exchange = [&](int round, bool scatter) {
    // Possibly on the pipeline's worker thread: the device must be current
    // for the communicator (a new thread starts on device 0).
    absl::StatusOr<int> bound = ctx_.device->Bind();
    if (!bound.ok()) (void)note(bound.status());
    const BoundExchange& b = bound_[round];
    const BoundExchange::Direction& d = scatter ? b.scatter : b.gather;
    // A scatter sends round r's results: after its math (the step's stream).
    if (scatter && lane != nullptr) (void)note(lane->AwaitSignal(*ctx_.device, 1 + round));
    const unsigned char* out = nullptr;
    unsigned char* in = nullptr;
    if (d.trailer != 0 && captured) {
      out = verdict_out_.as<unsigned char>();
      in = verdicts_on_device_.as<unsigned char>();
    } else if (d.trailer != 0) {
      {
        std::lock_guard<std::mutex> lock(mu);
        const int32_t code =
            verdict_code_ != 0 ? verdict_code_ : static_cast<int32_t>(first.code());
        WriteVerdict(code, verdict_digest_, mine());
      }
      out = mine();
      in = verdicts_on_device_.as<unsigned char>();
      if (ctx_.device->is_host()) {
        verdicts_.assign(kVerdictBytes * static_cast<size_t>(world_.size()), 0);
        in = verdicts_.data();
      }
    }
    absl::Status st = note(RunExchange(b, d, world_, on, send_.as<unsigned char>(),
                                       recv_.as<unsigned char>(), comm_stream, out, in,
                                       captured));
    if (!scatter && lane != nullptr) (void)note(lane->Signal(round));  // gathered
    return st;
  };
  Pipeline::Stages stages;
  stages.gather = [&](int r) { return exchange(r, false); };
  stages.compute = [&](int r) { return note(Orthogonalize(r)); };
  stages.scatter = [&](int r) { return exchange(r, true); };
  stages.communicates = [&](int r) { return !splits_[static_cast<size_t>(r)].members.empty(); };
  stages.instead = [&](int r) { return note(RunSplit(r, /*skip=*/true)); };
  verdicts_.clear();
  absl::Status ran = pipeline_->Run(rounds(), stages, /*skip_compute=*/failed);
  if (lane != nullptr) {
    // The step's stream (the updates, the verdicts' gate) after the lane.
    absl::Status st = lane->Signal(rounds());
    if (st.ok()) st = ctx_.device->AwaitSignal(*lane, rounds());
    if (ran.ok()) ran = st;
  }
  MUON_RETURN_IF_ERROR(ran);
  if (failed) return absl::OkStatus();
  for (const RoundTable& t : tables_) {
    stats_.orthogonalized += t.owned + static_cast<int64_t>(t.blocks.size());
    stats_.ns_flops += t.flops;
  }
  return absl::OkStatus();
}

}  // namespace muon
