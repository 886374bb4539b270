#include "muon/math/normuon.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace muon {

void NorMuonRowDivisors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                        double eps, float* moments, float* divisors) {
  double norm_sq = 0, normalized_sq = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double v = moments[i];
    moments[i] = static_cast<float>(v + (1.0 - beta2) * (row_sq[i] / static_cast<double>(cols) - v));
    const double d = std::sqrt(static_cast<double>(moments[i])) + eps;
    norm_sq += row_sq[i];
    normalized_sq += row_sq[i] / (d * d);
  }
  const double norm = std::sqrt(norm_sq);
  const double clamped = std::max(std::sqrt(normalized_sq), eps);
  for (int64_t i = 0; i < rows; ++i) {
    const double d = std::sqrt(static_cast<double>(moments[i])) + eps;
    divisors[i] = norm > 0 ? static_cast<float>(d * clamped / norm)
                           : std::numeric_limits<float>::infinity();
  }
}

}  // namespace muon
