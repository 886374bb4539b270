#include "muon/math/ns_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace muon {

std::vector<NsCoefficients> PolarExpressCoefficients() {
  // Degree-5 minimax polynomials from "The Polar Express" (arXiv:2505.16932).
  const std::vector<NsCoefficients> raw = {
      {8.28721201814563, -23.595886519098837, 17.300387312530933},
      {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
      {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
      {3.3184196573706015, -2.488488024314874, 0.51004894012372},
      {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
      {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
      {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
      {1.875, -1.25, 0.375},
  };
  // The safety factor keeps bf16 round-off from pushing singular values past
  // the polynomial's fixed point: p(x / s) with s = 1.01.
  const double s = 1.01;
  std::vector<NsCoefficients> out = raw;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    out[i] = {raw[i][0] / s, raw[i][1] / (s * s * s), raw[i][2] / (s * s * s * s * s)};
  }
  return out;
}

std::vector<NsCoefficients> ScheduleCoefficients(NsSchedule schedule) {
  switch (schedule) {
    case NsSchedule::kCans:
      return {{8.4703, -25.1081, 18.6293},
              {4.1828, -3.1087, 0.5806},
              {3.9619, -2.9541, 0.5630},
              {3.2866, -2.4647, 0.5074},
              {2.2737, -1.6447, 0.4162}};
    case NsSchedule::kDeepSeekV4: {
      std::vector<NsCoefficients> rows(8, NsCoefficients{3.4445, -4.7750, 2.0315});
      rows.insert(rows.end(), 2, NsCoefficients{2.0, -1.5, 0.5});
      return rows;
    }
    case NsSchedule::kAol:
      return {{4.0098, -7.0585, 2.4635},
              {3.4585, -5.5479, 2.5959},
              {2.7573, -3.2939, 1.4254},
              {2.7215, -3.0494, 1.3169}};
    case NsSchedule::kCubic5:
      return {{3.3656576, -3.3420992, 0.0},
              {2.5744352, -1.4957376, 0.0},
              {2.5368962, -1.4312570, 0.0},
              {2.4418906, -1.2764040, 0.0},
              {2.2230472, -0.9630650, 0.0}};
  }
  return {};
}

int ScheduleSteps(NsSchedule schedule) {
  switch (schedule) {
    case NsSchedule::kCans: return 0;
    case NsSchedule::kDeepSeekV4: return 10;
    case NsSchedule::kCubic5: return 5;
    case NsSchedule::kAol: return 4;
  }
  return 0;
}

int CubicIterations(const NsConfig& config) {
  int cubic = 0;
  for (int it = 0; it < config.steps; ++it) cubic += config.ForIteration(it)[2] == 0.0 ? 1 : 0;
  return cubic;
}

absl::Status ValidateNsConfig(const NsConfig& config) {
  if (config.steps < 0 || config.steps >= 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ns_steps: ", config.steps, " is out of range; it must be in [0, 100)"));
  }
  if (!(config.eps > 0) || !std::isfinite(config.eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eps: ", config.eps, " must be a positive finite number"));
  }
  if (config.coefficients.empty()) {
    return absl::InvalidArgumentError("ns coefficients: the table has no rows");
  }
  for (size_t i = 0; i < config.coefficients.size(); ++i) {
    for (double v : config.coefficients[i]) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("ns coefficients: row ", i, " holds a non-finite value"));
      }
    }
  }
  if (config.dtype != NsDtype::kBF16 && config.dtype != NsDtype::kFP32 &&
      config.dtype != NsDtype::kFP16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ns_dtype: unknown value ", static_cast<int>(config.dtype),
        "; use MUON_NS_DTYPE_BF16 (0), MUON_NS_DTYPE_FP32 (1) or MUON_NS_DTYPE_FP16 (2)"));
  }
  if (config.algorithm != NsAlgorithm::kStandard && config.algorithm != NsAlgorithm::kGram) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ns_algorithm: unknown value ", static_cast<int>(config.algorithm),
        "; use MUON_NS_STANDARD (0) or MUON_NS_GRAM (1)"));
  }
  if (config.aol && config.algorithm != NsAlgorithm::kStandard) {
    return absl::InvalidArgumentError(
        "ns_algorithm: GRAM does not run the AOL schedule's pre-scaling; use MUON_NS_STANDARD "
        "with ns_coefficients AOL");
  }
  return absl::OkStatus();
}

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps, int cubic_steps) {
  return NewtonSchulzBlockFlops(std::min(rows, cols), std::max(rows, cols), steps, cubic_steps);
}

double NewtonSchulzFlops(const NsConfig& config, int64_t rows, int64_t cols) {
  return NewtonSchulzBlockFlops(config, std::min(rows, cols), std::max(rows, cols),
                                std::max(rows, cols));
}

bool UsesGramNewtonSchulz(const NsConfig& config, int64_t rows, int64_t cols) {
  return config.algorithm == NsAlgorithm::kGram && rows != cols;
}

double NewtonSchulzBlockFlops(const NsConfig& config, int64_t m, int64_t width, int64_t n) {
  const int cubic = CubicIterations(config);
  if (!UsesGramNewtonSchulz(config, m, n) || config.steps == 0) {
    // AOL's pre-scaling forms W W^T, which its first iteration takes as its
    // gram (cpu/aol.h): no product more.
    return NewtonSchulzBlockFlops(m, width, config.steps, cubic);
  }
  const double s = static_cast<double>(m), w = static_cast<double>(width);
  double flops = 2 * s * s * w + 2 * s * s * w;  // the first R, the last X = Q W
  for (int i = 0; i < config.steps; ++i) {
    const bool fresh = i == 0 || config.RestartsAt(i);
    if (i > 0 && config.RestartsAt(i)) flops += 4 * s * s * w;  // W = Q W, R again
    if (config.ForIteration(i)[2] != 0.0) flops += 2 * s * s * s;
    if (!fresh) flops += 2 * s * s * s;
    if (i + 1 < config.steps && !config.RestartsAt(i + 1)) flops += 4 * s * s * s;
  }
  return flops;
}

double NewtonSchulzBlockFlops(int64_t m, int64_t width, int steps, int cubic_steps) {
  const double s = static_cast<double>(m), w = static_cast<double>(width);
  return steps * 4.0 * s * s * w + (steps - cubic_steps) * 2.0 * s * s * s;
}

}  // namespace muon
