#include "muon/math/cpu/gram_ns.h"

#include <algorithm>
#include <utility>

#include "muon/math/cpu/blas_tiles.h"
#include "muon/math/cpu/cpu_kernels.h"

namespace muon {
namespace cpu {
namespace {

// An m x m column-major matrix's upper triangle mirrored, then rounded.
void Finish(float* d, int64_t m, int round) {
  MirrorUpper(d, m, m);
  RoundToType(round, d, m * m);
}

// d = s * b + a * c (all m x m, s read as the symmetric matrix its upper
// triangle is, b and c whole): one symmetric product, rounded.
void SymmetricTimes(const float* s, const float* b, float a, const float* c, float* d,
                    int64_t m, int round) {
  if (a != 0.0f) std::copy(c, c + m * m, d);
  TiledSsymmUpper(true, m, m, 1.0f, s, m, b, m, a, d, m);
  RoundToType(round, d, m * m);
}

}  // namespace

void SymmetricTimesW(const NsProgram& program, const float* s, const float* x, float* out) {
  const int64_t m = program.m, n = program.n;
  if (program.tall) {
    TiledSsymmUpper(true, m, n, 1.0f, s, m, x, m, 0.0f, out, m);
  } else {
    TiledSsymmUpper(false, n, m, 1.0f, s, m, x, n, 0.0f, out, n);
  }
}

size_t GramWorkFloats(const NsProgram& program) {
  return static_cast<size_t>(program.x_elems + 4 * program.gram_elems);
}

void GramNewtonSchulz(const NsConfig& config, const NsProgram& program, float* u, float* work,
                      int round) {
  const int64_t m = program.m, mm = program.gram_elems;
  const int64_t ld_x = program.tall ? m : program.n;
  float* x = u;
  float* x_next = work;
  float* r = work + program.x_elems;
  float* z = r + mm;
  float* q = z + mm;
  float* t = q + mm;
  // R = W W^T (upper, mirrored, rounded).
  auto gram = [&] {
    TiledSsyrkUpper(!program.tall, m, program.n, 1.0f, x, ld_x, 0.0f, r, m);
    Finish(r, m, round);
  };
  // W <- Q W, Q read as symmetric.
  auto apply_q = [&] {
    SymmetricTimesW(program, q, x, x_next);
    RoundToType(round, x_next, program.x_elems);
    std::swap(x, x_next);
  };
  if (config.steps > 0) gram();
  for (int i = 0; i < config.steps; ++i) {
    const NsCoefficients& abc = config.ForIteration(i);
    const float a = static_cast<float>(abc[0]), b = static_cast<float>(abc[1]),
                c = static_cast<float>(abc[2]);
    const bool restart = config.RestartsAt(i);
    if (restart) {
      apply_q();
      gram();
    }
    // Z = b R + c R^2 (R R^T = R^2: one symmetric product).
    if (c != 0.0f) {
      TiledSsyrkUpper(false, m, m, c, r, m, 0.0f, z, m);
    } else {
      std::fill(z, z + mm, 0.0f);
    }
    FoldPolynomial(z, r, m, 0.0f, b);
    Finish(z, m, round);
    if (i == 0 || restart) {  // Q = Z + a I
      std::copy(z, z + mm, q);
      for (int64_t j = 0; j < m; ++j) q[j * m + j] += a;
      RoundToType(round, q, mm);
    } else {  // Q = Q Z + a Q
      SymmetricTimes(q, z, a, q, t, m, round);
      std::swap(q, t);
    }
    if (i + 1 < config.steps && !config.RestartsAt(i + 1)) {
      // R = (a I + Z) R (a I + Z): RZ = R Z + a R, then R = Z RZ + a RZ.
      SymmetricTimes(r, z, a, r, t, m, round);
      SymmetricTimes(z, t, a, t, r, m, round);
    }
  }
  if (config.steps > 0) apply_q();
  if (x != u) std::copy(x, x + program.x_elems, u);
}

}  // namespace cpu
}  // namespace muon
