#include "muon/math/cpu/cpu_backend.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/testing/random_matrix.h"
#include "muon/math/testing/reference_ns.h"

namespace muon {
namespace {

// Independent reference (muon/math/testing): double precision, naive loops.
std::vector<double> ReferenceNs(const std::vector<float>& u, int64_t rows, int64_t cols,
                                const NsConfig& cfg) {
  return ReferenceNewtonSchulz(std::vector<double>(u.begin(), u.end()), rows, cols, cfg);
}

double MaxRelErr(const std::vector<float>& got, const std::vector<double>& want) {
  double max_abs = 0, max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(want[i]));
    max_err = std::max(max_err, std::fabs(got[i] - want[i]));
  }
  return max_err / max_abs;
}

struct Shape {
  int64_t rows, cols;
};

class NsShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(NsShapes, Fp32MatchesDoubleReference) {
  const Shape s = GetParam();
  // Odd and even iteration counts end in different buffers; 0 only divides.
  for (int steps : {5, 4, 1, 0}) {
    NsConfig cfg;
    cfg.dtype = NsDtype::kFP32;
    cfg.steps = steps;
    auto u = RandomNormal(s.rows * s.cols, 3);
    auto want = ReferenceNs(u, s.rows, s.cols, cfg);
    CpuBackend be;
    ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, s.rows, s.cols}).ok());
    EXPECT_LT(MaxRelErr(u, want), 1e-5) << steps << " iterations";
  }
}

TEST_P(NsShapes, Fp32SchedulesMatchDoubleReference) {
  // CANS's 5 rows, DeepSeek-V4's 10, and cubic5 (c == 0: two products an
  // iteration, the polynomial product skipped). (CANS's first rows overshoot
  // a singular value of 1 on purpose: past its 5 rows fp32 and double part.)
  const Shape s = GetParam();
  for (NsSchedule schedule : {NsSchedule::kCans, NsSchedule::kDeepSeekV4, NsSchedule::kCubic5}) {
    NsConfig cfg;
    cfg.dtype = NsDtype::kFP32;
    cfg.coefficients = ScheduleCoefficients(schedule);
    cfg.steps = static_cast<int>(cfg.coefficients.size());
    auto u = RandomNormal(s.rows * s.cols, 4);
    auto want = ReferenceNs(u, s.rows, s.cols, cfg);
    // fp32 done naively: CANS amplifies round-off near a singular value of 1
    // (its first polynomial's slope there is 26), so no fp32 run lands within
    // 1e-5 of double; ours must land as close as the naive one, or closer.
    const double naive = MaxRelErr(ReferenceNewtonSchulzFp32(u, s.rows, s.cols, cfg), want);
    CpuBackend be;
    ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, s.rows, s.cols}).ok());
    EXPECT_LT(MaxRelErr(u, want), std::max(1e-5, 2.0 * naive))
        << "schedule " << static_cast<int>(schedule) << ", naive fp32 " << naive;
  }
}

