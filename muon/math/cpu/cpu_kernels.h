// The CPU backend's element-wise loops, vectorized: each entry point is
// compiled for AVX-512, AVX2 and the baseline (x86-64-v4, -v3, default) and
// chosen on each call by cpu::Features() (cpu_features.h: the CPU, capped by
// MUON_CPU_ISA or a test's mask), with -O3 and no floating-point
// contraction, so every level computes the same values as the scalar
// functions of muon/common/half.h and muon/math/elementwise.h, element by
// element. cpu_kernels_test.cc checks every level this CPU runs against
// those, on every bf16 rounding boundary and every dtype combination.
#ifndef MUON_MATH_CPU_CPU_KERNELS_H_
#define MUON_MATH_CPU_CPU_KERNELS_H_

#include <cstdint>

#include "muon/common/half.h"
#include "muon/math/backend.h"

namespace muon {
namespace cpu {

// The level the loops run at now: "x86-64-v4", "x86-64-v3" or "baseline".
const char* LoopLevel();

// p[i] <- p[i] rounded to bf16 (nearest, ties to even; NaNs stay NaN).
void RoundToBf16(float* p, int64_t n);
// p[i] <- p[i] rounded to fp16 (nearest, ties to even; beyond its range: inf).
void RoundToF16(float* p, int64_t n);
// p[i] rounded to `type` (ew::kF32: unchanged, kBF16, kF16).
inline void RoundToType(int type, float* p, int64_t n) {
  if (type == ew::kBF16) RoundToBf16(p, n);
  if (type == ew::kF16) RoundToF16(p, n);
}
// The sum of p[i]^2 in double, in a fixed order whatever the CPU: eight
// running sums over i mod 8, then added in order.
double SumSquares(const float* p, int64_t n);
// p[i] <- p[i] / d, then rounded to bf16 when `bf16`.
void Divide(float* p, int64_t n, float d, bool bf16);
// dst[i] = src[i] / d (fp32; src and dst do not overlap).
void DivideInto(const float* src, int64_t n, float d, float* dst);
// SumSquares of p[i] rounded to bf16 (RoundToBf16, then SumSquares, without
// writing p).
double SumSquaresAsBf16(const float* p, int64_t n);
// SumSquares of bf16 values (the same sum as SumSquares of them widened).
double SumSquaresBf16(const uint16_t* p, int64_t n);
// dst[i] = bf16 bits of src[i] / d, both bf16 (dst may be src).
void DivideBf16(const uint16_t* src, int64_t n, float d, uint16_t* dst);
// dst[i] = bf16 bits of (src[i] rounded to bf16) / d: RoundToBf16, Divide
// with bf16 and ToBf16 in one pass, src unchanged.
void DivideToBf16(const float* src, int64_t n, float d, uint16_t* dst);
// bf16 bits of p[i] (which must be bf16 values already, or are rounded).
void ToBf16(const float* src, int64_t n, uint16_t* dst);
void FromBf16(const uint16_t* src, int64_t n, float* dst);
// dst (cols x rows, row-major) = src (rows x cols, row-major) transposed.
void TransposeToBf16(const float* src, int64_t rows, int64_t cols, uint16_t* dst);
void TransposeFromBf16(const uint16_t* src, int64_t rows, int64_t cols, float* dst);

// Column-major m x m (leading dimension ld): the strict lower triangle <- the
// upper one transposed (d(i, j) = d(j, i) for i > j), tile by tile.
void MirrorUpper(float* d, int64_t m, int64_t ld);
// Column-major m x m, leading dimension m, upper triangle only (i <= j):
// poly(i, j) <- (poly(i, j) + b * gram(i, j)) + a when i == j: the fp32
// Newton-Schulz folds the polynomial's b * gram and the update's a * X into
// one matrix (poly then multiplies X alone).
void FoldPolynomial(float* poly, const float* gram, int64_t m, float a, float b);
// Column-major bf16: dst (cols x rows, leading dimension ld_dst) = src (rows x
// cols, leading dimension ld_src) transposed, tile by tile; src and dst must
// not overlap. Mirrors one computed block of a symmetric product into its
// transposed place.
void TransposeBlockBf16(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols,
                        uint16_t* dst, int64_t ld_dst);

// dst[i] = src[i] rounded to `via`, then stored as `dst_type` (ew::Load,
// ew::RoundTo, ew::Store for each element): the host's copy programs.
void Convert(DType src_type, const void* src, DType via, DType dst_type, void* dst, int64_t n);

// One tensor of the momentum step (ew::MomentumElement for each element);
// returns the number of non-finite gradient elements.
int64_t Momentum(const MomentumArgs& a, float w_buf, float w_out, bool nesterov);
// One tensor of decay and update (ew::ApplyElement for each element).
void Apply(const ApplyArgs& a, float decay, float alpha);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_CPU_KERNELS_H_
