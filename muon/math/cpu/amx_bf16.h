// Bf16 matrix products on Intel AMX tiles (Sapphire Rapids and later), for
// the CPU backend's native bf16 Newton-Schulz: bf16 operands, fp32 sums, one
// rounding of alpha L R + beta C to bf16 (round to nearest even).
//
// How: both operands are packed into tile order (L as 16 x 32 bf16 tiles,
// R as 16 x 16 bf16 pairs, the layout TDPBF16PS reads), zero-padded to
// multiples of 32; the product runs in blocks of the output (at most 256 x
// 256, fp32, in a per-thread buffer) over k in chunks of 256, 2 x 2 tiles at a
// time; each block is then scaled, added to beta C, rounded and stored. A
// symmetric product multiplies only the 32 x 32 pieces on and above the
// diagonal and mirrors the rest, so its result is exactly symmetric.
//
// Each element's sum runs over k in the same order whatever the thread count
// or blocking: results do not depend on the threads. Every function runs on
// the calling thread's OpenMP team (`threads` threads) and is reentrant.
#ifndef MUON_MATH_CPU_AMX_BF16_H_
#define MUON_MATH_CPU_AMX_BF16_H_

#include <cstddef>
#include <cstdint>

namespace muon {
namespace cpu {

// A bf16 matrix operand seen row-major: element (i, j) is data[i * ld + j],
// or data[j * ld + i] when `transposed`.
struct AmxOperand {
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
struct AmxProduct {
  int64_t rows = 0, cols = 0, k = 0;
  AmxOperand left, right;
  float alpha = 1.0f, beta = 0.0f;
  const uint16_t* c = nullptr;
  int64_t ld_c = 0;
  uint16_t* out = nullptr;
  int64_t ld_out = 0;
  bool symmetric = false;
};

// Whether this CPU has AMX tiles with bf16, AVX512-BF16, and the kernel lets
// this process use the tile state (asked once, for the whole process).
bool AmxBf16Usable();

// The working memory AmxMultiply needs for `p` with `threads` threads.
size_t AmxWorkspaceBytes(const AmxProduct& p, int threads);

// Runs `p` with up to `threads` OpenMP threads (no more than output blocks;
// one for products of at most 2^26 multiply-adds) and `workspace` (at least
// AmxWorkspaceBytes(p, threads) bytes, 64-byte aligned). Requires
// AmxBf16Usable(); all sizes positive.
void AmxMultiply(const AmxProduct& p, void* workspace, int threads);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_AMX_BF16_H_
