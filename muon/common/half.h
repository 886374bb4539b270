// Elements of the stored types, defined once for host code and CUDA kernels
// (__host__ __device__ under nvcc): bfloat16 and float16 conversions rounding
// to nearest even (float16 with subnormals and overflow to infinity, NaNs kept
// quiet), loads and stores by type. Plain C++ with no library header, so that
// nvcc compiles it as it is; half_test.cc checks every conversion on the CPU
// against the compiler's own float16 and an independent bfloat16 rounding.
//
// Types are numbered like muon::DType: 0 float32, 1 bfloat16, 2 float16.
#ifndef MUON_COMMON_HALF_H_
#define MUON_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MUON_HD __host__ __device__ __forceinline__
#else
#define MUON_HD inline
#endif

namespace muon {
namespace ew {

constexpr int kF32 = 0, kBF16 = 1, kF16 = 2;

MUON_HD uint32_t Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MUON_HD float FromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

MUON_HD bool IsFinite(float v) { return (Bits(v) & 0x7f800000u) != 0x7f800000u; }

// bfloat16: the high half of a float, rounded to nearest even.
// Written as a select, without a branch, so that loops over it vectorize.
MUON_HD uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = Bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

MUON_HD float Bf16BitsToFloat(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

// IEEE binary16.
MUON_HD uint16_t FloatToF16Bits(float f) {
  const uint32_t u = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {
    // A normal half: 10 mantissa bits kept, the 13 dropped round to nearest even.
    const uint32_t m = abs & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: a signed zero
  // A subnormal half, in units of 2^-24.
  const uint32_t m_full = (abs & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;
  uint32_t h = m_full >> shift;
  const uint32_t rest = m_full & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

MUON_HD float F16BitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (exp == 0x1fu) return FromBits(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (exp != 0) return FromBits(sign | ((exp + 112u) << 23) | (m << 13));
  if (m == 0) return FromBits(sign);
  int e = -1;  // a subnormal: normalized
  do {
    ++e;
    m <<= 1;
  } while ((m & 0x400u) == 0);
  return FromBits(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((m & 0x3ffu) << 13));
}

// `f` rounded to the precision of `type` (float32: itself).
MUON_HD float RoundTo(int type, float f) {
  switch (type) {
    case kBF16: return Bf16BitsToFloat(FloatToBf16Bits(f));
    case kF16: return F16BitsToFloat(FloatToF16Bits(f));
    default: return f;
  }
}

MUON_HD float Load(int type, const void* base, int64_t i) {
  switch (type) {
    case kBF16: return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case kF16: return F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// Stores `f` rounded to `type`.
MUON_HD void Store(int type, void* base, int64_t i, float f) {
  switch (type) {
    case kBF16: static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(f); break;
    case kF16: static_cast<uint16_t*>(base)[i] = FloatToF16Bits(f); break;
    default: static_cast<float*>(base)[i] = f;
  }
}

}  // namespace ew
}  // namespace muon

#endif  // MUON_COMMON_HALF_H_
