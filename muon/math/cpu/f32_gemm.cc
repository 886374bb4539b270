#include "muon/math/cpu/f32_gemm.h"

#include <omp.h>

#include <algorithm>

#include "muon/math/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip -Wuninitialized on their own
// _mm512_undefined_* values when inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace muon {
namespace cpu {

#if defined(__x86_64__) && defined(__linux__)

// Only the functions below carry AVX-512, and only after F32KernelRuns()
// does anything call them.
#define MUON_AVX512F __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace {

constexpr int64_t kPanel = 16;   // panel width: one zmm of fp32
// Output block edge (and the leading dimension of a thread's sums); an
// output of at most 256 x 256 runs in blocks of 128, so that a second thread
// has blocks to take. An element's sums run the same whatever the block.
constexpr int64_t kBlock = 256;
constexpr int64_t kSmallBlock = 128;
// k per pass over a block: a micro panel of right (48 columns x 256 k,
// 48 KiB) stays in L1/L2 while the block's rows stream past it.
constexpr int64_t kDepth = 256;
// Products of at most this many multiply-adds run on one thread (a team's
// wake-up costs about what a second thread saves there).
constexpr int64_t kSmallProduct = int64_t{1} << 23;
// Rows ahead that a block's stores prefetch their lines.
constexpr int64_t kStoreAhead = 8;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
size_t Align64(size_t v) { return (v + 63) / 64 * 64; }

// The symmetric product's operands are one matrix read as Y and as Y^T: the
// left panels serve as the right ones.
bool SharesPanels(const F32Product& p) {
  return p.symmetric && p.left.data == p.right.data && p.left.ld == p.right.ld &&
         p.left.transposed != p.right.transposed;
}

struct Geometry {
  int64_t rows_p, cols_p;
  size_t left_floats, right_floats;
  int64_t block;  // kBlock, or kSmallBlock for an output within one kBlock
  int64_t blocks_down, blocks_across;
};

Geometry GeometryOf(const F32Product& p) {
  Geometry g;
  g.rows_p = RoundUp(p.rows, kPanel);
  g.cols_p = RoundUp(p.cols, kPanel);
  g.left_floats = static_cast<size_t>(g.rows_p * p.k);
  g.right_floats = SharesPanels(p) ? 0 : static_cast<size_t>(g.cols_p * p.k);
  g.block = g.rows_p <= kBlock && g.cols_p <= kBlock ? kSmallBlock : kBlock;
  g.blocks_down = (g.rows_p + g.block - 1) / g.block;
  g.blocks_across = (g.cols_p + g.block - 1) / g.block;
  return g;
}

// The packed layout of an operand of `panels` panels (extent [16 q, 16 q +
// 16) for panel q) over k, chunk by chunk of kDepth k: chunk c (k0 = c
// kDepth) holds every panel's k0 .. k0 + depth - 1 (depth = min(kDepth,
// k - k0)), panel after panel, each k of a panel 16 floats: element (e, kk)
// of panel q is at Chunk(k0) + q * depth * 16 + (kk - k0) * 16 + e. A
// block's part of a chunk is one contiguous run, which the products
// prefetch while they compute the chunk before.
inline int64_t ChunkDepth(int64_t k, int64_t k0) { return std::min(kDepth, k - k0); }
inline int64_t ChunkStart(int64_t panels, int64_t k0) { return k0 * panels * kPanel; }

// One operand into panels (the layout above). Element (e, kk) of the source
// is data[kk * ld + e] when the extent is contiguous, else data[e * ld + kk].
// Units: one panel's 16 k.
struct Packing {
  const float* data;
  int64_t ld;
  bool extent_contiguous;
  int64_t extent, k, panels, depth_units;
  float* out;

  int64_t Units() const { return panels * depth_units; }
};

MUON_AVX512F inline __mmask16 Mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF)
                 : (n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1));
}

