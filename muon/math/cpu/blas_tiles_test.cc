// The tiled OpenBLAS products against a double-precision loop written here
// (each of SGEMM's four transposes, SSYRK's two, SSYMM's two sides, with
// leading dimensions wider than the matrices and beta), and their bits at
// one, two and three threads: the same (OpenBLAS's own threaded calls are
// not, on its Haswell, Zen and Prescott kernels).
#include "muon/math/cpu/blas_tiles.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/cpu/cpu_threads.h"

namespace muon {
namespace cpu {
namespace {

std::vector<float> Random(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(gen);
  return v;
}

// Column-major element (i, j) of op(X), X stored with leading dimension ld.
double At(const std::vector<float>& x, int64_t ld, bool trans, int64_t i, int64_t j) {
  return trans ? x[static_cast<size_t>(j + i * ld)] : x[static_cast<size_t>(i + j * ld)];
}

// Runs `product` into a copy of `start` at each thread count; the copies
// must hold the same bits. Returns the one-thread result.
std::vector<float> SameAtEveryThreadCount(const std::vector<float>& start,
                                          const std::function<void(float*)>& product) {
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    UseThreads(threads, 1);
    std::vector<float> out = start;
    product(out.data());
    if (first.empty()) {
      first = out;
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), out.data(), first.size() * sizeof(float)))
          << "the bits changed at " << threads << " threads";
    }
  }
  UseThreads(1, 1);
  return first;
}

// Two shapes: 256-wide tiles, and 512-wide ones (a side over 1024).
class BlasTilesShapes : public testing::TestWithParam<int> {};

TEST_P(BlasTilesShapes, SgemmMatchesTheLoopAndTheThreads) {
  const bool wide = GetParam() == 1;
  const int64_t m = wide ? 1100 : 300, n = wide ? 90 : 530, k = wide ? 70 : 270, pad = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "trans_a " << ta << " trans_b " << tb);
      const int64_t lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
      const auto a = Random(lda * (ta ? m : k), 1), b = Random(ldb * (tb ? k : n), 2);
      const auto c0 = Random(ldc * n, 3);
      const auto c = SameAtEveryThreadCount(c0, [&](float* out) {
        TiledSgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, out, ldc);
      });
      for (int64_t j = 0; j < n; j += 7) {
        for (int64_t i = 0; i < m; i += 5) {
          double want = 0.25 * c0[static_cast<size_t>(i + j * ldc)];
          for (int64_t p = 0; p < k; ++p) want += 0.5 * At(a, lda, ta, i, p) * At(b, ldb, tb, p, j);
          ASSERT_NEAR(c[static_cast<size_t>(i + j * ldc)], want, 1e-4) << i << ", " << j;
        }
      }
    }
  }
}

TEST_P(BlasTilesShapes, SsyrkWritesTheUpperTriangleOnly) {
  const bool wide = GetParam() == 1;
  const int64_t n = wide ? 1100 : 600, k = wide ? 40 : 150, pad = 2;
  for (bool trans : {false, true}) {
    SCOPED_TRACE(trans);
    const int64_t lda = (trans ? k : n) + pad, ldc = n + pad;
    const auto a = Random(lda * (trans ? n : k), 4);
    const auto c0 = Random(ldc * n, 5);
    const auto c = SameAtEveryThreadCount(c0, [&](float* out) {
      TiledSsyrkUpper(trans, n, k, 2.0f, a.data(), lda, 0.5f, out, ldc);
    });
    for (int64_t j = 0; j < n; j += 3) {
      for (int64_t i = 0; i < n; i += 4) {
        const size_t at = static_cast<size_t>(i + j * ldc);
        if (i > j) {
          ASSERT_EQ(c[at], c0[at]) << "wrote below the diagonal at " << i << ", " << j;
          continue;
        }
        double want = 0.5 * c0[at];
        for (int64_t p = 0; p < k; ++p) want += 2.0 * At(a, lda, trans, i, p) * At(a, lda, trans, j, p);
        ASSERT_NEAR(c[at], want, 1e-4) << i << ", " << j;
      }
    }
  }
}

TEST_P(BlasTilesShapes, SsymmReadsTheUpperTriangleOnly) {
  const bool wide = GetParam() == 1;
  const int64_t m = wide ? 1100 : 520, n = wide ? 60 : 290, pad = 1;
  for (bool left : {true, false}) {
    SCOPED_TRACE(left);
    const int64_t order = left ? m : n, lds = order + pad, ldb = m + pad, ldc = m + pad;
    auto s = Random(lds * order, 6);
    std::vector<float> upper = s;
    for (int64_t j = 0; j < order; ++j) {
      for (int64_t i = j + 1; i < order; ++i) s[static_cast<size_t>(i + j * lds)] = NAN;
    }
    const auto b = Random(ldb * n, 7);
    const auto c0 = Random(ldc * n, 8);
    const auto c = SameAtEveryThreadCount(c0, [&](float* out) {
      TiledSsymmUpper(left, m, n, 1.5f, s.data(), lds, b.data(), ldb, -1.0f, out, ldc);
    });
    auto sym = [&](int64_t i, int64_t j) {
      return i <= j ? upper[static_cast<size_t>(i + j * lds)] : upper[static_cast<size_t>(j + i * lds)];
    };
    for (int64_t j = 0; j < n; j += 3) {
      for (int64_t i = 0; i < m; i += 7) {
        double want = -1.0 * c0[static_cast<size_t>(i + j * ldc)];
        for (int64_t p = 0; p < order; ++p) {
          want += 1.5 * (left ? sym(i, p) * b[static_cast<size_t>(p + j * ldb)]
                              : b[static_cast<size_t>(i + p * ldb)] * sym(p, j));
        }
        ASSERT_NEAR(c[static_cast<size_t>(i + j * ldc)], want, 1e-4) << i << ", " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TileSides, BlasTilesShapes, testing::Values(0, 1));

}  // namespace
}  // namespace cpu
}  // namespace muon
