#include "muon/engine/optimizer.h"

#include <algorithm>
#include <exception>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/comm/self_comm.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"
#include "muon/device/host_device.h"
#include "muon/engine/checkpoint.h"
#include "muon/device/cuda_loader.h"
#include "muon/engine/local_update.h"
#include "muon/engine/orthogonalize.h"
#include "muon/engine/outcome.h"
#include "muon/engine/state_restore.h"

namespace muon {
Optimizer::Optimizer(const Options& options, std::shared_ptr<Comm> self)
    : options_(options), registry_(std::move(self)) {}

Optimizer::~Optimizer() = default;

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const Options& options) {
  MUON_RETURN_IF_ERROR(ValidateOptions(options));
  MUON_ASSIGN_OR_RETURN(std::shared_ptr<Comm> self,
                        Comm::Create(SelfCommTable(), "the single-process world"));
  std::unique_ptr<Optimizer> opt(new Optimizer(options, std::move(self)));
  MUON_RETURN_IF_ERROR(opt->registry_.SetAllocator(options.allocator));
  opt->registry_.SetUpdateInGrad(options.update_in_grad, options.ns.dtype == NsDtype::kBF16);
  return opt;
}

absl::Status Optimizer::SetLr(double lr) {
  MUON_RETURN_IF_ERROR(ValidateLr(lr));
  options_.lr = lr;
  return absl::OkStatus();
}

absl::Status Optimizer::SetWeightDecay(double weight_decay) {
  MUON_RETURN_IF_ERROR(ValidateWeightDecay(weight_decay));
  options_.weight_decay = weight_decay;
  return absl::OkStatus();
}

