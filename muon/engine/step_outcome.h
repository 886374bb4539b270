// One owner for a step's outcome (docs/step_semantics.md): whether a step may
// start, the agreements to skip it, and the job's verdict on it, the same on
// every rank.
//
//   Open   judges the last GPU step's verdicts (DeviceOutcome: they reach the
//          host with the stream) and refuses a step past the largest count a
//          state blob holds;
//   Begin  notes this rank's checks and, with skip_nonfinite, agrees with
//          every rank whether some gradient is not finite (before anything
//          changes);
//   Close  ends the step: on a GPU the verdicts stay on the device and gate
//          the updates there (judged by the next Open); on the host the ranks
//          agree (AgreeOutcome), skip_nonfinite_updates agrees whether some
//          update is not finite, and the updates land only where every rank
//          succeeded;
//   Counted  after the optimizer counted the step: its non-finite count home.
//
// A failure after state changed poisons this rank: Refusal() then refuses
// every step (each rank learns it through the step's verdict) until the
// state is restored (Restored, ParamRestored).
//
// Not thread-safe (the optimizer's calls are serialized by the caller).
#ifndef MUON_ENGINE_STEP_OUTCOME_H_
#define MUON_ENGINE_STEP_OUTCOME_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muon/engine/device_outcome.h"
#include "muon/engine/options.h"
#include "muon/engine/outcome.h"
#include "muon/engine/registry.h"
#include "muon/engine/setup.h"

namespace muon {

// What one step works with: bound per call (the setup is built at the first
// step, after Open).
struct StepCall {
  Registry* registry = nullptr;
  const Options* options = nullptr;
  StepSetup* setup = nullptr;  // NULL until the setup is built
  void* stream = nullptr;
  bool capturing = false;      // the step goes into a CUDA graph
  int64_t counted = 0;         // steps counted before this one

  // Ranks agree over the world (a setup with more than one rank).
  bool shared() const { return setup != nullptr && registry->world().size() > 1; }
};

// Open's answer.
struct StepOpened {
  absl::Status status;   // OK: the step goes on to its checks
  bool ends = false;     // the step ends with `status` here
  int64_t uncount = 0;   // the last step failed after the optimizer counted it
};

// Begin's answer.
struct StepBegun {
  LocalOutcome local;    // this rank's part so far
  bool skip = false;     // every rank skips the step: nothing changed
};

// Close's answer.
struct StepClosed {
  absl::Status status;   // this rank returns it; OK: the optimizer counts the step
  bool skipped = false;  // skip_nonfinite_updates: momenta stepped, no parameter
};

class StepOutcome {
 public:
  StepOpened Open(const StepCall& step);
  // *nonfinite_grads: this rank's count of non-finite gradient elements, when
  // skip_nonfinite counted them.
  StepBegun Begin(const StepCall& step, const absl::Status& ready, int64_t* nonfinite_grads);
  // The verdict this rank hands to the exchange's last scatter, once its
  // updates are computed (or it failed).
  void HandVerdict(const StepCall& step, const LocalOutcome& local);
  // `apply(gate)` puts the updates on this rank's parameters (gate: the
  // device's go-ahead, NULL on the host).
  StepClosed Close(const StepCall& step, const LocalOutcome& local,
                   const std::function<absl::Status(const int32_t* gate)>& apply);
  absl::Status Counted(const StepCall& step);

  // The refusal of a poisoned rank (OK when it is not poisoned): names what
  // restores it and the failure.
  absl::Status Refusal(const Registry& registry, const Options& options) const;
  // Refuses (FailedPrecondition) while the step in flight failed on some
  // rank: its state is not one to save.
  absl::Status PendingFailure(const Registry& registry) const {
    return device_.PendingFailure(registry);
  }
  // A whole state was loaded: not poisoned; the step in flight is still
  // judged by every rank, but no longer counted.
  void Restored();
  // One parameter's state was set (muon_set_state): poisoning ends once
  // every parameter holding state here was (not with NorMuon, whose moments
  // only a whole blob restores).
  void ParamRestored(const Registry& registry, size_t index, bool normuon);
  // The last step's non-finite count, once the stream got there.
  bool TakeCount(Device& device, int64_t* count) const { return device_.TakeCount(device, count); }

 private:
  void Poison(const Registry& registry, const absl::Status& cause);
  // skip_nonfinite: some rank's gradient holds a non-finite value (one
  // all_gather of the counts; -1 from a rank that failed already).
  absl::StatusOr<bool> AgreeToSkip(const StepCall& step, bool local_ok, int64_t* nonfinite_grads);
  // skip_nonfinite_updates: some rank's orthogonalized updates do (one
  // all_gather of the counts, on a GPU after a wait for its count; -1 from
  // a rank that failed, and then nothing is skipped: the step fails).
  absl::StatusOr<bool> AgreeToSkipUpdates(const StepCall& step, bool local_ok);
  StepClosed CloseOnDevice(const StepCall& step, LocalOutcome local,
                           const std::function<absl::Status(const int32_t* gate)>& apply);

  // Set when a step failed after changing state; cleared by a whole state or
  // once every param holding state here was restored.
  std::string poisoned_;
  std::vector<bool> restored_;  // per param, while poisoned
  // On a GPU: the steps' verdicts and non-finite counts, known without a
  // host wait (device_outcome.h).
  DeviceOutcome device_;
};

}  // namespace muon

#endif  // MUON_ENGINE_STEP_OUTCOME_H_
