#include "muon/math/backend.h"

#include <algorithm>

namespace muon {

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps) {
  return NewtonSchulzBlockFlops(std::min(rows, cols), std::max(rows, cols), steps);
}

double NewtonSchulzBlockFlops(int64_t m, int64_t width, int steps) {
  const double s = static_cast<double>(m), w = static_cast<double>(width);
  return steps * (4.0 * s * s * w + 2.0 * s * s * s);
}

}  // namespace muon
