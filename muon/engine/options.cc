#include "muon/engine/options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {

absl::Status ValidateLr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr: ", lr, " is invalid; it must be a finite number >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWeightDecay(double weight_decay) {
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_decay: ", weight_decay, " is invalid; it must be a finite number >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMomentum(double momentum) {
  if (!(momentum >= 0 && momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum: ", momentum, " is invalid; it must be in [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const Options& o) {
  MUON_RETURN_IF_ERROR(ValidateLr(o.lr));
  MUON_RETURN_IF_ERROR(ValidateWeightDecay(o.weight_decay));
  MUON_RETURN_IF_ERROR(ValidateMomentum(o.momentum));
  MUON_RETURN_IF_ERROR(ValidateNsConfig(o.ns));
  if (!(o.update_scale >= 0) || !std::isfinite(o.update_scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update_scale: ", o.update_scale, " is invalid; it must be a finite number >= 0"));
  }
  if (!(o.normuon_beta2 >= 0 && o.normuon_beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "normuon_beta2: ", o.normuon_beta2, " is invalid; it must be in [0, 1)"));
  }
  if (!(o.normuon_eps > 0) || !std::isfinite(o.normuon_eps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "normuon_eps: ", o.normuon_eps, " is invalid; it must be a finite number > 0"));
  }
  switch (o.adjust_lr) {
    case AdjustLr::kOriginal:
    case AdjustLr::kMatchRmsAdamW:
    case AdjustLr::kNone:
    case AdjustLr::kSpectralUnclamped:
    case AdjustLr::kSpectral:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "adjust_lr: unknown value ", static_cast<int>(o.adjust_lr),
          "; use MUON_ADJUST_LR_ORIGINAL (0), MATCH_RMS_ADAMW (1), NONE (2), "
          "SPECTRAL_UNCLAMPED (3) or SPECTRAL (4)"));
  }
  if (o.dist.prefetch_count < 0 || o.dist.prefetch_count > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefetch_count: ", o.dist.prefetch_count, " is out of range; it must be in [0, 64]"));
  }
  if (o.dist.round_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("round_bytes: ", o.dist.round_bytes, " must be positive"));
  }
  switch (o.dist.assignment) {
    case Assignment::kBalanced:
    case Assignment::kRoundRobin:
    case Assignment::kSpread:
    case Assignment::kSplit:
      break;
    case Assignment::kCustom:
      if (!o.dist.custom_assign) {
        return absl::InvalidArgumentError(
            "assign_fn: MUON_ASSIGNMENT_CUSTOM needs an assign_fn callback");
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "assignment: unknown value ", static_cast<int>(o.dist.assignment),
          "; use MUON_ASSIGNMENT_BALANCED (0), ROUND_ROBIN (1), CUSTOM (2), SPREAD (3) or "
          "SPLIT (4)"));
  }
  return absl::OkStatus();
}

double LrRatio(AdjustLr mode, int64_t rows, int64_t cols) {
  const double a = static_cast<double>(rows), b = static_cast<double>(cols);
  switch (mode) {
    case AdjustLr::kOriginal:
      return std::sqrt(std::max(1.0, a / b));
    case AdjustLr::kMatchRmsAdamW:
      return 0.2 * std::sqrt(std::max(a, b));
    case AdjustLr::kSpectralUnclamped:
      return std::sqrt(a / b);
    case AdjustLr::kSpectral:
      return std::sqrt(std::max(a, b));
    case AdjustLr::kNone:
      break;
  }
  return 1.0;
}

double AdjustedLr(double lr, AdjustLr mode, int64_t rows, int64_t cols) {
  return lr * LrRatio(mode, rows, cols);
}

std::vector<double> BlockLrRatios(AdjustLr mode, const BlockSplit& split, int64_t rows,
                                  int64_t cols) {
  std::vector<double> ratios;
  if (split.none()) return ratios;
  for (const BlockShape& b : SplitBlockShapes(split, rows, cols)) {
    ratios.push_back(LrRatio(mode, b.rows, b.cols));
  }
  return ratios;
}

double ApplyLrRatio(AdjustLr mode, const BlockSplit& split, int64_t rows, int64_t cols) {
  return split.none() ? LrRatio(mode, rows, cols) : 1.0;
}

}  // namespace muon
