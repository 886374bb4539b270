// NorMuon's normalization (the CPU backend's) against the paper's algorithm (arXiv 2510.05491,
// with Dion's eps placement) written here in long double, step by step.
#include "muon/math/cpu/cpu_backend.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"

namespace muon {
namespace {

using LD = long double;

// One step of the paper's NorMuon on o (rows x cols): v <- beta2 v + (1 -
// beta2) mean_j o^2; o <- o / (sqrt(v) + eps), rescaled to o's Frobenius norm.
void Reference(std::vector<LD>& o, std::vector<LD>& v, int64_t rows, int64_t cols, LD beta2,
               LD eps) {
  LD before = 0, after = 0;
  for (LD x : o) before += x * x;
  for (int64_t i = 0; i < rows; ++i) {
    LD mean = 0;
    for (int64_t j = 0; j < cols; ++j) mean += o[i * cols + j] * o[i * cols + j];
    v[i] = beta2 * v[i] + (1 - beta2) * mean / cols;
    for (int64_t j = 0; j < cols; ++j) o[i * cols + j] /= std::sqrt(v[i]) + eps;
  }
  for (LD x : o) after += x * x;
  const LD keep = std::sqrt(before) / std::max(std::sqrt(after), eps);
  for (LD& x : o) x *= keep;
}

absl::Status NorMuonHost(const MatrixBatch& batch, float* const* moments,
                         const NorMuonStep& step) {
  CpuBackend backend;
  return backend.NorMuon(step, batch, moments);
}

std::vector<float> Random(int64_t n, unsigned seed, float spread) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = d(gen) * (1.0f + spread * static_cast<float>(i % 7));
  return out;
}

TEST(NorMuon, MatchesThePapersStepsInFp32) {
  const int64_t rows = 24, cols = 40;
  std::vector<float> moments(rows, 0.0f);
  std::vector<LD> ref_v(rows, 0);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> o = Random(rows * cols, 7 + step, 0.5f);
    std::vector<LD> ref(o.begin(), o.end());
    float* m = moments.data();
    ASSERT_TRUE(NorMuonHost({o.data(), 1, rows, cols, DType::kF32}, &m,
                            {0.95, 1e-8, NsDtype::kFP32})
                    .ok());
    Reference(ref, ref_v, rows, cols, 0.95L, 1e-8L);
    for (int64_t i = 0; i < rows; ++i) {
      EXPECT_NEAR(moments[i], static_cast<double>(ref_v[i]), 1e-6 * static_cast<double>(ref_v[i]))
          << "step " << step << " row " << i;
    }
    for (size_t k = 0; k < o.size(); ++k) {
      EXPECT_NEAR(o[k], static_cast<double>(ref[k]), 2e-6 * (1 + std::fabs(static_cast<double>(ref[k]))))
          << "step " << step << " element " << k;
    }
  }
}

TEST(NorMuon, KeepsTheNormAndEqualizesRowsOfAConstantUpdate) {
  // From zero moments and the same update every step, v_i = (1 - beta2^t)
  // mean_i exactly, so every row leaves with the same RMS.
  const int64_t rows = 8, cols = 16;
  const std::vector<float> o0 = Random(rows * cols, 3, 2.0f);
  std::vector<float> moments(rows, 0.0f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> o = o0;
    float* m = moments.data();
    ASSERT_TRUE(NorMuonHost({o.data(), 1, rows, cols, DType::kF32}, &m,
                            {0.9, 1e-12, NsDtype::kFP32}).ok());
    double before = 0, after = 0;
    for (size_t k = 0; k < o.size(); ++k) {
      before += double{o0[k]} * o0[k];
      after += double{o[k]} * o[k];
    }
    EXPECT_NEAR(after, before, 1e-5 * before);
    const double rms = std::sqrt(after / (rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) s += double{o[i * cols + j]} * o[i * cols + j];
      EXPECT_NEAR(std::sqrt(s / cols), rms, 1e-5 * rms) << "row " << i;
    }
  }
}

TEST(NorMuon, Bf16KeepsBf16PrecisionAndMatchesFp32Math) {
  const int64_t rows = 6, cols = 10, count = 2;
  std::vector<float> f = Random(rows * cols * count, 11, 1.0f);
  for (float& x : f) x = ew::RoundTo(ew::kBF16, x);
  std::vector<uint16_t> b(f.size());
  for (size_t k = 0; k < f.size(); ++k) b[k] = ew::FloatToBf16Bits(f[k]);
  std::vector<float> mf(rows * count, 0.0f), mb(rows * count, 0.0f);
  float* pf[2] = {mf.data(), mf.data() + rows};
  float* pb[2] = {mb.data(), mb.data() + rows};
  const NorMuonStep step{0.95, 1e-8, NsDtype::kBF16};
  ASSERT_TRUE(NorMuonHost({f.data(), count, rows, cols, DType::kF32}, pf, step).ok());
  ASSERT_TRUE(NorMuonHost({b.data(), count, rows, cols, DType::kBF16}, pb, step).ok());
  for (size_t k = 0; k < f.size(); ++k) {
    EXPECT_EQ(f[k], ew::RoundTo(ew::kBF16, f[k])) << "fp32 slot keeps bf16 precision at " << k;
    EXPECT_EQ(ew::FloatToBf16Bits(f[k]), b[k]) << "same bits from either slot at " << k;
  }
  EXPECT_EQ(mf, mb);
}

TEST(NorMuon, ZeroUpdateStaysZero) {
  std::vector<float> o(12, 0.0f), moments(3, 0.0f);
  float* m = moments.data();
  ASSERT_TRUE(NorMuonHost({o.data(), 1, 3, 4, DType::kF32}, &m, {}).ok());
  for (float x : o) EXPECT_EQ(x, 0.0f);
  for (float x : moments) EXPECT_EQ(x, 0.0f);
}

TEST(NorMuon, RefusesOtherDtypes) {
  std::vector<uint16_t> o(4);
  std::vector<float> moments(2);
  float* m = moments.data();
  const absl::Status st = NorMuonHost({o.data(), 1, 2, 2, DType::kF16}, &m, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("float16"), std::string::npos) << st;
}

}  // namespace
}  // namespace muon
