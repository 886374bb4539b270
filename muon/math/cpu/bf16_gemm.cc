#include "muon/math/cpu/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "muon/math/cpu/bf16_kernels.h"
#include "muon/math/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own
// _mm512_undefined_epi32() when inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace muon {
namespace cpu {

#if defined(__x86_64__) && defined(__linux__)

// Only the functions below carry the AVX-512 instruction sets (both kernels'
// CPUs have them), and only after Bf16KernelRuns() does anything call them.
#define MUON_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

// Products of at most this many multiply-adds run on one thread: a sleeping
// team's wake-up costs more than a second thread saves (AMX: 400^3, about
// 0.05 ms on one core; at 512^3 a second thread already pays within a step:
// Llama-3 8B / 8's step at two threads 62.0 ms with 512^3 on one thread, 58.7
// without). AVX512-BF16 multiplies several times slower: a smaller bound.
constexpr int64_t kSmallProductAmx = int64_t{1} << 26;
constexpr int64_t kSmallProductAvx512 = int64_t{1} << 24;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The packed sizes: rows and cols padded to 32, k to tiles of 32.
struct Geometry {
  int64_t rows_p, cols_p, k_tiles;
  size_t left_elems, right_elems;
  int64_t blocks_down, blocks_across;
};

Geometry GeometryOf(const Bf16Product& p) {
  Geometry g;
  g.rows_p = RoundUp(p.rows, 32);
  g.cols_p = RoundUp(p.cols, 32);
  g.k_tiles = RoundUp(p.k, 32) / 32;
  g.left_elems = static_cast<size_t>(g.rows_p / kTile * g.k_tiles * kTileElems);
  g.right_elems = static_cast<size_t>(g.cols_p / kTile * g.k_tiles * kTileElems);
  g.blocks_down = (g.rows_p + kBlock - 1) / kBlock;
  g.blocks_across = (g.cols_p + kBlock - 1) / kBlock;
  return g;
}

constexpr size_t kBlockBytes = static_cast<size_t>(kBlock * kBlock) * sizeof(float);

size_t Align64(size_t v) { return (v + 63) / 64 * 64; }

struct Workspace {
  uint16_t* left;
  uint16_t* right;
  float* blocks;  // kBlock x kBlock fp32 per thread, tile by tile
};

Workspace Carve(const Geometry& g, void* workspace) {
  auto* base = static_cast<char*>(workspace);
  Workspace w;
  w.left = reinterpret_cast<uint16_t*>(base);
  base += Align64(g.left_elems * sizeof(uint16_t));
  w.right = reinterpret_cast<uint16_t*>(base);
  base += Align64(g.right_elems * sizeof(uint16_t));
  w.blocks = reinterpret_cast<float*>(base);
  return w;
}

MUON_AVX512 inline __mmask32 Mask32(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : (n <= 0 ? 0 : (__mmask32{1} << n) - 1);
}

// A left tile from a row-major matrix: 16 rows (`rows` valid) of 32 k
// (`k` valid) starting at src; invalid elements zero.
MUON_AVX512 void LeftTileFromRows(const uint16_t* src, int64_t ld, int64_t rows, int64_t k,
                               uint16_t* tile) {
  const __mmask32 mask = Mask32(k);
  for (int64_t r = 0; r < kTile; ++r) {
    const __m512i v = r < rows ? _mm512_maskz_loadu_epi16(mask, src + r * ld) : _mm512_setzero_si512();
    _mm512_store_si512(tile + r * 32, v);
  }
}

// Two right tiles in pair order from a row-major matrix: k rows (`k` valid)
// of 32 columns (`cols` valid) starting at src, the first 16 columns to
// `tile`, the next 16 to `next`; tile row q holds rows 2q and 2q + 1
// interleaved.
MUON_AVX512 void RightTilesFromRows(const uint16_t* src, int64_t ld, int64_t k, int64_t cols,
                                 uint16_t* tile, uint16_t* next) {
  const __mmask32 mask = Mask32(cols);
  const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                       8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (int64_t q = 0; q < kTile; ++q) {
    const __m512i even =
        2 * q < k ? _mm512_maskz_loadu_epi16(mask, src + 2 * q * ld) : _mm512_setzero_si512();
    const __m512i odd =
        2 * q + 1 < k ? _mm512_maskz_loadu_epi16(mask, src + (2 * q + 1) * ld) : _mm512_setzero_si512();
    _mm512_store_si512(tile + q * 32, _mm512_permutex2var_epi16(even, low, odd));
    _mm512_store_si512(next + q * 32, _mm512_permutex2var_epi16(even, high, odd));
  }
}

// dst = src transposed as a 16 x 16 matrix of 32-bit words. A left tile's
// word (r, q) is the pair (2q, 2q + 1) of row r; a right tile's word (q, c)
// the pair of column c: the transposed tile is the other kind.
MUON_AVX512 void TransposeWords(const uint16_t* src, uint16_t* dst) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(src + i * 32);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + c], lane l: rows 4i..4i+3 of column 4l + c.
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_store_si512(dst + (0 + c) * 32, _mm512_shuffle_i32x4(v0, w0, 0x88));
    _mm512_store_si512(dst + (8 + c) * 32, _mm512_shuffle_i32x4(v0, w0, 0xDD));
    _mm512_store_si512(dst + (4 + c) * 32, _mm512_shuffle_i32x4(v1, w1, 0x88));
    _mm512_store_si512(dst + (12 + c) * 32, _mm512_shuffle_i32x4(v1, w1, 0xDD));
  }
}