// AOL's pre-scaling (cpu/aol.h) then its 4 rows, written out here in double
// from the definition: W the wide orientation, s_i = 1 / sqrt(max(sum_j
// |(W W^T)_ij|, eps)), X = diag(s) W, then X <- a X + (b A + c A^2) X.
std::vector<double> AolReference(const std::vector<float>& u, int64_t rows, int64_t cols,
                                 const NsConfig& cfg) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  std::vector<double> x(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) x[i * n + j] = tall ? u[j * cols + i] : u[i * cols + j];
  }
  auto gram = [&](const std::vector<double>& w) {
    std::vector<double> g(static_cast<size_t>(m * m), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t k = 0; k < m; ++k) {
        for (int64_t j = 0; j < n; ++j) g[i * m + k] += w[i * n + j] * w[k * n + j];
      }
    }
    return g;
  };
  const std::vector<double> g0 = gram(x);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t k = 0; k < m; ++k) sum += std::fabs(g0[i * m + k]);
    const double scale = 1.0 / std::sqrt(std::max(sum, cfg.eps));
    for (int64_t j = 0; j < n; ++j) x[i * n + j] *= scale;
  }
  for (int it = 0; it < cfg.steps; ++it) {
    const NsCoefficients& abc = cfg.ForIteration(it);
    const std::vector<double> a = gram(x);
    std::vector<double> b(static_cast<size_t>(m * m));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t k = 0; k < m; ++k) {
        double aa = 0;
        for (int64_t l = 0; l < m; ++l) aa += a[i * m + l] * a[l * m + k];
        b[i * m + k] = abc[1] * a[i * m + k] + abc[2] * aa;
      }
    }
    std::vector<double> next(x.size());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double bx = 0;
        for (int64_t l = 0; l < m; ++l) bx += b[i * m + l] * x[l * n + j];
        next[i * n + j] = abc[0] * x[i * n + j] + bx;
      }
    }
    x = next;
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) (tall ? out[j * cols + i] : out[i * cols + j]) = x[i * n + j];
  }
  return out;
}

TEST_P(NsShapes, AolMatchesItsDefinitionInDouble) {
  const Shape s = GetParam();
  NsConfig cfg;
  cfg.coefficients = ScheduleCoefficients(NsSchedule::kAol);
  cfg.steps = 4;
  cfg.aol = true;
  cfg.dtype = NsDtype::kFP32;
  auto u = RandomNormal(s.rows * s.cols, 8);
  const std::vector<double> want = AolReference(u, s.rows, s.cols, cfg);
  std::vector<float> got = u;
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {got.data(), 1, s.rows, s.cols}).ok());
  EXPECT_LT(MaxRelErr(got, want), 1e-5);
  // Not the Frobenius division: the same rows without the pre-scaling differ
  // (for a vector, one row, the two scalings are one: 1 / |w|).
  NsConfig plain = cfg;
  plain.aol = false;
  if (std::min(s.rows, s.cols) > 1) {
    EXPECT_GT(MaxRelErr(got, ReferenceNs(u, s.rows, s.cols, plain)), 1e-3);
  }
  // bf16: bf16 values, near the double result.
  cfg.dtype = NsDtype::kBF16;
  got = u;
  ASSERT_TRUE(be.Orthogonalize(cfg, {got.data(), 1, s.rows, s.cols}).ok());
  for (float v : got) ASSERT_EQ(FloatBits(v) & 0xffffu, 0u) << "not a bf16 value: " << v;
  EXPECT_LT(MaxRelErr(got, want), 0.1);
}

// AOL's pre-scaling forms W W^T, which is also, scaled on both sides, the
// first iteration's gram: it is reused (as flash-newton-schulz does), so
// AOL's 4 iterations run as many products as 4 plain ones (an extra gram
// product otherwise), in every dtype, on every engine this CPU runs, wide
// and tall.
TEST(CpuBackend, AolRunsNoProductBeyondItsIterations) {
  for (const Shape s : {Shape{40, 96}, Shape{96, 40}, Shape{48, 48}}) {
    for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16, NsDtype::kFP16}) {
      for (bool native : {false, true}) {
        NsConfig aol;
        aol.coefficients = ScheduleCoefficients(NsSchedule::kAol);
        aol.steps = 4;
        aol.aol = true;
        aol.dtype = dtype;
        NsConfig plain = aol;
        plain.aol = false;
        CpuBackend be;
        be.AllowNativeBf16(native);
        const auto u = RandomNormal(s.rows * s.cols, 12);
        int64_t products[2] = {0, 0};
        for (int k = 0; k < 2; ++k) {
          std::vector<float> x = u;
          const int64_t before = be.ProductsRun();
          ASSERT_TRUE(be.Orthogonalize(k == 0 ? plain : aol, {x.data(), 1, s.rows, s.cols}).ok());
          products[k] = be.ProductsRun() - before;
        }
        EXPECT_EQ(products[0], 12) << s.rows << "x" << s.cols;  // 3 products x 4
        EXPECT_EQ(products[1], products[0])
            << s.rows << "x" << s.cols << " dtype " << static_cast<int>(dtype) << " native "
            << native << " (" << be.Bf16EngineName() << ")";
      }
    }
  }
}

