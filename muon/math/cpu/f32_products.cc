#include "muon/math/cpu/f32_products.h"

#include <algorithm>
#include <cstdlib>

#include "muon/math/cpu/blas_tiles.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/cpu/gram_ns.h"

namespace muon {
namespace {

// Y Y^T (n x n, row- or column-major alike: it is symmetric) for Y = op(A),
// op(A) n x k, A column-major with leading dimension lda.
cpu::F32Product SymmetricProduct(bool trans_a, int64_t n, int64_t k, const float* a, int64_t lda) {
  cpu::F32Product p;
  p.rows = p.cols = n;
  p.k = k;
  // Y(i, q) is a[q lda + i] (row-major: transposed) unless trans_a.
  p.left = {a, lda, !trans_a};
  p.right = {a, lda, trans_a};
  p.symmetric = true;
  return p;
}

// Column-major D (m x n) = op(A) op(B), read row-major as D^T = op(B)^T
// op(A)^T: rows n, cols m.
cpu::F32Product GeneralProduct(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               const float* a, int64_t lda, const float* b, int64_t ldb) {
  cpu::F32Product p;
  p.rows = n;
  p.cols = m;
  p.k = k;
  p.left = {b, ldb, trans_b};
  p.right = {a, lda, trans_a};
  return p;
}

// The update's product in the program's orientation: X' = S X (tall: m x n,
// leading dimension m) or X'^T = X^T S (wide: n x m, leading dimension n).
cpu::F32Product UpdateProduct(const NsProgram& program, const float* s, const float* x) {
  const int64_t m = program.m, n = program.n;
  return program.tall ? GeneralProduct(false, false, m, n, m, s, m, x, m)
                      : GeneralProduct(false, false, n, m, m, x, n, s, m);
}

}  // namespace

absl::Status Fp32Products::Choose(int threads) {
  threads_ = std::max(threads, 1);
  absl::StatusOr<cpu::Fp32Engine> engine =
      cpu::ChooseFp32Engine(cpu::Features(), std::getenv("MUON_CPU_FP32"));
  engine_ = engine.ok() ? *engine : cpu::Fp32Engine::kOpenBlas;
  return engine.status();
}

absl::Status Fp32Products::Reserve(const NsProgram& program) {
  if (engine_ != cpu::Fp32Engine::kAvx512) return absl::OkStatus();
  const size_t gram = cpu::F32WorkspaceBytes(
      SymmetricProduct(!program.tall, program.m, program.n, nullptr, 1), threads_);
  const size_t poly = cpu::F32WorkspaceBytes(
      SymmetricProduct(false, program.m, program.m, nullptr, 1), threads_);
  const size_t update = cpu::F32WorkspaceBytes(UpdateProduct(program, nullptr, nullptr), threads_);
  return workspace_.Get(std::max({gram, poly, update})).status();
}

bool Fp32Products::Kernel(const cpu::F32Product& p) {
  if (p.rows <= 0 || p.cols <= 0 || p.k <= 0) return false;  // the kernel's sizes are positive
  absl::StatusOr<void*> workspace = workspace_.Get(cpu::F32WorkspaceBytes(p, threads_));
  if (!workspace.ok()) return false;
  cpu::F32Multiply(p, *workspace, threads_);
  return true;
}

void Fp32Products::Run(const NsGemm& g, float alpha, float beta, const float* a, const float* b,
                       const float* c, float* d) {
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.a.ld), ldb = static_cast<int>(g.b.ld),
            ldd = static_cast<int>(g.d.ld);
  ++products_run_;
  if (engine_ == cpu::Fp32Engine::kAvx512) {
    cpu::F32Product p = g.symmetric
                            ? SymmetricProduct(g.trans_a, g.m, g.k, a, g.a.ld)
                            : GeneralProduct(g.trans_a, g.trans_b, g.m, g.n, g.k, a, g.a.ld, b, g.b.ld);
    p.alpha = alpha;
    p.beta = beta;
    p.c = c;
    p.ld_c = g.d.ld;  // C and D share layout
    p.out = d;
    p.ld_out = g.d.ld;
    if (Kernel(p)) return;
  }
  // CBLAS updates C in place: D starts as C.
  if (beta != 0.0f && c != d) std::copy(c, c + g.d.ld * g.n, d);
  if (g.symmetric) {
    cpu::TiledSsyrkUpper(g.trans_a, m, k, alpha, a, lda, beta, d, ldd);
    cpu::MirrorUpper(d, g.m, g.d.ld);
  } else {
    cpu::TiledSgemm(g.trans_a, g.trans_b, m, n, k, alpha, a, lda, b, ldb, beta, d, ldd);
  }
}

void Fp32Products::Gram(const NsProgram& program, const float* x, float* gram) {
  // As stored, X is W^T (n x m, leading dimension n) when wide, W (m x n,
  // leading dimension m) when tall.
  const int64_t ld_x = program.tall ? program.m : program.n;
  ++products_run_;
  if (engine_ == cpu::Fp32Engine::kAvx512) {
    cpu::F32Product p = SymmetricProduct(!program.tall, program.m, program.n, x, ld_x);
    p.out = gram;
    p.ld_out = program.m;
    if (Kernel(p)) return;
  }
  const int m = static_cast<int>(program.m), n = static_cast<int>(program.n);
  cpu::TiledSsyrkUpper(!program.tall, m, n, 1.0f, x, ld_x, 0.0f, gram, m);
  cpu::MirrorUpper(gram, program.m, program.m);
}

void Fp32Products::Polynomial(int64_t m, const float* gram, float a, float b, float c,
                              float* poly) {
  if (c != 0.0f) ++products_run_;
  if (engine_ == cpu::Fp32Engine::kAvx512) {
    // Both triangles (TimesW reads them): c gram gram + b gram in one pass.
    bool done = false;
    if (c != 0.0f) {
      cpu::F32Product p = SymmetricProduct(false, m, m, gram, m);
      p.alpha = c;
      p.beta = b;
      p.c = gram;
      p.ld_c = m;
      p.out = poly;
      p.ld_out = m;
      done = Kernel(p);
    } else {
      for (int64_t i = 0; i < m * m; ++i) poly[i] = b * gram[i];
      done = true;
    }
    if (done) {
      for (int64_t i = 0; i < m; ++i) poly[i * m + i] += a;
      return;
    }
  }
  // The upper triangle: SYMM reads no other.
  if (c != 0.0f) {
    cpu::TiledSsyrkUpper(false, m, m, c, gram, m, 0.0f, poly, m);
  } else {
    std::fill(poly, poly + m * m, 0.0f);
  }
  cpu::FoldPolynomial(poly, gram, m, a, b);
  // The kernel's working memory ran short here: its TimesW may not.
  if (engine_ == cpu::Fp32Engine::kAvx512) cpu::MirrorUpper(poly, m, m);
}

void Fp32Products::TimesW(const NsProgram& program, const float* poly, const float* x,
                          float* out) {
  ++products_run_;
  if (engine_ == cpu::Fp32Engine::kAvx512) {
    cpu::F32Product p = UpdateProduct(program, poly, x);
    p.out = out;
    p.ld_out = program.tall ? program.m : program.n;
    if (Kernel(p)) return;
  }
  // SYMM reads the upper triangle, which either engine's Polynomial leaves.
  cpu::SymmetricTimesW(program, poly, x, out);
}

}  // namespace muon
