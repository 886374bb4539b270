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
    // round r's gather done, rounds its last scatter done.
    MUON_RETURN_IF_ERROR(device->ReserveSignals(rounds + 1));
    MUON_RETURN_IF_ERROR(s->lane_.device->ReserveSignals(rounds + 1));
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
  if (any_split && !device->is_host()) {
    return absl::UnimplementedError(
        "MUON_ASSIGNMENT_SPLIT: a matrix split over ranks runs on the CPU backend only so far");
  }
  slot_dtype_ = any_split ? DType::kF32 : device->math().SlotDtype(ctx_.options->ns);
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

absl::Status ExchangeStepper::PlanSplits(const Plan& plan) {
  const int me = world_.rank();
  splits_.assign(tables_.size(), SplitRound());
  for (size_t r = 0; r < splits_.size(); ++r) {
    splits_[r].op = absl::StrCat("summing the split matrices of round ", r);
  }
  size_t sum_bytes = 0;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    if (u.parts <= 1) continue;
    SplitRound& r = splits_[static_cast<size_t>(u.round)];
    const PlanParam& pp = plan.params[u.param];
    const int64_t m = std::min(pp.rows, pp.cols), n = std::max(pp.rows, pp.cols);
    std::vector<MemberSum> sums = BlockSums(ctx_.options->ns, m, n);
    if (ctx_.moments != nullptr) sums.push_back({true, pp.rows});  // NorMuonBlock's
    if (u.part == 0) {
      r.members.emplace_back();
      r.names.push_back(pp.name);
      r.calls = std::max(r.calls, static_cast<int>(sums.size()));
    }
    r.members.back().push_back(u.owner);
    if (u.owner != me) continue;
    if (r.mine >= 0) {  // the same plan on every rank: every rank fails here alike
      return absl::InvalidArgumentError(absl::StrCat(
          "round ", u.round, " gives rank ", me, " parts of two split matrices ('",
          r.names[static_cast<size_t>(r.mine)], "' and '", plan.params[u.param].name,
          "'): a rank takes one part per round"));
    }
    r.mine = static_cast<int>(r.members.size()) - 1;
    r.place = u.part;
    for (const BlockSlot& b : tables_[static_cast<size_t>(u.round)].blocks) {
      if (b.unit == static_cast<int>(i)) r.block = b;
    }
    r.first = u.first;
    r.n = n;
    // NorMuon's moments of the whole's rows: every member keeps them all
    // (NorMuonBlock updates them alike), saved and restored as an owner's;
    // the first member gives them to a host putting the owners' together.
    if (ctx_.moments != nullptr) {
      r.moments = ctx_.moments->Add(pp.name, u.index, pp.rows, /*primary=*/u.part == 0);
    }
    // A sum's chunks: at most its whole count, or a value per member.
    for (const MemberSum& sum : sums) {
      sum_bytes = std::max({sum_bytes,
                            static_cast<size_t>(sum.count) * (sum.f64 ? sizeof(double) : sizeof(float)),
                            static_cast<size_t>(u.parts) * sizeof(double)});
    }
    r.sums = std::move(sums);
  }
  sum_send_.assign(sum_bytes, 0);
  sum_recv_.assign(sum_bytes, 0);
  const size_t world = static_cast<size_t>(world_.size());
  for (auto* v : {&sum_send_bytes_, &sum_send_offsets_, &sum_recv_bytes_, &sum_recv_offsets_}) {
    v->assign(world, 0);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status ExchangeStepper::Sum(int round, T* values, int64_t count) {
  const SplitRound& s = splits_[static_cast<size_t>(round)];
  std::fill(sum_send_bytes_.begin(), sum_send_bytes_.end(), 0);
  std::fill(sum_recv_bytes_.begin(), sum_recv_bytes_.end(), 0);
  std::fill(sum_send_offsets_.begin(), sum_send_offsets_.end(), 0);
  std::fill(sum_recv_offsets_.begin(), sum_recv_offsets_.end(), 0);
  const std::string& op = s.op;
  if (s.mine < 0) {  // no part: two collectives without bytes, both issued whatever happens
    absl::Status st = world_.AllToAllV(sum_send_.data(), sum_send_bytes_, sum_send_offsets_,
                                       sum_recv_.data(), sum_recv_bytes_, sum_recv_offsets_,
                                       nullptr, op);
    const absl::Status second =
        world_.AllToAllV(sum_send_.data(), sum_send_bytes_, sum_send_offsets_, sum_recv_.data(),
                         sum_recv_bytes_, sum_recv_offsets_, nullptr, op);
    return st.ok() ? second : st;
  }
  const std::vector<int>& members = s.members[static_cast<size_t>(s.mine)];
  const int64_t g = static_cast<int64_t>(members.size()), j = s.place;
  if (values == nullptr) {  // a member that failed: zeros (made on this path only)
    sum_zeros_.assign(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T), 0);
    values = reinterpret_cast<T*>(sum_zeros_.data());
  }
  auto begin = [&](int64_t i) { return i * (count / g) + std::min(i, count % g); };
  auto length = [&](int64_t i) { return count / g + (i < count % g ? 1 : 0); };
  // Reduce-scatter: chunk i to member i; chunk j from every other member.
  size_t sent = 0, received = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (i == j) continue;
    const size_t peer = static_cast<size_t>(members[static_cast<size_t>(i)]);
    sum_send_offsets_[peer] = sent;
    sum_send_bytes_[peer] = static_cast<size_t>(length(i)) * sizeof(T);
    std::memcpy(sum_send_.data() + sent, values + begin(i), sum_send_bytes_[peer]);
    sent += sum_send_bytes_[peer];
    sum_recv_offsets_[peer] = received;
    sum_recv_bytes_[peer] = static_cast<size_t>(length(j)) * sizeof(T);
    received += sum_recv_bytes_[peer];
  }
  absl::Status st = world_.AllToAllV(sum_send_.data(), sum_send_bytes_, sum_send_offsets_,
                                     sum_recv_.data(), sum_recv_bytes_, sum_recv_offsets_,
                                     nullptr, op);
  // Chunk j, member by member in member order (every member's chunk the
  // same way, so every member ends with the same bits).
  T* own = values + begin(j);
  for (int64_t e = 0; e < length(j); ++e) {
    T total = 0;
    for (int64_t i = 0; i < g; ++i) {
      T v;
      if (i == j) {
        v = own[e];
      } else {
        const size_t peer = static_cast<size_t>(members[static_cast<size_t>(i)]);
        std::memcpy(&v, sum_recv_.data() + sum_recv_offsets_[peer] + e * sizeof(T), sizeof(T));
      }
      total = i == 0 ? v : total + v;
    }
    own[e] = total;
  }
  // All-gather: chunk j to every other member; chunk i from member i.
  sent = received = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (i == j) continue;
    const size_t peer = static_cast<size_t>(members[static_cast<size_t>(i)]);
    sum_send_offsets_[peer] = sent;
    sum_send_bytes_[peer] = static_cast<size_t>(length(j)) * sizeof(T);
    std::memcpy(sum_send_.data() + sent, own, sum_send_bytes_[peer]);
    sent += sum_send_bytes_[peer];
    sum_recv_offsets_[peer] = received;
    sum_recv_bytes_[peer] = static_cast<size_t>(length(i)) * sizeof(T);
    received += sum_recv_bytes_[peer];
  }
  const absl::Status gathered = world_.AllToAllV(sum_send_.data(), sum_send_bytes_,
                                                 sum_send_offsets_, sum_recv_.data(),
                                                 sum_recv_bytes_, sum_recv_offsets_, nullptr, op);
  if (st.ok()) st = gathered;
  for (int64_t i = 0; i < g; ++i) {
    if (i == j) continue;
    const size_t peer = static_cast<size_t>(members[static_cast<size_t>(i)]);
    std::memcpy(values + begin(i), sum_recv_.data() + sum_recv_offsets_[peer],
                sum_recv_bytes_[peer]);
  }
  return st;
}

