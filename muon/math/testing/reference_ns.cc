#include "muon/math/testing/reference_ns.h"

#include <algorithm>
#include <cmath>

namespace muon {

namespace {

template <typename T>
std::vector<T> Reference(const std::vector<T>& u, int64_t rows, int64_t cols, const NsConfig& cfg) {
  const bool t = rows > cols;
  const int64_t m = t ? cols : rows, n = t ? rows : cols;
  std::vector<T> x(m * n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) (t ? x[j * n + i] : x[i * n + j]) = u[i * cols + j];
  T norm = 0;
  for (T v : x) norm += v * v;
  norm = std::max(std::sqrt(norm), static_cast<T>(cfg.eps));
  for (T& v : x) v /= norm;
  for (int it = 0; it < cfg.steps; ++it) {
    const auto& abc = cfg.ForIteration(it);
    const T a0 = static_cast<T>(abc[0]), b0 = static_cast<T>(abc[1]), c0 = static_cast<T>(abc[2]);
    std::vector<T> a(m * m, 0), b(m * m, 0), xn(m * n, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k) a[i * m + j] += x[i * n + k] * x[j * n + k];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        T s = 0;
        for (int64_t k = 0; k < m; ++k) s += a[i * m + k] * a[k * m + j];
        b[i * m + j] = b0 * a[i * m + j] + c0 * s;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T s = 0;
        for (int64_t k = 0; k < m; ++k) s += b[i * m + k] * x[k * n + j];
        xn[i * n + j] = a0 * x[i * n + j] + s;
      }
    x.swap(xn);
  }
  std::vector<T> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = t ? x[j * n + i] : x[i * n + j];
  return out;
}

}  // namespace

std::vector<double> ReferenceNewtonSchulz(const std::vector<double>& u, int64_t rows,
                                          int64_t cols, const NsConfig& cfg) {
  return Reference(u, rows, cols, cfg);
}

std::vector<float> ReferenceNewtonSchulzFp32(const std::vector<float>& u, int64_t rows,
                                             int64_t cols, const NsConfig& cfg) {
  return Reference(u, rows, cols, cfg);
}

}  // namespace muon
