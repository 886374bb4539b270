#include "muon/math/cpu/cpu_kernels.h"

#include <algorithm>

#include "muon/common/half.h"
#include "muon/math/elementwise.h"

// Clones for the CPUs the loops gain most on; ifunc picks one at load time.
// Not under ThreadSanitizer: its instrumented ifunc resolvers would run
// before its runtime starts.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define MUON_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MUON_CLONES
#endif
#define MUON_INLINE inline __attribute__((always_inline))

namespace muon {
namespace cpu {
namespace {

constexpr int kF32 = ew::kF32, kBF16 = ew::kBF16, kF16 = ew::kF16;

template <int T>
MUON_INLINE float Load(const void* base, int64_t i) {
  if constexpr (T == kF32) return static_cast<const float*>(base)[i];
  if constexpr (T == kBF16) return ew::Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
  if constexpr (T == kF16) return ew::F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
}

template <int T>
MUON_INLINE void Store(void* base, int64_t i, float f) {
  if constexpr (T == kF32) static_cast<float*>(base)[i] = f;
  if constexpr (T == kBF16) static_cast<uint16_t*>(base)[i] = ew::FloatToBf16Bits(f);
  if constexpr (T == kF16) static_cast<uint16_t*>(base)[i] = ew::FloatToF16Bits(f);
}

template <int T>
MUON_INLINE float RoundTo(float f) {
  if constexpr (T == kF32) return f;
  if constexpr (T == kBF16) return ew::Bf16BitsToFloat(ew::FloatToBf16Bits(f));
  if constexpr (T == kF16) return ew::F16BitsToFloat(ew::FloatToF16Bits(f));
}

// Stores f rounded to T and returns the stored value: one conversion where
// RoundTo then Store would make two (rounding is idempotent, NaNs included).
template <int T>
MUON_INLINE float StoreRounded(void* base, int64_t i, float f) {
  if constexpr (T == kF32) {
    static_cast<float*>(base)[i] = f;
    return f;
  } else {
    const uint16_t bits = T == kBF16 ? ew::FloatToBf16Bits(f) : ew::FloatToF16Bits(f);
    static_cast<uint16_t*>(base)[i] = bits;
    return T == kBF16 ? ew::Bf16BitsToFloat(bits) : ew::F16BitsToFloat(bits);
  }
}

// ew::TorchLerp with its branch (on the loop's fixed weight) chosen outside
// the loop.
template <bool kSmallWeight>
MUON_INLINE float Lerp(float self, float end, float w) {
  return kSmallWeight ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}
inline bool SmallWeight(float w) { return w < 0.5f && w > -0.5f; }

template <int G, int B, int O, bool kNesterov, bool kSmallBuf, bool kSmallOut>
MUON_INLINE int64_t MomentumLoop(const MomentumArgs& a, float w_buf, float w_out) {
  const void* grad = a.grad;
  void* buf = a.buf;
  void* out = a.out;
  int64_t nonfinite = 0;
  for (int64_t i = 0; i < a.n; ++i) {  // ew::MomentumElement with its types fixed
    const float g = Load<G>(grad, i);
    nonfinite += ew::IsFinite(g) ? 0 : 1;
    const float b = StoreRounded<B>(buf, i, Lerp<kSmallBuf>(Load<B>(buf, i), g, w_buf));
    if constexpr (!kNesterov) {
      Store<O>(out, i, b);
    } else if constexpr (O == B) {
      StoreRounded<B>(out, i, Lerp<kSmallOut>(g, b, w_out));
    } else {
      Store<O>(out, i, RoundTo<B>(Lerp<kSmallOut>(g, b, w_out)));
    }
  }
  return nonfinite;
}

template <int G, int B, int O>
MUON_INLINE int64_t MomentumNesterov(const MomentumArgs& a, float w_buf, float w_out,
                                     bool nesterov) {
  const bool small_buf = SmallWeight(w_buf), small_out = SmallWeight(w_out);
  if (!nesterov) {
    return small_buf ? MomentumLoop<G, B, O, false, true, true>(a, w_buf, w_out)
                     : MomentumLoop<G, B, O, false, false, true>(a, w_buf, w_out);
  }
  if (small_buf) {
    return small_out ? MomentumLoop<G, B, O, true, true, true>(a, w_buf, w_out)
                     : MomentumLoop<G, B, O, true, true, false>(a, w_buf, w_out);
  }
  return small_out ? MomentumLoop<G, B, O, true, false, true>(a, w_buf, w_out)
                   : MomentumLoop<G, B, O, true, false, false>(a, w_buf, w_out);
}

template <int G, int B>
MUON_INLINE int64_t MomentumOut(const MomentumArgs& a, float w_buf, float w_out, bool nesterov) {
  switch (static_cast<int>(a.out_dtype)) {
    case kBF16: return MomentumNesterov<G, B, kBF16>(a, w_buf, w_out, nesterov);
    case kF16: return MomentumNesterov<G, B, kF16>(a, w_buf, w_out, nesterov);
    default: return MomentumNesterov<G, B, kF32>(a, w_buf, w_out, nesterov);
  }
}

template <int G>
MUON_INLINE int64_t MomentumBuf(const MomentumArgs& a, float w_buf, float w_out, bool nesterov) {
  switch (static_cast<int>(a.buf_dtype)) {
    case kBF16: return MomentumOut<G, kBF16>(a, w_buf, w_out, nesterov);
    case kF16: return MomentumOut<G, kF16>(a, w_buf, w_out, nesterov);
    default: return MomentumOut<G, kF32>(a, w_buf, w_out, nesterov);
  }
}

template <int P, int U>
MUON_INLINE void ApplyLoop(const ApplyArgs& a, float decay, float alpha) {
  void* param = a.param;
  const void* update = a.update;
  for (int64_t i = 0; i < a.n; ++i) {  // ew::ApplyElement with its types fixed
    Store<P>(param, i, RoundTo<P>(Load<P>(param, i) * decay) + alpha * Load<U>(update, i));
  }
}

template <int P>
MUON_INLINE void ApplyUpdate(const ApplyArgs& a, float decay, float alpha) {
  switch (static_cast<int>(a.update_dtype)) {
    case kBF16: return ApplyLoop<P, kBF16>(a, decay, alpha);
    case kF16: return ApplyLoop<P, kF16>(a, decay, alpha);
    default: return ApplyLoop<P, kF32>(a, decay, alpha);
  }
}

template <int S, int V, int D>
MUON_INLINE void ConvertLoop(const void* src, void* dst, int64_t n) {
  // Rounding to `via` changes nothing when the source has that dtype, and
  // the store makes it when the destination has it (rounding is idempotent).
  constexpr bool kRound = V != S && V != D;
  for (int64_t i = 0; i < n; ++i) {
    const float v = Load<S>(src, i);
    Store<D>(dst, i, kRound ? RoundTo<V>(v) : v);
  }
}

template <int S, int V>
MUON_INLINE void ConvertTo(const void* src, int dst_type, void* dst, int64_t n) {
  switch (dst_type) {
    case kBF16: return ConvertLoop<S, V, kBF16>(src, dst, n);
    case kF16: return ConvertLoop<S, V, kF16>(src, dst, n);
    default: return ConvertLoop<S, V, kF32>(src, dst, n);
  }
}

template <int S>
MUON_INLINE void ConvertVia(const void* src, int via, int dst_type, void* dst, int64_t n) {
  switch (via) {
    case kBF16: return ConvertTo<S, kBF16>(src, dst_type, dst, n);
    case kF16: return ConvertTo<S, kF16>(src, dst_type, dst, n);
    default: return ConvertTo<S, kF32>(src, dst_type, dst, n);
  }
}

}  // namespace

MUON_CLONES void Convert(DType src_type, const void* src, DType via, DType dst_type, void* dst,
                         int64_t n) {
  const int v = static_cast<int>(via), d = static_cast<int>(dst_type);
  switch (static_cast<int>(src_type)) {
    case kBF16: return ConvertVia<kBF16>(src, v, d, dst, n);
    case kF16: return ConvertVia<kF16>(src, v, d, dst, n);
    default: return ConvertVia<kF32>(src, v, d, dst, n);
  }
}

MUON_CLONES void RoundToBf16(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = RoundTo<kBF16>(p[i]);
}

namespace {

// acc[k] += f(p[i])^2 for the elements i (from 0) with i mod 8 == k, in order.
template <typename F>
MUON_INLINE void AddSquares(const float* p, int64_t n, F f, double* acc) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) {
      const double v = f(p[i + k]);
      acc[k] += v * v;
    }
  }
  for (int k = 0; i < n; ++i, ++k) {
    const double v = f(p[i]);
    acc[k] += v * v;
  }
}

