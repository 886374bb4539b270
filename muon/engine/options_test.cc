#include "muon/engine/options.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace muon {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// Expects InvalidArgument whose message names `field` and contains `cause`.
void ExpectInvalid(const absl::Status& s, const std::string& field, const std::string& cause) {
  ASSERT_FALSE(s.ok()) << "expected an error naming " << field;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Mentions(s, field)) << s;
  EXPECT_TRUE(Mentions(s, cause)) << s;
}

TEST(Options, DefaultsMatchTheDesign) {
  const Options o;
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.weight_decay, 0.1);
  EXPECT_EQ(o.momentum, 0.95);
  EXPECT_TRUE(o.nesterov);
  EXPECT_EQ(o.ns.steps, 5);
  ASSERT_EQ(o.ns.coefficients.size(), 1u);
  EXPECT_EQ(o.ns.coefficients[0][0], 3.4445);
  EXPECT_EQ(o.ns.coefficients[0][1], -4.7750);
  EXPECT_EQ(o.ns.coefficients[0][2], 2.0315);
  EXPECT_EQ(o.ns.eps, 1e-7);
  EXPECT_EQ(o.ns.dtype, NsDtype::kBF16);
  EXPECT_EQ(o.adjust_lr, AdjustLr::kOriginal);
  EXPECT_FALSE(o.momentum_fp32);
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(Options, BoundaryValuesAreAccepted) {
  Options o;
  o.lr = 0;
  o.weight_decay = 0;
  o.momentum = 0;
  o.ns.steps = 0;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.ns.steps = 99;
  o.momentum = 0.999999;
  o.lr = 10;
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(Options, Lr) {
  ExpectInvalid(ValidateLr(-0.5), "lr", "-0.5");
  ExpectInvalid(ValidateLr(-0.5), "lr", ">= 0");
  ExpectInvalid(ValidateLr(kNaN), "lr", "nan");
  ExpectInvalid(ValidateLr(kInf), "lr", "finite");
  ExpectInvalid(ValidateLr(-kInf), "lr", "finite");
  EXPECT_TRUE(ValidateLr(0).ok());
  EXPECT_TRUE(ValidateLr(3e-4).ok());
  Options o;
  o.lr = -1;
  ExpectInvalid(ValidateOptions(o), "lr", ">= 0");
}

TEST(Options, WeightDecay) {
  ExpectInvalid(ValidateWeightDecay(-0.01), "weight_decay", ">= 0");
  ExpectInvalid(ValidateWeightDecay(kNaN), "weight_decay", "nan");
  ExpectInvalid(ValidateWeightDecay(kInf), "weight_decay", "finite");
  EXPECT_TRUE(ValidateWeightDecay(0).ok());
  Options o;
  o.weight_decay = kNaN;
  ExpectInvalid(ValidateOptions(o), "weight_decay", "nan");
}

TEST(Options, Momentum) {
  ExpectInvalid(ValidateMomentum(1.0), "momentum", "[0, 1)");
  ExpectInvalid(ValidateMomentum(1.5), "momentum", "1.5");
  ExpectInvalid(ValidateMomentum(-0.1), "momentum", "[0, 1)");
  ExpectInvalid(ValidateMomentum(kNaN), "momentum", "nan");
  ExpectInvalid(ValidateMomentum(kInf), "momentum", "[0, 1)");
  EXPECT_TRUE(ValidateMomentum(0).ok());
  EXPECT_TRUE(ValidateMomentum(std::nextafter(1.0, 0.0)).ok());
  Options o;
  o.momentum = 1.0;
  ExpectInvalid(ValidateOptions(o), "momentum", "[0, 1)");
}

TEST(Options, NsSteps) {
  Options o;
  o.ns.steps = 100;
  ExpectInvalid(ValidateOptions(o), "ns_steps", "100");
  o.ns.steps = 1000;
  ExpectInvalid(ValidateOptions(o), "ns_steps", "[0, 100)");
  o.ns.steps = -1;
  ExpectInvalid(ValidateOptions(o), "ns_steps", "-1");
  o.ns.steps = 99;
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(Options, Eps) {
  Options o;
  for (double eps : {0.0, -1e-7, kNaN, kInf}) {
    o.ns.eps = eps;
    ExpectInvalid(ValidateOptions(o), "eps", "positive finite");
  }
}

TEST(Options, CoefficientTable) {
  Options o;
  o.ns.coefficients.clear();
  ExpectInvalid(ValidateOptions(o), "coefficients", "no rows");
  o.ns.coefficients = {{3.0, -3.0, 1.0}, {1.0, kNaN, 0.0}};
  ExpectInvalid(ValidateOptions(o), "coefficients", "row 1");
  o.ns.coefficients = {{kInf, -3.0, 1.0}};
  ExpectInvalid(ValidateOptions(o), "coefficients", "non-finite");
  o.ns.coefficients = PolarExpressCoefficients();
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(Options, UnknownEnums) {
  Options o;
  o.adjust_lr = static_cast<AdjustLr>(5);  // 4 is SPECTRAL since 0.7
  ExpectInvalid(ValidateOptions(o), "adjust_lr", "unknown value 5");
  o.adjust_lr = static_cast<AdjustLr>(-1);
  ExpectInvalid(ValidateOptions(o), "adjust_lr", "unknown value -1");
  o.adjust_lr = AdjustLr::kNone;
  o.ns.dtype = static_cast<NsDtype>(3);
  ExpectInvalid(ValidateOptions(o), "ns_dtype", "unknown value 3");
}

TEST(Options, FirstBadFieldIsNamed) {
  // With several bad fields the message names one of them (the first checked)
  // and never reports success.
  Options o;
  o.lr = -1;
  o.momentum = 2;
  const absl::Status s = ValidateOptions(o);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Mentions(s, "lr")) << s;
}

TEST(AdjustedLr, SpectralUnclampedScalesBothWays) {
  const double lr = 0.02;
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kSpectralUnclamped, 16, 4), lr * 2.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kSpectralUnclamped, 4, 16), lr * 0.5);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kSpectralUnclamped, 8, 8), lr);
}

