// The AVX-512 fp32 kernel against products computed here in double from the
// definition: on small integers (every fp32 sum exact, so the result has one
// right answer) for every orientation of both operands, uneven edges, k not
// a multiple of 16 or of the k chunk, symmetric products across several
// blocks (with one packed operand and with two), c read in place; on random
// floats within fp32's rounding of the sums; results that do not depend on
// the threads; nothing written outside the output. Runs where the CPU has
// AVX-512; a skip names what it lacks. The feature mask turns the kernel off.
#include "muon/math/cpu/f32_gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/cpu/cpu_features.h"

namespace muon {
namespace cpu {
namespace {

#define MUON_REQUIRE_AVX512()                                                              \
  if (!F32KernelRuns())                                                                    \
  GTEST_SKIP() << "this CPU (features: " << FeatureNames(Features())                       \
               << ") has no avx512 for the fp32 kernel"

constexpr float kUntouched = -12345.5f;  // a value the cases never produce
constexpr int64_t kPad = 3;              // columns past the output, each row

struct Case {
  int64_t rows, cols, k;
  bool left_transposed, right_transposed, symmetric;
  float alpha, beta;
  bool in_place = false;  // c is out itself (holding c's values)
  bool shared = false;    // symmetric: right is left's matrix read transposed
  bool integers = true;   // small integers (exact) or floats in [-1, 1)
};

std::string Name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + "x" + std::to_string(c.k) +
         (c.left_transposed ? " L^T" : " L") + (c.right_transposed ? " R^T" : " R") +
         (c.symmetric ? " symmetric" : "") + (c.shared ? " shared" : "") +
         (c.in_place ? " in place" : "") + (c.integers ? " integers" : " floats") + " alpha " +
         std::to_string(c.alpha) + " beta " + std::to_string(c.beta);
}

// Runs the case with `threads` and returns the output (rows x (cols +
// kPad)), after checking it against the double product.
std::vector<float> RunAndCheck(const Case& c, int threads) {
  std::mt19937 rng(static_cast<uint32_t>(c.rows * 131 + c.cols * 17 + c.k));
  std::uniform_int_distribution<int> small(-4, 4);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  auto draw = [&] { return c.integers ? static_cast<float>(small(rng)) : real(rng); };
  // Logical left (rows x k) and right (k x cols); a symmetric case takes
  // right = left^T (stored apart, or `shared`: left's storage read twice).
  std::vector<float> l(static_cast<size_t>(c.rows * c.k)), r(static_cast<size_t>(c.k * c.cols));
  for (float& v : l) v = draw();
  for (int64_t p = 0; p < c.k; ++p) {
    for (int64_t j = 0; j < c.cols; ++j) r[p * c.cols + j] = c.symmetric ? l[j * c.k + p] : draw();
  }
  // c: symmetric when the product is.
  std::vector<float> cm(static_cast<size_t>(c.rows * c.cols));
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.cols; ++j) {
      cm[i * c.cols + j] = c.symmetric && j < i ? cm[j * c.cols + i] : draw();
    }
  }
  // Stored forms, with a leading dimension 2 wider than needed.
  const int64_t l_ld = (c.left_transposed ? c.rows : c.k) + 2;
  std::vector<float> l_store(static_cast<size_t>((c.left_transposed ? c.k : c.rows) * l_ld), 7.0f);
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t p = 0; p < c.k; ++p) {
      l_store[c.left_transposed ? p * l_ld + i : i * l_ld + p] = l[i * c.k + p];
    }
  }
  const int64_t r_ld = (c.right_transposed ? c.k : c.cols) + 2;
  std::vector<float> r_store(static_cast<size_t>((c.right_transposed ? c.cols : c.k) * r_ld),
                             7.0f);
  for (int64_t p = 0; p < c.k; ++p) {
    for (int64_t j = 0; j < c.cols; ++j) {
      r_store[c.right_transposed ? j * r_ld + p : p * r_ld + j] = r[p * c.cols + j];
    }
  }
  const int64_t ld_out = c.cols + kPad;
  std::vector<float> out(static_cast<size_t>(c.rows * ld_out), kUntouched);
  std::vector<float> c_store(static_cast<size_t>(c.rows * ld_out), kUntouched);
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.cols; ++j) {
      (c.in_place ? out : c_store)[i * ld_out + j] = cm[i * c.cols + j];
    }
  }
  F32Product p;
  p.rows = c.rows;
  p.cols = c.cols;
  p.k = c.k;
  p.left = {l_store.data(), l_ld, c.left_transposed};
  // The shared case reads left's storage as right: right(p, j) = left(j, p).
  p.right = c.shared ? F32Operand{l_store.data(), l_ld, !c.left_transposed}
                     : F32Operand{r_store.data(), r_ld, c.right_transposed};
  p.alpha = c.alpha;
  p.beta = c.beta;
  p.c = c.in_place ? out.data() : c_store.data();
  p.ld_c = ld_out;
  p.out = out.data();
  p.ld_out = ld_out;
  p.symmetric = c.symmetric;
  std::vector<char> raw(F32WorkspaceBytes(p, threads) + 64);
  void* workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) &
                                            ~uintptr_t{63});
  F32Multiply(p, workspace, threads);
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.cols; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t q = 0; q < c.k; ++q) {
        sum += static_cast<double>(l[i * c.k + q]) * r[q * c.cols + j];
        magnitude += std::fabs(static_cast<double>(l[i * c.k + q]) * r[q * c.cols + j]);
      }
      const double want = static_cast<double>(c.alpha) * sum +
                          (c.beta != 0.0f ? static_cast<double>(c.beta) * cm[i * c.cols + j] : 0.0);
      const double got = out[i * ld_out + j];
      // Integers: exact. Floats: fp32's rounding of k sums and the epilogue.
      const double bound = c.integers ? 0.0
                                      : 2e-7 * (c.k + 4) * (std::fabs(c.alpha) * magnitude +
                                                            std::fabs(c.beta) + 1.0);
      EXPECT_LE(std::fabs(got - want), bound) << Name(c) << " at (" << i << ", " << j << ")";
      if (std::fabs(got - want) > bound) return out;
    }
    for (int64_t j = c.cols; j < ld_out; ++j) {
      EXPECT_EQ(out[i * ld_out + j], kUntouched) << Name(c) << ": wrote past the row " << i;
    }
  }
  if (c.symmetric) {
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        EXPECT_EQ(out[i * ld_out + j], out[j * ld_out + i]) << Name(c) << ": not symmetric";
      }
    }
  }
  return out;
}