// The eight running sums, added in order.
MUON_INLINE double SumOfLanes(const double* acc) {
  double sum = 0.0;
  for (int k = 0; k < 8; ++k) sum += acc[k];
  return sum;
}

// Eight running sums over i mod 8 of f(p[i])^2, then added in order.
template <typename F>
MUON_INLINE double SumSquaresOf(const float* p, int64_t n, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  AddSquares(p, n, f, acc);
  return SumOfLanes(acc);
}

}  // namespace

MUON_CLONES double SumSquares(const float* p, int64_t n) {
  return SumSquaresOf(p, n, [](float v) { return v; });
}

MUON_CLONES double SumSquaresAsBf16(const float* p, int64_t n) {
  return SumSquaresOf(p, n, [](float v) { return RoundTo<kBF16>(v); });
}

MUON_CLONES double SumSquaresBf16(const uint16_t* p, int64_t n) {
  // Widened a block at a time (the fp32 loop vectorizes well; a block is a
  // multiple of 8, so every element keeps its running sum).
  constexpr int64_t kBlock = 2048;
  alignas(64) float wide[kBlock];
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    for (int64_t k = 0; k < len; ++k) wide[k] = ew::Bf16BitsToFloat(p[i + k]);
    AddSquares(wide, len, [](float v) { return v; }, acc);
  }
  return SumOfLanes(acc);
}

