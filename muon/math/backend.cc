#include "muon/math/backend.h"

#include <algorithm>

namespace muon {

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps, int cubic_steps) {
  return NewtonSchulzBlockFlops(std::min(rows, cols), std::max(rows, cols), steps, cubic_steps);
}

double NewtonSchulzBlockFlops(int64_t m, int64_t width, int steps, int cubic_steps) {
  const double s = static_cast<double>(m), w = static_cast<double>(width);
  return steps * 4.0 * s * s * w + (steps - cubic_steps) * 2.0 * s * s * s;
}

}  // namespace muon
