#include "muon/math/cpu/cpu_kernels.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>  // F16C (x86-64-v3 and up): the fp16 rounding
#endif

#include "muon/common/half.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/elementwise.h"

// The loops are compiled for three CPU levels (AVX-512, AVX2, the baseline)
// and chosen on each call by cpu::Features(), so that a test's mask runs
// every level this CPU can run. clang (the fuzz builds) compiles the
// baseline only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MUON_LEVELS 1
#else
#define MUON_LEVELS 0
#endif
#define MUON_INLINE inline __attribute__((always_inline))

namespace muon {
namespace cpu {

#if MUON_LEVELS
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define MUON_F16C 1  // (the target pragma defines no __F16C__ macro)
namespace v4 {
#include "muon/math/cpu/cpu_kernels_loops.inc"
}  // namespace v4
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
namespace v3 {
#include "muon/math/cpu/cpu_kernels_loops.inc"
}  // namespace v3
#pragma GCC pop_options
#undef MUON_F16C
#endif
#define MUON_F16C 0
namespace base {
#include "muon/math/cpu/cpu_kernels_loops.inc"
}  // namespace base

namespace {

// 2: AVX-512 (x86-64-v4), 1: AVX2 (x86-64-v3), 0: the baseline.
int Level() {
#if MUON_LEVELS
  const uint32_t f = Features();
  if (f & kFeatureAvx512) return 2;
  if (f & kFeatureAvx2) return 1;
#endif
  return 0;
}

}  // namespace

#if MUON_LEVELS
#define MUON_DISPATCH(name, ...)                      \
  switch (Level()) {                                  \
    case 2: return v4::name(__VA_ARGS__);             \
    case 1: return v3::name(__VA_ARGS__);             \
    default: return base::name(__VA_ARGS__);          \
  }
#else
#define MUON_DISPATCH(name, ...) return base::name(__VA_ARGS__);
#endif

const char* LoopLevel() {
  switch (Level()) {
    case 2: return "x86-64-v4";
    case 1: return "x86-64-v3";
    default: return "baseline";
  }
}

void Convert(DType src_type, const void* src, DType via, DType dst_type, void* dst, int64_t n) {
  MUON_DISPATCH(Convert, src_type, src, via, dst_type, dst, n)
}
void RoundToBf16(float* p, int64_t n) { MUON_DISPATCH(RoundToBf16, p, n) }
void RoundToF16(float* p, int64_t n) { MUON_DISPATCH(RoundToF16, p, n) }
double SumSquares(const float* p, int64_t n) { MUON_DISPATCH(SumSquares, p, n) }
double SumSquaresAsBf16(const float* p, int64_t n) { MUON_DISPATCH(SumSquaresAsBf16, p, n) }
double SumSquaresBf16(const uint16_t* p, int64_t n) { MUON_DISPATCH(SumSquaresBf16, p, n) }
void DivideBf16(const uint16_t* src, int64_t n, float d, uint16_t* dst) {
  MUON_DISPATCH(DivideBf16, src, n, d, dst)
}
void Divide(float* p, int64_t n, float d, bool bf16) { MUON_DISPATCH(Divide, p, n, d, bf16) }
void DivideInto(const float* src, int64_t n, float d, float* dst) {
  MUON_DISPATCH(DivideInto, src, n, d, dst)
}
void DivideToBf16(const float* src, int64_t n, float d, uint16_t* dst) {
  MUON_DISPATCH(DivideToBf16, src, n, d, dst)
}
void ToBf16(const float* src, int64_t n, uint16_t* dst) { MUON_DISPATCH(ToBf16, src, n, dst) }
void FromBf16(const uint16_t* src, int64_t n, float* dst) { MUON_DISPATCH(FromBf16, src, n, dst) }
void TransposeToBf16(const float* src, int64_t rows, int64_t cols, uint16_t* dst) {
  MUON_DISPATCH(TransposeToBf16, src, rows, cols, dst)
}
void TransposeFromBf16(const uint16_t* src, int64_t rows, int64_t cols, float* dst) {
  MUON_DISPATCH(TransposeFromBf16, src, rows, cols, dst)
}
void MirrorUpper(float* d, int64_t m, int64_t ld) { MUON_DISPATCH(MirrorUpper, d, m, ld) }
void FoldPolynomial(float* poly, const float* gram, int64_t m, float a, float b) {
  MUON_DISPATCH(FoldPolynomial, poly, gram, m, a, b)
}
void TransposeBlockBf16(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols,
                        uint16_t* dst, int64_t ld_dst) {
  MUON_DISPATCH(TransposeBlockBf16, src, ld_src, rows, cols, dst, ld_dst)
}
int64_t Momentum(const MomentumArgs& a, float w_buf, float w_out, bool nesterov) {
  MUON_DISPATCH(Momentum, a, w_buf, w_out, nesterov)
}
void Apply(const ApplyArgs& a, float decay, float alpha) { MUON_DISPATCH(Apply, a, decay, alpha) }

}  // namespace cpu
}  // namespace muon
