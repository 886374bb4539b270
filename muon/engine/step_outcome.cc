#include "muon/engine/step_outcome.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/dtype.h"
#include "muon/common/status.h"
#include "muon/engine/checkpoint.h"
#include "muon/engine/exchange_stepper.h"

namespace muon {
namespace {

// The GPU form: the verdicts stay on the device (more than one rank and a
// go-ahead buffer).
bool OnDevice(const StepCall& step) { return step.shared() && !step.setup->gate.empty(); }

}  // namespace

StepOpened StepOutcome::Open(const StepCall& step) {
  StepOpened out;
  // On a GPU: the last step's outcome first (every rank the same); not while
  // the step is captured into a CUDA graph (the host can wait for nothing).
  const DeviceOutcome::Settled last =
      step.capturing ? DeviceOutcome::Settled{} : device_.Settle(*step.registry, step.stream);
  const absl::Status& settled = last.status;
  out.uncount = last.uncount ? 1 : 0;
  if (last.job_failed) {
    // (A state loaded since is not the failed step's.)
    if (!last.restored) Poison(*step.registry, settled);
    out.status = settled;
    out.ends = true;
    return out;
  }
  if (!settled.ok() && poisoned_.empty()) Poison(*step.registry, settled);
  // Before anything changes (and before any collective: every rank of a
  // consistent job holds the same count), so that every state a step
  // reaches can be saved and loaded again.
  const int64_t count = step.counted - out.uncount;
  if (settled.ok() && count >= kMaxSavedStepCount) {
    out.status = absl::OutOfRangeError(absl::StrCat(
        "the step count is ", count, ", the largest a state blob holds (INT64_MAX - 1): "
        "one more step could not be saved and loaded; nothing changed (load an earlier state "
        "to go on)"));
    out.ends = true;
    return out;
  }
  out.status = settled;
  return out;
}

StepBegun StepOutcome::Begin(const StepCall& step, const absl::Status& ready,
                             int64_t* nonfinite_grads) {
  // From the first momentum update on, state changes. A rank whose part
  // fails (or that refuses: poisoned) goes on taking part in every
  // collective of the step; then every rank agrees on the outcome.
  StepBegun begun;
  begun.local.Note(ready);
  if (step.options->skip_nonfinite) {
    absl::StatusOr<bool> skip = AgreeToSkip(step, begun.local.ok(), nonfinite_grads);
    if (!skip.ok()) {
      begun.local.Note(skip.status());
    } else {
      begun.skip = *skip;
    }
  }
  return begun;
}

void StepOutcome::HandVerdict(const StepCall& step, const LocalOutcome& local) {
  step.setup->exchange->SetVerdict(static_cast<int32_t>(local.status().code()),
                                   HyperDigest(*step.options));
}

StepClosed StepOutcome::Close(const StepCall& step, const LocalOutcome& local,
                              const std::function<absl::Status(const int32_t* gate)>& apply) {
  if (OnDevice(step)) {  // judged at the next Open
    if (!step.options->skip_nonfinite_updates) return CloseOnDevice(step, local, apply);
    // Every rank's count of non-finite updates first (a gather every rank
    // joins, whatever failed); a skipped step applies nothing anywhere.
    LocalOutcome mine = local;
    absl::StatusOr<bool> skip = AgreeToSkipUpdates(step, local.ok());
    if (!skip.ok()) mine.Note(skip.status());
    const bool skipped = skip.ok() && *skip;
    static const std::function<absl::Status(const int32_t*)> kNothing =
        [](const int32_t*) { return absl::OkStatus(); };
    StepClosed closed = CloseOnDevice(step, mine, skipped ? kNothing : apply);
    closed.skipped = closed.status.ok() && skipped;
    return closed;
  }
  // The verdicts travelled with the exchange's last scatter when it ends the
  // step; else one all_gather of them.
  const ExchangeStepper& ex = *step.setup->exchange;
  StepClosed closed;
  absl::Status st =
      step.shared()
          ? AgreeOutcome(step.registry->world(), step.registry->device().get(), local,
                         *step.options, step.stream, absl::StrCat("step ", step.counted + 1),
                         ex.carries_verdicts() ? &ex.verdicts() : nullptr, &step.setup->agree)
          : local.status();
  // Applied only where every rank succeeded (a device error there poisons
  // this rank, whose next step every rank then fails), and every update is
  // finite when skip_nonfinite_updates asks.
  absl::StatusOr<bool> skip = false;
  if (st.ok() && step.options->skip_nonfinite_updates) skip = AgreeToSkipUpdates(step, true);
  if (!skip.ok()) st = skip.status();
  if (st.ok() && !*skip) st = apply(nullptr);
  closed.skipped = st.ok() && *skip;  // the momentum stepped; no parameter
  if (!st.ok() && poisoned_.empty()) Poison(*step.registry, st);
  closed.status = st;
  return closed;
}

StepClosed StepOutcome::CloseOnDevice(
    const StepCall& step, LocalOutcome local,
    const std::function<absl::Status(const int32_t* gate)>& apply) {
  StepClosed closed;
  closed.status = device_.Finish(*step.registry, *step.setup, *step.options, local, step.stream,
                                 step.counted + 1, step.capturing, apply);
  if (!closed.status.ok() && poisoned_.empty()) Poison(*step.registry, closed.status);
  return closed;
}

absl::Status StepOutcome::Counted(const StepCall& step) {
  if (OnDevice(step)) {
    device_.Counted();  // (the next Open takes it back if the job failed it)
    return absl::OkStatus();
  }
  if (!step.setup->nonfinite.empty() && !step.capturing) {
    return device_.SendCountHome(step.registry->device(), *step.setup);
  }
  return absl::OkStatus();
}

absl::Status StepOutcome::Refusal(const Registry& registry, const Options& options) const {
  if (poisoned_.empty()) return absl::OkStatus();
  size_t done = 0, total = 0;
  const std::vector<Param>& params = registry.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].holds_state) continue;
    ++total;
    done += i < restored_.size() && restored_[i] ? 1 : 0;
  }
  // NorMuon's moments are only in a blob: muon_set_state cannot restore them.
  const std::string how =
      options.normuon
          ? std::string("muon_load_state or muon_load_states with whole blobs: NorMuon's "
                        "second moments are in them, and muon_set_state cannot restore those")
          : absl::StrCat("muon_load_state with a whole blob, or muon_set_state for every "
                         "parameter: ", done, " of ", total, " restored so far");
  return absl::FailedPreconditionError(absl::StrCat(
      "refused: an earlier step failed mid-way, so parameters and state may be "
      "half-updated; restore both from a checkpoint (", how,
      ") before stepping again. The failure: ", poisoned_));
}

