// The element conversions CUDA kernels and the CPU share (half.h), checked
// on every input that matters: every 16-bit pattern back to float, and every
// float whose low bits are at or around a rounding boundary (all 65536 high
// halves, each with the low patterns that decide the rounding) down to 16
// bits. float16 against the compiler's own _Float16 conversions; bfloat16
// against nearest-even rounding worked out in double precision.
#include "muon/common/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

uint16_t CompilerF16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

float CompilerF16ToFloat(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

// bfloat16 nearest to f (ties to even), from the two candidates around it.
uint16_t ReferenceBf16(float f) {
  const uint32_t u = ew::Bits(f);
  const uint16_t down = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return down;
  const uint16_t up = static_cast<uint16_t>(down + 1);  // away from zero in magnitude
  const double x = f;
  const double a = ew::Bf16BitsToFloat(down);
  // `up` may be infinity (down is the largest finite): its distance is then
  // taken as that of 2^128, the next step.
  const double b = (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), x)
                                             : static_cast<double>(ew::Bf16BitsToFloat(up));
  const double da = std::fabs(x - a), db = std::fabs(b - x);
  if (da < db) return down;
  if (db < da) return up;
  return (down & 1u) == 0 ? down : up;
}

std::vector<uint16_t> LowPatterns() {
  return {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x7ffe, 0x7fff,
          0x8000, 0x8001, 0x8fff, 0xc000, 0xe000, 0xefff, 0xf000, 0xf001, 0xffff};
}

TEST(Half, EveryBf16PatternBackToFloat) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = ew::Bf16BitsToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(ew::Bits(f), b << 16) << b;
    if (!std::isnan(f)) {
      ASSERT_EQ(ew::FloatToBf16Bits(f), b) << b;  // exact values round-trip
    }
  }
}

TEST(Half, FloatToBf16RoundsToNearestEvenEverywhere) {
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint16_t lo : LowPatterns()) {
      const uint32_t u = (hi << 16) | lo;
      const float f = ew::FromBits(u);
      const uint16_t got = ew::FloatToBf16Bits(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(ew::Bf16BitsToFloat(got))) << std::hex << u;
        ASSERT_EQ(got & 0x8000u, hi & 0x8000u) << std::hex << u;  // the sign kept
        continue;
      }
      ASSERT_EQ(got, ReferenceBf16(f)) << std::hex << u;
    }
  }
}

TEST(Half, EveryF16PatternBackToFloat) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float want = CompilerF16ToFloat(static_cast<uint16_t>(b));
    const float got = ew::F16BitsToFloat(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << b;
      continue;
    }
    ASSERT_EQ(ew::Bits(got), ew::Bits(want)) << b;
    ASSERT_EQ(ew::FloatToF16Bits(got), b) << b;
  }
}

TEST(Half, FloatToF16MatchesTheCompilerEverywhere) {
  // Every exponent and sign, each mantissa's high bits with the low patterns
  // around float16's rounding point (13 dropped bits) and its subnormals'.
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint16_t lo : LowPatterns()) {
      const uint32_t u = (hi << 16) | lo;
      const float f = ew::FromBits(u);
      const uint16_t got = ew::FloatToF16Bits(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(ew::F16BitsToFloat(got))) << std::hex << u;
        continue;
      }
      ASSERT_EQ(got, CompilerF16(f)) << std::hex << u;
    }
  }
}

TEST(Half, LoadStoreAndRoundAgree) {
  uint16_t b16[1], f16[1];
  float f32[1];
  for (float v : {0.0f, -0.0f, 1.0f / 3.0f, 65519.0f, 65520.0f, 1e-8f, -3.5e38f, INFINITY}) {
    ew::Store(ew::kBF16, b16, 0, v);
    ew::Store(ew::kF16, f16, 0, v);
    ew::Store(ew::kF32, f32, 0, v);
    EXPECT_EQ(ew::Bits(ew::Load(ew::kBF16, b16, 0)), ew::Bits(ew::RoundTo(ew::kBF16, v))) << v;
    EXPECT_EQ(ew::Bits(ew::Load(ew::kF16, f16, 0)), ew::Bits(ew::RoundTo(ew::kF16, v))) << v;
    EXPECT_EQ(ew::Bits(ew::Load(ew::kF32, f32, 0)), ew::Bits(v)) << v;
  }
  EXPECT_TRUE(ew::IsFinite(65504.0f));
  EXPECT_FALSE(ew::IsFinite(INFINITY));
  EXPECT_FALSE(ew::IsFinite(std::nanf("")));
}

}  // namespace
}  // namespace muon