// One operand to pack: the tiles of its 32-row (left form) or 32-column
// (right form) pairs of groups, k tile by k tile. An operand stored with k
// contiguous gives left tiles by copying rows, one stored with its other
// dimension contiguous gives right tiles by interleaving row pairs; the other
// form is the word transpose. `extent` is its size in the group dimension.
struct Packing {
  Bf16Operand o;
  bool k_contiguous, left_form;
  int64_t extent, k, k_tiles, pairs;
  uint16_t* out;  // group g's tile t at (g * k_tiles + t) tiles

  int64_t Units() const { return pairs * k_tiles; }
};

// Unit u of `pk`: one k tile of one pair of groups. Units run along the
// stored rows: pair by pair (each pair's k tiles along its rows) when k is
// contiguous, k tile by k tile (each tile's pairs along its rows) otherwise.
MUON_AVX512 void PackUnit(const Packing& pk, int64_t u) {
  alignas(64) uint16_t scratch[2][kTileElems];
  const int64_t pair = pk.k_contiguous ? u / pk.k_tiles : u % pk.pairs;
  const int64_t t = pk.k_contiguous ? u % pk.k_tiles : u / pk.pairs;
  const bool direct = pk.k_contiguous == pk.left_form;
  const Bf16Operand& o = pk.o;
  const int64_t e0 = pair * 32, p0 = t * 32;
  uint16_t* tile = pk.out + (2 * pair * pk.k_tiles + t) * kTileElems;
  uint16_t* next = tile + pk.k_tiles * kTileElems;
  uint16_t* first = direct ? tile : scratch[0];
  uint16_t* second = direct ? next : scratch[1];
  if (pk.k_contiguous) {
    LeftTileFromRows(o.data + e0 * o.ld + p0, o.ld, pk.extent - e0, pk.k - p0, first);
    LeftTileFromRows(o.data + (e0 + kTile) * o.ld + p0, o.ld, pk.extent - e0 - kTile, pk.k - p0,
                     second);
  } else {
    RightTilesFromRows(o.data + p0 * o.ld + e0, o.ld, pk.k - p0, pk.extent - e0, first, second);
  }
  if (!direct) {
    TransposeWords(scratch[0], tile);
    TransposeWords(scratch[1], next);
  }
}

