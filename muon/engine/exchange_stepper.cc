#include "muon/engine/exchange_stepper.h"

#include <algorithm>
#include <mutex>

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
  const DType ns_wire = options.ns.dtype == NsDtype::kBF16 ? DType::kBF16 : DType::kF32;
  s->tables_ = BuildRoundTables(plan, me, world.size(), ns_wire);
  // The job-wide pieces (every rank's blocks) are not needed any more.
  for (PlanParam& pp : plan.params) {
    for (Holder& h : pp.holders) h.first_block = h.num_blocks = 0;
    std::vector<muon::RunBlock>().swap(pp.blocks);
  }
  s->stats_.matrices_total = static_cast<int64_t>(plan.units.size());
  for (const Unit& u : plan.units) s->stats_.matrices_owned += u.owner == me;

  const int rounds = s->rounds();
  // A world of one only copies: nothing to run ahead, and one slot.
  const int lookahead = world.size() == 1
                            ? 0
                            : std::min(options.dist.prefetch_count, std::max(0, rounds - 1));
  int64_t most_slots = 0;
  for (const RoundTable& t : s->tables_) most_slots = std::max(most_slots, t.slot_floats);
  const std::shared_ptr<Device>& device = ctx.device;
  // The owned matrices in the dtype the backend orthogonalizes with the least
  // work (bf16 for the CPU's AMX products: no rounding and widening passes).
  s->slot_dtype_ = device->math().SlotDtype(options.ns);
  for (int k = 0; k <= lookahead; ++k) {
    MUON_ASSIGN_OR_RETURN(
        DeviceBuffer b,
        DeviceBuffer::Make(device, static_cast<size_t>(most_slots) * SizeOf(s->slot_dtype_),
                           "the working buffer of owned matrices"));
    s->slots_.push_back(std::move(b));
  }
  s->carry_ = carry_verdicts && rounds > 0 && world.size() > 1;
  const size_t trailers = s->carry_ ? kVerdictBytes * static_cast<size_t>(world.size()) : 0;
  const size_t exchange_bytes = MaxExchangeBytes(s->tables_) + trailers;
  MUON_ASSIGN_OR_RETURN(s->send_, DeviceBuffer::Make(device, exchange_bytes, "the send buffer"));
  if (world.size() > 1) {  // a world of one unpacks from the send buffer
    MUON_ASSIGN_OR_RETURN(s->recv_,
                          DeviceBuffer::Make(device, exchange_bytes, "the receive buffer"));
  }
  if (s->carry_ && !device->is_host()) {
    MUON_ASSIGN_OR_RETURN(s->verdicts_on_device_,
                          DeviceBuffer::Make(device, trailers, "the step verdicts"));
    MUON_ASSIGN_OR_RETURN(s->verdict_out_,
                          DeviceBuffer::Make(device, kVerdictBytes, "this rank's step verdict"));
  }
  for (int r = 0; r < rounds; ++r) {
    MUON_ASSIGN_OR_RETURN(
        BoundExchange b,
        BindExchange(s->tables_[r], *ctx.device, *ctx.updates,
                     LocalBuffer{s->slots_[r % s->slots_.size()].data(), s->slot_dtype_},
                     s->send_.as<unsigned char>(),
                     s->recv_.as<unsigned char>(), world.size() == 1,
                     s->carry_ && r == rounds - 1 ? kVerdictBytes : 0));
    s->bound_.push_back(std::move(b));
  }
  for (const RoundTable& t : s->tables_) {
    for (const ShapeBatch& b : t.batches) {
      MUON_RETURN_IF_ERROR(ctx.device->math().Reserve(options.ns, b.count, b.rows, b.cols));
    }
  }
  // On GPUs with more than one rank, the exchanges run on the device's
  // communication lane (a stream of their own) so that a round's exchange
  // overlaps another's math; stream points order the two (a world of one
  // only copies: it stays on the step's stream).
  if (!device->is_host() && world.size() > 1 && rounds > 0) {
    MUON_ASSIGN_OR_RETURN(s->lane_, device->CommLane());
    // Step stream: 0 the momentum done, 1 + r round r's math done. Lane: r
    // round r's gather done, rounds its last scatter done.
    MUON_RETURN_IF_ERROR(device->ReserveSignals(rounds + 1));
    MUON_RETURN_IF_ERROR(s->lane_.device->ReserveSignals(rounds + 1));
  }
  MUON_ASSIGN_OR_RETURN(s->pipeline_, Pipeline::Create(lookahead));
  return s;
}

absl::Status ExchangeStepper::Orthogonalize(int round) {
  Device& device = *ctx_.device;
  Device* lane = lane_.device;
  if (lane != nullptr) MUON_RETURN_IF_ERROR(device.AwaitSignal(*lane, round));  // gathered
  void* slots = slots_[round % slots_.size()].data();
  for (const ShapeBatch& b : tables_[round].batches) {
    MUON_RETURN_IF_ERROR(ctx_.device->math().Orthogonalize(
        ctx_.options->ns,
        {ElementAt(slots, slot_dtype_, b.offset), b.count, b.rows, b.cols, slot_dtype_}));
  }
  return lane != nullptr ? device.Signal(1 + round) : absl::OkStatus();
}

absl::Status ExchangeStepper::Run(void* stream, bool failed) {
  stats_.orthogonalized = 0;
  stats_.ns_flops = 0;
  // The first failure of this step so far (both lanes note theirs), for the
  // verdict the last scatter carries.
  std::mutex mu;
  absl::Status first;
  auto note = [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(mu);
    if (first.ok() && !st.ok()) first = st;
    return st;
  };
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
        WriteVerdict(code, verdict_digest_, mine_);
      }
      out = mine_;
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
    stats_.orthogonalized += t.owned;
    stats_.ns_flops += t.flops;
  }
  return absl::OkStatus();
}

}  // namespace muon