absl::Status Optimizer::SetMomentum(double momentum) {
  MUON_RETURN_IF_ERROR(ValidateMomentum(momentum));
  options_.momentum = momentum;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Optimizer::RegisterParam(const DLTensor* value, const DLTensor* grad,
                                                 const std::string& name, int view,
                                                 const DistSpec* dist, const BlockSplit& split) {
  return registry_.Register(value, grad, name, view, dist, options_.momentum_fp32, split);
}

absl::StatusOr<int64_t> Optimizer::RegisterCustomParam(const DLTensor* value, const DLTensor* grad,
                                                       const std::string& name, int64_t rows,
                                                       int64_t cols,
                                                       std::shared_ptr<CustomPath> path,
                                                       const BlockSplit& split) {
  return registry_.RegisterCustom(value, grad, name, rows, cols, std::move(path),
                                  options_.momentum_fp32, split);
}

absl::Status Optimizer::Step(void* stream) {
  const CurrentDevice current(*registry_.device());  // for the whole step
  MUON_RETURN_IF_ERROR(current.status());
  // This step's stream first: whether it captures into a CUDA graph is asked
  // of it, not of the last step's stream.
  MUON_RETURN_IF_ERROR(registry_.device()->SetStream(stream));
  StepCall step{&registry_, &options_, setup_.get(), stream,
                   registry_.device()->Capturing(), step_count_};
  const StepOpened opened = outcome_.Open(step);
  step_count_ -= opened.uncount;
  step.counted = step_count_;
  if (opened.ends) return opened.status;
  const absl::Status ready = opened.status.ok() ? Prepare(stream) : opened.status;
  step.setup = setup_.get();
  // Until the plan exists nothing of a step is collective but the setup,
  // which agrees on its own; in a world of one there is nobody to agree with.
  if (setup_ == nullptr || setup_->empty() || (!step.shared() && !ready.ok())) return ready;
  StepBegun begun = outcome_.Begin(step, ready, &stats_.nonfinite_grads);
  if (begun.skip) {
    ++stats_.steps_skipped;  // nothing changed, on any rank
    return absl::OkStatus();
  }
  RunStages(step, &begun.local);
  const StepClosed closed = outcome_.Close(
      step, begun.local, [this](const int32_t* gate) { return ApplyUpdates(gate); });
  if (!closed.status.ok()) return closed.status;
  if (closed.skipped) ++stats_.steps_skipped;
  ++step_count_;
  CountStats();
  return outcome_.Counted(step);
}

void Optimizer::RunStages(const StepCall& step, LocalOutcome* local) {
  try {
    // lr, weight decay and momentum where the kernels read them; not while
    // captured, so that a graph's replays read what was written last
    // (PushHyperparameters between replays).
    if (local->ok() && !step.capturing) {
      local->Note(registry_.device()->math().StoreScalars(setup_->scalars(), ScalarsOf(options_)));
    }
    if (local->ok()) local->Note(UpdateMomenta());
    outcome_.HandVerdict(step, *local);
    local->Note(RunSteppers(step.stream, !local->ok()));
  } catch (const std::bad_alloc&) {
    local->Note(absl::ResourceExhaustedError("out of host memory in the middle of a step"));
  } catch (const std::exception& e) {
    local->Note(absl::InternalError(absl::StrCat("in the middle of a step: ", e.what())));
  }
}

const StepStats& Optimizer::stats() const {
  int64_t count = 0;
  if (outcome_.TakeCount(*registry_.device(), &count)) stats_.nonfinite_grads = count;
  stats_.memory_bytes = registry_.device()->allocated_bytes();
  stats_.momentum_bytes = 0;
  stats_.param_elements = 0;
  for (const Param& p : registry_.params()) {
    stats_.momentum_bytes += static_cast<int64_t>(p.momentum.size());
    stats_.param_elements += p.numel();
  }
  stats_.bytes_per_param =
      stats_.param_elements == 0
          ? 0.0
          : static_cast<double>(stats_.memory_bytes) / static_cast<double>(stats_.param_elements);
  return stats_;
}

absl::Status Optimizer::Prepare(void* stream) {
  MUON_RETURN_IF_ERROR(outcome_.Refusal(registry_, options_));
  if (registry_.params().empty() && !registry_.distributed()) {
    return absl::FailedPreconditionError(
        "no parameters are registered; call muon_register_param first");
  }
  // (Step set the device's stream already.)
  // Setup fails before any tensor is written.
  if (setup_ == nullptr) {
    // A failed setup leaves setup_ NULL on every rank (they all return the
    // same error and set up again at the next step), except on a rank whose
    // last setup collective failed alone: it keeps setup_ and returns its
    // error, which its step then carries into the step's verdict.
    const absl::Status set_up = SetUpSteps(registry_, options_, moment_stash_, stream, &setup_);
    if (setup_ == nullptr) return set_up;
    moment_stash_ = MomentStash();  // the owners took theirs
    int64_t job_matrices = 0;  // the plan's, the same on every rank
    for (const Stepper* s : setup_->steppers()) job_matrices += s->stats().matrices_total;
    if (job_matrices == 0) {
      // No rank registered anything: every rank leaves registration open, as
      // before the call.
      setup_.reset();
      return absl::FailedPreconditionError(
          "no parameters are registered on any rank; call muon_register_param first");
    }
    registry_.Close();
    stats_.matrices_total = stats_.matrices_owned = 0;
    for (const Stepper* s : setup_->steppers()) {
      stats_.matrices_total += s->stats().matrices_total;
      stats_.matrices_owned += s->stats().matrices_owned;
    }
    MUON_RETURN_IF_ERROR(set_up);
  }
  if (setup_->empty()) {
    return absl::FailedPreconditionError(
        "no parameters are registered on any rank; call muon_register_param first");
  }
  return absl::OkStatus();
}

absl::Status Optimizer::UpdateMomenta() {
  // 1. Momentum into each local piece's update buffer (non-finite gradient
  // elements counted in the same pass).
  std::vector<Param>& params = registry_.params();
  nonfinite_ = 0;
  int64_t* counter = &nonfinite_;
  if (!setup_->nonfinite.empty()) {  // a GPU: a device counter, zeroed on the stream
    counter = setup_->nonfinite.as<int64_t>();
    MUON_RETURN_IF_ERROR(registry_.device()->ZeroAsync(counter, sizeof(int64_t)));
  }
  // Every piece in one backend call (one launch on a GPU).
  std::vector<MomentumArgs>& args = setup_->momentum_args;
  args.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    if (!StepsLocally(p)) continue;
    args.push_back(MomentumOf(p, p.grad.dtype, p.grad.data, setup_->updates[i]));
  }
  if (args.empty()) return absl::OkStatus();
  return registry_.device()->math().Momentum(
      MomentumStepOf(options_, setup_->scalars(), counter), args);
}

