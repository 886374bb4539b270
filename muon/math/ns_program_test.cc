// The Newton-Schulz program (ns_program.h) run by a plain column-major
// executor in double, against the iteration written out on row-major matrices
// as torch writes it (transpose in, iterate, transpose out): the program's ops,
// leading dimensions, strides and scalars are right for wide, tall and square
// batches, with no transpose anywhere.
#include "muon/math/ns_program.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

using Mat = std::vector<double>;  // row-major unless said otherwise

// Element (i, j) of op(M) for a column-major M with leading dimension ld.
double At(const double* m, int64_t ld, bool trans, int64_t i, int64_t j) {
  return trans ? m[i * ld + j] : m[j * ld + i];
}

// The rows and columns of an operand as stored (before op).
void Stored(const NsGemm& g, char which, int64_t* rows, int64_t* cols) {
  const bool t = which == 'a' ? g.trans_a : g.trans_b;
  const int64_t r = which == 'a' ? g.m : g.k, c = which == 'a' ? g.k : g.n;
  *rows = t ? c : r;
  *cols = t ? r : c;
}

// Runs `p` (every matrix of the batch, `steps` iterations) on x in double.
void Execute(const NsProgram& p, const NsCoefficients& abc, int steps, std::vector<double>* x) {
  std::vector<double> x_next(x->size()), gram(p.count * p.gram_elems), poly(gram.size());
  std::vector<double>* buffers[4] = {x, &x_next, &gram, &poly};
  auto value = [&](NsScalar s) {
    return s == NsScalar::kZero ? 0.0 : s == NsScalar::kOne ? 1.0
         : s == NsScalar::kA  ? abc[0] : s == NsScalar::kB ? abc[1] : abc[2];
  };
  for (int it = 0; it < steps; ++it) {
    for (const NsGemm* gp : ProductsFor(p, abc)) {
      const NsGemm& g = *gp;
      for (int64_t b = 0; b < p.count; ++b) {
        const double* a = buffers[static_cast<int>(g.a.buffer)]->data() + b * g.a.stride;
        const double* bm = buffers[static_cast<int>(g.b.buffer)]->data() + b * g.b.stride;
        const double* c = buffers[static_cast<int>(g.c.buffer)]->data() + b * g.c.stride;
        double* d = buffers[static_cast<int>(g.d.buffer)]->data() + b * g.d.stride;
        if (g.beta != NsScalar::kZero) {
          ASSERT_NE(c, d) << g.name << " is not out of place";
        }
        for (int64_t j = 0; j < g.n; ++j) {
          for (int64_t i = 0; i < g.m; ++i) {
            double acc = 0.0;
            for (int64_t l = 0; l < g.k; ++l) {
              acc += At(a, g.a.ld, g.trans_a, i, l) * At(bm, g.b.ld, g.trans_b, l, j);
            }
            const double cij = g.beta == NsScalar::kZero ? 0.0 : c[j * g.c.ld + i];
            d[j * g.d.ld + i] = value(g.alpha) * acc + value(g.beta) * cij;
          }
        }
      }
    }
    std::swap(*buffers[0], *buffers[1]);
  }
}

// The same iteration as torch writes it, on one row-major rows x cols matrix.
Mat Direct(const Mat& u, int64_t rows, int64_t cols, const NsCoefficients& abc, int steps) {
  const bool t = rows > cols;
  const int64_t m = t ? cols : rows, n = t ? rows : cols;
  Mat x(m * n);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) (t ? x[j * n + i] : x[i * n + j]) = u[i * cols + j];
  }
  for (int it = 0; it < steps; ++it) {
    Mat a(m * m), b(m * m), next(m * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        for (int64_t l = 0; l < n; ++l) a[i * m + j] += x[i * n + l] * x[j * n + l];
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0.0;
        for (int64_t l = 0; l < m; ++l) aa += a[i * m + l] * a[l * m + j];
        b[i * m + j] = abc[1] * a[i * m + j] + abc[2] * aa;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double bx = 0.0;
        for (int64_t l = 0; l < m; ++l) bx += b[i * m + l] * x[l * n + j];
        next[i * n + j] = abc[0] * x[i * n + j] + bx;
      }
    }
    x = next;
  }
  Mat out(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = t ? x[j * n + i] : x[i * n + j];
  }
  return out;
}

class NsProgramTest : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(NsProgramTest, EqualsTheIterationOnRowMajorMatrices) {
  const auto [rows, cols] = GetParam();
  const int64_t count = 3;
  const int steps = 3;
  std::mt19937 rng(static_cast<unsigned>(rows * 131 + cols));
  std::normal_distribution<double> normal;
  Mat batch(count * rows * cols);
  for (double& v : batch) v = normal(rng) / std::sqrt(static_cast<double>(rows * cols));

