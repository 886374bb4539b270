// The optimizer's hyper-parameters, their validation, and the lr adjustment.
#ifndef MUON_ENGINE_OPTIONS_H_
#define MUON_ENGINE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "muon/device/device.h"
#include "muon/sharding/assignment.h"
#include "muon/math/ns_config.h"
#include "muon/math/split_blocks.h"

namespace muon {

enum class AdjustLr { kOriginal = 0, kMatchRmsAdamW = 1, kNone = 2, kSpectralUnclamped = 3,
                      kSpectral = 4 };

// The distributed engine's settings (they do not change results).
struct DistOptions {
  Assignment assignment = Assignment::kBalanced;
  CustomAssignFn custom_assign;  // Assignment::kCustom
  int prefetch_count = 1;
  bool async_parallelism = true;
  int64_t round_bytes = int64_t{256} << 20;
};

struct Options {
  double lr = 1e-3;
  double weight_decay = 0.1;
  double momentum = 0.95;
  bool nesterov = true;
  NsConfig ns;
  AdjustLr adjust_lr = AdjustLr::kOriginal;
  bool momentum_fp32 = false;
  bool skip_nonfinite = false;  // skip the step on every rank when a grad is not finite
  DistOptions dist;
  Device::Allocator allocator;  // the host's (muon_options_t.allocate); unset: the library's
  // The update lives in each gradient's own memory between the momentum and
  // the apply (no per-parameter update buffer); see muon_options_t.
  bool update_in_grad = false;
  // Multiplies every Muon update after the lr adjustment (muon_options_t).
  double update_scale = 1.0;
  // Cautious weight decay (muon_options_t.cautious_wd).
  bool cautious_wd = false;
  // Skip the step on every rank when an orthogonalized update is not finite
  // (muon_options_t.skip_nonfinite_updates).
  bool skip_nonfinite_updates = false;
  // NorMuon (muon_options_t.normuon; muon/math/normuon.h).
  bool normuon = false;
  double normuon_beta2 = 0.95;
  double normuon_eps = 1e-8;
};

absl::Status ValidateLr(double lr);
absl::Status ValidateWeightDecay(double weight_decay);
absl::Status ValidateMomentum(double momentum);
// All of the above, the NS config and the enum values; the message names the field.
absl::Status ValidateOptions(const Options& options);

// The lr a rows x cols matrix steps with (the decay keeps the plain lr).
// The shape's lr ratio, and lr times it, as torch's _adjust_lr computes them.
double LrRatio(AdjustLr mode, int64_t rows, int64_t cols);
double AdjustedLr(double lr, AdjustLr mode, int64_t rows, int64_t cols);
// The lr ratio of each block of a split rows x cols matrix, for its own
// shape (the owner multiplies it in; the apply then steps a split parameter
// with a ratio of 1). Empty for an unsplit one.
std::vector<double> BlockLrRatios(AdjustLr mode, const BlockSplit& split, int64_t rows,
                                  int64_t cols);
// The ratio a parameter's apply uses: its shape's, or 1 when split.
double ApplyLrRatio(AdjustLr mode, const BlockSplit& split, int64_t rows, int64_t cols);

}  // namespace muon

#endif  // MUON_ENGINE_OPTIONS_H_
