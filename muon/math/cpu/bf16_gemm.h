// Bf16 matrix products for the CPU backend's native bf16 Newton-Schulz: bf16
// operands, fp32 sums, one rounding of alpha L R + beta C to bf16 (round to
// nearest even). Two kernels over one driver:
//   - kAmx: Intel AMX tiles (Sapphire Rapids and later), 2 x 2 tiles of
//     16 x 16 fp32 sums per step (TDPBF16PS);
//   - kAvx512Bf16: AVX512-BF16 (AMD Zen 4/5, Intel Cooper Lake, any AVX512-BF16
//     CPU without AMX), 8 rows x 48 columns of fp32 sums in 24 registers per
//     step (VDPBF16PS).
//
// How: both operands are packed into tile order (L as 16 x 32 bf16 tiles,
// R as 16 x 16 bf16 pairs: the layout TDPBF16PS reads, and the one whose rows
// VDPBF16PS multiplies by a broadcast pair of L), zero-padded to multiples of
// 32; the product runs in blocks of the output (at most 256 x 256, fp32, in a
// per-thread buffer) over k in chunks (256 on AMX, 512 on AVX512-BF16); each
// block is then scaled, added to beta C, rounded and stored. A symmetric
// product computes only the pieces on and above the diagonal and mirrors the
// rest, so its result is exactly symmetric.
//
// Each element's sum runs over k in the same order whatever the thread count
// or blocking: results do not depend on the threads. Every function runs on
// the calling thread's OpenMP team (`threads` threads) and is reentrant.
#ifndef MUON_MATH_CPU_BF16_GEMM_H_
#define MUON_MATH_CPU_BF16_GEMM_H_

#include <cstddef>
#include <cstdint>

namespace muon {
namespace cpu {

// A bf16 matrix operand seen row-major: element (i, j) is data[i * ld + j],
// or data[j * ld + i] when `transposed`.
struct Bf16Operand {
  const uint16_t* data = nullptr;
  int64_t ld = 0;
  bool transposed = false;
};

// out (rows x cols, row-major, leading dimension ld_out) =
//   bf16(alpha * left right + beta * c),
// left rows x k, right k x cols, c rows x cols (leading dimension ld_c, read
// only when beta != 0; it may be `out` itself with the same leading
// dimension). `out` must not overlap left or right. With `symmetric`, rows ==
// cols and both left right and c are symmetric: only the part on and above
// the diagonal is computed and the rest mirrored from it.
struct Bf16Product {
  int64_t rows = 0, cols = 0, k = 0;
  Bf16Operand left, right;
  float alpha = 1.0f, beta = 0.0f;
  const uint16_t* c = nullptr;
  int64_t ld_c = 0;
  uint16_t* out = nullptr;
  int64_t ld_out = 0;
  bool symmetric = false;
};

enum class Bf16Kernel { kAmx, kAvx512Bf16 };

// Whether this CPU runs `kernel` (cpu_features.h's Features(): the mask
// applies).
bool Bf16KernelRuns(Bf16Kernel kernel);

// The working memory Bf16Multiply needs for `p` with `threads` threads.
size_t Bf16WorkspaceBytes(const Bf16Product& p, int threads);

// Runs `p` on `kernel` with up to `threads` OpenMP threads (no more than
// output blocks; one for small products) and `workspace` (at least
// Bf16WorkspaceBytes(p, threads) bytes, 64-byte aligned). Requires
// Bf16KernelRuns(kernel); all sizes positive. Both kernels give the same
// bits whenever their sums are exact in fp32; otherwise only the order of
// the fp32 sums differs.
void Bf16Multiply(Bf16Kernel kernel, const Bf16Product& p, void* workspace, int threads);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_BF16_GEMM_H_
