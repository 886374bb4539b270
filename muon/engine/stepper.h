// A stepper orthogonalizes a set of the job's matrices, collectively with the
// other ranks: the optimizer computes momentum into each parameter's update
// buffer, runs every stepper, then applies each update buffer (ZeRO-2
// parameters are stepped whole by their stepper). Three steppers exist, one
// per way a matrix can be spread: exchange rounds over layouts
// (exchange_stepper.h), the host's own callbacks (custom_stepper.h), and
// ZeRO-2 replicas (zero2_stepper.h).
#ifndef MUON_ENGINE_STEPPER_H_
#define MUON_ENGINE_STEPPER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "muon/device/device.h"
#include "muon/engine/options.h"
#include "muon/engine/owner_moments.h"
#include "muon/engine/param.h"

namespace muon {

// What a stepper borrows from the optimizer, for the optimizer's lifetime.
// The options and the parameters' tensors may change between steps (lr
// schedules, rebinding); nothing else does after setup.
struct StepContext {
  std::shared_ptr<Device> device;
  const Options* options = nullptr;
  // lr, weight decay and momentum in the device's memory, as the kernels
  // read them (written by the optimizer before the steppers run).
  const StepScalars* scalars = nullptr;
  std::vector<Param>* params = nullptr;
  // Per parameter (registration order): where its update lives on the
  // device, holding the momentum output before the steppers run and the
  // orthogonalized update after: an update buffer (bf16 for an
  // exchange-stepped parameter when Newton-Schulz is bf16, else fp32), or
  // with update_in_grad the gradient's own memory (exchange-stepped ones).
  const std::vector<LocalBuffer>* updates = nullptr;
  // With NorMuon (options->normuon): where each stepper adds the matrices
  // it orthogonalizes at Create; allocated after every stepper was created,
  // so a stepper takes their memory at Run. NULL without NorMuon.
  OwnerMoments* moments = nullptr;
  // On a GPU with skip_nonfinite_updates: the device counter (int64) the
  // exchange stepper zeroes and counts the step's non-finite orthogonalized
  // updates into (NULL: each stepper's host stats count them).
  int64_t* nonfinite_updates = nullptr;

  // The fp32 update buffer of a custom-path or ZeRO-2 parameter (those
  // always have one).
  float* update(size_t i) const { return static_cast<float*>((*updates)[i].data); }
};

// A parameter's split blocks as a stepper runs them: the split, and each
// block's lr ratio (BlockLrRatios), which its owner multiplies in.
struct SplitBatch {
  BlockSplit split;
  std::vector<double> factors;
};

struct StepperStats {
  int64_t matrices_total = 0;  // planned: matrices of the whole job it steps
  int64_t matrices_owned = 0;  // planned: of which this rank orthogonalizes
  int64_t orthogonalized = 0;  // last step, this rank
  double ns_flops = 0;         // last step, this rank
  int64_t nonfinite = 0;       // last step: non-finite gradient elements its momentum pass read
  // last step, with skip_nonfinite_updates: non-finite values in the updates
  // this rank orthogonalized
  int64_t nonfinite_updates = 0;
};

class Stepper {
 public:
  virtual ~Stepper() = default;
  // One step's orthogonalization. Every collective of the stepper is issued
  // whatever fails on this rank (the other ranks' calls must pair up); after
  // a failure, and throughout when `failed` (this rank already failed its
  // step), nothing more is computed and no state is changed. Returns the
  // first failure; the optimizer agrees on the step's outcome after.
  virtual absl::Status Run(void* stream, bool failed) = 0;
  virtual const StepperStats& stats() const = 0;
};

}  // namespace muon

#endif  // MUON_ENGINE_STEPPER_H_
