// The native bf16 products (every engine this CPU runs: the AMX kernel, the
// AVX512-BF16 kernel, oneDNN) against the product each NsGemm describes,
// computed here in double from its column-major definition; whole
// Newton-Schulz runs on each engine against the double reference and the
// emulated path; and the backend's choice of engine on every CPU kind this
// host can pose as (cpu_features.h's mask). A skip names what the CPU lacks.
#include "muon/math/cpu/native_bf16.h"

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/testing/random_matrix.h"
#include "muon/math/testing/reference_ns.h"

namespace muon {
namespace {

using ew::Bf16BitsToFloat;
using ew::FloatToBf16Bits;

struct Shape {
  int64_t rows, cols;
};

using Engine = NativeBf16Gemm::Engine;

// Every native engine this CPU runs (libmuon's kernels first).
std::vector<Engine> Engines(bool with_onednn = true) {
  std::vector<Engine> engines;
  for (Engine e : {Engine::kAmx, Engine::kAvx512Bf16, Engine::kOneDnn}) {
    if (e == Engine::kOneDnn && !with_onednn) continue;
    if (NativeBf16Gemm::Create({}, e) != nullptr) engines.push_back(e);
  }
  return engines;
}

#define MUON_REQUIRE_NATIVE()                                                        \
  if (Engines().empty())                                                             \
  GTEST_SKIP() << "this CPU (features: " << cpu::FeatureNames(cpu::Features())      \
               << ") has no avx512_bf16: no native bf16 products"

// Sets an environment variable for the scope (unset when `value` is null).
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
  bool had_;
  std::string old_;
};

class NativeProducts : public ::testing::TestWithParam<Shape> {};

// D = alpha op(A) op(B) + beta C from the description, in double.
std::vector<double> Expected(const NsGemm& g, float alpha, float beta,
                             const std::vector<std::vector<uint16_t>>& bufs) {
  auto at = [&](const NsOperand& o, bool trans, int64_t i, int64_t j) {
    const auto& v = bufs[static_cast<int>(o.buffer)];
    return static_cast<double>(Bf16BitsToFloat(trans ? v[i * o.ld + j] : v[j * o.ld + i]));
  };
  std::vector<double> d(bufs[static_cast<int>(g.d.buffer)].size());
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double acc = 0.0;
      for (int64_t p = 0; p < g.k; ++p) acc += at(g.a, g.trans_a, i, p) * at(g.b, g.trans_b, p, j);
      const double c = beta == 0.0f ? 0.0 : at(g.c, false, i, j);
      d[j * g.d.ld + i] = alpha * acc + beta * c;
    }
  }
  return d;
}

