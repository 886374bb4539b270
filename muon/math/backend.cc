#include "muon/math/backend.h"

#include <algorithm>

namespace muon {

double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

}  // namespace muon
