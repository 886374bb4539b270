// The inner kernels of bf16_gemm.h: one output block's fp32 sums from the
// packed operands, on AMX tiles or on AVX512-BF16. Internal to bf16_gemm.cc.
//
// Packed operands: groups of 16 rows (left) or 16 columns (right), each group
// k_tiles tiles of 32 k in a row (group g's tile t at (g * k_tiles + t) *
// kTileElems). A left tile is 16 rows of 32 k; a right tile is 16 rows of
// pairs: row q holds (k 2q, k 2q + 1) for each of its 16 columns.
//
// A block's sums (at most kBlock x kBlock fp32) are kept tile by tile: the
// 16 x 16 tile (u, v) at acc + (u * kBlock / 16 + v) * 256, row-major.
#ifndef MUON_MATH_CPU_BF16_KERNELS_H_
#define MUON_MATH_CPU_BF16_KERNELS_H_

#include <cstdint>

namespace muon {
namespace cpu {

constexpr int64_t kTile = 16;        // tile rows; a tile row is 32 bf16 (64 bytes)
constexpr int64_t kTileElems = 512;  // bf16 per packed operand tile (1 KiB)
constexpr int64_t kBlock = 256;      // output block edge, elements
constexpr int64_t kChunk = 8;        // k tiles (of 32) per pass over a block

// The sums of an rb x cb block (multiples of 32) over all k_tiles into acc;
// `left` and `right` point at the block's first group. With `diagonal` (a
// symmetric product's block on the diagonal) only the sums on and above the
// diagonal need be right (the epilogue reads no other).
using BlockSums = void (*)(const uint16_t* left, const uint16_t* right, int64_t k_tiles,
                           int64_t rb, int64_t cb, bool diagonal, float* acc);

void AmxBlockSums(const uint16_t* left, const uint16_t* right, int64_t k_tiles, int64_t rb,
                  int64_t cb, bool diagonal, float* acc);
// Around a thread's AMX blocks: the tile configuration, then its release.
void AmxBegin();
void AmxEnd();

void Avx512Bf16BlockSums(const uint16_t* left, const uint16_t* right, int64_t k_tiles,
                         int64_t rb, int64_t cb, bool diagonal, float* acc);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_BF16_KERNELS_H_