TEST_P(NsShapes, Bf16StaysBf16AndNearReference) {
  const Shape s = GetParam();
  NsConfig cfg;  // bf16 by default
  auto u = RandomNormal(s.rows * s.cols, 5);
  auto want = ReferenceNs(u, s.rows, s.cols, cfg);
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, s.rows, s.cols}).ok());
  for (float v : u) ASSERT_EQ(FloatBits(v) & 0xffffu, 0u) << "not a bf16 value: " << v;
  EXPECT_LT(MaxRelErr(u, want), 0.1);  // bf16 keeps 8 bits; five iterations compound
}

// Gram Newton-Schulz computes the standard iteration's polynomial through
// the m x m Gram matrix: in fp32 it lands on the double standard iteration,
// with or without restarts, at every iteration count.
TEST_P(NsShapes, GramFp32MatchesTheStandardIterationInDouble) {
  const Shape s = GetParam();
  for (uint64_t restarts : {uint64_t{0}, uint64_t{1} << 2, (uint64_t{1} << 2) | (uint64_t{1} << 3)}) {
    for (int steps : {5, 4, 1, 0}) {
      NsConfig cfg;
      cfg.dtype = NsDtype::kFP32;
      cfg.algorithm = NsAlgorithm::kGram;
      cfg.gram_restarts = restarts;
      cfg.coefficients = PolarExpressCoefficients();
      cfg.steps = steps;
      auto u = RandomNormal(s.rows * s.cols, 6);
      auto want = ReferenceNs(u, s.rows, s.cols, cfg);
      // The yardstick: the naive fp32 standard iteration. The Gram form's
      // round-off grows along its chain of m x m products (Polar Express's
      // first rows amplify it), which is what restarts cut: restarting at 2
      // and 3 lands as close as the naive iteration; fewer restarts within
      // 30 times it (measured: up to 22x without any, at 24 x 8).
      const double naive = MaxRelErr(ReferenceNewtonSchulzFp32(u, s.rows, s.cols, cfg), want);
      CpuBackend be;
      ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, s.rows, s.cols}).ok());
      const double factor = restarts == ((uint64_t{1} << 2) | (uint64_t{1} << 3)) ? 2 : 30;
      EXPECT_LT(MaxRelErr(u, want), std::max(1e-5, factor * naive))
          << steps << " iterations, restarts " << restarts << ", naive fp32 " << naive;
    }
  }
}

// Reduced precision keeps its dtype's values, standard and Gram alike, and
// stays near the double iteration.
TEST_P(NsShapes, Fp16AndGramKeepTheirDtypesValues) {
  const Shape s = GetParam();
  for (NsDtype dtype : {NsDtype::kFP16, NsDtype::kBF16}) {
    for (NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      NsConfig cfg;
      cfg.dtype = dtype;
      cfg.algorithm = algorithm;
      auto u = RandomNormal(s.rows * s.cols, 7);
      for (float& x : u) x *= 3e4f;  // past fp16's range: normalized in fp32 first
      auto want = ReferenceNs(u, s.rows, s.cols, cfg);
      CpuBackend be;
      ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, s.rows, s.cols}).ok());
      const int type = dtype == NsDtype::kFP16 ? ew::kF16 : ew::kBF16;
      for (float v : u) ASSERT_EQ(v, ew::RoundTo(type, v)) << "not a value of the dtype: " << v;
      EXPECT_LT(MaxRelErr(u, want), dtype == NsDtype::kFP16 ? 0.02 : 0.1)
          << "dtype " << static_cast<int>(dtype) << " algorithm " << static_cast<int>(algorithm);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NsShapes,
                         ::testing::Values(Shape{16, 16}, Shape{8, 24}, Shape{24, 8}, Shape{1, 7},
                                           Shape{7, 1}, Shape{33, 65}));

