// The vectorized loops (cpu_kernels.cc) against the scalar element functions
// they inline, element by element and bit for bit: the bf16 rounding on every
// rounding boundary of every exponent, momentum and apply for every dtype
// combination, lengths that leave every remainder of a vector. Every test runs
// at each CPU level this CPU can run (AVX-512, AVX2, the baseline, chosen
// through cpu_features.h's mask); a skip names the level the CPU lacks.
#include "muon/math/cpu/cpu_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/elementwise.h"

namespace muon {
namespace {

struct Level {
  uint32_t mask;
  const char* name;  // what cpu::LoopLevel() reports under the mask
};

// Each test at one CPU level: the mask on for the test's duration.
class CpuKernels : public ::testing::TestWithParam<Level> {
 protected:
  void SetUp() override {
    const Level level = GetParam();
    if ((cpu::DetectedFeatures() & level.mask) != level.mask) {
      GTEST_SKIP() << "this CPU (features: " << cpu::FeatureNames(cpu::DetectedFeatures())
                   << ") has no " << cpu::FeatureNames(level.mask & ~cpu::DetectedFeatures())
                   << " for the " << level.name << " loops";
    }
    mask_ = std::make_unique<cpu::ScopedFeatureMask>(level.mask);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    ASSERT_STREQ(cpu::LoopLevel(), level.name);
#endif
  }
  void TearDown() override { mask_.reset(); }

 private:
  std::unique_ptr<cpu::ScopedFeatureMask> mask_;
};

INSTANTIATE_TEST_SUITE_P(
    Levels, CpuKernels,
    ::testing::Values(Level{cpu::kFeatureAvx2 | cpu::kFeatureAvx512, "x86-64-v4"},
                      Level{cpu::kFeatureAvx2, "x86-64-v3"}, Level{0, "baseline"}),
    [](const ::testing::TestParamInfo<Level>& info) {
      return std::string(info.param.mask & cpu::kFeatureAvx512 ? "Avx512"
                         : info.param.mask & cpu::kFeatureAvx2 ? "Avx2"
                                                              : "Baseline");
    });

// The scalar reference: bf16 rounding written out independently (the high
// half, plus one when the dropped half is above half-way, or exactly half-way
// with an odd kept half; NaNs quieted).
uint16_t ReferenceBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  uint32_t hi = u >> 16;
  const uint32_t lo = u & 0xffffu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) ++hi;
  return static_cast<uint16_t>(hi);
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every high half (sign, exponent, 7 mantissa bits), each with the low halves
// around the rounding boundary and the extremes.
std::vector<float> Boundaries() {
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu, 0x4000u};
  std::vector<float> v;
  for (uint32_t hi = 0; hi <= 0xffffu; ++hi) {
    for (uint32_t lo : lows) v.push_back(FromBits((hi << 16) | lo));
  }
  return v;
}

TEST_P(CpuKernels, F16RoundingAsHalfH) {
  // Every fp16 value's neighbourhood (its bits shifted to fp32, and the
  // midpoints and their neighbours), past the range and through subnormals.
  std::vector<float> in;
  for (uint32_t h = 0; h < 0x10000u; h += 7) {
    const float f = ew::F16BitsToFloat(static_cast<uint16_t>(h));
    const uint32_t bits = ToBits(f);
    for (uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u}) in.push_back(FromBits(bits + d));
  }
  in.push_back(70000.0f);
  in.push_back(-1e-9f);
  std::vector<float> rounded = in;
  cpu::RoundToF16(rounded.data(), static_cast<int64_t>(rounded.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const float want = ew::RoundTo(ew::kF16, in[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(rounded[i]));
    } else {
      ASSERT_EQ(ToBits(rounded[i]), ToBits(want)) << std::hex << ToBits(in[i]);
    }
  }
  EXPECT_TRUE(std::isinf(rounded[rounded.size() - 2]));
}

