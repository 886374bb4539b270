#include "muon/common/dtype.h"

#include <dlpack/dlpack.h>

#include "absl/strings/str_cat.h"

namespace muon {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
  }
  return "unknown";
}

DLDataType ToDLDataType(DType t) {
  DLDataType dt;
  dt.lanes = 1;
  switch (t) {
    case DType::kF32:
      dt.code = kDLFloat;
      dt.bits = 32;
      break;
    case DType::kBF16:
      dt.code = kDLBfloat;
      dt.bits = 16;
      break;
    case DType::kF16:
      dt.code = kDLFloat;
      dt.bits = 16;
      break;
  }
  return dt;
}

absl::StatusOr<DType> FromDLDataType(const DLDataType& dt, const std::string& what) {
  if (dt.lanes == 1) {
    if (dt.code == kDLFloat && dt.bits == 32) return DType::kF32;
    if (dt.code == kDLFloat && dt.bits == 16) return DType::kF16;
    if (dt.code == kDLBfloat && dt.bits == 16) return DType::kBF16;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": unsupported dtype (DLPack code ", static_cast<int>(dt.code), ", bits ",
      static_cast<int>(dt.bits), ", lanes ", static_cast<int>(dt.lanes),
      "); supported are float32, bfloat16 and float16"));
}

uint16_t FloatToF16Bits(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal half: keep 10 mantissa bits, round to nearest even on the 13 dropped.
    uint32_t m = abs & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: fine
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: signed zero
  // Subnormal half: value = m_full * 2^(exp-23); half subnormal unit is 2^-24.
  const uint32_t m_full = (abs & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;  // 14..24 : m_full >> (shift) gives units of 2^-24
  uint32_t h = m_full >> shift;
  const uint32_t rest = m_full & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float F16BitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (m << 13));  // inf / NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (m << 13));
  if (m == 0) return BitsToFloat(sign);
  // Subnormal: normalize.
  int e = -1;
  do {
    ++e;
    m <<= 1;
  } while ((m & 0x400u) == 0);
  return BitsToFloat(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((m & 0x3ffu) << 13));
}

}  // namespace muon
