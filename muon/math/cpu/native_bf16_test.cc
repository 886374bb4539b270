// The native bf16 products (both engines: the AMX kernel, oneDNN) against the product each NsGemm describes,
// computed here in double from its column-major definition; and whole
// Newton-Schulz runs against the double reference and the emulated path.
#include "muon/math/cpu/native_bf16.h"

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/testing/reference_ns.h"

namespace muon {
namespace {

using ew::Bf16BitsToFloat;
using ew::FloatToBf16Bits;

#define MUON_REQUIRE_NATIVE()                                                   \
  if (!NativeBf16Gemm::Available()) GTEST_SKIP() << "this CPU has no native bf16 products"

struct Shape {
  int64_t rows, cols;
};

using Engine = NativeBf16Gemm::Engine;

// Every engine this CPU runs.
std::vector<Engine> Engines() {
  std::vector<Engine> engines;
  for (Engine e : {Engine::kAmx, Engine::kOneDnn}) {
    if (NativeBf16Gemm::Create({}, e) != nullptr) engines.push_back(e);
  }
  return engines;
}

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
  for (const NsGemm& g : program.iteration) {
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
  for (Engine engine : Engines()) {
  auto gemm = NativeBf16Gemm::Create({}, engine);
  ASSERT_NE(gemm, nullptr);
  SCOPED_TRACE(gemm->EngineName());
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
      uint16_t* ptrs[4] = {bufs[0].data(), bufs[1].data(), bufs[2].data(), bufs[3].data()};
      ASSERT_TRUE(gemm->Prepare(g, alpha, beta).ok());
      ASSERT_TRUE(gemm->Run(g, alpha, beta, ptrs).ok());
      const auto& d = bufs[static_cast<int>(g.d.buffer)];
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
          const int64_t at = j * g.d.ld + i;
          ASSERT_EQ(d[at], FloatToBf16Bits(static_cast<float>(want[at])))
              << s.rows << "x" << s.cols << " " << g.name << " at (" << i << ", " << j
              << "): " << Bf16BitsToFloat(d[at]) << " vs " << want[at];
        }
      }
    }
  }
  }
}

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> Orthogonalize(bool native, std::vector<float> u, int64_t rows, int64_t cols) {
  CpuBackend backend;
  backend.AllowNativeBf16(native);
  EXPECT_EQ(backend.NativeBf16(), native);
  NsConfig cfg;  // bf16
  MatrixBatch batch{u.data(), 1, rows, cols};
  EXPECT_TRUE(backend.Orthogonalize(cfg, batch).ok());
  return u;
}

TEST(NativeBf16, NewtonSchulzMatchesReferenceAndEmulation) {
  MUON_REQUIRE_NATIVE();
  const Shape shapes[] = {{96, 160}, {160, 96}, {128, 128}, {7, 300},
                          {300, 7}, {33, 65}, {800, 900}, {900, 800}};
  for (const Shape& s : shapes) {
    const std::vector<float> u = Random(s.rows * s.cols, 7);
    const std::vector<float> native = Orthogonalize(true, u, s.rows, s.cols);
    const std::vector<float> emulated = Orthogonalize(false, u, s.rows, s.cols);
    NsConfig cfg;
    const std::vector<double> want =
        ReferenceNewtonSchulz(std::vector<double>(u.begin(), u.end()), s.rows, s.cols, cfg);
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

// Where the backend takes bf16 matrices (SlotDtype: the AMX kernel), a bf16
// batch gives bit for bit the fp32 batch's result: odd and even iteration
// counts (the result lands in the matrix's own memory either way), wide and
// tall, several matrices in one batch.
TEST(NativeBf16, Bf16BatchesEqualFp32Batches) {
  MUON_REQUIRE_NATIVE();
  CpuBackend probe;
  if (probe.SlotDtype(NsConfig()) != DType::kBF16) GTEST_SKIP() << "this backend takes fp32 only";
  NsConfig fp32_config;
  fp32_config.dtype = NsDtype::kFP32;
  EXPECT_EQ(probe.SlotDtype(fp32_config), DType::kF32);
  const Shape shapes[] = {{96, 160}, {160, 96}, {33, 65}, {300, 7}};
  for (const Shape& s : shapes) {
    for (int steps : {5, 4, 1, 0}) {
      NsConfig cfg;
      cfg.steps = steps;
      std::vector<float> u = Random(2 * s.rows * s.cols, 13);
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
  // A backend that takes fp32 only refuses bf16.
  CpuBackend emulated;
  emulated.AllowNativeBf16(false);
  std::vector<uint16_t> bits(16 * 16);
  EXPECT_FALSE(emulated.Orthogonalize(NsConfig(), {bits.data(), 1, 16, 16, DType::kBF16}).ok());
}

// In-process ranks run with fewer threads each than one process: the result
// must not depend on the thread count (bit for bit).
TEST(NativeBf16, ResultDoesNotDependOnThreads) {
  MUON_REQUIRE_NATIVE();
  for (const Shape& s : {Shape{256, 1024}, Shape{800, 1024}}) {  // whole; in blocks
    const std::vector<float> u = Random(s.rows * s.cols, 11);
    ::setenv("MUON_CPU_THREADS", "1", 1);
    const std::vector<float> one = Orthogonalize(true, u, s.rows, s.cols);
    ::setenv("MUON_CPU_THREADS", "3", 1);
    const std::vector<float> three = Orthogonalize(true, u, s.rows, s.cols);
    EXPECT_EQ(omp_get_max_threads(), 3);  // the setting took
    ::unsetenv("MUON_CPU_THREADS");
    EXPECT_EQ(one, three) << s.rows << "x" << s.cols;
  }
}

// The AMX kernel wherever the CPU has it, none (the emulated path) where it
// does not, unless MUON_CPU_AMX=0 asks for oneDNN.
TEST(NativeBf16, EngineChoice) {
  MUON_REQUIRE_NATIVE();
  const bool amx = NativeBf16Gemm::Create({}, Engine::kAmx) != nullptr;
  if (amx) {
    EXPECT_STREQ(NativeBf16Gemm::Create()->EngineName(), "amx");
  } else {
    EXPECT_EQ(NativeBf16Gemm::Create(), nullptr);
  }
  EXPECT_STREQ(NativeBf16Gemm::Create({}, Engine::kOneDnn)->EngineName(), "onednn");
  ::setenv("MUON_CPU_AMX", "0", 1);
  EXPECT_STREQ(NativeBf16Gemm::Create()->EngineName(), "onednn");
  ::unsetenv("MUON_CPU_AMX");
}

TEST(NativeBf16, EnvironmentTurnsItOff) {
  ::setenv("MUON_CPU_NATIVE_BF16", "0", 1);
  EXPECT_FALSE(NativeBf16Gemm::Available());
  EXPECT_EQ(NativeBf16Gemm::Create(), nullptr);
  CpuBackend backend;
  EXPECT_FALSE(backend.NativeBf16());
  ::unsetenv("MUON_CPU_NATIVE_BF16");
}

}  // namespace
}  // namespace muon