TEST(F32Gemm, EveryOrientationAndEdgeAgainstDouble) {
  MUON_REQUIRE_AVX512();
  const int64_t sizes[][3] = {{1, 1, 1},     {5, 7, 3},      {16, 16, 16},   {17, 33, 19},
                              {48, 48, 256}, {40, 100, 257}, {256, 256, 64}, {257, 300, 520},
                              {31, 513, 40}};
  for (const auto& s : sizes) {
    for (int lt = 0; lt < 2; ++lt) {
      for (int rt = 0; rt < 2; ++rt) {
        RunAndCheck({s[0], s[1], s[2], lt == 1, rt == 1, false, 1.0f, 0.0f}, 2);
        RunAndCheck({s[0], s[1], s[2], lt == 1, rt == 1, false, -0.5f, 2.0f}, 2);
      }
    }
  }
}

TEST(F32Gemm, SymmetricProductsAcrossBlocks) {
  MUON_REQUIRE_AVX512();
  for (int64_t n : {1, 15, 40, 255, 256, 300, 600}) {
    for (int lt = 0; lt < 2; ++lt) {
      // Y Y^T with one packed operand, and a product of two symmetric-result
      // operands packed separately; beta with c separate and in place.
      RunAndCheck({n, n, 37, lt == 1, lt == 0, true, 1.0f, 0.0f, false, true}, 2);
      RunAndCheck({n, n, 300, lt == 1, lt == 0, true, 0.25f, -1.0f, true, true}, 3);
      RunAndCheck({n, n, 300, lt == 1, lt == 0, true, 0.25f, 1.5f, false, true}, 1);
      RunAndCheck({n, n, 41, lt == 1, lt == 1, true, 1.0f, 0.0f, false, false}, 2);
      RunAndCheck({n, n, 260, lt == 0, lt == 1, true, 2.0f, 0.5f, true, false}, 2);
    }
  }
}

TEST(F32Gemm, FloatsWithinRounding) {
  MUON_REQUIRE_AVX512();
  RunAndCheck({300, 520, 1000, false, false, false, 1.0f, 0.0f, false, false, false}, 2);
  RunAndCheck({520, 300, 700, true, true, false, 0.3f, 0.7f, true, false, false}, 2);
  RunAndCheck({513, 513, 900, false, true, true, 1.0f, 0.0f, false, true, false}, 2);
}

TEST(F32Gemm, ResultDoesNotDependOnThreads) {
  MUON_REQUIRE_AVX512();
  // Outputs within 256 x 256 run in blocks of 128 (a second thread's share).
  for (const Case& c : {Case{600, 700, 1100, false, false, false, 1.0f, 0.5f, false, false, false},
                        Case{700, 700, 900, false, true, true, 1.0f, 0.0f, false, true, false},
                        Case{200, 250, 600, true, false, false, 1.0f, 0.5f, false, false, false},
                        Case{256, 256, 300, false, true, true, 1.0f, 0.0f, false, true, false}}) {
    const std::vector<float> one = RunAndCheck(c, 1);
    for (int threads : {2, 3, 5}) {
      const std::vector<float> many = RunAndCheck(c, threads);
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
          << Name(c) << ": " << threads << " threads differ from one";
    }
  }
}

TEST(F32Gemm, TheFeatureMaskTurnsTheKernelOff) {
  ScopedFeatureMask avx2(kFeatureAvx2);
  EXPECT_FALSE(F32KernelRuns());
}

}  // namespace
}  // namespace cpu
}  // namespace muon
