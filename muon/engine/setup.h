// The first step's setup: the handshake that agrees on the plan
// (sharding/handshake.h), then everything the steps need, allocated once:
// each parameter's update buffer and the three steppers. A failed setup
// changes no parameter and no state, and every rank fails alike.
#ifndef MUON_ENGINE_SETUP_H_
#define MUON_ENGINE_SETUP_H_

#include "muon/engine/custom_stepper.h"
#include "muon/engine/exchange_stepper.h"
#include "muon/engine/registry.h"
#include "muon/engine/zero2_stepper.h"

namespace muon {

// What the first step makes, for the optimizer's lifetime.
struct StepSetup {
  std::vector<DeviceBuffer> updates;  // per parameter: StepContext::updates

  std::unique_ptr<ExchangeStepper> exchange;
  std::unique_ptr<CustomStepper> custom;
  std::unique_ptr<Zero2Stepper> zero2;

  // In the order they run.
  std::vector<Stepper*> steppers() const { return {exchange.get(), custom.get(), zero2.get()}; }
  // No rank registered a matrix (ZeRO-2: this rank holds none).
  bool empty() const;
};

// Sets up the steps of `registry`'s parameters with `options` (kept by
// pointer: the steppers read the current options at every step).
absl::StatusOr<std::unique_ptr<StepSetup>> SetUpSteps(Registry& registry, const Options& options,
                                                      void* stream);

}  // namespace muon

#endif  // MUON_ENGINE_SETUP_H_