MUON_CLONES void DivideBf16(const uint16_t* src, int64_t n, float d, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) Store<kBF16>(dst, i, Load<kBF16>(src, i) / d);
}

MUON_CLONES void Divide(float* p, int64_t n, float d, bool bf16) {
  if (bf16) {
    for (int64_t i = 0; i < n; ++i) p[i] = RoundTo<kBF16>(p[i] / d);
  } else {
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] / d;
  }
}

MUON_CLONES void DivideInto(const float* src, int64_t n, float d, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] / d;
}

MUON_CLONES void DivideToBf16(const float* src, int64_t n, float d, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) Store<kBF16>(dst, i, RoundTo<kBF16>(src[i]) / d);
}

MUON_CLONES void ToBf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ew::FloatToBf16Bits(src[i]);
}

MUON_CLONES void FromBf16(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ew::Bf16BitsToFloat(src[i]);
}

constexpr int64_t kTile = 32;  // transposes go tile by tile (cache lines)

MUON_CLONES void TransposeToBf16(const float* src, int64_t rows, int64_t cols, uint16_t* dst) {
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = ew::FloatToBf16Bits(src[i * cols + j]);
      }
    }
  }
}

MUON_CLONES void TransposeFromBf16(const uint16_t* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = ew::Bf16BitsToFloat(src[i * cols + j]);
      }
    }
  }
}

MUON_CLONES void MirrorUpper(float* d, int64_t m, int64_t ld) {
  for (int64_t j0 = 0; j0 < m; j0 += kTile) {
    for (int64_t i0 = j0; i0 < m; i0 += kTile) {
      const int64_t j1 = std::min(m, j0 + kTile), i1 = std::min(m, i0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = std::max(i0, j + 1); i < i1; ++i) d[j * ld + i] = d[i * ld + j];
      }
    }
  }
}

MUON_CLONES void FoldPolynomial(float* poly, const float* gram, int64_t m, float a, float b) {
  for (int64_t j = 0; j < m; ++j) {
    float* p = poly + j * m;
    const float* g = gram + j * m;
    for (int64_t i = 0; i <= j; ++i) p[i] = p[i] + b * g[i];
    p[j] = p[j] + a;
  }
}

MUON_CLONES void TransposeBlockBf16(const uint16_t* src, int64_t ld_src, int64_t rows,
                                    int64_t cols, uint16_t* dst, int64_t ld_dst) {
  for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
    for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile), i1 = std::min(rows, i0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) dst[i * ld_dst + j] = src[j * ld_src + i];
      }
    }
  }
}

MUON_CLONES int64_t Momentum(const MomentumArgs& a, float w_buf, float w_out, bool nesterov) {
  switch (static_cast<int>(a.grad_dtype)) {
    case kBF16: return MomentumBuf<kBF16>(a, w_buf, w_out, nesterov);
    case kF16: return MomentumBuf<kF16>(a, w_buf, w_out, nesterov);
    default: return MomentumBuf<kF32>(a, w_buf, w_out, nesterov);
  }
}

MUON_CLONES void Apply(const ApplyArgs& a, float decay, float alpha) {
  switch (static_cast<int>(a.param_dtype)) {
    case kBF16: return ApplyUpdate<kBF16>(a, decay, alpha);
    case kF16: return ApplyUpdate<kF16>(a, decay, alpha);
    default: return ApplyUpdate<kF32>(a, decay, alpha);
  }
}

}  // namespace cpu
}  // namespace muon