// Small integers and power-of-two scalars: every sum is exact in fp32, so the
// product rounded once to bf16 has one right answer.
TEST_P(NativeProducts, EveryProductOfTheProgramIsExact) {
  MUON_REQUIRE_NATIVE();
  const Shape s = GetParam();
  const NsProgram program = PlanNewtonSchulz(1, s.rows, s.cols);
  for (Engine engine : Engines()) {
  auto gemm = NativeBf16Gemm::Create({}, engine);
  ASSERT_NE(gemm, nullptr);
  SCOPED_TRACE(gemm->EngineName());
  std::mt19937 rng(static_cast<uint32_t>(s.rows * 100 + s.cols));
  std::uniform_int_distribution<int> small(-4, 4);
  const float scalars[][2] = {{1.0f, 0.0f}, {0.25f, -0.5f}, {-2.0f, 2.0f}};
  for (const NsGemm* gp :
       {&program.iteration[0], &program.iteration[1], &program.iteration[2], &program.cubic_update}) {
    const NsGemm& g = *gp;
    for (const auto& ab : scalars) {
      std::vector<std::vector<uint16_t>> bufs = {
          std::vector<uint16_t>(program.x_elems), std::vector<uint16_t>(program.x_elems),
          std::vector<uint16_t>(program.gram_elems), std::vector<uint16_t>(program.gram_elems)};
      for (auto& b : bufs) {
        for (auto& v : b) v = FloatToBf16Bits(static_cast<float>(small(rng)));
      }
      // Gram and poly are symmetric, as in every iteration.
      for (int b = 2; b < 4; ++b) {
        for (int64_t j = 0; j < program.m; ++j) {
          for (int64_t i = 0; i < j; ++i) bufs[b][i * program.m + j] = bufs[b][j * program.m + i];
        }
      }
      const std::vector<std::vector<uint16_t>> before = bufs;
      const std::vector<double> want = Expected(g, ab[0], ab[1], bufs);
      uint16_t* ptrs[4] = {bufs[0].data(), bufs[1].data(), bufs[2].data(), bufs[3].data()};
      ASSERT_TRUE(gemm->Run(g, ab[0], ab[1], ptrs).ok());
      for (int b = 0; b < 4; ++b) {
        if (b == static_cast<int>(g.d.buffer)) continue;
        EXPECT_EQ(bufs[b], before[b]) << g.name << ": buffer " << b << " changed";
      }
      const auto& d = bufs[static_cast<int>(g.d.buffer)];
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
          const int64_t at = j * g.d.ld + i;
          ASSERT_EQ(d[at], FloatToBf16Bits(static_cast<float>(want[at])))
              << g.name << " alpha " << ab[0] << " beta " << ab[1] << " at (" << i << ", " << j
              << "): " << Bf16BitsToFloat(d[at]) << " vs " << want[at];
        }
      }
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NativeProducts,
                         ::testing::Values(Shape{5, 3}, Shape{3, 5}, Shape{4, 4}, Shape{17, 40},
                                           Shape{40, 17}, Shape{1, 9}, Shape{64, 64}));

// Symmetric products wide enough to run as blocks (the blocks on and above
// the diagonal multiplied, the others mirrored): two uneven blocks (800:
// 416 + 384), three (1100), and the tall program, whose gram runs whole and
// whose poly runs as blocks. Exact as above.
TEST(NativeBf16, BlockedSymmetricProductsAreExact) {
  MUON_REQUIRE_NATIVE();
  const Shape shapes[] = {{800, 1000}, {1100, 1100}, {1000, 800}};
  for (const Shape& s : shapes) {
    const NsProgram program = PlanNewtonSchulz(1, s.rows, s.cols);
    std::mt19937 rng(static_cast<uint32_t>(s.rows + s.cols));
    std::uniform_int_distribution<int> small(-4, 4);
    std::vector<std::vector<uint16_t>> bufs = {
        std::vector<uint16_t>(program.x_elems), std::vector<uint16_t>(program.x_elems),
        std::vector<uint16_t>(program.gram_elems), std::vector<uint16_t>(program.gram_elems)};
    for (auto& b : bufs) {
      for (auto& v : b) v = FloatToBf16Bits(static_cast<float>(small(rng)));
    }
    for (int64_t j = 0; j < program.m; ++j) {  // gram symmetric
      for (int64_t i = 0; i < j; ++i) bufs[2][i * program.m + j] = bufs[2][j * program.m + i];
    }
    for (int which = 0; which < 2; ++which) {  // gram, then poly
      const NsGemm& g = program.iteration[static_cast<size_t>(which)];
      ASSERT_TRUE(g.symmetric) << g.name;
      const float alpha = which == 0 ? 1.0f : -2.0f, beta = which == 0 ? 0.0f : 2.0f;
      if (which == 1) {  // poly reads C: make D's stale contents differ from it
        std::fill(bufs[3].begin(), bufs[3].end(), FloatToBf16Bits(7.0f));
      }
      const std::vector<double> want = Expected(g, alpha, beta, bufs);
      std::vector<uint16_t> exact(want.size());
      for (size_t at = 0; at < want.size(); ++at) {
        exact[at] = FloatToBf16Bits(static_cast<float>(want[at]));
      }
      for (Engine engine : Engines()) {  // each from the same inputs
        auto gemm = NativeBf16Gemm::Create({}, engine);
        ASSERT_NE(gemm, nullptr);
        std::vector<std::vector<uint16_t>> mine = bufs;
        uint16_t* ptrs[4] = {mine[0].data(), mine[1].data(), mine[2].data(), mine[3].data()};
        ASSERT_TRUE(gemm->Prepare(g, alpha, beta).ok());
        ASSERT_TRUE(gemm->Run(g, alpha, beta, ptrs).ok());
        const auto& d = mine[static_cast<int>(g.d.buffer)];
        for (int64_t j = 0; j < g.n; ++j) {
          for (int64_t i = 0; i < g.m; ++i) {
            const int64_t at = j * g.d.ld + i;
            ASSERT_EQ(d[at], exact[static_cast<size_t>(at)])
                << gemm->EngineName() << " " << s.rows << "x" << s.cols << " " << g.name
                << " at (" << i << ", " << j << "): " << Bf16BitsToFloat(d[at]) << " vs "
                << want[at];
          }
        }
      }
      // The next product reads this one's result.
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
          const int64_t at = j * g.d.ld + i;
          bufs[static_cast<int>(g.d.buffer)][at] = exact[static_cast<size_t>(at)];
        }
      }
    }
  }
}