// Sets an environment variable for a scope (unset when `value` is null).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// Both fp32 engines (OpenBLAS; libmuon's AVX-512 kernel where the CPU has
// AVX-512) on matrices of several output blocks: each within fp32's rounding
// of the double reference, for the fp32 program and the emulated bf16 and
// fp16 ones (fp32 products rounded), and within rounding of each other.
TEST(CpuBackend, BothFp32EnginesMatchTheReference) {
  const bool kernel_runs = (cpu::Features() & cpu::kFeatureAvx512) != 0;
  if (!kernel_runs) {
    std::printf("this CPU (features: %s) has no avx512: OpenBLAS's products only\n",
                cpu::FeatureNames(cpu::Features()).c_str());
  }
  for (const Shape s : {Shape{300, 520}, Shape{520, 300}, Shape{257, 257}}) {
    for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16, NsDtype::kFP16}) {
      NsConfig cfg;
      cfg.dtype = dtype;
      const auto u = RandomNormal(s.rows * s.cols, 11);
      const auto want = ReferenceNs(u, s.rows, s.cols, cfg);
      std::vector<float> results[2];
      for (int e = 0; e < (kernel_runs ? 2 : 1); ++e) {
        const ScopedEnv engine("MUON_CPU_FP32", e == 0 ? "openblas" : "avx512");
        CpuBackend be;
        be.AllowNativeBf16(false);
        results[e] = u;
        const absl::Status st = be.Orthogonalize(cfg, {results[e].data(), 1, s.rows, s.cols});
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_STREQ(be.Fp32EngineName(), e == 0 ? "openblas" : "avx512");
        // fp32: the NsShapes bound; bf16 and fp16 round every product.
        const double bound = dtype == NsDtype::kFP32 ? 1e-5 : dtype == NsDtype::kBF16 ? 0.1 : 0.02;
        EXPECT_LT(MaxRelErr(results[e], want), bound)
            << s.rows << "x" << s.cols << " " << static_cast<int>(dtype) << " on "
            << be.Fp32EngineName();
      }
      if (kernel_runs && dtype == NsDtype::kFP32) {
        double diff = 0.0;
        for (size_t i = 0; i < u.size(); ++i) {
          diff = std::max(diff, std::fabs(static_cast<double>(results[0][i]) - results[1][i]));
        }
        EXPECT_LT(diff, 2e-5) << s.rows << "x" << s.cols << ": the engines part";
      }
    }
  }
}

// MUON_CPU_FP32 naming no engine fails the Newton-Schulz with the setting
// named; a CPU without AVX-512 (the mask) runs OpenBLAS's products.
TEST(CpuBackend, Fp32EngineSettingAndMask) {
  NsConfig cfg;
  cfg.dtype = NsDtype::kFP32;
  auto u = RandomNormal(8 * 24, 3);
  {
    const ScopedEnv bad("MUON_CPU_FP32", "mkl");
    CpuBackend be;
    const absl::Status st = be.Orthogonalize(cfg, {u.data(), 1, 8, 24});
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("MUON_CPU_FP32=\"mkl\""), std::string::npos) << st;
  }
  const ScopedEnv unset("MUON_CPU_FP32", nullptr);
  const cpu::ScopedFeatureMask avx2(cpu::kFeatureAvx2);
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, 8, 24}).ok());
  EXPECT_STREQ(be.Fp32EngineName(), "openblas");
}

TEST(CpuBackend, BatchEqualsOneByOne) {
  NsConfig cfg;
  cfg.dtype = NsDtype::kFP32;
  const int64_t r = 12, c = 20, count = 3;
  auto batch = RandomNormal(count * r * c, 9);
  auto single = batch;
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {batch.data(), count, r, c}).ok());
  for (int64_t k = 0; k < count; ++k) {
    ASSERT_TRUE(be.Orthogonalize(cfg, {single.data() + k * r * c, 1, r, c}).ok());
  }
  EXPECT_EQ(batch, single);
}

