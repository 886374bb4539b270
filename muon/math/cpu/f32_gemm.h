// fp32 matrix products on AVX-512 for the CPU backend's fp32 products
// (f32_products.h chooses between this kernel and OpenBLAS): fp32 operands,
// fp32 sums, alpha L R + beta C.
//
// Why a kernel of our own: where OpenBLAS runs its AVX2 kernels on an
// AVX-512 CPU (OPENBLAS_CORETYPE=Haswell, set on many machines because older
// OpenBLAS builds miscompute on some processors, or an OpenBLAS that does not
// know the CPU), its products run at half the CPU's fp32 rate: measured on an
// AMD Zen 5 core, OpenBLAS 0.3.21 (Haswell kernels) 120 GFLOP/s, this kernel
// 230 (BENCHMARKS.md). Where OpenBLAS runs its own AVX-512 kernels, they run
// one thread per call in tiles (for the same bits at any thread count) and
// fp32 Newton-Schulz on them took 1.05-1.2x the kernel's time (an Intel
// Xeon, 1 and 2 threads). oneDNN's sgemm is as fast but splits a product's
// sums by its thread count (its results change with the threads; libmuon's
// must not) and has no symmetric product.
//
// How: both operands are packed into panels of 16 (rows of the left, columns
// of the right), each panel k rows of 16 floats, zero-padded to a multiple
// of 16, stored chunk by chunk of 256 k (a block's part of a chunk is one
// contiguous run); the product runs in blocks of the output (at most 256 x
// 256, fp32 sums in a per-thread buffer) over k in those chunks, 8 rows x 48
// columns of sums in 24 registers per step (VFMADD231PS with a broadcast
// left element), each step prefetching into L2 the data of the steps after
// it (from L3 the hardware prefetchers fell behind: 77% of the FMA peak at
// k = 4096 against 90% at 1024, measured on an Intel Xeon core; on one
// thread, whose next block is known, the last chunk of a block prefetches
// the next block's first); each block is then scaled, added to beta C and
// stored, each row's stores prefetching the lines of a row further on. A
// symmetric product computes only the blocks on and above the diagonal and
// mirrors them, so its result is exactly symmetric; its two operands (Y and
// Y^T, one matrix read two ways) are packed once.
//
// Each element's sum runs over k in the same order whatever the thread count
// or blocking: results do not depend on the threads. Every function runs on
// the calling thread's OpenMP team (`threads` threads) and is reentrant.
#ifndef MUON_MATH_CPU_F32_GEMM_H_
#define MUON_MATH_CPU_F32_GEMM_H_

#include <cstddef>
#include <cstdint>

namespace muon {
namespace cpu {

// An fp32 matrix operand seen row-major: element (i, j) is data[i * ld + j],
// or data[j * ld + i] when `transposed`.
struct F32Operand {
  const float* data = nullptr;
  int64_t ld = 0;
  bool transposed = false;
};

// out (rows x cols, row-major, leading dimension ld_out) =
//   alpha * left right + beta * c,
// left rows x k, right k x cols, c rows x cols (leading dimension ld_c, read
// only when beta != 0; it may be `out` itself with the same leading
// dimension). `out` must not overlap left or right. With `symmetric`, rows ==
// cols and both left right and c are symmetric: only the part on and above
// the diagonal is computed (and of c read) and the rest mirrored from it.
struct F32Product {
  int64_t rows = 0, cols = 0, k = 0;
  F32Operand left, right;
  float alpha = 1.0f, beta = 0.0f;
  const float* c = nullptr;
  int64_t ld_c = 0;
  float* out = nullptr;
  int64_t ld_out = 0;
  bool symmetric = false;
};

// Whether this CPU runs the kernel (cpu_features.h's Features(), the mask
// included: AVX-512).
bool F32KernelRuns();

// The working memory F32Multiply needs for `p` with `threads` threads.
size_t F32WorkspaceBytes(const F32Product& p, int threads);

// Runs `p` with up to `threads` OpenMP threads (no more than output blocks;
// one for small products) and `workspace` (at least F32WorkspaceBytes(p,
// threads) bytes, 64-byte aligned). Requires F32KernelRuns(); all sizes
// positive.
void F32Multiply(const F32Product& p, void* workspace, int threads);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_F32_GEMM_H_