// The configs every engine runs: torch's quintic, and the cubic5 schedule
// (c == 0: two products an iteration).
std::vector<NsConfig> Schedules() {
  NsConfig cubic;
  cubic.coefficients = ScheduleCoefficients(NsSchedule::kCubic5);
  return {NsConfig(), cubic};
}

// bf16 Newton-Schulz of u on `engine`, asked for through MUON_CPU_BF16.
std::vector<float> Orthogonalize(Engine engine, std::vector<float> u, int64_t rows, int64_t cols,
                                 const NsConfig& cfg = NsConfig()) {
  ScopedEnv setting("MUON_CPU_BF16", cpu::Bf16EngineName(engine));
  CpuBackend backend;
  EXPECT_STREQ(backend.Bf16EngineName(), cpu::Bf16EngineName(engine));
  MatrixBatch batch{u.data(), 1, rows, cols};
  EXPECT_TRUE(backend.Orthogonalize(cfg, batch).ok());
  return u;
}

TEST(NativeBf16, NewtonSchulzMatchesReferenceAndEmulation) {
  MUON_REQUIRE_NATIVE();
  const Shape shapes[] = {{96, 160}, {160, 96}, {128, 128}, {7, 300},
                          {300, 7}, {33, 65}, {520, 600}, {600, 520}};
  for (const NsConfig& cfg : Schedules()) {
  SCOPED_TRACE(cfg.coefficients[0][2] == 0.0 ? "cubic5" : "torch's quintic");
  for (const Shape& s : shapes) {
    const std::vector<float> u = RandomNormal(s.rows * s.cols, 7);
    const std::vector<float> emulated = Orthogonalize(Engine::kEmulated, u, s.rows, s.cols, cfg);
    const std::vector<double> want =
        ReferenceNewtonSchulz(std::vector<double>(u.begin(), u.end()), s.rows, s.cols, cfg);
    for (Engine engine : Engines()) {
      SCOPED_TRACE(cpu::Bf16EngineName(engine));
      const std::vector<float> native = Orthogonalize(engine, u, s.rows, s.cols, cfg);
      double max_abs = 0, err_native = 0, diff = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        ASSERT_EQ(ew::Bits(native[i]) & 0xffffu, 0u) << "not a bf16 value: " << native[i];
        max_abs = std::max(max_abs, std::fabs(want[i]));
        err_native = std::max(err_native, std::fabs(native[i] - want[i]));
        diff = std::max(diff, static_cast<double>(std::fabs(native[i] - emulated[i])));
      }
      EXPECT_LT(err_native / max_abs, 0.1) << s.rows << "x" << s.cols;
      // Only the order of fp32 sums differs: a few bf16 steps apart at most.
      EXPECT_LT(diff / max_abs, 0.05) << s.rows << "x" << s.cols;
    }
  }
  }
}