TEST(CpuBackend, OutputIsNearlyOrthogonal) {
  // Ten iterations of the quintic push every singular value into roughly
  // [0.68, 1.13]: rows of X X^T have a diagonal near 1.
  NsConfig cfg;
  cfg.dtype = NsDtype::kFP32;
  cfg.steps = 10;
  const int64_t r = 16, c = 64;
  auto u = RandomNormal(r * c, 21);
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, r, c}).ok());
  for (int64_t i = 0; i < r; ++i) {
    double d = 0;
    for (int64_t k = 0; k < c; ++k) d += double(u[i * c + k]) * u[i * c + k];
    EXPECT_GT(d, 0.4);
    EXPECT_LT(d, 1.35);
  }
}

TEST(CpuBackend, ZeroMatrixStaysZero) {
  NsConfig cfg;
  std::vector<float> u(6 * 4, 0.f);
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, 6, 4}).ok());
  for (float v : u) EXPECT_EQ(v, 0.f);
}

TEST(CpuBackend, TableCoefficientsPerIteration) {
  NsConfig cfg;
  cfg.dtype = NsDtype::kFP32;
  cfg.coefficients = {{2.0, -1.5, 0.5}, {1.5, -0.5, 0.0}};
  cfg.steps = 4;
  auto u = RandomNormal(10 * 6, 4);
  auto want = ReferenceNs(u, 10, 6, cfg);
  CpuBackend be;
  ASSERT_TRUE(be.Orthogonalize(cfg, {u.data(), 1, 10, 6}).ok());
  EXPECT_LT(MaxRelErr(u, want), 1e-5);
}

TEST(CpuBackend, MomentumMatchesFormula) {
  const int64_t n = 1000;
  auto g = RandomNormal(n, 1), b0 = RandomNormal(n, 2);
  for (bool nesterov : {false, true}) {
    auto b = b0;
    std::vector<float> out(n);
    CpuBackend be;
    MomentumArgs a;
    a.grad = g.data();
    a.buf = b.data();
    a.n = n;
    a.out = out.data();
    const StepScalars scalars{0.0, 0.0, 0.9};
    MomentumStep step;
    step.scalars = &scalars;
    step.nesterov = nesterov;
    ASSERT_TRUE(be.Momentum(step, {a}).ok());
    for (int64_t i = 0; i < n; ++i) {
      const double nb = b0[i] + 0.1 * (double(g[i]) - b0[i]);
      EXPECT_NEAR(b[i], nb, 1e-6);
      const double o = nesterov ? g[i] + 0.9 * (nb - g[i]) : nb;
      EXPECT_NEAR(out[i], o, 1e-6);
    }
  }
}

TEST(CpuBackend, MomentumInBf16RoundsBuffer) {
  std::vector<uint16_t> g = {FloatToBf16Bits(1.0f), FloatToBf16Bits(-3.0f)};
  std::vector<uint16_t> b = {FloatToBf16Bits(0.5f), FloatToBf16Bits(0.25f)};
  std::vector<float> out(2);
  MomentumArgs a;
  a.grad_dtype = DType::kBF16;
  a.grad = g.data();
  a.buf_dtype = DType::kBF16;
  a.buf = b.data();
  a.n = 2;
  a.out = out.data();
  const StepScalars scalars{0.0, 0.0, 0.95};
  MomentumStep step;
  step.scalars = &scalars;
  CpuBackend be;
  ASSERT_TRUE(be.Momentum(step, {a}).ok());
  for (int i = 0; i < 2; ++i) {
    const float gf = Bf16BitsToFloat(g[i]);
    const float bf = Bf16BitsToFloat(b[i]);
    EXPECT_EQ(FloatBits(bf) & 0xffffu, 0u);
    EXPECT_EQ(FloatBits(out[i]) & 0xffffu, 0u);
    EXPECT_NEAR(out[i], gf + 0.95 * (bf - gf), 0.02);
  }
  EXPECT_NEAR(Bf16BitsToFloat(b[0]), 0.5 + 0.05 * 0.5, 0.005);
}

