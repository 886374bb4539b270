// The shared element functions against torch's formulas, written out here
// from torch's definitions (lerp's two branches, the buffer rounded after
// each in-place op), over every bfloat16 and float16 momentum value.
#include "muon/math/elementwise.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace muon {
namespace {

// torch.lerp(start, end, weight) for float opmath (ATen's lerp formula).
float TorchLerpReference(float start, float end, float weight) {
  const float diff = end - start;
  return std::fabs(weight) < 0.5f ? start + weight * diff : end - diff * (1.0f - weight);
}

TEST(Elementwise, LerpTakesTorchsBranchOnEachSideOfOneHalf) {
  for (float w : {0.0f, 0.05f, 0.4999f, 0.5f, 0.95f, 1.0f, -0.3f}) {
    for (float a : {0.0f, 1.0f, -3.25f, 1e-20f, 7e30f}) {
      for (float b : {2.0f, -1.5f, 3e-8f}) {
        EXPECT_EQ(ew::Bits(ew::TorchLerp(a, b, w)), ew::Bits(TorchLerpReference(a, b, w)))
            << a << " " << b << " " << w;
      }
    }
  }
}

// buf.lerp_(grad, 1 - momentum) in the buffer's dtype, then
// grad.lerp(buf, momentum) (nesterov) in the same dtype, as torch.optim.Muon.
void ExpectMomentumLikeTorch(int type, uint16_t bits, float g, float momentum, bool nesterov) {
  float buf = type == ew::kBF16 ? ew::Bf16BitsToFloat(bits) : ew::F16BitsToFloat(bits);
  if (!std::isfinite(buf)) return;
  const float want_buf = ew::RoundTo(type, TorchLerpReference(buf, g, 1.0f - momentum));
  const float want_out =
      nesterov ? ew::RoundTo(type, TorchLerpReference(g, want_buf, momentum)) : want_buf;
  const float out = ew::MomentumElement(type, g, &buf, 1.0f - momentum, momentum, nesterov);
  ASSERT_EQ(ew::Bits(buf), ew::Bits(want_buf)) << type << " " << bits << " " << g;
  ASSERT_EQ(ew::Bits(out), ew::Bits(want_out)) << type << " " << bits << " " << g;
  // Both are values of the buffer's dtype.
  ASSERT_EQ(ew::Bits(ew::RoundTo(type, out)), ew::Bits(out));
}

TEST(Elementwise, MomentumOverEveryHalfPrecisionBufferValue) {
  for (int type : {ew::kBF16, ew::kF16}) {
    for (uint32_t bits = 0; bits < 0x10000u; bits += 1) {
      for (float g : {0.0f, 1.0f, -0.0173f, 300.5f}) {
        ExpectMomentumLikeTorch(type, static_cast<uint16_t>(bits), g, 0.95f, true);
        ExpectMomentumLikeTorch(type, static_cast<uint16_t>(bits), g, 0.9f, false);
      }
    }
  }
}

TEST(Elementwise, MomentumInFloat32IsPlainFloatArithmetic) {
  float buf = 0.25f;
  const float out = ew::MomentumElement(ew::kF32, 1.0f, &buf, 0.05f, 0.95f, true);
  EXPECT_EQ(buf, TorchLerpReference(0.25f, 1.0f, 0.05f));
  EXPECT_EQ(out, TorchLerpReference(1.0f, buf, 0.95f));
}

TEST(Elementwise, DecayIsRoundedBeforeTheUpdateIsAdded) {
  // param.mul_(1 - lr * wd) rounds to the parameter's dtype before add_.
  for (uint32_t bits = 0x3f00; bits < 0x4100; ++bits) {  // bf16 values around 1
    const float p = ew::Bf16BitsToFloat(static_cast<uint16_t>(bits));
    const float decay = 0.9998f, alpha = -0.02f, u = 0.37f;
    const float want = ew::RoundTo(ew::kBF16, p * decay) + alpha * u;
    ASSERT_EQ(ew::Bits(ew::ApplyElement(ew::kBF16, p, u, decay, alpha)), ew::Bits(want)) << bits;
  }
  EXPECT_EQ(ew::ApplyElement(ew::kF32, 2.0f, 1.0f, 0.5f, -0.25f), 0.75f);
}

TEST(Elementwise, CautiousDecayIsThePapersIndicator) {
  // arXiv 2510.12402: decay where update * param >= 0, evaluated in double.
  const float values[] = {-3.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.5f};
  for (float p : values) {
    for (float u : values) {
      const double product = static_cast<double>(p) * static_cast<double>(u);
      const float want = product >= 0.0 ? 0.99f : 1.0f;
      EXPECT_EQ(ew::CautiousDecay(p, u, 0.99f), want) << "p " << p << " u " << u;
    }
  }
  // Underflowing products keep their signs: 1e-30 * -1e-30 is 0 in float.
  EXPECT_EQ(ew::CautiousDecay(1e-30f, -1e-30f, 0.99f), 1.0f);
}

}  // namespace
}  // namespace muon