void StepOutcome::Restored() {
  device_.Restored();  // (the step in flight is still judged by every rank)
  poisoned_.clear();
}

void StepOutcome::ParamRestored(const Registry& registry, size_t index, bool normuon) {
  if (poisoned_.empty()) return;
  // Poisoned until every param holding state here has been restored.
  const std::vector<Param>& params = registry.params();
  restored_.resize(params.size(), false);
  restored_[index] = true;
  bool all = true;
  for (size_t i = 0; i < params.size(); ++i) all = all && (restored_[i] || !params[i].holds_state);
  // (NorMuon's moments are restored by a whole blob only.)
  if (all && !normuon) poisoned_.clear();
}

void StepOutcome::Poison(const Registry& registry, const absl::Status& cause) {
  constexpr size_t kKept = 300;  // the refusal repeats it: keep it short
  poisoned_ = std::string(cause.message().substr(0, kKept));
  if (cause.message().size() > kKept) poisoned_ += "...";
  restored_.assign(registry.params().size(), false);
}

absl::StatusOr<bool> StepOutcome::AgreeToSkip(const StepCall& step, bool local_ok,
                                              int64_t* nonfinite_grads) {
  Device& device = *step.registry->device();
  StepSetup& setup = *step.setup;
  int64_t mine = -1;  // -1: this rank already failed its step
  absl::Status counted;
  if (local_ok && setup.nonfinite.empty()) {
    mine = 0;
    for (const Param& p : step.registry->params()) {
      if (p.active) mine += CountNonFinite(p.grad.dtype, p.grad.data, p.numel());
    }
  } else if (local_ok) {
    // A GPU: counted there, then the one wait this option costs (as a
    // mixed-precision scaler's check of its inf flag).
    int64_t* counter = setup.nonfinite.as<int64_t>();
    counted = device.Capturing()
                  ? absl::FailedPreconditionError(
                        "skip_nonfinite waits for the GPU's count, which a step being captured "
                        "into a CUDA graph cannot do; capture steps without it")
                  : device.ZeroAsync(counter, sizeof(int64_t));
    // Every gradient in one call (one launch, however many parameters).
    std::vector<CountArgs>& args = setup.nonfinite_args;
    args.clear();  // its capacity kept: no allocation after the first step
    for (const Param& p : step.registry->params()) {
      if (p.active) args.push_back({p.grad.dtype, p.grad.data, p.numel()});
    }
    if (counted.ok()) counted = device.math().CountNonFiniteAll(args, counter);
    if (counted.ok()) counted = device.ToHost(&mine, counter, sizeof mine);
    if (!counted.ok()) mine = -1;
  }
  std::vector<int64_t>& all = setup.nonfinite_counts;  // one per rank
  all[0] = mine;
  if (step.shared()) {
    // On a GPU through the step's verdict buffers (allocated at setup).
    const DeviceStaging staging{setup.verdict_send.data(), setup.verdicts.data()};
    static const std::string* const kOp = new std::string("counting non-finite gradients");
    MUON_RETURN_IF_ERROR(HostCollectives(step.registry->world(), &device, step.stream)
                             .GatherInt64(mine, all.data(), *kOp,
                                          setup.verdicts.empty() ? nullptr : &staging));
  }
  MUON_RETURN_IF_ERROR(counted);
  int64_t total = 0;
  for (int64_t c : all) {
    if (c < 0) return false;  // a rank failed: the step goes on, to fail on every rank
    total += c;
  }
  *nonfinite_grads = mine;
  device_.DropCount();  // this count is the step's
  return total > 0;
}