// One output block: rows [i0, i0 + rb), cols [j0, j0 + cb) of the padded
// product, its sums into `acc` by the kernel (tile (u, v) at acc + (u *
// kBlock / 16 + v) * 256), then alpha acc + beta c rounded into out (only the
// part on and above the diagonal when symmetric).
MUON_AVX512 void RunBlock(const Bf16Product& p, const Geometry& g, const Workspace& w,
                          BlockSums sums, int64_t i0, int64_t j0, float* acc) {
  const int64_t rb = std::min(kBlock, g.rows_p - i0);
  const int64_t cb = std::min(kBlock, g.cols_p - j0);
  const bool diagonal = p.symmetric && i0 == j0;
  sums(w.left + i0 / kTile * g.k_tiles * kTileElems, w.right + j0 / kTile * g.k_tiles * kTileElems,
       g.k_tiles, rb, cb, diagonal, acc);
  // The epilogue, row by row: alpha acc + beta c, rounded, to out, 32
  // columns (one 64-byte line) per store; on the diagonal only columns >= row.
  const __m512 alpha = _mm512_set1_ps(p.alpha);
  const __m512 beta = _mm512_set1_ps(p.beta);
  const bool with_c = p.beta != 0.0f;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i lane_high = _mm512_add_epi32(lane, _mm512_set1_epi32(16));
  for (int64_t i = 0; i < std::min(rb, p.rows - i0); ++i) {
    const int64_t row = i0 + i;
    const float* acc_row = acc + (i / kTile * (kBlock / kTile)) * 256 + i % kTile * kTile;
    for (int64_t j = diagonal ? i / 32 * 32 : 0; j < std::min(cb, p.cols - j0); j += 32) {
      const int64_t col = j0 + j;
      __mmask32 mask = Mask32(p.cols - col);
      if (diagonal && col < row + 1) {  // the 32 columns reach the diagonal
        const __m512i from = _mm512_set1_epi32(static_cast<int>(row - col));
        const __mmask32 upper = static_cast<__mmask32>(_mm512_cmpge_epi32_mask(lane, from)) |
                                static_cast<__mmask32>(_mm512_cmpge_epi32_mask(lane_high, from))
                                    << 16;
        mask &= upper;
      }
      const float* tile = acc_row + j / kTile * 256;  // the next tile's row 256 floats on
      __m512 lo = _mm512_mul_ps(alpha, _mm512_load_ps(tile));
      __m512 hi = _mm512_mul_ps(alpha, _mm512_load_ps(tile + 256));
      if (with_c) {
        const __m512i c16 = _mm512_maskz_loadu_epi16(mask, p.c + row * p.ld_c + col);
        const __m512 c_lo = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(c16)), 16));
        const __m512 c_hi = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(c16, 1)), 16));
        lo = _mm512_fmadd_ps(beta, c_lo, lo);
        hi = _mm512_fmadd_ps(beta, c_hi, hi);
      }
      const __m512i both = _mm512_inserti64x4(
          _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(lo)), (__m256i)_mm512_cvtneps_pbh(hi), 1);
      _mm512_mask_storeu_epi16(p.out + row * p.ld_out + col, mask, both);
    }
  }
}

// The mirror of a symmetric product's block (i0, j0), once its part on and
// above the diagonal is in out: out(j, i) = out(i, j) for j > i. A 32 x 32
// piece above the diagonal moves as two right tiles of its rows (row pairs
// interleaved), word-transposed: each tile row is then one mirrored row of 32
// elements, one 64-byte store. Pieces on the diagonal move element by element.
MUON_AVX512 void MirrorBlock(const Bf16Product& p, int64_t i0, int64_t j0) {
  alignas(64) uint16_t pairs[2][kTileElems];
  alignas(64) uint16_t mirrored[kTileElems];
  const int64_t rows = std::min(kBlock, p.rows - i0), cols = std::min(kBlock, p.cols - j0);
  const int64_t ld = p.ld_out;
  for (int64_t i = 0; i < rows; i += 32) {
    const int64_t row0 = i0 + i, row_count = std::min<int64_t>(32, rows - i);
    for (int64_t j = 0; j < cols; j += 32) {
      const int64_t col0 = j0 + j, col_count = std::min<int64_t>(32, cols - j);
      if (col0 + col_count <= row0 + 1) continue;  // nothing above the diagonal
      if (col0 < row0 + row_count) {  // crosses the diagonal: element by element
        for (int64_t r = 0; r < row_count; ++r) {
          for (int64_t c = std::max<int64_t>(row0 + r + 1 - col0, 0); c < col_count; ++c) {
            p.out[(col0 + c) * ld + row0 + r] = p.out[(row0 + r) * ld + col0 + c];
          }
        }
        continue;
      }
      RightTilesFromRows(p.out + row0 * ld + col0, ld, row_count, col_count, pairs[0], pairs[1]);
      const __mmask32 rows_mask = Mask32(row_count);
      for (int half = 0; half < 2; ++half) {
        TransposeWords(pairs[half], mirrored);
        for (int64_t c = 0; c < std::min<int64_t>(kTile, col_count - half * kTile); ++c) {
          _mm512_mask_storeu_epi16(p.out + (col0 + half * kTile + c) * ld + row0, rows_mask,
                                   _mm512_load_si512(mirrored + c * 32));
        }
      }
    }
  }
}

}  // namespace

