#include "muon/math/cpu/aol.h"

#include <algorithm>
#include <cmath>

#include "muon/math/cpu/cpu_kernels.h"

namespace muon {
namespace cpu {

void AolScale(float* x, int64_t rows, int64_t cols, bool tall, double eps, int round,
              float* gram, double* scales) {
  const int64_t m = tall ? cols : rows;
  if (rows == 0 || cols == 0) return;
  // Row i of the symmetric gram read as its column i (contiguous).
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < m; ++j) sum += std::fabs(static_cast<double>(gram[j + i * m]));
    scales[i] = 1.0 / std::sqrt(std::max(sum, eps));
  }
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      // s_i s_j first: the same product for (i, j) and (j, i), so the
      // result stays exactly symmetric.
      gram[i + j * m] = static_cast<float>(static_cast<double>(gram[i + j * m]) *
                                           (scales[i] * scales[j]));
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      row[c] = static_cast<float>(static_cast<double>(row[c]) * scales[tall ? c : r]);
    }
  }
  RoundToType(round, x, rows * cols);
  RoundToType(round, gram, m * m);
}

}  // namespace cpu
}  // namespace muon
