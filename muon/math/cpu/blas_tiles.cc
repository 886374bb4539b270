#include "muon/math/cpu/blas_tiles.h"

#include <cblas.h>

#include <algorithm>

#include "muon/math/cpu/cpu_threads.h"

namespace muon {
namespace cpu {
namespace {

// One product's tiling: tiles of `side` along each of its dimensions.
struct Tiling {
  int64_t side;
  int Tiles(int64_t extent) const { return static_cast<int>((extent + side - 1) / side); }
  int64_t Start(int tile) const { return tile * side; }
  int Size(int tile, int64_t extent) const {
    return static_cast<int>(std::min(side, extent - Start(tile)));
  }
};
CBLAS_TRANSPOSE Op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

// Runs tile(i) for i in [0, count) on the calling thread's team; each tile
// alone on one thread, so the order of its sums never depends on the team.
template <typename Fn>
void ForTiles(int count, Fn tile) {
  const int team = std::min(TileThreads(), count);
  if (team <= 1) {
    for (int i = 0; i < count; ++i) tile(i);
    return;
  }
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
  for (int i = 0; i < count; ++i) tile(i);
}

}  // namespace

void TiledSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const Tiling tiling{BlasTile(std::max(m, n))};
  const int rows = tiling.Tiles(m), cols = tiling.Tiles(n);
  ForTiles(rows * cols, [&](int t) {
    const int i = t % rows, j = t / rows;
    const int64_t r0 = tiling.Start(i), c0 = tiling.Start(j);
    cblas_sgemm(CblasColMajor, Op(trans_a), Op(trans_b), tiling.Size(i, m), tiling.Size(j, n),
                static_cast<int>(k), alpha, trans_a ? a + r0 * lda : a + r0,
                static_cast<int>(lda), trans_b ? b + c0 : b + c0 * ldb, static_cast<int>(ldb),
                beta, c + r0 + c0 * ldc, static_cast<int>(ldc));
  });
}

void TiledSsyrkUpper(bool trans, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     float beta, float* c, int64_t ldc) {
  if (n <= 0) return;
  const Tiling tiling{BlasTile(n)};
  const int tiles = tiling.Tiles(n);
  // The tiles on and above the diagonal, column after column.
  const int count = tiles * (tiles + 1) / 2;
  ForTiles(count, [&](int t) {
    int j = 0;
    while ((j + 1) * (j + 2) / 2 <= t) ++j;
    const int i = t - j * (j + 1) / 2;
    const int64_t r0 = tiling.Start(i), c0 = tiling.Start(j);
    const float* ai = trans ? a + r0 * lda : a + r0;
    const float* aj = trans ? a + c0 * lda : a + c0;
    float* out = c + r0 + c0 * ldc;
    if (i == j) {
      cblas_ssyrk(CblasColMajor, CblasUpper, Op(trans), tiling.Size(j, n), static_cast<int>(k),
                  alpha,
                  aj, static_cast<int>(lda), beta, out, static_cast<int>(ldc));
    } else {
      cblas_sgemm(CblasColMajor, Op(trans), Op(!trans), tiling.Size(i, n), tiling.Size(j, n),
                  static_cast<int>(k), alpha, ai, static_cast<int>(lda), aj,
                  static_cast<int>(lda), beta, out, static_cast<int>(ldc));
    }
  });
}

void TiledSsymmUpper(bool left, int64_t m, int64_t n, float alpha, const float* s, int64_t lds,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const Tiling tiling{BlasTile(std::max(m, n))};
  const int rows = tiling.Tiles(m), cols = tiling.Tiles(n);
  const int64_t inner = left ? m : n;  // S's order
  const int ld_s = static_cast<int>(lds), ld_b = static_cast<int>(ldb),
            ld_c = static_cast<int>(ldc);
  ForTiles(rows * cols, [&](int t) {
    const int i = t % rows, j = t / rows;
    const int64_t r0 = tiling.Start(i), c0 = tiling.Start(j);
    const int mi = tiling.Size(i, m), nj = tiling.Size(j, n);
    float* out = c + r0 + c0 * ldc;
    // C_ij = sum over K of S_iK B_Kj (left) or B_iK S_Kj (right), K in order;
    // S_xy below the diagonal read as S_yx^T.
    for (int kt = 0; kt < tiling.Tiles(inner); ++kt) {
      const int64_t k0 = tiling.Start(kt);
      const int kk = tiling.Size(kt, inner);
      const float step_beta = kt == 0 ? beta : 1.0f;
      if (left) {
        const float* bk = b + k0 + c0 * ldb;
        if (kt == i) {
          cblas_ssymm(CblasColMajor, CblasLeft, CblasUpper, mi, nj, alpha, s + r0 + r0 * lds,
                      ld_s, bk, ld_b, step_beta, out, ld_c);
        } else {
          const bool above = kt > i;  // S_iK stored; else S_Ki^T
          cblas_sgemm(CblasColMajor, Op(!above), CblasNoTrans, mi, nj, kk, alpha,
                      above ? s + r0 + k0 * lds : s + k0 + r0 * lds, ld_s, bk, ld_b, step_beta,
                      out, ld_c);
        }
      } else {
        const float* bk = b + r0 + k0 * ldb;
        if (kt == j) {
          cblas_ssymm(CblasColMajor, CblasRight, CblasUpper, mi, nj, alpha, s + c0 + c0 * lds,
                      ld_s, bk, ld_b, step_beta, out, ld_c);
        } else {
          const bool above = kt < j;  // S_Kj stored; else S_jK^T
          cblas_sgemm(CblasColMajor, CblasNoTrans, Op(!above), mi, nj, kk, alpha, bk, ld_b,
                      above ? s + k0 + c0 * lds : s + c0 + k0 * lds, ld_s, step_beta, out, ld_c);
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace muon
