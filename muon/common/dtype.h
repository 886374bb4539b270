// Element types the library stores, and exact conversions between them and
// float. bf16/fp16 rounding is round-to-nearest-even, as in torch and CUDA.
#ifndef MUON_COMMON_DTYPE_H_
#define MUON_COMMON_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "muon/common/half.h"

namespace muon {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element.
inline size_t SizeOf(DType t) { return t == DType::kF32 ? 4 : 2; }

// Element i of a buffer of `t` elements at `base` (null stays null).
inline const void* ElementAt(const void* base, DType t, int64_t i) {
  if (base == nullptr) return nullptr;
  return static_cast<const unsigned char*>(base) + i * static_cast<int64_t>(SizeOf(t));
}
inline void* ElementAt(void* base, DType t, int64_t i) {
  return const_cast<void*>(ElementAt(static_cast<const void*>(base), t, i));
}

// "float32", "bfloat16", "float16".
const char* DTypeName(DType t);

// The DLPack description of `t` (one lane).
DLDataType ToDLDataType(DType t);

// The DType of a DLPack dtype, or InvalidArgument naming `what` when the
// library does not store that dtype.
absl::StatusOr<DType> FromDLDataType(const DLDataType& dt, const std::string& what);

inline uint32_t FloatBits(float f) { return ew::Bits(f); }
inline float BitsToFloat(uint32_t u) { return ew::FromBits(u); }

// bfloat16 and float16 <-> float, rounding to nearest even (half.h, shared
// with the CUDA kernels).
inline uint16_t FloatToBf16Bits(float f) { return ew::FloatToBf16Bits(f); }
inline float Bf16BitsToFloat(uint16_t h) { return ew::Bf16BitsToFloat(h); }
inline float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }
inline uint16_t FloatToF16Bits(float f) { return ew::FloatToF16Bits(f); }
inline float F16BitsToFloat(uint16_t h) { return ew::F16BitsToFloat(h); }
inline float RoundToF16(float f) { return F16BitsToFloat(FloatToF16Bits(f)); }

// Rounds `f` to the precision of `t` (identity for kF32).
inline float RoundTo(DType t, float f) { return ew::RoundTo(static_cast<int>(t), f); }

// Element i of a buffer of type `t`, as float.
inline float LoadAsFloat(DType t, const void* base, int64_t i) {
  return ew::Load(static_cast<int>(t), base, i);
}

// Non-finite (NaN, +-Inf) elements among n of type t at base.
inline int64_t CountNonFinite(DType t, const void* base, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = LoadAsFloat(t, base, i);
    count += ew::IsFinite(v) ? 0 : 1;
  }
  return count;
}

// Stores `f` (rounded to `t`) as element i of a buffer of type `t`.
inline void StoreFromFloat(DType t, void* base, int64_t i, float f) {
  ew::Store(static_cast<int>(t), base, i, f);
}

}  // namespace muon

#endif  // MUON_COMMON_DTYPE_H_
