// The optimizer's hyper-parameters, their validation, and the lr adjustment.
#ifndef MUON_ENGINE_OPTIONS_H_
#define MUON_ENGINE_OPTIONS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "muon/math/ns_config.h"

namespace muon {

enum class AdjustLr { kOriginal = 0, kMatchRmsAdamW = 1, kNone = 2 };

struct Options {
  double lr = 1e-3;
  double weight_decay = 0.1;
  double momentum = 0.95;
  bool nesterov = true;
  NsConfig ns;
  AdjustLr adjust_lr = AdjustLr::kOriginal;
  bool momentum_fp32 = false;
};

absl::Status ValidateLr(double lr);
absl::Status ValidateWeightDecay(double weight_decay);
absl::Status ValidateMomentum(double momentum);
// All of the above, the NS config and the enum values; the message names the field.
absl::Status ValidateOptions(const Options& options);

// The lr a rows x cols matrix steps with (the decay keeps the plain lr).
double AdjustedLr(double lr, AdjustLr mode, int64_t rows, int64_t cols);

}  // namespace muon

#endif  // MUON_ENGINE_OPTIONS_H_