// rows[c] <- lane r of rows[r], lane c: a 16 x 16 transpose of 32-bit words
// in registers.
MUON_AVX512F void Transpose16(__m512i rows[16]) {
  __m512i pairs[16];
  for (int i = 0; i < 8; ++i) {
    pairs[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    pairs[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  // quads[4 i + c], 128-bit lane L: rows 4 i .. 4 i + 3 of column 4 L + c.
  __m512i quads[16];
  for (int i = 0; i < 4; ++i) {
    quads[4 * i + 0] = _mm512_unpacklo_epi64(pairs[4 * i], pairs[4 * i + 2]);
    quads[4 * i + 1] = _mm512_unpackhi_epi64(pairs[4 * i], pairs[4 * i + 2]);
    quads[4 * i + 2] = _mm512_unpacklo_epi64(pairs[4 * i + 1], pairs[4 * i + 3]);
    quads[4 * i + 3] = _mm512_unpackhi_epi64(pairs[4 * i + 1], pairs[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i even_top = _mm512_shuffle_i32x4(quads[c], quads[4 + c], 0x88);
    const __m512i odd_top = _mm512_shuffle_i32x4(quads[c], quads[4 + c], 0xDD);
    const __m512i even_bottom = _mm512_shuffle_i32x4(quads[8 + c], quads[12 + c], 0x88);
    const __m512i odd_bottom = _mm512_shuffle_i32x4(quads[8 + c], quads[12 + c], 0xDD);
    rows[c] = _mm512_shuffle_i32x4(even_top, even_bottom, 0x88);
    rows[8 + c] = _mm512_shuffle_i32x4(even_top, even_bottom, 0xDD);
    rows[4 + c] = _mm512_shuffle_i32x4(odd_top, odd_bottom, 0x88);
    rows[12 + c] = _mm512_shuffle_i32x4(odd_top, odd_bottom, 0xDD);
  }
}

MUON_AVX512F void PackUnit(const Packing& pk, int64_t u) {
  const int64_t panel = pk.extent_contiguous ? u % pk.panels : u / pk.depth_units;
  const int64_t unit = pk.extent_contiguous ? u / pk.panels : u % pk.depth_units;
  const int64_t e0 = panel * kPanel, k0 = unit * kPanel;
  const int64_t depth = std::min(kPanel, pk.k - k0);
  const int64_t chunk = k0 / kDepth * kDepth;
  float* out = pk.out + ChunkStart(pk.panels, chunk) + panel * ChunkDepth(pk.k, chunk) * kPanel +
               (k0 - chunk) * kPanel;
  if (pk.extent_contiguous) {
    const __mmask16 mask = Mask16(pk.extent - e0);
    for (int64_t kk = 0; kk < depth; ++kk) {
      _mm512_store_ps(out + kk * kPanel,
                      _mm512_maskz_loadu_ps(mask, pk.data + (k0 + kk) * pk.ld + e0));
    }
    return;
  }
  // k contiguous: 16 source rows of 16 k, transposed.
  const __mmask16 mask = Mask16(depth);
  __m512i rows[16];
  for (int64_t e = 0; e < kPanel; ++e) {
    rows[e] = e0 + e < pk.extent
                  ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, pk.data + (e0 + e) * pk.ld + k0))
                  : _mm512_setzero_si512();
  }
  Transpose16(rows);
  for (int64_t kk = 0; kk < depth; ++kk) {
    _mm512_store_ps(out + kk * kPanel, _mm512_castsi512_ps(rows[kk]));
  }
}

// A run of `count` cache lines from `from`.
struct Lines {
  const char* from = nullptr;
  int64_t count = 0;

  // Part `index` of the run cut into `parts` parts of equal length (the
  // last ones shorter or empty).
  Lines Share(int64_t parts, int64_t index) const {
    const int64_t per = (count + parts - 1) / std::max<int64_t>(parts, 1);
    const int64_t first = std::min(count, index * per);
    return {from + first * 64, std::min(per, count - first)};
  }
};

// Cache lines to bring into L2 while a micro tile computes: `lines`, then
// `more`.
struct Prefetch {
  Lines lines, more;
};

// acc's kRows x (16 NG) sums (row-major, leading dimension kBlock) +=, or =
// when `first`, the sums over `depth` k: per k, NG vectors of right times
// each row's broadcast left element. `left` is the k0 row of a left panel,
// offset to the micro tile's first row; `right` the k0 row of its first
// right panel, the next panels `stride` floats on. Every other k it
// prefetches one line of `pf` (the data of the steps after it: from L3 the
// hardware's prefetchers do not run far enough ahead of the FMAs).
template <int NG, int kRows>
MUON_AVX512F inline void Kernel(const float* left, const float* right, int64_t stride,
                                int64_t depth, bool first, float* acc, const Prefetch& pf) {
  __m512 sums[kRows][NG];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < NG; ++g) sums[r][g] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < depth; ++kk) {
    if ((kk & 1) == 0) {
      const int64_t q = kk >> 1;
      if (q < pf.lines.count) {
        _mm_prefetch(pf.lines.from + q * 64, _MM_HINT_T1);
      } else if (q - pf.lines.count < pf.more.count) {
        _mm_prefetch(pf.more.from + (q - pf.lines.count) * 64, _MM_HINT_T1);
      }
    }
    __m512 b[NG];
#pragma GCC unroll 3
    for (int g = 0; g < NG; ++g) b[g] = _mm512_load_ps(right + g * stride + kk * kPanel);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512 x = _mm512_set1_ps(left[kk * kPanel + r]);
#pragma GCC unroll 3
      for (int g = 0; g < NG; ++g) sums[r][g] = _mm512_fmadd_ps(x, b[g], sums[r][g]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
    for (int g = 0; g < NG; ++g) {
      float* at = acc + r * kBlock + g * kPanel;
      _mm512_store_ps(at, first ? sums[r][g] : _mm512_add_ps(_mm512_load_ps(at), sums[r][g]));
    }
  }
}

// A packed operand: its panels and k.
struct PackedOperand {
  const float* data;
  int64_t panels, k;

  // The first float of panel q in the chunk that starts at k0.
  const float* At(int64_t q, int64_t k0) const {
    return data + ChunkStart(panels, k0) + q * ChunkDepth(k, k0) * kPanel;
  }
  // `panels` panels from panel q of the chunk at k0, as cache lines (one
  // line per k of a panel; a chunk's panels lie one after another).
  Lines Run(int64_t q, int64_t k0, int64_t panels_in_run) const {
    return {reinterpret_cast<const char*>(At(q, k0)), panels_in_run * ChunkDepth(k, k0)};
  }
};

// An output block: its first row and column and its extent (multiples of
// 16).
struct BlockSpan {
  int64_t i0, j0, rb, cb;
};

// The sums of block (i0, j0) (rb x cb, multiples of 16) into acc: k chunk
// by chunk, 48 columns (a micro panel of right) at a time, 8 rows at a time
// (16 when the panel is 16 wide: 16 sums in flight, not 8, to cover the
// FMA's latency). On the diagonal, micro tiles wholly below it are skipped.
// While a micro panel computes, its tiles prefetch the next micro panel and
// a share of the block's left part of the next chunk; in the last chunk,
// those of the first chunk of `following` (the block this thread computes
// next, when known).
MUON_AVX512F void BlockSums(const PackedOperand& left, const PackedOperand& right,
                            const BlockSpan& block, bool diagonal, const BlockSpan* following,
                            float* acc) {
  const int64_t i0 = block.i0, j0 = block.j0, rb = block.rb, cb = block.cb;
  const int64_t k = left.k;
  const int64_t steps = (cb + 47) / 48;  // micro panels per chunk
  for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
    const int64_t depth = ChunkDepth(k, k0), stride = depth * kPanel;
    const bool first = k0 == 0;
    const int64_t next = k0 + kDepth;  // the next chunk, when < k
    // The block's part of the next chunk's left operand (or the following
    // block's part of the first).
    Lines left_next;
    if (next < k) {
      left_next = left.Run(i0 / kPanel, next, rb / kPanel);
    } else if (following != nullptr) {
      left_next = left.Run(following->i0 / kPanel, 0, following->rb / kPanel);
    }
    for (int64_t j = 0; j < cb; j += 48) {
      const int64_t groups = std::min<int64_t>(3, (cb - j) / kPanel);
      const int64_t rows = groups == 1 ? 16 : 8;
      const float* r = right.At((j0 + j) / kPanel, k0);
      // What this micro panel's tiles prefetch: the next micro panel (this
      // chunk's, or the next chunk's first) and a share of the next left.
      Lines right_next;
      if (j + 48 < cb) {
        right_next =
            right.Run((j0 + j + 48) / kPanel, k0, std::min<int64_t>(3, (cb - j - 48) / kPanel));
      } else if (next < k) {
        right_next = right.Run(j0 / kPanel, next, std::min<int64_t>(3, cb / kPanel));
      } else if (following != nullptr) {
        right_next =
            right.Run(following->j0 / kPanel, 0, std::min<int64_t>(3, following->cb / kPanel));
      }
      const Lines left_share = left_next.Share(steps, j / 48);
      const int64_t tiles = (diagonal ? std::min(rb, j + groups * kPanel) : rb) / rows;
      int64_t tile = 0;
      for (int64_t i = 0; i < rb; i += rows) {
        if (diagonal && j + groups * kPanel <= i) continue;
        const Prefetch pf{right_next.Share(tiles, tile), left_share.Share(tiles, tile)};
        ++tile;
        const float* l = left.At((i0 + i) / kPanel, k0) + (i0 + i) % kPanel;
        float* a = acc + i * kBlock + j;
        switch (groups) {
          case 3: Kernel<3, 8>(l, r, stride, depth, first, a, pf); break;
          case 2: Kernel<2, 8>(l, r, stride, depth, first, a, pf); break;
          default: Kernel<1, 16>(l, r, stride, depth, first, a, pf); break;
        }
      }
    }
  }
}

// alpha acc + beta c into out for block (i0, j0); on the diagonal only
// columns >= row.
MUON_AVX512F void Store(const F32Product& p, int64_t i0, int64_t j0, int64_t rb, int64_t cb,
                        bool diagonal, const float* acc) {
  const __m512 alpha = _mm512_set1_ps(p.alpha);
  const __m512 beta = _mm512_set1_ps(p.beta);
  const bool with_c = p.beta != 0.0f;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const int64_t rows_here = std::min(rb, p.rows - i0), cols_here = std::min(cb, p.cols - j0);
  for (int64_t i = 0; i < rows_here; ++i) {
    const int64_t row = i0 + i;
    // The lines of the row kStoreAhead on into L1 (from L3 a store waits for
    // its line; a few rows of them in flight keep the stores going).
    if (i + kStoreAhead < rows_here) {
      const char* line = reinterpret_cast<const char*>(p.out + (row + kStoreAhead) * p.ld_out + j0);
      for (int64_t q = 0; q < (cols_here + kPanel - 1) / kPanel; ++q) {
        _mm_prefetch(line + 64 * q, _MM_HINT_T0);
      }
    }
    for (int64_t j = diagonal ? i / kPanel * kPanel : 0; j < cols_here; j += kPanel) {
      const int64_t col = j0 + j;
      __mmask16 mask = Mask16(p.cols - col);
      if (diagonal && col < row + 1) {
        mask &= _mm512_cmpge_epi32_mask(lane, _mm512_set1_epi32(static_cast<int>(row - col)));
      }
      __m512 v = _mm512_mul_ps(alpha, _mm512_load_ps(acc + i * kBlock + j));
      if (with_c) {
        v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, p.c + row * p.ld_c + col), v);
      }
      _mm512_mask_storeu_ps(p.out + row * p.ld_out + col, mask, v);
    }
  }
}