TEST(AdjustedLr, SpectralIsTheLongerSidesRoot) {
  const double lr = 0.02;
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kSpectral, 16, 4), lr * 4.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kSpectral, 4, 16), lr * 4.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kSpectral, 9, 9), lr * 3.0);
}

TEST(AdjustedLr, Original) {
  const double lr = 0.02;
  // Tall: lr * sqrt(rows / cols).
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 16, 4), lr * 2.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 36, 4), lr * 3.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 6, 3), lr * std::sqrt(2.0));
  // Square and wide: no scaling (max(1, A/B) = 1).
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 8, 8), lr);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 4, 64), lr);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 1, 1000), lr);
}

TEST(AdjustedLr, MatchRmsAdamW) {
  const double lr = 0.01;
  // lr * 0.2 * sqrt(max(A, B)), symmetric in A and B.
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kMatchRmsAdamW, 100, 25), lr * 0.2 * 10.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kMatchRmsAdamW, 25, 100), lr * 0.2 * 10.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kMatchRmsAdamW, 16, 16), lr * 0.2 * 4.0);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kMatchRmsAdamW, 1, 1), lr * 0.2);
  EXPECT_DOUBLE_EQ(AdjustedLr(lr, AdjustLr::kMatchRmsAdamW, 7, 3), lr * 0.2 * std::sqrt(7.0));
}

// torch multiplies lr by the ratio it computed first: the same bits.
TEST(AdjustedLr, RoundsAsTorchDoes) {
  for (double lr : {0.03, 0.02, 1e-3, 0.7}) {
    EXPECT_EQ(AdjustedLr(lr, AdjustLr::kMatchRmsAdamW, 7, 3), lr * (0.2 * std::sqrt(7.0)));
    EXPECT_EQ(AdjustedLr(lr, AdjustLr::kOriginal, 6, 3), lr * std::sqrt(2.0));
  }
}

TEST(AdjustedLr, None) {
  for (int64_t r : {1, 3, 64}) {
    for (int64_t c : {1, 5, 128}) {
      EXPECT_EQ(AdjustedLr(0.125, AdjustLr::kNone, r, c), 0.125);
    }
  }
}

TEST(AdjustedLr, ZeroLrStaysZero) {
  for (AdjustLr m : {AdjustLr::kOriginal, AdjustLr::kMatchRmsAdamW, AdjustLr::kNone}) {
    EXPECT_EQ(AdjustedLr(0.0, m, 32, 2), 0.0);
  }
}

}  // namespace
}  // namespace muon
