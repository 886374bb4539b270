// Both kernels (AMX, AVX512-BF16) against products computed here in double
// from the definition, on small integers (every fp32 sum exact, so the bf16
// result has one right answer): every orientation of both operands, uneven
// edges, k not a multiple of 32, symmetric products across several blocks,
// results that do not depend on the threads, and nothing written outside the
// output. Each kernel runs wherever the CPU can run it; a skip names what the
// CPU lacks.
#include "muon/math/cpu/bf16_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"
#include "muon/math/cpu/cpu_features.h"

namespace muon {
namespace cpu {
namespace {

using ew::Bf16BitsToFloat;
using ew::FloatToBf16Bits;

Bf16Engine EngineOf(Bf16Kernel k) {
  return k == Bf16Kernel::kAmx ? Bf16Engine::kAmx : Bf16Engine::kAvx512Bf16;
}

#define MUON_REQUIRE_KERNEL(k)                                                            \
  if (!Bf16KernelRuns(k))                                                                 \
  GTEST_SKIP() << "this CPU (features: " << FeatureNames(Features()) << ") has no "       \
               << FeatureNames(FeaturesFor(EngineOf(k)) & ~Features()) << " for the "    \
               << Bf16EngineName(EngineOf(k)) << " kernel"

constexpr uint16_t kUntouched = 0x7fc1;  // a NaN pattern the kernel never writes
constexpr int64_t kPad = 5;             // columns past the output, each row

struct Case {
  int64_t rows, cols, k;
  bool left_transposed, right_transposed, symmetric;
  float alpha, beta;
  bool in_place = false;  // c is out itself (holding c's values)
};

std::string Name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + "x" + std::to_string(c.k) +
         (c.left_transposed ? " L^T" : " L") + (c.right_transposed ? " R^T" : " R") +
         (c.symmetric ? " symmetric" : "") + (c.in_place ? " in place" : "") + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta);
}

// Runs the case on `kernel` with `threads` and returns the output (rows x
// (cols + kPad)), after checking it against the double product (unless
// `check` is false: the caller compares it with a checked run).
std::vector<uint16_t> RunAndCheck(Bf16Kernel kernel, const Case& c, int threads,
                                  bool check = true) {
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 131 + c.cols * 17 + c.k));
  std::uniform_int_distribution<int> small(-4, 4);
  auto bf = [&] { return FloatToBf16Bits(static_cast<float>(small(rng))); };
  const int64_t ld_left = c.left_transposed ? c.rows + 3 : c.k + 2;
  const int64_t ld_right = c.right_transposed ? c.k + 1 : c.cols + 6;
  const int64_t ld = c.cols + kPad;
  std::vector<uint16_t> left((c.left_transposed ? c.k : c.rows) * ld_left);
  std::vector<uint16_t> right((c.right_transposed ? c.cols : c.k) * ld_right);
  std::vector<uint16_t> cin(c.rows * ld), out(c.rows * ld, kUntouched);
  for (auto& v : left) v = bf();
  for (auto& v : right) v = bf();
  for (auto& v : cin) v = bf();
  auto l_at = [&](int64_t i, int64_t p) -> uint16_t& {
    return c.left_transposed ? left[p * ld_left + i] : left[i * ld_left + p];
  };
  auto r_at = [&](int64_t p, int64_t j) -> uint16_t& {
    return c.right_transposed ? right[j * ld_right + p] : right[p * ld_right + j];
  };
  if (c.symmetric) {  // right = left^T and c symmetric
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t p = 0; p < c.k; ++p) r_at(p, i) = l_at(i, p);
      for (int64_t j = 0; j < i; ++j) cin[i * ld + j] = cin[j * ld + i];
    }
  }
  if (c.in_place) {
    for (int64_t i = 0; i < c.rows; ++i) {
      std::copy(cin.begin() + i * ld, cin.begin() + i * ld + c.cols, out.begin() + i * ld);
    }
  }
  Bf16Product p;
  p.rows = c.rows;
  p.cols = c.cols;
  p.k = c.k;
  p.left = {left.data(), ld_left, c.left_transposed};
  p.right = {right.data(), ld_right, c.right_transposed};
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.c = c.in_place ? out.data() : cin.data();
  p.ld_c = ld;
  p.out = out.data();
  p.ld_out = ld;
  p.symmetric = c.symmetric;
  const size_t bytes = Bf16WorkspaceBytes(p, threads);
  void* workspace = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  Bf16Multiply(kernel, p, workspace, threads);
  std::free(workspace);
  if (!check) return out;
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.cols; ++j) {
      double sum = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        sum += static_cast<double>(Bf16BitsToFloat(l_at(i, q))) * Bf16BitsToFloat(r_at(q, j));
      }
      // beta 0 reads nothing (BLAS): alpha * 0 may be -0.
      const double want = c.beta == 0.0f ? c.alpha * sum
                                          : c.alpha * sum + c.beta * Bf16BitsToFloat(cin[i * ld + j]);
      EXPECT_EQ(out[i * ld + j], FloatToBf16Bits(static_cast<float>(want)))
          << Name(c) << " at (" << i << ", " << j << ")";
      if (::testing::Test::HasFailure()) return out;
    }
    for (int64_t j = c.cols; j < ld; ++j) {
      EXPECT_EQ(out[i * ld + j], kUntouched) << Name(c) << ": wrote past the output at " << i;
    }
  }
  return out;
}

