#include "muon/math/ns_config.h"

#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

TEST(NsConfig, DefaultsAreTorchs) {
  NsConfig c;
  EXPECT_EQ(c.steps, 5);
  EXPECT_EQ(c.eps, 1e-7);
  EXPECT_EQ(c.dtype, NsDtype::kBF16);
  EXPECT_EQ(c.ForIteration(0), (NsCoefficients{3.4445, -4.7750, 2.0315}));
  EXPECT_EQ(c.ForIteration(4), c.ForIteration(0));
  EXPECT_TRUE(ValidateNsConfig(c).ok());
}

TEST(NsConfig, TableRowsThenLastRow) {
  NsConfig c;
  c.coefficients = {{1, 2, 3}, {4, 5, 6}};
  EXPECT_EQ(c.ForIteration(0), (NsCoefficients{1, 2, 3}));
  EXPECT_EQ(c.ForIteration(1), (NsCoefficients{4, 5, 6}));
  EXPECT_EQ(c.ForIteration(7), (NsCoefficients{4, 5, 6}));
}

TEST(NsConfig, PolarExpressPreset) {
  auto pe = PolarExpressCoefficients();
  ASSERT_EQ(pe.size(), 8u);
  // First row: published (8.2872..., -23.5958..., 17.3003...) over (1.01, 1.01^3, 1.01^5).
  EXPECT_NEAR(pe[0][0], 8.28721201814563 / 1.01, 1e-12);
  EXPECT_NEAR(pe[0][1], -23.595886519098837 / (1.01 * 1.01 * 1.01), 1e-12);
  EXPECT_NEAR(pe[0][2], 17.300387312530933 / (1.01 * 1.01 * 1.01 * 1.01 * 1.01), 1e-12);
  // The last row is the fixed point's polynomial, without the safety factor.
  EXPECT_EQ(pe[7], (NsCoefficients{1.875, -1.25, 0.375}));
  // The last polynomial p(x) = a x + b x^3 + c x^5 has 1 as its fixed point.
  EXPECT_EQ(pe[7][0] + pe[7][1] + pe[7][2], 1.0);
  // The first one inflates small singular values the most.
  for (size_t i = 1; i < pe.size(); ++i) EXPECT_GT(pe[0][0], pe[i][0]);
}

// The published tables (Emerging-Optimizers' _COEFFICIENT_SETS), typed here
// value for value.
TEST(NsConfig, CansPresetIsThePublishedTable) {
  const std::vector<NsCoefficients> want = {{8.4703, -25.1081, 18.6293},
                                            {4.1828, -3.1087, 0.5806},
                                            {3.9619, -2.9541, 0.5630},
                                            {3.2866, -2.4647, 0.5074},
                                            {2.2737, -1.6447, 0.4162}};
  EXPECT_EQ(ScheduleCoefficients(NsSchedule::kCans), want);
  EXPECT_EQ(ScheduleSteps(NsSchedule::kCans), 0);  // any count: the last row repeats
}

TEST(NsConfig, DeepSeekV4PresetIsEightQuinticsThenTwoFinishers) {
  const auto rows = ScheduleCoefficients(NsSchedule::kDeepSeekV4);
  ASSERT_EQ(rows.size(), 10u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(rows[i], (NsCoefficients{3.4445, -4.7750, 2.0315})) << i;
  for (int i = 8; i < 10; ++i) EXPECT_EQ(rows[i], (NsCoefficients{2.0, -1.5, 0.5})) << i;
  EXPECT_EQ(ScheduleSteps(NsSchedule::kDeepSeekV4), 10);
}

TEST(NsConfig, Cubic5PresetIsThePublishedTableWithCZero) {
  const std::vector<NsCoefficients> want = {{3.3656576, -3.3420992, 0.0},
                                            {2.5744352, -1.4957376, 0.0},
                                            {2.5368962, -1.4312570, 0.0},
                                            {2.4418906, -1.2764040, 0.0},
                                            {2.2230472, -0.9630650, 0.0}};
  EXPECT_EQ(ScheduleCoefficients(NsSchedule::kCubic5), want);
  EXPECT_EQ(ScheduleSteps(NsSchedule::kCubic5), 5);
}

TEST(NsConfig, CubicIterationsCountsTheRowsWithCZero) {
  NsConfig c;
  EXPECT_EQ(CubicIterations(c), 0);
  c.coefficients = ScheduleCoefficients(NsSchedule::kCubic5);
  EXPECT_EQ(CubicIterations(c), 5);
  c.coefficients = {{3, -3, 0}, {2, -1, 0.5}};  // one cubic, then the quintic repeats
  c.steps = 4;
  EXPECT_EQ(CubicIterations(c), 1);
}

TEST(NsConfig, Validation) {
  NsConfig c;
  c.steps = 100;
  EXPECT_NE(ValidateNsConfig(c).message().find("ns_steps"), std::string::npos);
  c.steps = -1;
  EXPECT_FALSE(ValidateNsConfig(c).ok());
  c = NsConfig();
  c.eps = 0;
  EXPECT_NE(ValidateNsConfig(c).message().find("eps"), std::string::npos);
  c = NsConfig();
  c.coefficients.clear();
  EXPECT_FALSE(ValidateNsConfig(c).ok());
  c = NsConfig();
  c.coefficients[0][1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(ValidateNsConfig(c).ok());
  c = NsConfig();
  c.steps = 99;
  EXPECT_TRUE(ValidateNsConfig(c).ok());
}

// A split member's cost: the m^2 n terms at its block's width, the m x m
// ones whole. Over the parts: the whole's, plus the m x m work every other
// member repeats.
TEST(NsConfig, BlockFlopsCountAPartOfTheWhole) {
  const int64_t m = 64, n = 224;
  for (NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    NsConfig c;
    c.algorithm = algorithm;
    const double whole = NewtonSchulzFlops(c, m, n);
    const double mm = NewtonSchulzBlockFlops(c, m, 0, n);  // what every member computes
    EXPECT_EQ(NewtonSchulzBlockFlops(c, m, n, n), whole);
    EXPECT_DOUBLE_EQ(NewtonSchulzBlockFlops(c, m, 100, n) + NewtonSchulzBlockFlops(c, m, 124, n),
                     whole + mm);
  }
  NsConfig gram;
  gram.algorithm = NsAlgorithm::kGram;
  NsConfig standard;
  // Gram's: 2 R formed (the start, the restart at 2) and 2 X = Q W of m^2 n
  // each, against the standard iteration's 5 x 4 m^2 n.
  EXPECT_DOUBLE_EQ(NewtonSchulzBlockFlops(gram, m, n, n) - NewtonSchulzBlockFlops(gram, m, 0, n),
                   4 * 2.0 * m * m * n);
  EXPECT_DOUBLE_EQ(
      NewtonSchulzBlockFlops(standard, m, n, n) - NewtonSchulzBlockFlops(standard, m, 0, n),
      5 * 4.0 * m * m * n);
  // A square matrix runs the standard iteration.
  EXPECT_EQ(NewtonSchulzBlockFlops(gram, m, 32, m), NewtonSchulzBlockFlops(standard, m, 32, m));
}

}  // namespace
}  // namespace muon