TEST_P(CpuKernels, Bf16RoundingOnEveryBoundary) {
  const std::vector<float> in = Boundaries();
  std::vector<float> rounded = in;
  cpu::RoundToBf16(rounded.data(), static_cast<int64_t>(rounded.size()));
  std::vector<uint16_t> bits(in.size());
  cpu::ToBf16(in.data(), static_cast<int64_t>(in.size()), bits.data());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = ReferenceBf16(in[i]);
    ASSERT_EQ(bits[i], want) << std::hex << ToBits(in[i]);
    ASSERT_EQ(ToBits(rounded[i]), static_cast<uint32_t>(want) << 16) << std::hex << ToBits(in[i]);
    ASSERT_EQ(ew::FloatToBf16Bits(in[i]), want) << std::hex << ToBits(in[i]);
  }
  std::vector<float> back(bits.size());
  cpu::FromBf16(bits.data(), static_cast<int64_t>(bits.size()), back.data());
  for (size_t i = 0; i < bits.size(); ++i) {
    ASSERT_EQ(ToBits(back[i]), static_cast<uint32_t>(bits[i]) << 16);
  }
}

TEST_P(CpuKernels, DivideRoundsAsScalar) {  // and DivideToBf16
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 3.f);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 1000}) {
    std::vector<float> x(n);
    for (float& v : x) v = d(rng);
    for (bool bf16 : {false, true}) {
      std::vector<float> got = x;
      cpu::Divide(got.data(), n, 1.7f, bf16);
      for (int64_t i = 0; i < n; ++i) {
        const float q = x[i] / 1.7f;
        ASSERT_EQ(ToBits(got[i]), ToBits(bf16 ? ew::Bf16BitsToFloat(ReferenceBf16(q)) : q));
      }
    }
    std::vector<float> into(n);
    cpu::DivideInto(x.data(), n, 1.7f, into.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ToBits(into[i]), ToBits(x[i] / 1.7f));
    // DivideBf16: bf16 in, bf16 out, in place too.
    std::vector<uint16_t> in(n), out(n);
    for (int64_t i = 0; i < n; ++i) in[i] = ReferenceBf16(x[i]);
    cpu::DivideBf16(in.data(), n, 1.7f, out.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], ReferenceBf16(ew::Bf16BitsToFloat(in[i]) / 1.7f));
    }
    cpu::DivideBf16(in.data(), n, 1.7f, in.data());
    ASSERT_EQ(in, out);
    std::vector<uint16_t> bits(n);
    cpu::DivideToBf16(x.data(), n, 1.7f, bits.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits[i], ReferenceBf16(ew::Bf16BitsToFloat(ReferenceBf16(x[i])) / 1.7f));
    }
  }
}

TEST_P(CpuKernels, SumSquaresIsExactForSmallIntegersAndOrderFixed) {
  for (int64_t n : {0, 1, 5, 8, 13, 64, 1001}) {
    std::vector<float> x(n);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>((i * 7) % 11) - 5.0f;
      want += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_EQ(cpu::SumSquares(x.data(), n), want) << n;
  }
  // Eight running sums over i mod 8, added in order (a fixed order: the same
  // double on every CPU).
  std::vector<float> x(20);
  std::mt19937 rng(2);
  std::normal_distribution<float> d(0.f, 1e3f);
  for (float& v : x) v = d(rng);
  double acc[8] = {};
  for (size_t i = 0; i < x.size(); ++i) acc[i % 8] += static_cast<double>(x[i]) * x[i];
  double want = 0;
  for (double a : acc) want += a;
  EXPECT_EQ(cpu::SumSquares(x.data(), 20), want);
  // SumSquaresAsBf16: the same order over the values rounded to bf16, x
  // itself unchanged.
  const std::vector<float> before = x;
  std::vector<float> rounded = x;
  for (float& v : rounded) v = ew::Bf16BitsToFloat(ReferenceBf16(v));
  ASSERT_NE(rounded, x);
  EXPECT_EQ(cpu::SumSquaresAsBf16(x.data(), 20), cpu::SumSquares(rounded.data(), 20));
  EXPECT_EQ(x, before);
  // SumSquaresBf16: the same over the bf16 values themselves.
  std::vector<uint16_t> bits(20);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = ReferenceBf16(x[i]);
  EXPECT_EQ(cpu::SumSquaresBf16(bits.data(), 20), cpu::SumSquares(rounded.data(), 20));
}

