// The custom-path stepper (muon_register_param_custom): for parameters whose
// layout no placement list describes, the host moves the data. For each such
// parameter, in the order of names, every holder calls the host's gather_fn
// with its update values; the owner (chosen by the host's assign_fn at setup)
// receives the whole matrix, orthogonalizes it, and every holder's
// redistribute_fn writes its piece of the result back. Host tensors only.
// The owner's working copy of its largest matrix is the stepper's one
// allocation, made at setup through the device (counted, and through the
// host's allocator when one is set).
#ifndef MUON_ENGINE_CUSTOM_STEPPER_H_
#define MUON_ENGINE_CUSTOM_STEPPER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/engine/stepper.h"
#include "muon/sharding/plan.h"

namespace muon {

class CustomStepper : public Stepper {
 public:
  // `units`: the plan's custom-path parameters; `world_rank`: this rank.
  // Errors (the working copy refused by the allocator, the Newton-Schulz
  // workspace) name the parameter and the bytes.
  static absl::StatusOr<std::unique_ptr<CustomStepper>> Create(std::vector<CustomUnit> units,
                                                               int world_rank,
                                                               const StepContext& ctx);

  absl::Status Run(void* stream, bool failed) override;
  const StepperStats& stats() const override { return stats_; }

 private:
  CustomStepper(std::vector<CustomUnit> units, int world_rank, const StepContext& ctx)
      : units_(std::move(units)), me_(world_rank), ctx_(ctx) {}
  absl::Status RunOne(const CustomUnit& c, void* stream, bool failed);

  std::vector<CustomUnit> units_;
  int me_;
  StepContext ctx_;
  std::vector<int> moment_ids_;  // per unit: its NorMuon moments' id, or -1
  // Per unit: its blocks' lr ratios (split_sizes; empty when whole); the
  // blocks' host copy.
  std::vector<std::vector<double>> factors_;
  SplitOrthogonalizer split_blocks_;
  DeviceBuffer slot_;  // fp32, the largest matrix this rank owns (empty when none)
  StepperStats stats_;
};

}  // namespace muon

#endif  // MUON_ENGINE_CUSTOM_STEPPER_H_
