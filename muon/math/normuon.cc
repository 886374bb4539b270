#include "muon/math/normuon.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/common/half.h"

namespace muon {

void NorMuonRowFactors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                       double eps, float* moments, float* factors) {
  double norm_sq = 0, normalized_sq = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double v = moments[i];
    moments[i] = static_cast<float>(v + (1.0 - beta2) * (row_sq[i] / static_cast<double>(cols) - v));
    const double d = std::sqrt(static_cast<double>(moments[i])) + eps;
    norm_sq += row_sq[i];
    normalized_sq += row_sq[i] / (d * d);
  }
  const double keep = std::sqrt(norm_sq) / std::max(std::sqrt(normalized_sq), eps);
  for (int64_t i = 0; i < rows; ++i) {
    const double d = std::sqrt(static_cast<double>(moments[i])) + eps;
    factors[i] = static_cast<float>(keep / d);
  }
}

absl::Status NorMuonHost(const MatrixBatch& batch, float* const* moments,
                         const NorMuonStep& step) {
  if (batch.dtype != DType::kF32 && batch.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("NorMuon takes fp32 or bf16 matrices, not ", DTypeName(batch.dtype)));
  }
  if (batch.rows <= 0 || batch.cols <= 0) return absl::OkStatus();
  const int type = batch.dtype == DType::kBF16 ? ew::kBF16 : ew::kF32;
  const int round = step.ns_dtype == NsDtype::kBF16 ? ew::kBF16 : ew::kF32;
  std::vector<double> row_sq(static_cast<size_t>(batch.rows));
  std::vector<float> factors(static_cast<size_t>(batch.rows));
  const int64_t size = batch.rows * batch.cols;
  for (int64_t k = 0; k < batch.count; ++k) {
    if (moments[k] == nullptr) continue;  // not stepped: left as it is
    const int64_t base = k * size;
    for (int64_t i = 0; i < batch.rows; ++i) {
      double s = 0;
      for (int64_t j = 0; j < batch.cols; ++j) {
        const double x = ew::Load(type, batch.data, base + i * batch.cols + j);
        s += x * x;
      }
      row_sq[static_cast<size_t>(i)] = s;
    }
    NorMuonRowFactors(row_sq.data(), batch.rows, batch.cols, step.beta2, step.eps, moments[k],
                      factors.data());
    for (int64_t i = 0; i < batch.rows; ++i) {
      const float f = factors[static_cast<size_t>(i)];
      for (int64_t j = 0; j < batch.cols; ++j) {
        const int64_t at = base + i * batch.cols + j;
        ew::Store(type, batch.data, at, ew::RoundTo(round, ew::Load(type, batch.data, at) * f));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace muon
