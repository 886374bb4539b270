// Element types the library stores, and exact conversions between them and
// float. bf16/fp16 rounding is round-to-nearest-even, as in torch and CUDA.
#ifndef MUON_COMMON_DTYPE_H_
#define MUON_COMMON_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"

namespace muon {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element.
inline size_t SizeOf(DType t) { return t == DType::kF32 ? 4 : 2; }

// "float32", "bfloat16", "float16".
const char* DTypeName(DType t);

// The DLPack description of `t` (one lane).
DLDataType ToDLDataType(DType t);

// The DType of a DLPack dtype, or InvalidArgument naming `what` when the
// library does not store that dtype.
absl::StatusOr<DType> FromDLDataType(const DLDataType& dt, const std::string& what);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 <-> float. NaNs stay NaN (quiet); rounding is to nearest even.
inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16BitsToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// The float nearest to `f` that bf16 can hold.
inline float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

// IEEE binary16 <-> float, round to nearest even, with subnormals and
// overflow to infinity.
uint16_t FloatToF16Bits(float f);
float F16BitsToFloat(uint16_t h);

inline float RoundToF16(float f) { return F16BitsToFloat(FloatToF16Bits(f)); }

// Rounds `f` to the precision of `t` (identity for kF32).
inline float RoundTo(DType t, float f) {
  switch (t) {
    case DType::kBF16:
      return RoundToBf16(f);
    case DType::kF16:
      return RoundToF16(f);
    default:
      return f;
  }
}

// Element i of a buffer of type `t`, as float.
inline float LoadAsFloat(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Non-finite (NaN, +-Inf) elements among n of type t at base.
inline int64_t CountNonFinite(DType t, const void* base, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = LoadAsFloat(t, base, i);
    count += (v - v == 0.0f) ? 0 : 1;  // false for NaN and +-Inf
  }
  return count;
}

// Stores `f` (rounded to `t`) as element i of a buffer of type `t`.
inline void StoreFromFloat(DType t, void* base, int64_t i, float f) {
  switch (t) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(f);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16Bits(f);
      break;
    default:
      static_cast<float*>(base)[i] = f;
  }
}

}  // namespace muon

#endif  // MUON_COMMON_DTYPE_H_