TEST_P(CpuKernels, TransposesMoveEveryElement) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 70}, {70, 3}, {33, 65}}) {
    std::vector<float> src(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) src[i] = static_cast<float>(i % 251) - 100.0f;
    std::vector<uint16_t> t(rows * cols);
    cpu::TransposeToBf16(src.data(), rows, cols, t.data());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        ASSERT_EQ(t[j * rows + i], ReferenceBf16(src[i * cols + j]));
      }
    }
    std::vector<float> back(rows * cols);
    cpu::TransposeFromBf16(t.data(), cols, rows, back.data());
    EXPECT_EQ(back, src);  // small integers: exact in bf16
  }
}

TEST_P(CpuKernels, FoldPolynomialChangesTheUpperTriangleOnly) {
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.f, 2.f);
  for (int64_t m : {1, 2, 7, 33}) {
    std::vector<float> poly(m * m), gram(m * m);
    for (float& v : poly) v = d(rng);
    for (float& v : gram) v = d(rng);
    std::vector<float> got = poly;
    cpu::FoldPolynomial(got.data(), gram.data(), m, 3.4445f, -4.775f);
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t at = j * m + i;
        float want = poly[at];
        if (i <= j) want = poly[at] + -4.775f * gram[at];
        if (i == j) want = want + 3.4445f;
        ASSERT_EQ(ToBits(got[at]), ToBits(want)) << m << " at " << i << ", " << j;
      }
    }
  }
}

TEST_P(CpuKernels, MirrorUpperFillsExactlyTheLowerTriangle) {
  for (int64_t m : {1, 2, 31, 32, 33, 70}) {
    const int64_t ld = m + 3;  // padding rows stay untouched
    std::vector<float> d(ld * m), want;
    for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>(i);
    want = d;
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = j + 1; i < m; ++i) want[j * ld + i] = want[i * ld + j];
    }
    cpu::MirrorUpper(d.data(), m, ld);
    EXPECT_EQ(d, want) << m;
  }
}

