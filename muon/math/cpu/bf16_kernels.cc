#include "muon/math/cpu/bf16_kernels.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace muon {
namespace cpu {

#if defined(__x86_64__) && defined(__linux__)

// Only these functions carry the AMX and AVX512-BF16 instruction sets, and
// only after Bf16KernelRuns() does anything call them.
#define MUON_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define MUON_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

// The tile configuration: tiles 0-3 the 2 x 2 fp32 accumulators, 4-5 two
// left tiles, 6-7 two right tiles; every tile 16 rows of 64 bytes. A constant
// (GCC 12 drops stores into a local configuration that only LDTILECFG reads).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
constexpr TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

// acc (32 x 32 fp32: four 16 x 16 tiles at acc, acc + 256, acc + across,
// acc + across + 256) += left groups (2 from `left`) x right groups (2 from
// `right`) over k tiles [t0, t0 + tiles); starts from zero when `first`.
MUON_AMX inline void Kernel(const uint16_t* left, const uint16_t* right, int64_t k_tiles, int64_t t0,
                     int64_t tiles, bool first, float* acc, int64_t across) {
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, acc, 64);
    _tile_loadd(1, acc + 256, 64);
    _tile_loadd(2, acc + across, 64);
    _tile_loadd(3, acc + across + 256, 64);
  }
  const uint16_t* a0 = left + t0 * kTileElems;
  const uint16_t* a1 = a0 + k_tiles * kTileElems;
  const uint16_t* b0 = right + t0 * kTileElems;
  const uint16_t* b1 = b0 + k_tiles * kTileElems;
  // Software-pipelined: tiles are not renamed, so the next step's loads go
  // right after the last product reading each register.
  _tile_loadd(4, a0, 64);
  _tile_loadd(6, b0, 64);
  _tile_loadd(5, a1, 64);
  _tile_loadd(7, b1, 64);
  for (int64_t t = 1; t < tiles; ++t) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(4, a0 + t * kTileElems, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(6, b0 + t * kTileElems, 64);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(5, a1 + t * kTileElems, 64);
    _tile_loadd(7, b1 + t * kTileElems, 64);
  }
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
  _tile_stored(0, acc, 64);
  _tile_stored(1, acc + 256, 64);
  _tile_stored(2, acc + across, 64);
  _tile_stored(3, acc + across + 256, 64);
}


// acc's kRows x (16 ng) sums at rows [0, kRows) of `left` (a left tile's
// rows r0..), columns of ng right groups, += (or =, when `first`) the sums
// over k tiles [t0, t0 + tiles): per k pair, ng rows of right pairs times
// each row's broadcast pair of left, in kRows ng registers.
template <int NG, int kRows>
MUON_AVX512_BF16 inline void DotKernel(const uint16_t* left, const uint16_t* right,
                                       int64_t k_tiles, int64_t t0, int64_t tiles, bool first,
                                       float* acc) {
  __m512 sums[kRows][NG];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < NG; ++g) sums[r][g] = _mm512_setzero_ps();
  }
  for (int64_t t = t0; t < t0 + tiles; ++t) {
    const auto* a = reinterpret_cast<const int32_t*>(left + t * kTileElems);
    const uint16_t* b = right + t * kTileElems;
    for (int q = 0; q < 16; ++q) {
      __m512bh pairs[NG];
#pragma GCC unroll 3
      for (int g = 0; g < NG; ++g) {
        pairs[g] = (__m512bh)_mm512_load_si512(b + g * k_tiles * kTileElems + q * 32);
      }
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        const __m512bh x = (__m512bh)_mm512_set1_epi32(a[r * 16 + q]);
#pragma GCC unroll 3
        for (int g = 0; g < NG; ++g) sums[r][g] = _mm512_dpbf16_ps(sums[r][g], x, pairs[g]);
      }
    }
  }
  // Row r of tile v: acc + v * 256 + r * 16.
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < NG; ++g) {
      float* at = acc + g * 256 + r * 16;
      _mm512_store_ps(at, first ? sums[r][g] : _mm512_add_ps(_mm512_load_ps(at), sums[r][g]));
    }
  }
}

}  // namespace

MUON_AMX void AmxBegin() { _tile_loadconfig(&kTileConfig); }

MUON_AMX void AmxEnd() { _tile_release(); }

MUON_AMX void AmxBlockSums(const uint16_t* left, const uint16_t* right, int64_t k_tiles,
                           int64_t rb, int64_t cb, bool diagonal, float* acc) {
  const int64_t across = kBlock / kTile * 256;  // floats from tile row u to u + 1
  for (int64_t t0 = 0; t0 < k_tiles; t0 += kChunk) {
    const int64_t tiles = std::min(kChunk, k_tiles - t0);
    for (int64_t i = 0; i < rb; i += 32) {
      const uint16_t* l = left + i / kTile * k_tiles * kTileElems;
      for (int64_t j = diagonal ? i : 0; j < cb; j += 32) {
        const uint16_t* r = right + j / kTile * k_tiles * kTileElems;
        Kernel(l, r, k_tiles, t0, tiles, t0 == 0, acc + (i / kTile * (kBlock / kTile) + j / kTile) * 256,
               across);
      }
    }
  }
}

// Micro tiles of 8 rows x 48 columns (the last of a block 16 or 32 wide;
// 16 rows x 16 columns when 16 wide, so that 16 sums, not 8, hide
// VDPBF16PS's latency: 451 against 340 GFLOP/s on an AMD Zen 5 core),
// columns outer: a micro panel of right (48 columns x 512 k, 48 KiB: L1's
// size on Zen 5, kept there or in L2) is reused while the block's rows
// stream past it. On the diagonal of a symmetric
// product, micro tiles wholly below it are skipped. k runs in chunks of
// kAvx512Chunk tiles: fewer passes over the block's sums than kChunk's
// (GPT-2's step about 3% faster on that core).
constexpr int64_t kAvx512Chunk = 2 * kChunk;

MUON_AVX512_BF16 void Avx512Bf16BlockSums(const uint16_t* left, const uint16_t* right,
                                          int64_t k_tiles, int64_t rb, int64_t cb, bool diagonal,
                                          float* acc) {
  for (int64_t t0 = 0; t0 < k_tiles; t0 += kAvx512Chunk) {
    const int64_t tiles = std::min(kAvx512Chunk, k_tiles - t0);
    for (int64_t j = 0; j < cb; j += 48) {
      const int64_t groups = std::min<int64_t>(3, (cb - j) / kTile);
      const uint16_t* r = right + j / kTile * k_tiles * kTileElems;
      for (int64_t i = 0; i < rb; i += groups == 1 ? 16 : 8) {
        if (diagonal && j + groups * kTile <= i) continue;  // every column below every row
        const uint16_t* l = left + (i / kTile * k_tiles) * kTileElems + i % kTile * 32;
        float* a = acc + (i / kTile * (kBlock / kTile) + j / kTile) * 256 + i % kTile * kTile;
        switch (groups) {
          case 3: DotKernel<3, 8>(l, r, k_tiles, t0, tiles, t0 == 0, a); break;
          case 2: DotKernel<2, 8>(l, r, k_tiles, t0, tiles, t0 == 0, a); break;
          default: DotKernel<1, 16>(l, r, k_tiles, t0, tiles, t0 == 0, a); break;
        }
      }
    }
  }
}

#else  // not x86-64 Linux

void AmxBegin() {}
void AmxEnd() {}
void AmxBlockSums(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, bool, float*) {}
void Avx512Bf16BlockSums(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, bool,
                         float*) {}

#endif

}  // namespace cpu
}  // namespace muon