// out(j, i) = out(i, j) for j > i within block (i0, j0) of a symmetric
// product, once its part on and above the diagonal is stored: 16 x 16
// pieces above the diagonal through a register transpose, pieces on it
// element by element.
MUON_AVX512F void Mirror(const F32Product& p, int64_t i0, int64_t j0, int64_t block) {
  const int64_t rows = std::min(block, p.rows - i0), cols = std::min(block, p.cols - j0);
  const int64_t ld = p.ld_out;
  for (int64_t i = 0; i < rows; i += kPanel) {
    const int64_t row0 = i0 + i, row_count = std::min(kPanel, rows - i);
    for (int64_t j = 0; j < cols; j += kPanel) {
      const int64_t col0 = j0 + j, col_count = std::min(kPanel, cols - j);
      if (col0 + col_count <= row0 + 1) continue;  // nothing above the diagonal
      if (col0 < row0 + row_count) {
        for (int64_t r = 0; r < row_count; ++r) {
          for (int64_t c = std::max<int64_t>(row0 + r + 1 - col0, 0); c < col_count; ++c) {
            p.out[(col0 + c) * ld + row0 + r] = p.out[(row0 + r) * ld + col0 + c];
          }
        }
        continue;
      }
      __m512i piece[16];
      const __mmask16 cols_mask = Mask16(col_count);
      for (int64_t r = 0; r < kPanel; ++r) {
        piece[r] = r < row_count ? _mm512_castps_si512(_mm512_maskz_loadu_ps(
                                       cols_mask, p.out + (row0 + r) * ld + col0))
                                 : _mm512_setzero_si512();
      }
      Transpose16(piece);
      const __mmask16 rows_mask = Mask16(row_count);
      for (int64_t c = 0; c < col_count; ++c) {
        _mm512_mask_storeu_ps(p.out + (col0 + c) * ld + row0, rows_mask,
                              _mm512_castsi512_ps(piece[c]));
      }
    }
  }
}

}  // namespace

