// OpenBLAS's fp32 products (SGEMM, SSYRK, SSYMM) with results that do not
// depend on the thread count. OpenBLAS's own threading does not promise
// that: at two threads its SGEMM, SSYRK and SSYMM sum some outputs in
// another order than at one (measured on OpenBLAS 0.3.21's Haswell, Zen and
// Prescott kernels, from 8 x 8 SSYMM up), so a rank with a share of the
// cores would not compute what one process computes. Here the output is cut
// into square tiles whose side follows the product's shape only (BlasTile),
// the same whatever the threads; each
// tile is a fixed sequence of single-threaded OpenBLAS calls (OpenBLAS is
// kept at one thread: cpu_threads.h), and the tiles run on an OpenMP team of
// the threads cpu::UseThreads gave the calling thread. Column-major, as
// CBLAS reads it; the arguments are CBLAS's.
#ifndef MUON_MATH_CPU_BLAS_TILES_H_
#define MUON_MATH_CPU_BLAS_TILES_H_

#include <cstdint>

namespace muon {
namespace cpu {

// The side of the tiles of a product whose output's larger side is
// `extent`: 128 up to 256 (a 256 x 256 product in one tile ran on one of two
// threads), 256 up to 1024 (enough tiles for a team), 512 above (fewer
// packings of the operands: at 4096 x 4096 x 4096 on an AVX-512 core
// OpenBLAS's own call runs 152 GFLOP/s, 512-tiles 129, 256-tiles 112).
inline int64_t BlasTile(int64_t extent) {
  return extent <= 256 ? 128 : extent <= 1024 ? 256 : 512;
}

// C (m x n) = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n.
void TiledSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc);

// The upper triangle of C (n x n) = alpha op(A) op(A)^T + beta C, op(A)
// n x k (A^T when `trans`); the lower triangle is not written.
void TiledSsyrkUpper(bool trans, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     float beta, float* c, int64_t ldc);

// C (m x n) = alpha S B + beta C (`left`, S m x m) or alpha B S + beta C
// (S n x n), S read from its upper triangle only.
void TiledSsymmUpper(bool left, int64_t m, int64_t n, float alpha, const float* s, int64_t lds,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_BLAS_TILES_H_
