#include "muon/math/cpu/aol.h"

#include <algorithm>
#include <cmath>

#include "muon/math/cpu/blas_tiles.h"
#include "muon/math/cpu/cpu_kernels.h"

namespace muon {
namespace cpu {

int64_t AolWorkFloats(int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols);
  return m * m + 1 + 2 * m;  // (one float of padding aligns the doubles)
}

void AolPrescale(float* x, int64_t rows, int64_t cols, double eps, int round, float* work) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  if (m == 0 || n == 0) return;
  // bf16 starts from the bf16 input (as torch's bf16 Newton-Schulz, and as a
  // bf16 slot holds it); fp16 from the fp32 values (whose range fp16 may
  // not hold), as its Frobenius division does.
  if (round == ew::kBF16) RoundToBf16(x, rows * cols);
  float* gram = work;
  double* scale = reinterpret_cast<double*>(work + m * m + (m * m) % 2);  // 8-byte aligned
  // The upper triangle of W W^T (m x m, column-major): x x^T for a wide x,
  // x^T x for a tall one (x read column-major is x^T).
  TiledSsyrkUpper(!tall, m, n, 1.0f, x, cols, 0.0f, gram, m);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < m; ++j) {
      sum += std::fabs(static_cast<double>(i <= j ? gram[i + j * m] : gram[j + i * m]));
    }
    scale[i] = 1.0 / std::sqrt(std::max(sum, eps));
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      row[c] = static_cast<float>(static_cast<double>(row[c]) * scale[tall ? c : r]);
    }
  }
  RoundToType(round, x, rows * cols);
}

}  // namespace cpu
}  // namespace muon