bool F32KernelRuns() { return (Features() & kFeatureAvx512) != 0; }

size_t F32WorkspaceBytes(const F32Product& p, int threads) {
  const Geometry g = GeometryOf(p);
  return Align64(g.left_floats * sizeof(float)) + Align64(g.right_floats * sizeof(float)) +
         static_cast<size_t>(std::max(threads, 1)) * kBlock * kBlock * sizeof(float);
}

void F32Multiply(const F32Product& p, void* workspace, int threads) {
  const Geometry g = GeometryOf(p);
  auto* base = static_cast<char*>(workspace);
  float* left_panels = reinterpret_cast<float*>(base);
  base += Align64(g.left_floats * sizeof(float));
  float* right_panels = SharesPanels(p) ? left_panels : reinterpret_cast<float*>(base);
  base += Align64(g.right_floats * sizeof(float));
  float* blocks = reinterpret_cast<float*>(base);
  const int64_t depth_units = (p.k + kPanel - 1) / kPanel;
  // left(i, kk) is data[i ld + kk] unless transposed; right(kk, j) is
  // data[kk ld + j] unless transposed.
  const Packing left{p.left.data, p.left.ld, p.left.transposed, p.rows, p.k,
                     g.rows_p / kPanel, depth_units, left_panels};
  const Packing right{p.right.data, p.right.ld, !p.right.transposed, p.cols, p.k,
                      g.cols_p / kPanel, depth_units, right_panels};
  const int64_t right_units = SharesPanels(p) ? 0 : right.Units();
  const int64_t blocks_total = g.blocks_down * g.blocks_across;
  const int64_t computed = p.symmetric ? g.blocks_down * (g.blocks_down + 1) / 2 : blocks_total;
  const bool small = p.rows * p.cols * p.k <= kSmallProduct;
  const int team =
      small ? 1 : static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, computed)));
  auto span_of = [&](int64_t b) {
    const int64_t i0 = b / g.blocks_across * g.block, j0 = b % g.blocks_across * g.block;
    return BlockSpan{i0, j0, std::min(g.block, g.rows_p - i0), std::min(g.block, g.cols_p - j0)};
  };
  // Whether block b is computed: a symmetric product skips those below the
  // diagonal.
  auto computed_block = [&](int64_t b) {
    return !p.symmetric || b % g.blocks_across >= b / g.blocks_across;
  };
  // The block after b that is computed, or blocks_total.
  auto computed_after = [&](int64_t b) {
    do {
      ++b;
    } while (b < blocks_total && !computed_block(b));
    return b;
  };