TEST(CpuBackend, ApplyDecaysThenSteps) {
  std::vector<float> p = {1.0f, -2.0f, 0.5f};
  std::vector<float> u = {0.5f, 0.25f, -1.0f};
  ApplyArgs a;
  a.param = p.data();
  a.n = 3;
  a.update = u.data();
  a.lr_ratio = 2.0;
  const StepScalars scalars{0.1, 0.5, 0.0};  // decay 1 - 0.1 * 0.5, adjusted lr 0.2
  CpuBackend be;
  ASSERT_TRUE(be.Apply({&scalars, nullptr}, {a}).ok());
  EXPECT_FLOAT_EQ(p[0], 1.0f * 0.95f - 0.2f * 0.5f);
  EXPECT_FLOAT_EQ(p[1], -2.0f * 0.95f - 0.2f * 0.25f);
  EXPECT_FLOAT_EQ(p[2], 0.5f * 0.95f + 0.2f);
}

TEST(CpuBackend, ApplyInF16RoundsToHalf) {
  std::vector<uint16_t> p = {FloatToF16Bits(1.0f)};
  std::vector<float> u = {3e-4f};
  ApplyArgs a;
  a.param_dtype = DType::kF16;
  a.param = p.data();
  a.n = 1;
  a.update = u.data();
  const StepScalars scalars{1.0, 0.0, 0.0};
  CpuBackend be;
  ASSERT_TRUE(be.Apply({&scalars, nullptr}, {a}).ok());
  // Half spacing below 1 is 2^-11: 1 - 3e-4 is nearest to 1 - 2^-11.
  EXPECT_EQ(F16BitsToFloat(p[0]), 1.0f - std::ldexp(1.0f, -11));
}