  const NsProgram p = PlanNewtonSchulz(count, rows, cols);
  EXPECT_EQ(p.m, std::min(rows, cols));
  EXPECT_EQ(p.n, std::max(rows, cols));
  EXPECT_EQ(p.x_elems, rows * cols);
  // torch's quintic (three products), and a cubic (c == 0: two products).
  for (const NsCoefficients& abc :
       {NsCoefficients{3.4445, -4.7750, 2.0315}, NsCoefficients{3.3656576, -3.3420992, 0.0}}) {
    SCOPED_TRACE(abc[2] == 0.0 ? "cubic" : "quintic");
    std::vector<double> x = batch;  // the row-major memory, untouched by any transpose
    Execute(p, abc, steps, &x);
    if (HasFatalFailure()) return;
    for (int64_t b = 0; b < count; ++b) {
      const Mat one(batch.begin() + b * rows * cols, batch.begin() + (b + 1) * rows * cols);
      const Mat want = Direct(one, rows, cols, abc, steps);
      for (int64_t e = 0; e < rows * cols; ++e) {
        ASSERT_NEAR(x[b * rows * cols + e], want[e], 1e-12 * std::max(1.0, std::fabs(want[e])))
            << "matrix " << b << " element " << e;
      }
    }
  }
}

TEST(NsProgram, ACubicIterationRunsTwoProductsTheOthersThree) {
  const NsProgram p = PlanNewtonSchulz(1, 6, 4);
  const NsIterationProducts quintic = ProductsFor(p, {3.4445, -4.7750, 2.0315});
  ASSERT_EQ(quintic.count, 3);
  EXPECT_EQ(quintic.gemm[0], &p.iteration[0]);
  EXPECT_EQ(quintic.gemm[1], &p.iteration[1]);
  EXPECT_EQ(quintic.gemm[2], &p.iteration[2]);
  const NsIterationProducts cubic = ProductsFor(p, {2.0, -1.0, 0.0});
  ASSERT_EQ(cubic.count, 2);
  EXPECT_EQ(cubic.gemm[0], &p.iteration[0]);
  EXPECT_EQ(cubic.gemm[1], &p.cubic_update);
  EXPECT_EQ(p.cubic_update.alpha, NsScalar::kB);  // W' = a W + b gram W
  EXPECT_EQ(p.cubic_update.beta, NsScalar::kA);
}

TEST_P(NsProgramTest, OperandsStayInsideTheirBuffersAndSymmetryClaimsHold) {
  const auto [rows, cols] = GetParam();
  const NsProgram p = PlanNewtonSchulz(2, rows, cols);
  auto elems = [&](NsBuffer b) {
    return b == NsBuffer::kX || b == NsBuffer::kXNext ? p.x_elems : p.gram_elems;
  };
  for (const NsGemm* gp : {&p.iteration[0], &p.iteration[1], &p.iteration[2], &p.cubic_update}) {
    const NsGemm& g = *gp;
    SCOPED_TRACE(g.name);
    int64_t r, c;
    Stored(g, 'a', &r, &c);
    EXPECT_GE(g.a.ld, r);
    EXPECT_LE(g.a.ld * (c - 1) + r, elems(g.a.buffer));
    EXPECT_EQ(g.a.stride, elems(g.a.buffer));
    Stored(g, 'b', &r, &c);
    EXPECT_GE(g.b.ld, r);
    EXPECT_LE(g.b.ld * (c - 1) + r, elems(g.b.buffer));
    EXPECT_EQ(g.d.ld * g.n, elems(g.d.buffer));  // D fills its buffer: nothing stale
    EXPECT_EQ(g.c.ld, g.d.ld);
    if (g.beta != NsScalar::kZero) {
      EXPECT_NE(g.c.buffer, g.d.buffer);  // out of place
    }
    if (g.symmetric) {
      EXPECT_EQ(g.m, g.n);
      // op(B) is op(A)^T itself (same buffer, opposite op), or A is the
      // symmetric Gram matrix taken twice the same way.
      EXPECT_EQ(g.a.buffer, g.b.buffer);
      EXPECT_TRUE(g.trans_a != g.trans_b || g.a.buffer == NsBuffer::kGram);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NsProgramTest,
                         ::testing::Values(std::pair<int64_t, int64_t>{4, 7},
                                           std::pair<int64_t, int64_t>{9, 3},
                                           std::pair<int64_t, int64_t>{5, 5},
                                           std::pair<int64_t, int64_t>{1, 6},
                                           std::pair<int64_t, int64_t>{8, 1}));

TEST(NsScalarValueTest, NamesEachCoefficient) {
  const NsCoefficients abc = {1.5, -2.25, 3.0};
  EXPECT_EQ(NsScalarValue(NsScalar::kZero, abc), 0.0f);
  EXPECT_EQ(NsScalarValue(NsScalar::kOne, abc), 1.0f);
  EXPECT_EQ(NsScalarValue(NsScalar::kA, abc), 1.5f);
  EXPECT_EQ(NsScalarValue(NsScalar::kB, abc), -2.25f);
  EXPECT_EQ(NsScalarValue(NsScalar::kC, abc), 3.0f);
}

}  // namespace
}  // namespace muon