// Where the backend takes bf16 matrices (SlotDtype: libmuon's kernels), a bf16
// batch gives bit for bit the fp32 batch's result: odd and even iteration
// counts (the result lands in the matrix's own memory either way), cubic5
// and AOL, wide and tall, several matrices in one batch.
TEST(NativeBf16, Bf16BatchesEqualFp32Batches) {
  if (Engines(false).empty()) {
    GTEST_SKIP() << "this CPU (features: " << cpu::FeatureNames(cpu::Features())
                 << ") has no avx512_bf16: its backend takes fp32 only";
  }
  for (Engine engine : Engines(false)) {
  SCOPED_TRACE(cpu::Bf16EngineName(engine));
  ScopedEnv setting("MUON_CPU_BF16", cpu::Bf16EngineName(engine));
  CpuBackend probe;
  ASSERT_EQ(probe.SlotDtype(NsConfig()), DType::kBF16);
  NsConfig fp32_config;
  fp32_config.dtype = NsDtype::kFP32;
  EXPECT_EQ(probe.SlotDtype(fp32_config), DType::kF32);
  const Shape shapes[] = {{96, 160}, {160, 96}, {33, 65}, {300, 7}};
  for (const Shape& s : shapes) {
    // -5: the cubic5 schedule; -4: AOL's (its first gram from the pre-scaling)
    for (int steps : {5, 4, 1, 0, -5, -4}) {
      NsConfig cfg;
      cfg.steps = steps < 0 ? -steps : steps;
      if (steps == -5) cfg.coefficients = ScheduleCoefficients(NsSchedule::kCubic5);
      if (steps == -4) {
        cfg.coefficients = ScheduleCoefficients(NsSchedule::kAol);
        cfg.aol = true;
      }
      std::vector<float> u = RandomNormal(2 * s.rows * s.cols, 13);
      std::vector<uint16_t> bits(u.size());
      for (size_t i = 0; i < u.size(); ++i) bits[i] = FloatToBf16Bits(u[i]);
      CpuBackend a, b;
      ASSERT_TRUE(a.Orthogonalize(cfg, {u.data(), 2, s.rows, s.cols}).ok());
      ASSERT_TRUE(b.Orthogonalize(cfg, {bits.data(), 2, s.rows, s.cols, DType::kBF16}).ok());
      for (size_t i = 0; i < u.size(); ++i) {
        ASSERT_EQ(ew::Bits(u[i]), ew::Bits(Bf16BitsToFloat(bits[i])))
            << s.rows << "x" << s.cols << ", " << steps << " iterations, at " << i;
      }
    }
  }
  }
  // A backend that takes fp32 only refuses bf16.
  CpuBackend emulated;
  emulated.AllowNativeBf16(false);
  std::vector<uint16_t> bits(16 * 16);
  EXPECT_FALSE(emulated.Orthogonalize(NsConfig(), {bits.data(), 1, 16, 16, DType::kBF16}).ok());
}

// In-process ranks run with fewer threads each than one process: the result
// must not depend on the thread count (bit for bit).
TEST(NativeBf16, ResultDoesNotDependOnThreads) {
  if (Engines(false).empty()) {
    GTEST_SKIP() << "this CPU (features: " << cpu::FeatureNames(cpu::Features())
                 << ") has no avx512_bf16: no native bf16 kernel of libmuon's";
  }
  for (Engine engine : Engines(false)) {  // oneDNN's results may depend on them
  SCOPED_TRACE(cpu::Bf16EngineName(engine));
  for (const Shape& s : {Shape{256, 1024}, Shape{800, 1024}}) {  // whole; in blocks
    const std::vector<float> u = RandomNormal(s.rows * s.cols, 11);
    ::setenv("MUON_CPU_THREADS", "1", 1);
    const std::vector<float> one = Orthogonalize(engine, u, s.rows, s.cols);
    ::setenv("MUON_CPU_THREADS", "3", 1);
    const std::vector<float> three = Orthogonalize(engine, u, s.rows, s.cols);
    EXPECT_EQ(omp_get_max_threads(), 3);  // the setting took
    ::unsetenv("MUON_CPU_THREADS");
    EXPECT_EQ(one, three) << s.rows << "x" << s.cols;
  }
  }
}