#pragma omp parallel num_threads(team)
  {
    float* acc = blocks + static_cast<size_t>(omp_get_thread_num()) * (kBlock * kBlock);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < left.Units() + right_units; ++u) {
      if (u < left.Units()) {
        PackUnit(left, u);
      } else {
        PackUnit(right, u - left.Units());
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks_total; ++b) {
      if (!computed_block(b)) continue;
      const BlockSpan span = span_of(b);
      const int64_t i0 = span.i0, j0 = span.j0, rb = span.rb, cb = span.cb;
      const bool diagonal = p.symmetric && i0 == j0;
      // One thread takes the blocks in order: the next one is known.
      const int64_t after = team == 1 ? computed_after(b) : blocks_total;
      const BlockSpan following = after < blocks_total ? span_of(after) : BlockSpan{};
      BlockSums({left_panels, left.panels, p.k}, {right_panels, right.panels, p.k}, span,
                diagonal, after < blocks_total ? &following : nullptr, acc);
      Store(p, i0, j0, rb, cb, diagonal, acc);
      if (p.symmetric) Mirror(p, i0, j0, g.block);
    }
  }
}

#else  // not x86-64 Linux

bool F32KernelRuns() { return false; }
size_t F32WorkspaceBytes(const F32Product&, int) { return 0; }
void F32Multiply(const F32Product&, void*, int) {}

#endif

}  // namespace cpu
}  // namespace muon
