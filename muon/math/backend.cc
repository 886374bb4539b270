#include "muon/math/backend.h"

#include <algorithm>

namespace muon {

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return NewtonSchulzBlockFlops(static_cast<int64_t>(m), static_cast<int64_t>(n), steps);
}

double NewtonSchulzBlockFlops(int64_t m, int64_t width, int steps) {
  const double s = static_cast<double>(m), w = static_cast<double>(width);
  return steps * (4.0 * s * s * w + 2.0 * s * s * s);
}

}  // namespace muon