// The workspace comes from the memory source when one is set (the device's
// Allocate: counted, and the host's allocator), grows only, and goes back.
TEST(CpuBackend, WorkspaceComesFromTheMemorySource) {
  std::vector<std::pair<void*, size_t>> live;
  std::vector<std::string> what;
  int64_t allocations = 0;
  {
    CpuBackend be;
    MemorySource source;
    source.allocate = [&](size_t bytes, const std::string& w) -> absl::StatusOr<void*> {
      ++allocations;
      void* p = std::calloc(bytes, 1);
      live.push_back({p, bytes});
      what.push_back(w);
      return p;
    };
    source.free = [&](void* p) {
      for (size_t i = 0; i < live.size(); ++i) {
        if (live[i].first == p) live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      std::free(p);
    };
    be.SetMemorySource(source);
    ASSERT_TRUE(be.Reserve(NsConfig{}, 1, 6, 16).ok());
    // The workspace, and the native bf16 products' own (the AMX kernel's
    // packed operands, or oneDNN's scratchpad) where they are native, else
    // the fp32 kernel's packed operands where it runs.
    const bool fp32_kernel = std::string(be.Fp32EngineName()) == "avx512";
    const size_t blocks = be.NativeBf16() || fp32_kernel ? 2u : 1u;
    ASSERT_EQ(live.size(), blocks);
    EXPECT_EQ(what[0], "the Newton-Schulz workspace");
    EXPECT_EQ(live[0].second, (6 * 16 + 2 * 6 * 6) * sizeof(float));
    if (blocks == 2 && be.NativeBf16()) {
      EXPECT_TRUE(what[1] == "the bf16 product's packed operands" ||
                  what[1] == "the bf16 product scratchpad")
          << what[1];
    } else if (blocks == 2) {
      EXPECT_EQ(what[1], "the fp32 products' packed operands");
    }
    auto u = RandomNormal(6 * 16, 3);
    auto want = ReferenceNs(u, 6, 16, NsConfig{});
    ASSERT_TRUE(be.Orthogonalize(NsConfig{}, {u.data(), 1, 6, 16}).ok());
    EXPECT_EQ(allocations, static_cast<int64_t>(blocks));  // reserved: nothing more
    EXPECT_LT(MaxRelErr(u, want), 0.1);  // bf16, as Bf16StaysBf16AndNearReference
    ASSERT_TRUE(be.Reserve(NsConfig{}, 1, 3, 4).ok());  // smaller: kept
    EXPECT_EQ(allocations, static_cast<int64_t>(blocks));
  }
  EXPECT_TRUE(live.empty());
}

// One call steps several tensors of different dtypes and lr ratios, each as
// a call of its own would, and a nonzero go-ahead flag leaves all untouched.
TEST(CpuBackend, OneCallStepsManyTensors) {
  auto g1 = RandomNormal(37, 5), g2 = RandomNormal(5, 6), b1 = RandomNormal(37, 7);
  std::vector<uint16_t> b2(5, FloatToBf16Bits(0.25f));
  std::vector<float> out1(37), out2(5);
  auto b1_alone = b1;
  auto b2_alone = b2;
  std::vector<float> out1_alone(37), out2_alone(5);
  const StepScalars scalars{0.02, 0.1, 0.9};
  MomentumStep step;
  step.scalars = &scalars;
  int64_t nonfinite = 0;
  step.nonfinite = &nonfinite;
  g2[3] = std::nanf("");
  MomentumArgs m1{DType::kF32, g1.data(), DType::kF32, b1.data(), 37, out1.data()};
  MomentumArgs m2{DType::kF32, g2.data(), DType::kBF16, b2.data(), 5, out2.data()};
  CpuBackend be;
  ASSERT_TRUE(be.Momentum(step, {m1, m2}).ok());
  EXPECT_EQ(nonfinite, 1);
  m1.buf = b1_alone.data();
  m1.out = out1_alone.data();
  m2.buf = b2_alone.data();
  m2.out = out2_alone.data();
  step.nonfinite = nullptr;
  ASSERT_TRUE(be.Momentum(step, {m1}).ok());
  ASSERT_TRUE(be.Momentum(step, {m2}).ok());
  EXPECT_EQ(b1, b1_alone);
  EXPECT_EQ(b2, b2_alone);
  EXPECT_EQ(0, std::memcmp(out1.data(), out1_alone.data(), out1.size() * 4));
  EXPECT_EQ(0, std::memcmp(out2.data(), out2_alone.data(), out2.size() * 4));

  auto p1 = RandomNormal(37, 8);
  std::vector<uint16_t> p2(5, FloatToBf16Bits(1.5f));
  const auto p1_before = p1;
  const auto p2_before = p2;
  const ApplyArgs a1{DType::kF32, p1.data(), 37, out1.data(), 1.0};
  const ApplyArgs a2{DType::kBF16, p2.data(), 5, out1.data(), 3.0};
  const int32_t refused = 1, go = 0;
  ASSERT_TRUE(be.Apply({&scalars, &refused}, {a1, a2}).ok());
  EXPECT_EQ(p1, p1_before);
  EXPECT_EQ(p2, p2_before);
  ASSERT_TRUE(be.Apply({&scalars, &go}, {a1, a2}).ok());
  for (int i = 0; i < 37; ++i) {
    const float decayed = p1_before[i] * static_cast<float>(1.0 - 0.02 * 0.1);
    EXPECT_EQ(p1[i], decayed + static_cast<float>(-0.02) * out1[i]) << i;
  }
  for (int i = 0; i < 5; ++i) {
    const float decayed = RoundToBf16(1.5f * static_cast<float>(1.0 - 0.02 * 0.1));
    EXPECT_EQ(p2[i], FloatToBf16Bits(decayed + static_cast<float>(-0.02 * 3.0) * out1[i])) << i;
  }
}

}  // namespace
}  // namespace muon
