// The first step's setup: the handshake that agrees on the plan
// (sharding/handshake.h), then everything the steps need, allocated once:
// each parameter's update buffer and the three steppers. A failed setup
// changes no parameter and no state, and every rank fails alike.
#ifndef MUON_ENGINE_SETUP_H_
#define MUON_ENGINE_SETUP_H_

#include <array>
#include <memory>
#include <vector>

#include "muon/engine/custom_stepper.h"
#include "muon/engine/exchange_stepper.h"
#include "muon/engine/outcome.h"
#include "muon/engine/owner_moments.h"
#include "muon/engine/registry.h"
#include "muon/engine/zero2_stepper.h"

namespace muon {

// What the first step makes, for the optimizer's lifetime.
struct StepSetup {
  // Per parameter: where its update lives (StepContext::updates), and the
  // update buffers of those whose update is not in their gradient.
  std::vector<LocalBuffer> updates;
  std::vector<DeviceBuffer> update_buffers;

  // NorMuon's moments of the matrices this rank owns (NULL without NorMuon).
  std::unique_ptr<OwnerMoments> moments;

  std::unique_ptr<ExchangeStepper> exchange;
  std::unique_ptr<CustomStepper> custom;
  std::unique_ptr<Zero2Stepper> zero2;

  // On a GPU with more than one rank (else empty), the step verdicts stay on
  // the device: this rank's (when no exchange carries them), every rank's,
  // and the go-ahead the updates are gated by (math VerdictGate).
  DeviceBuffer verdict_send, verdicts, gate;
  // On a GPU: the step's count of non-finite gradient elements (int64).
  DeviceBuffer nonfinite;
  // On a GPU with skip_nonfinite_updates: the step's count of non-finite
  // orthogonalized update elements (int64), and with more than one rank the
  // buffers its agreement gathers every rank's count through.
  DeviceBuffer nonfinite_updates, update_count_send, update_counts;
  // lr, weight decay and momentum where the kernels read them (StepScalars;
  // written on the stream by each uncaptured step and PushHyperparameters).
  DeviceBuffer scalar_buffer;
  StepScalars* scalars() const { return scalar_buffer.as<StepScalars>(); }
  // The backend calls' argument lists, the agreement's buffers and every
  // rank's non-finite count (skip_nonfinite), kept so that a step allocates
  // nothing.
  std::vector<MomentumArgs> momentum_args;
  std::vector<ApplyArgs> apply_args;
  AgreeScratch agree;
  std::vector<int64_t> nonfinite_counts;  // one per world rank
  std::vector<CountArgs> nonfinite_args;  // on a GPU: the gradients counted

  // In the order they run (an array: a step allocates nothing).
  std::array<Stepper*, 3> steppers() const { return {exchange.get(), custom.get(), zero2.get()}; }
  // No rank registered a matrix (the job's answer, the same on every rank).
  bool empty() const;
};

// Sets up the steps of `registry`'s parameters with `options` (kept by
// pointer: the steppers read the current options at every step), agreed like
// a step: every rank issues every collective of the setup whatever fails on
// it (group memberships, the handshake, the plan check, the agreement on the
// outcome), and every rank returns the same outcome, the failing ranks and
// their causes named. On success *setup is the setup; on failure it is NULL,
// with one exception: a rank whose own setup succeeded and whose last
// collective (the agreement) failed after its verdict left cannot tell
// whether the others stepped on. It keeps *setup and returns its error: its
// step goes on taking part in the step's collectives, refusing, so that
// every rank fails that same step (the others learn why from its verdict).
// `stash`: NorMuon moments loaded before the first step, for the matrices
// this rank turns out to own.
absl::Status SetUpSteps(Registry& registry, const Options& options, const MomentStash& stash,
                        void* stream, std::unique_ptr<StepSetup>* setup);

}  // namespace muon

#endif  // MUON_ENGINE_SETUP_H_
