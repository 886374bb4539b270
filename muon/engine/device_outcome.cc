#include "muon/engine/device_outcome.h"

#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {

void DeviceOutcome::Reserve(const std::shared_ptr<Device>& device, int ranks) {
  const size_t bytes = kVerdictBytes + sizeof(int64_t) + kVerdictBytes * static_cast<size_t>(ranks);
  if (home_.size() >= bytes || plain_.size() >= bytes) return;
  if (!device->Capturing()) {
    absl::StatusOr<StagingBuffer> pinned =
        StagingBuffer::Make(device, bytes, "the step's outcome on the host");
    if (pinned.ok()) {
      home_ = std::move(*pinned);
      plain_.clear();
      return;
    }
  }
  plain_.assign(bytes, 0);
}

absl::Status DeviceOutcome::Finish(Registry& registry, StepSetup& setup, const Options& options,
                                   LocalOutcome& local, void* stream, int64_t step, bool capturing,
                                   const std::function<absl::Status(const int32_t* gate)>& apply) {
  Device& device = *registry.device();
  Comm& world = registry.world();
  const size_t bytes = kVerdictBytes * static_cast<size_t>(world.size());
  const std::string what = absl::StrCat("step ", step);
  const ExchangeStepper& ex = *setup.exchange;
  const void* verdicts = setup.verdicts.data();
  try {
    Reserve(registry.device(), world.size());
    if (ex.carries_verdicts()) {
      verdicts = ex.device_verdicts();
    } else {
      // One all_gather of them on the device (issued whatever failed).
      WriteVerdict(static_cast<int32_t>(local.status().code()), HyperDigest(options), mine());
      local.Note(device.FromHostAsync(setup.verdict_send.data(), mine(), kVerdictBytes));
      local.Note(world.AllGather(setup.verdict_send.data(), setup.verdicts.data(), kVerdictBytes,
                                 stream, AgreeingLabel(what, &setup.agree.label)));
    }
    // Every rank applies only if every verdict says so: decided on the device.
    int32_t* gate = setup.gate.as<int32_t>();
    if (local.ok()) local.Note(device.math().VerdictGate(verdicts, world.size(), kVerdictMagic, gate));
    if (local.ok()) local.Note(apply(gate));
    if (capturing) return local.status();
    // The verdicts reach the host with the stream; the next step judges them.
    local.Note(device.ToHostAsync(this->verdicts(), verdicts, bytes));
    local.Note(device.ToHostAsync(nonfinite(), setup.nonfinite.data(), sizeof(int64_t)));
    local.Note(device.Mark());
  } catch (const std::bad_alloc&) {
    local.Note(absl::ResourceExhaustedError("out of host memory at the end of a step"));
  }
  pending_ = true;
  counted_ = restored_ = false;
  step_ = step;
  local_ = local.status();
  options_ = options;
  count_pending_ = local.ok();
  return local.status();
}

absl::Status DeviceOutcome::SendCountHome(const std::shared_ptr<Device>& device,
                                          const StepSetup& setup) {
  try {
    Reserve(device, 1);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory at the end of a step");
  }
  MUON_RETURN_IF_ERROR(device->ToHostAsync(nonfinite(), setup.nonfinite.data(), sizeof(int64_t)));
  MUON_RETURN_IF_ERROR(device->Mark());
  count_pending_ = true;
  return absl::OkStatus();
}

DeviceOutcome::Settled DeviceOutcome::Settle(Registry& registry, void* stream) {
  Settled out;
  if (!pending_) return out;
  pending_ = false;
  // The stream made the copy long ago in a training loop (the forward and
  // backward passes ran since): this waits for nothing there.
  out.status = registry.device()->WaitMark();
  const int n = registry.world().size();
  if (!out.status.ok() || VerdictsSayOk(verdicts(), n)) return out;
  // Every rank holds the same verdicts and comes here: the reports.
  LocalOutcome local;
  local.Note(local_);
  out.status = JudgeVerdicts(registry.world(), registry.device().get(), local, options_, stream,
                             absl::StrCat("step ", step_), verdicts(),
                             kVerdictBytes * static_cast<size_t>(n));
  if (out.status.ok()) out.status = absl::InternalError("the verdicts said no, their judgement yes");
  out.job_failed = true;
  out.uncount = counted_;  // the updates were applied nowhere: the step did not happen
  out.restored = restored_;
  counted_ = false;
  return out;
}

absl::Status DeviceOutcome::PendingFailure(const Registry& registry) const {
  if (!pending_ || restored_) return absl::OkStatus();
  MUON_RETURN_IF_ERROR(registry.device()->WaitMark());
  if (VerdictsSayOk(verdicts(), registry.world().size())) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", step_, " failed on some rank (its verdicts came back with the stream), so "
      "nothing of it was applied and the state here is not a step's; the next muon_step names "
      "the ranks and causes on every rank. Save the state of an earlier step"));
}

bool DeviceOutcome::TakeCount(Device& device, int64_t* count) const {
  if (!count_pending_) return false;
  count_pending_ = false;
  *count = device.WaitMark().ok() ? *nonfinite() : -1;
  return true;
}

}  // namespace muon
