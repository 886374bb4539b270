#include "muon/math/testing/reference_ns.h"

#include <algorithm>
#include <cmath>

namespace muon {

std::vector<double> ReferenceNewtonSchulz(const std::vector<double>& u, int64_t rows,
                                          int64_t cols, const NsConfig& cfg) {
  const bool t = rows > cols;
  const int64_t m = t ? cols : rows, n = t ? rows : cols;
  std::vector<double> x(m * n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) (t ? x[j * n + i] : x[i * n + j]) = u[i * cols + j];
  double norm = 0;
  for (double v : x) norm += v * v;
  norm = std::max(std::sqrt(norm), cfg.eps);
  for (double& v : x) v /= norm;
  for (int it = 0; it < cfg.steps; ++it) {
    const auto& abc = cfg.ForIteration(it);
    std::vector<double> a(m * m, 0), b(m * m, 0), xn(m * n, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k) a[i * m + j] += x[i * n + k] * x[j * n + k];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = 0;
        for (int64_t k = 0; k < m; ++k) s += a[i * m + k] * a[k * m + j];
        b[i * m + j] = abc[1] * a[i * m + j] + abc[2] * s;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t k = 0; k < m; ++k) s += b[i * m + k] * x[k * n + j];
        xn[i * n + j] = abc[0] * x[i * n + j] + s;
      }
    x.swap(xn);
  }
  std::vector<double> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = t ? x[j * n + i] : x[i * n + j];
  return out;
}

}  // namespace muon