absl::Status Optimizer::RunSteppers(void* stream, bool failed) {
  // 2. Every stepper: pieces to their owners, Newton-Schulz, the results back.
  // Each one issues all its collectives whatever failed (stepper.h).
  registry_.world().ResetCounters();
  for (const auto& g : registry_.groups()) g->ResetCounters();
  absl::Status first;
  for (Stepper* s : setup_->steppers()) {
    absl::Status st = s->Run(stream, failed || !first.ok());
    if (first.ok()) first = st;
  }
  return first;
}

absl::Status Optimizer::ApplyUpdates(const int32_t* gate) {
  // 3. Decay and the update onto every local piece, in one backend call.
  std::vector<Param>& params = registry_.params();
  std::vector<ApplyArgs>& args = setup_->apply_args;
  args.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!StepsLocally(params[i])) continue;
    args.push_back(ApplyOf(options_, params[i], setup_->updates[i]));
  }
  if (args.empty()) return absl::OkStatus();
  return registry_.device()->math().Apply({setup_->scalars(), gate}, args);
}

absl::Status Optimizer::PushHyperparameters(void* stream) {
  if (setup_ == nullptr) return absl::OkStatus();  // the first step writes them
  const CurrentDevice current(*registry_.device());
  MUON_RETURN_IF_ERROR(current.status());
  MUON_RETURN_IF_ERROR(registry_.device()->SetStream(stream));
  return registry_.device()->math().StoreScalars(setup_->scalars(), ScalarsOf(options_));
}

void Optimizer::CountStats() {
  StepStats s;
  s.steps = step_count_;
  auto count = [&](const Comm& c) {
    s.traffic.bytes_sent += c.counters().bytes_sent;
    s.traffic.bytes_received += c.counters().bytes_received;
    s.traffic.collectives += c.counters().collectives;
  };
  count(registry_.world());
  for (const auto& g : registry_.groups()) {
    if (g.get() != &registry_.world()) count(*g);  // (the world is among the groups)
  }
  s.rounds = setup_->exchange->rounds();
  s.nonfinite_grads = nonfinite_;
  for (const Stepper* st : setup_->steppers()) {
    s.matrices_orthogonalized += st->stats().orthogonalized;
    s.ns_flops += st->stats().ns_flops;
    const int64_t n = st->stats().nonfinite;
    s.nonfinite_grads = (s.nonfinite_grads < 0 || n < 0) ? -1 : s.nonfinite_grads + n;
  }
  s.matrices_total = stats_.matrices_total;
  s.matrices_owned = stats_.matrices_owned;
  s.steps_skipped = stats_.steps_skipped;
  stats_ = s;
}

absl::Status Optimizer::Orthogonalize(const DLTensor* in, const DLTensor* out, int view,
                                     void* stream) {
  MUON_ASSIGN_OR_RETURN(const TensorView v, ViewTensor(in, "in"));
  std::shared_ptr<Device> device = registry_.device();
  const std::string where = DeviceString(v.device);
  if (where != device->name() && !(device->is_host() && v.on_host())) {
    if (!registry_.params().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in: is on ", where, ", the optimizer's parameters on ", device->name()));
    }
    if (v.on_host()) {
      device = MakeHostDevice();
    } else {
      MUON_ASSIGN_OR_RETURN(device, OpenCudaDevice(v.device.device_id));
    }
  }
  const CurrentDevice current(*device);  // (its end marks the stream for the next call)
  MUON_RETURN_IF_ERROR(current.status());
  return OrthogonalizeTensor(device, options_.ns, in, out, view, stream);
}

}  // namespace muon
