#include "muon/math/backend.h"

#include <algorithm>

namespace muon {

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps, int cubic_steps) {
  return NewtonSchulzBlockFlops(std::min(rows, cols), std::max(rows, cols), steps, cubic_steps);
}

double NewtonSchulzFlops(const NsConfig& config, int64_t rows, int64_t cols) {
  const int cubic = CubicIterations(config);
  if (config.algorithm != NsAlgorithm::kGram || rows == cols || config.steps == 0) {
    // AOL's pre-scaling forms W W^T once more (2 m^2 n).
    const double m = static_cast<double>(std::min(rows, cols));
    const double aol = config.aol ? 2 * m * m * static_cast<double>(std::max(rows, cols)) : 0;
    return NewtonSchulzFlops(rows, cols, config.steps, cubic) + aol;
  }
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  double flops = 2 * m * m * n + 2 * m * m * n;  // the first R, the last X = Q W
  for (int i = 0; i < config.steps; ++i) {
    const bool fresh = i == 0 || config.RestartsAt(i);
    if (i > 0 && config.RestartsAt(i)) flops += 4 * m * m * n;  // W = Q W, R again
    if (config.ForIteration(i)[2] != 0.0) flops += 2 * m * m * m;
    if (!fresh) flops += 2 * m * m * m;
    if (i + 1 < config.steps && !config.RestartsAt(i + 1)) flops += 4 * m * m * m;
  }
  return flops;
}

double NewtonSchulzBlockFlops(int64_t m, int64_t width, int steps, int cubic_steps) {
  const double s = static_cast<double>(m), w = static_cast<double>(width);
  return steps * 4.0 * s * s * w + (steps - cubic_steps) * 2.0 * s * s * s;
}

}  // namespace muon