absl::StatusOr<bool> StepOutcome::AgreeToSkipUpdates(const StepCall& step, bool local_ok) {
  StepSetup& setup = *step.setup;
  Device& device = *step.registry->device();
  int64_t mine = 0;
  for (const Stepper* s : setup.steppers()) mine += s->stats().nonfinite_updates;
  absl::Status counted;
  if (!setup.nonfinite_updates.empty()) {
    // A GPU: counted there; the one wait this option costs, after the
    // orthogonalization (as skip_nonfinite waits for the gradients' count).
    int64_t on_device = 0;
    counted = device.Capturing()
                  ? absl::FailedPreconditionError(
                        "skip_nonfinite_updates waits for the GPU's count of non-finite "
                        "updates, which a step being captured into a CUDA graph cannot do; "
                        "capture steps without it")
                  : device.ToHost(&on_device, setup.nonfinite_updates.data(), sizeof on_device);
    mine += on_device;
  }
  if (!local_ok || !counted.ok()) mine = -1;  // this rank failed its step
  std::vector<int64_t>& all = setup.nonfinite_counts;  // one per rank
  all[0] = mine;
  if (step.shared()) {
    static const std::string* const kOp = new std::string("counting non-finite updates");
    const DeviceStaging staging{setup.update_count_send.data(), setup.update_counts.data()};
    MUON_RETURN_IF_ERROR(HostCollectives(step.registry->world(), &device, step.stream)
                             .GatherInt64(mine, all.data(), *kOp,
                                          setup.update_counts.empty() ? nullptr : &staging));
  }
  MUON_RETURN_IF_ERROR(counted);
  int64_t total = 0;
  for (int64_t c : all) {
    if (c < 0) return false;  // a rank failed: the step fails on every rank, nothing skipped
    total += c;
  }
  return total > 0;
}

}  // namespace muon