size_t Bf16WorkspaceBytes(const Bf16Product& p, int threads) {
  const Geometry g = GeometryOf(p);
  return Align64(g.left_elems * sizeof(uint16_t)) + Align64(g.right_elems * sizeof(uint16_t)) +
         static_cast<size_t>(std::max(threads, 1)) * kBlockBytes;
}

bool Bf16KernelRuns(Bf16Kernel kernel) {
  const uint32_t need = FeaturesFor(kernel == Bf16Kernel::kAmx ? Bf16Engine::kAmx
                                                                 : Bf16Engine::kAvx512Bf16);
  return (Features() & need) == need;
}

void Bf16Multiply(Bf16Kernel kernel, const Bf16Product& p, void* workspace, int threads) {
  const bool amx = kernel == Bf16Kernel::kAmx;
  const BlockSums sums = amx ? AmxBlockSums : Avx512Bf16BlockSums;
  const Geometry g = GeometryOf(p);
  const Workspace w = Carve(g, workspace);
  // left(i, p) = data[i ld + p] unless transposed; right(p, j) =
  // data[p ld + j] unless transposed.
  const Packing left{p.left, !p.left.transposed, true, p.rows, p.k, g.k_tiles, g.rows_p / 32,
                     w.left};
  const Packing right{p.right, p.right.transposed, false, p.cols, p.k, g.k_tiles, g.cols_p / 32,
                      w.right};
  // Output blocks, upper ones only when symmetric.
  const int64_t blocks = g.blocks_down * g.blocks_across;
  const int64_t computed =
      p.symmetric ? g.blocks_down * (g.blocks_down + 1) / 2 : blocks;
  // No more threads than blocks: a one-block product (256 wide or less) runs
  // on the calling thread alone instead of waking a team for nothing; so does
  // a small product.
  const bool small = p.rows * p.cols * p.k <= (amx ? kSmallProductAmx : kSmallProductAvx512);
  const int team =
      small ? 1 : static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, computed)));
#pragma omp parallel num_threads(team)
  {
    float* acc = w.blocks + static_cast<size_t>(omp_get_thread_num()) * (kBlock * kBlock);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < left.Units() + right.Units(); ++u) {
      if (u < left.Units()) {
        PackUnit(left, u);
      } else {
        PackUnit(right, u - left.Units());
      }
    }
    if (amx) AmxBegin();
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t bi = b / g.blocks_across, bj = b % g.blocks_across;
      if (p.symmetric && bj < bi) continue;
      RunBlock(p, g, w, sums, bi * kBlock, bj * kBlock, acc);
      if (p.symmetric) MirrorBlock(p, bi * kBlock, bj * kBlock);
    }
    if (amx) AmxEnd();
  }
}

#else  // not x86-64 Linux

bool Bf16KernelRuns(Bf16Kernel) { return false; }
size_t Bf16WorkspaceBytes(const Bf16Product&, int) { return 0; }
void Bf16Multiply(Bf16Kernel, const Bf16Product&, void*, int) {}

#endif

}  // namespace cpu
}  // namespace muon