// Values of every kind for a dtype: normal, tiny, huge, zero, inf, NaN.
std::vector<float> Mixed(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (i % 13) {
      case 3: v[i] = 1e-40f; break;
      case 5: v[i] = 7e4f; break;
      case 7: v[i] = 0.0f; break;
      case 11: v[i] = d(rng) * 1e-6f; break;
      default: v[i] = d(rng);
    }
  }
  if (n > 20) {
    v[17] = std::numeric_limits<float>::infinity();
    v[19] = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

// Storage of `type` holding the values of `v` rounded to it.
std::vector<uint8_t> Stored(int type, const std::vector<float>& v) {
  std::vector<uint8_t> s(v.size() * (type == ew::kF32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) ew::Store(type, s.data(), static_cast<int64_t>(i), v[i]);
  return s;
}

DType D(int t) { return static_cast<DType>(t); }

TEST_P(CpuKernels, MomentumEveryDtypeCombinationMatchesTheElementFunction) {
  // Weights (1 - momentum, momentum) on either side of torch's lerp switch at
  // 0.5, and at it.
  const std::pair<float, float> weights[] = {{0.05f, 0.95f}, {0.7f, 0.3f}, {0.5f, 0.5f},
                                             {0.2f, 0.2f}, {0.9f, 0.9f}};
  for (auto [w_buf, w_out] : weights) {
    for (int64_t n : {1, 9, 16, 37, 200}) {
      for (int g = 0; g < 3; ++g) {
        for (int b = 0; b < 3; ++b) {
          for (int o = 0; o < 3; ++o) {
            for (bool nesterov : {false, true}) {
              auto grad = Stored(g, Mixed(n, 1)), buf = Stored(b, Mixed(n, 2));
              auto want_buf = buf;
              std::vector<uint8_t> out(n * 4), want_out(n * 4);
              int64_t want_nonfinite = 0;
              for (int64_t i = 0; i < n; ++i) {
                const float gv = ew::Load(g, grad.data(), i);
                want_nonfinite += ew::IsFinite(gv) ? 0 : 1;
                float bv = ew::Load(b, want_buf.data(), i);
                const float ov = ew::MomentumElement(b, gv, &bv, w_buf, w_out, nesterov);
                ew::Store(b, want_buf.data(), i, bv);
                ew::Store(o, want_out.data(), i, ov);
              }
              const MomentumArgs a{D(g), grad.data(), D(b), buf.data(), n, out.data(), D(o)};
              EXPECT_EQ(cpu::Momentum(a, w_buf, w_out, nesterov), want_nonfinite);
              const std::string what = "n " + std::to_string(n) + " types " + std::to_string(g) +
                                       std::to_string(b) + std::to_string(o) +
                                       (nesterov ? " nesterov" : "") + " weights " +
                                       std::to_string(w_buf) + ", " + std::to_string(w_out);
              ASSERT_EQ(buf, want_buf) << what;
              ASSERT_EQ(out, want_out) << what;
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuKernels, ApplyEveryDtypeCombinationMatchesTheElementFunction) {
  for (bool cautious : {false, true}) {
  for (int64_t n : {1, 9, 16, 37, 200}) {
    for (int p = 0; p < 3; ++p) {
      for (int u = 0; u < 3; ++u) {
        auto param = Stored(p, Mixed(n, 3)), update = Stored(u, Mixed(n, 4));
        auto want = param;
        int decayed = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float pv = ew::Load(p, want.data(), i), uv = ew::Load(u, update.data(), i);
          const float decay = cautious ? ew::CautiousDecay(pv, uv, 0.998f) : 0.998f;
          decayed += decay != 1.0f;
          ew::Store(p, want.data(), i, ew::ApplyElement(p, pv, uv, decay, -0.02f));
        }
        if (cautious && n >= 37) {
          ASSERT_LT(decayed, n) << "no element escaped the decay";
        }
        ApplyArgs a;
        a.param_dtype = D(p);
        a.param = param.data();
        a.n = n;
        a.update = update.data();
        a.update_dtype = D(u);
        a.cautious = cautious;
        cpu::Apply(a, 0.998f, -0.02f);
        ASSERT_EQ(param, want) << "n " << n << " types " << p << u << " cautious " << cautious;
      }
    }
  }
  }
}

TEST_P(CpuKernels, ConvertEveryDtypeCombinationMatchesTheElementFunctions) {
  for (int64_t n : {1, 9, 16, 37, 200}) {
    for (int s = 0; s < 3; ++s) {
      for (int v = 0; v < 3; ++v) {
        for (int d = 0; d < 3; ++d) {
          const auto src = Stored(s, Mixed(n, 5));
          std::vector<uint8_t> dst(n * 4, 0xab), want(n * 4, 0xab);
          for (int64_t i = 0; i < n; ++i) {
            ew::Store(d, want.data(), i, ew::RoundTo(v, ew::Load(s, src.data(), i)));
          }
          cpu::Convert(D(s), src.data(), D(v), D(d), dst.data(), n);
          ASSERT_EQ(dst, want) << "n " << n << " types " << s << v << d;
        }
      }
    }
  }
  // Every bf16 rounding boundary, fp32 to bf16 and fp32 via bf16.
  const std::vector<float> in = Boundaries();
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<uint16_t> bits(in.size());
  cpu::Convert(DType::kF32, in.data(), DType::kF32, DType::kBF16, bits.data(), n);
  std::vector<float> via(in.size());
  cpu::Convert(DType::kF32, in.data(), DType::kBF16, DType::kF32, via.data(), n);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(bits[i], ReferenceBf16(in[i])) << std::hex << ToBits(in[i]);
    ASSERT_EQ(ToBits(via[i]), static_cast<uint32_t>(ReferenceBf16(in[i])) << 16)
        << std::hex << ToBits(in[i]);
  }
}

}  // namespace
}  // namespace muon