class Kernels : public ::testing::TestWithParam<Bf16Kernel> {};

TEST_P(Kernels, EveryOrientationAndEdge) {
  const Bf16Kernel kernel = GetParam();
  MUON_REQUIRE_KERNEL(kernel);
  const int64_t shapes[][3] = {{1, 1, 1},    {16, 16, 16},  {32, 32, 32},  {33, 47, 65},
                               {100, 37, 300}, {300, 300, 70}, {257, 513, 129}, {7, 600, 31}};
  for (const auto& s : shapes) {
    for (int lt = 0; lt < 2; ++lt) {
      for (int rt = 0; rt < 2; ++rt) {
        const Case c{s[0], s[1], s[2], lt == 1, rt == 1, false, lt ? 0.25f : 1.0f,
                     rt ? -0.5f : 0.0f};
        RunAndCheck(kernel, c, 1 + (lt ^ rt));
        if (HasFailure()) return;
        if (c.beta != 0.0f) {
          Case in_place = c;
          in_place.in_place = true;
          RunAndCheck(kernel, in_place, 2);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// Symmetric: blocks on and above the diagonal (up to 3 x 3 blocks of 256),
// mirrored below; with C apart from out and with C in out itself.
TEST_P(Kernels, SymmetricProductsAcrossBlocks) {
  const Bf16Kernel kernel = GetParam();
  MUON_REQUIRE_KERNEL(kernel);
  for (int64_t n : {1, 16, 33, 300, 600}) {
    for (int lt = 0; lt < 2; ++lt) {
      for (int rt = 0; rt < 2; ++rt) {
        RunAndCheck(kernel, Case{n, n, n / 2 + 7, lt == 1, rt == 1, true, -2.0f, lt ? 2.0f : 0.0f}, 2);
        if (HasFailure()) return;
        // C read in place: out starts as C and ends as the product.
        RunAndCheck(kernel, Case{n, n, n / 2 + 7, lt == 1, rt == 1, true, -2.0f, 2.0f, true}, 2);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(Kernels, ResultDoesNotDependOnThreads) {
  const Bf16Kernel kernel = GetParam();
  MUON_REQUIRE_KERNEL(kernel);
  for (bool symmetric : {false, true}) {
    const Case c{520, 520, 700, false, true, symmetric, 0.5f, 0.25f};
    const std::vector<uint16_t> one = RunAndCheck(kernel, c, 1);
    EXPECT_EQ(one, RunAndCheck(kernel, c, 2, /*check=*/false));
    EXPECT_EQ(one, RunAndCheck(kernel, c, 3, /*check=*/false));
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16, Kernels,
                         ::testing::Values(Bf16Kernel::kAmx, Bf16Kernel::kAvx512Bf16),
                         [](const ::testing::TestParamInfo<Bf16Kernel>& info) {
                           return std::string(info.param == Bf16Kernel::kAmx ? "Amx"
                                                                             : "Avx512Bf16");
                         });

// A CPU of the other kind, through the mask: capped at AVX512-BF16 the AMX
// kernel does not run and the AVX512-BF16 one still does; capped at AVX-512
// neither does.
TEST(Bf16Kernels, FollowTheFeatureMask) {
  const uint32_t detected = Features();
  {
    ScopedFeatureMask no_amx(kFeatureAvx2 | kFeatureAvx512 | kFeatureAvx512Bf16);
    EXPECT_FALSE(Bf16KernelRuns(Bf16Kernel::kAmx));
    EXPECT_EQ(Bf16KernelRuns(Bf16Kernel::kAvx512Bf16), (detected & kFeatureAvx512Bf16) != 0);
  }
  {
    ScopedFeatureMask avx512(kFeatureAvx2 | kFeatureAvx512);
    EXPECT_FALSE(Bf16KernelRuns(Bf16Kernel::kAmx));
    EXPECT_FALSE(Bf16KernelRuns(Bf16Kernel::kAvx512Bf16));
  }
  EXPECT_EQ(Bf16KernelRuns(Bf16Kernel::kAmx), (detected & kFeatureAmxBf16) != 0);
}

}  // namespace
}  // namespace cpu
}  // namespace muon
