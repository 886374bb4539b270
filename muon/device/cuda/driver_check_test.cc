// DriverMismatch: which drivers run a plugin built with which CUDA, and what
// the refusal says (the versions as CUDA numbers them: 1000 major + 10 minor).
#include "muon/device/cuda/driver_check.h"

#include "gtest/gtest.h"

namespace muon {
namespace {

TEST(DriverCheck, ADriverOfTheSameMajorOrNewerWillDo) {
  EXPECT_EQ(DriverMismatch(13000, 13000), "");
  EXPECT_EQ(DriverMismatch(13020, 13000), "");  // a newer minor
  EXPECT_EQ(DriverMismatch(13000, 13020), "");  // an older minor: minor-version compatibility
  EXPECT_EQ(DriverMismatch(14000, 13000), "");
}

TEST(DriverCheck, AnOlderMajorIsRefusedNamingBothVersionsAndTheFix) {
  const std::string m = DriverMismatch(12080, 13000);
  EXPECT_NE(m.find("supports CUDA 12.8"), std::string::npos) << m;
  EXPECT_NE(m.find("built with CUDA 13.0"), std::string::npos) << m;
  EXPECT_NE(m.find("580 or later"), std::string::npos) << m;
  EXPECT_NE(m.find("CUDA 12 toolkit"), std::string::npos) << m;
  EXPECT_NE(DriverMismatch(11040, 12010).find("525 or later"), std::string::npos);
}

TEST(DriverCheck, NoDriverSaysSo) {
  EXPECT_NE(DriverMismatch(0, 13000).find("no NVIDIA driver"), std::string::npos);
}

}  // namespace
}  // namespace muon