absl::Status ExchangeStepper::RunSplit(int round, bool skip) {
  const SplitRound& s = splits_[static_cast<size_t>(round)];
  const bool part = s.mine >= 0;
  size_t issued = 0;
  absl::Status st;
  if (part && !skip) {
    void* slots = slots_[static_cast<size_t>(round) % slots_.size()].data();
    const MatrixBlock block{static_cast<float*>(slots) + s.block.offset, s.block.m,
                            s.block.width, s.block.tall, s.first, s.n};
    // Each sum the backend asks for must be the schedule's next: one that is
    // not is refused before it reaches the wire, and the schedule's own are
    // made below, so that the members' collectives still pair up.
    auto scheduled = [&](bool f64, int64_t count) -> absl::Status {
      if (issued >= s.sums.size() || !(s.sums[issued] == MemberSum{f64, count})) {
        return absl::InternalError(absl::StrCat(
            "the backend asked for sum ", issued + 1, " (", count, f64 ? " doubles" : " floats",
            ") where the members' schedule has ",
            issued < s.sums.size() ? absl::StrCat(s.sums[issued].count,
                                                  s.sums[issued].f64 ? " doubles" : " floats")
                                   : std::string("no more")));
      }
      ++issued;
      return absl::OkStatus();
    };
    auto sum = [&](auto* v, int64_t n) -> absl::Status {
      MUON_RETURN_IF_ERROR(scheduled(sizeof(*v) == sizeof(double), n));
      return Sum(round, v, n);
    };
    // Each captures one reference: held inside the std::function, no
    // allocation per step.
    MemberSums hook;
    hook.f64 = [&sum](double* v, int64_t n) { return sum(v, n); };
    hook.f32 = [&sum](float* v, int64_t n) { return sum(v, n); };
    const Options& o = *ctx_.options;
    st = ctx_.device->math().OrthogonalizeBlock(o.ns, block, hook);
    if (st.ok() && s.moments >= 0) {
      st = ctx_.device->math().NorMuonBlock({o.normuon_beta2, o.normuon_eps, o.ns.dtype}, block,
                                            ctx_.moments->data(s.moments), hook);
    }
    if (st.ok() && issued != s.sums.size()) {
      st = absl::InternalError(absl::StrCat("the backend made ", issued, " of the ",
                                            s.sums.size(), " sums its members' schedule has"));
    }
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("split matrix '", s.names[static_cast<size_t>(s.mine)],
                                                "': ", st.message()));
    }
  }
  // The sums the members expect from a rank that did not compute (or
  // stopped), then those of the round's other split matrices (no bytes).
  for (size_t k = issued; k < static_cast<size_t>(s.calls); ++k) {
    absl::Status sum;
    if (k < s.sums.size() && s.sums[k].f64) {
      sum = Sum<double>(round, nullptr, s.sums[k].count);
    } else {
      sum = Sum<float>(round, nullptr, k < s.sums.size() ? s.sums[k].count : 0);
    }
    if (st.ok()) st = sum;
  }
  return st;
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
