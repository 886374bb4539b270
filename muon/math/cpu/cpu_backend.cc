#include "muon/math/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

void RoundSpanToBf16(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = RoundToBf16(p[i]);
}

// dst (cols x rows) = transpose of src (rows x cols), in cache-sized tiles.
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) dst[j * rows + i] = src[i * cols + j];
      }
    }
  }
}

template <typename Fn>
absl::Status Guarded(const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of host memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::Momentum(const MomentumArgs& a) {
  const float w_buf = static_cast<float>(1.0 - a.momentum);
  const float w_out = static_cast<float>(a.momentum);
  int64_t nonfinite = 0;
  const int grad_type = static_cast<int>(a.grad_dtype), buf_type = static_cast<int>(a.buf_dtype);
  for (int64_t i = 0; i < a.n; ++i) {  // as the CUDA kernel: the same element functions
    const float g = ew::Load(grad_type, a.grad, i);
    nonfinite += ew::IsFinite(g) ? 0 : 1;
    float b = ew::Load(buf_type, a.buf, i);
    a.out[i] = ew::MomentumElement(buf_type, g, &b, w_buf, w_out, a.nesterov);
    ew::Store(buf_type, a.buf, i, b);
  }
  if (a.nonfinite != nullptr) *a.nonfinite += nonfinite;
  return absl::OkStatus();
}

absl::Status CpuBackend::Apply(const ApplyArgs& a) {
  if (a.gate != nullptr && *a.gate != 0) return absl::OkStatus();  // the job said no
  const float decay = static_cast<float>(a.decay);
  const float alpha = static_cast<float>(-a.lr_adjusted);
  const int type = static_cast<int>(a.param_dtype);
  for (int64_t i = 0; i < a.n; ++i) {
    ew::Store(type, a.param, i,
              ew::ApplyElement(type, ew::Load(type, a.param, i), a.update[i], decay, alpha));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CountNonFinite(DType dtype, const void* data, int64_t n,
                                        int64_t* counter) {
  *counter += muon::CountNonFinite(dtype, data, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                                     int32_t* flag) {
  const auto* v = static_cast<const unsigned char*>(verdicts);
  uint64_t digest0 = 0;
  if (n > 0) std::memcpy(&digest0, v + 8, 8);
  int32_t bad = 0;
  for (int64_t r = 0; r < n; ++r) {
    uint32_t m;
    int32_t code;
    uint64_t digest;
    std::memcpy(&m, v + 16 * r, 4);
    std::memcpy(&code, v + 16 * r + 4, 4);
    std::memcpy(&digest, v + 16 * r + 8, 8);
    if (m != magic || code != 0 || digest != digest0) bad = 1;
  }
  *flag = bad;
  return absl::OkStatus();
}

absl::Status CpuBackend::Reserve(int64_t rows, int64_t cols) {
  const size_t m = static_cast<size_t>(std::min(rows, cols));
  const size_t n = static_cast<size_t>(std::max(rows, cols));
  return Guarded("Newton-Schulz workspace", [&] {
    if (x_.size() < m * n) {
      x_.resize(m * n);
      x_next_.resize(m * n);
    }
    if (gram_.size() < m * m) {
      gram_.resize(m * m);
      poly_.resize(m * m);
    }
  });
}

absl::Status CpuBackend::Orthogonalize(const NsConfig& config, const MatrixBatch& batch) {
  if (batch.count == 0 || batch.rows == 0 || batch.cols == 0) return absl::OkStatus();
  auto reserved = Reserve(batch.rows, batch.cols);
  if (!reserved.ok()) return reserved;
  const int64_t stride = batch.rows * batch.cols;
  for (int64_t k = 0; k < batch.count; ++k) {
    OrthogonalizeOne(config, batch.data + k * stride, batch.rows, batch.cols);
  }
  return absl::OkStatus();
}

void CpuBackend::OrthogonalizeOne(const NsConfig& config, float* u, int64_t rows, int64_t cols) {
  const bool bf16 = config.dtype == NsDtype::kBF16;
  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows;  // X is m x n with m <= n
  const int64_t n = transposed ? rows : cols;
  float* x = x_.data();
  float* x_next = x_next_.data();
  float* gram = gram_.data();
  float* poly = poly_.data();

  if (transposed) {
    Transpose(u, rows, cols, x);
  } else {
    std::copy(u, u + m * n, x);
  }
  if (bf16) RoundSpanToBf16(x, m * n);

  // X <- X / max(||X||_F, eps); the norm has the compute dtype's precision.
  double sumsq = 0.0;
  for (int64_t i = 0; i < m * n; ++i) sumsq += static_cast<double>(x[i]) * x[i];
  float norm = static_cast<float>(std::sqrt(sumsq));
  if (bf16) norm = RoundToBf16(norm);
  norm = std::max(norm, static_cast<float>(config.eps));
  if (bf16) norm = RoundToBf16(norm);
  for (int64_t i = 0; i < m * n; ++i) x[i] = x[i] / norm;
  if (bf16) RoundSpanToBf16(x, m * n);

  const int mi = static_cast<int>(m), ni = static_cast<int>(n);
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    // gram = X X^T (symmetric: computed once per pair, then mirrored).
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, mi, ni, 1.0f, x, ni, 0.0f, gram, mi);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < i; ++j) gram[i * m + j] = gram[j * m + i];
    }
    if (bf16) RoundSpanToBf16(gram, m * m);
    // poly = b * gram + c * gram @ gram
    std::copy(gram, gram + m * m, poly);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mi, mi, mi, static_cast<float>(abc[2]),
                gram, mi, gram, mi, static_cast<float>(abc[1]), poly, mi);
    if (bf16) RoundSpanToBf16(poly, m * m);
    // X <- a * X + poly @ X
    std::copy(x, x + m * n, x_next);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mi, ni, mi, 1.0f, poly, mi, x, ni,
                static_cast<float>(abc[0]), x_next, ni);
    if (bf16) RoundSpanToBf16(x_next, m * n);
    std::swap(x, x_next);
  }

  if (transposed) {
    Transpose(x, m, n, u);
  } else {
    std::copy(x, x + m * n, u);
  }
}

}  // namespace muon