// The backend runs the engine cpu_features.h chooses, for every CPU kind
// this host can pose as: AMX, AVX512-BF16 without AMX, AVX-512 or AVX2 alone
// (emulated), nothing (emulated); and a bf16 Newton-Schulz on each gives a
// result within the reference's bound.
TEST(NativeBf16, BackendRunsTheChosenEngineOnEveryCpuKind) {
  using namespace cpu;  // NOLINT
  const uint32_t kinds[] = {kAllFeatures, kFeatureAvx2 | kFeatureAvx512 | kFeatureAvx512Bf16,
                            kFeatureAvx2 | kFeatureAvx512, kFeatureAvx2, 0};
  const std::vector<float> u = RandomNormal(160 * 96, 3);
  NsConfig cfg;
  const std::vector<double> want =
      ReferenceNewtonSchulz(std::vector<double>(u.begin(), u.end()), 160, 96, cfg);
  for (uint32_t kind : kinds) {
    ScopedFeatureMask mask(kind);
    const absl::StatusOr<Bf16Engine> chosen = ChooseBf16EngineHere();
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    CpuBackend backend;
    SCOPED_TRACE(FeatureNames(Features()));
    EXPECT_STREQ(backend.Bf16EngineName(), Bf16EngineName(*chosen));
    EXPECT_EQ(backend.NativeBf16(), *chosen != Bf16Engine::kEmulated);
    EXPECT_EQ(backend.SlotDtype(cfg), *chosen == Bf16Engine::kEmulated ? DType::kF32 : DType::kBF16);
    std::vector<float> x = u;
    ASSERT_TRUE(backend.Orthogonalize(cfg, {x.data(), 1, 160, 96}).ok());
    double max_abs = 0, err = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(want[i]));
      err = std::max(err, std::fabs(x[i] - want[i]));
    }
    EXPECT_LT(err / max_abs, 0.1);
  }
}

// A setting that asks for an engine this CPU cannot run fails the first bf16
// Newton-Schulz with a message that names the fix (never a silent fallback)
// and again until it is fixed; fp32 Newton-Schulz is unaffected.
TEST(NativeBf16, UnrunnableSettingFailsClearly) {
  cpu::ScopedFeatureMask avx2(cpu::kFeatureAvx2);
  ScopedEnv setting("MUON_CPU_BF16", "amx");
  CpuBackend backend;
  EXPECT_FALSE(backend.NativeBf16());
  std::vector<float> x = RandomNormal(32 * 48, 5);
  const absl::Status st = backend.Orthogonalize(NsConfig(), {x.data(), 1, 32, 48});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("MUON_CPU_BF16=amx"), std::string::npos) << st;
  EXPECT_NE(st.message().find("unset MUON_CPU_BF16"), std::string::npos) << st;
  NsConfig fp32;
  fp32.dtype = NsDtype::kFP32;
  EXPECT_TRUE(backend.Orthogonalize(fp32, {x.data(), 1, 32, 48}).ok());
  {  // Fixed, the same backend goes on.
    ScopedEnv fixed("MUON_CPU_BF16", "emulated");
    EXPECT_TRUE(backend.Orthogonalize(NsConfig(), {x.data(), 1, 32, 48}).ok());
    EXPECT_STREQ(backend.Bf16EngineName(), "emulated");
  }
  ScopedEnv bad_isa("MUON_CPU_ISA", "avx-512");
  ScopedEnv no_engine("MUON_CPU_BF16", nullptr);
  CpuBackend other;
  const absl::Status isa = other.Orthogonalize(NsConfig(), {x.data(), 1, 32, 48});
  ASSERT_FALSE(isa.ok());
  EXPECT_NE(isa.message().find("MUON_CPU_ISA=\"avx-512\""), std::string::npos) << isa;
}

// oneDNN only on request, and the older settings still hold.
TEST(NativeBf16, OneDnnOnRequestAndOlderSettings) {
  MUON_REQUIRE_NATIVE();
  {
    CpuBackend backend;
    EXPECT_STRNE(backend.Bf16EngineName(), "onednn");
  }
  if (NativeBf16Gemm::Create({}, Engine::kOneDnn) != nullptr) {
    ScopedEnv amx("MUON_CPU_AMX", "0");
    CpuBackend backend;
    EXPECT_STREQ(backend.Bf16EngineName(), "onednn");
  }
  ScopedEnv off("MUON_CPU_NATIVE_BF16", "0");
  CpuBackend backend;
  EXPECT_FALSE(backend.NativeBf16());
  EXPECT_STREQ(backend.Bf16EngineName(), "emulated");
}

}  // namespace
}  // namespace muon
