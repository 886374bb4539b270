#include "muon/common/dtype.h"

#include <dlpack/dlpack.h>

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace muon {
namespace {

// Independent reference: nearest representable value by exhaustive search of
// the two candidates around `f` in a format with `mant` explicit mantissa bits,
// ties to even, computed in double.
TEST(Bf16, KnownValues) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(-2.0f), 0xc000);
  EXPECT_EQ(Bf16BitsToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(RoundToBf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1+2^-6.
  EXPECT_EQ(RoundToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(RoundToBf16(std::numeric_limits<float>::infinity())));
}

TEST(Bf16, RoundingIsNearest) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1000.f, 1000.f);
  for (int i = 0; i < 100000; ++i) {
    const float f = dist(rng);
    const float r = RoundToBf16(f);
    // r must be representable and no bf16 neighbour may be closer.
    EXPECT_EQ(FloatBits(r) & 0xffffu, 0u);
    const float up = BitsToFloat(FloatBits(r) + 0x10000u);
    const float down = BitsToFloat(FloatBits(r) - 0x10000u);
    EXPECT_LE(std::fabs(double(r) - f), std::fabs(double(up) - f));
    EXPECT_LE(std::fabs(double(r) - f), std::fabs(double(down) - f));
  }
}

#if defined(__FLT16_MAX__)
// The compiler's own _Float16 conversion is an independent reference.
TEST(F16, MatchesCompilerConversion) {
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng();
    const float f = BitsToFloat(bits);
    if (std::isnan(f)) continue;
    const float scaled = std::ldexp(std::fmod(f, 1.0f), static_cast<int>(rng() % 40) - 28);
    for (float x : {f, scaled}) {
      const _Float16 h = static_cast<_Float16>(x);
      uint16_t ref;
      std::memcpy(&ref, &h, 2);
      ASSERT_EQ(FloatToF16Bits(x), ref) << "x=" << x;
    }
  }
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    const float ref = static_cast<float>(h);
    const float got = F16BitsToFloat(bits);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(FloatBits(got), FloatBits(ref)) << "bits=" << b;
    }
  }
}
#endif

TEST(F16, KnownValues) {
  EXPECT_EQ(FloatToF16Bits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(65520.0f), 0x7c00);          // rounds to inf
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(F16BitsToFloat(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, DLPackRoundTrip) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto back = FromDLDataType(ToDLDataType(t), "x");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, t);
  }
  DLDataType i32{kDLInt, 32, 1};
  auto bad = FromDLDataType(i32, "grad of 'w'");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("grad of 'w'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("unsupported dtype"), std::string::npos);
}

}  // namespace
}  // namespace muon
