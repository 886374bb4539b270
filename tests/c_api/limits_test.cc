// The C API at the ends of its ranges: muon_status_string over every int a
// C host can pass.
#include <climits>

#include "capi/muon.h"
#include "gtest/gtest.h"
#include "tests/c_api/status_of_int.h"

namespace {

TEST(StatusString, EveryIntGetsStaticTextAndUndeclaredOnesSaySo) {
  EXPECT_STREQ(muon_test_status_string_of_int(0), "OK");
  EXPECT_STREQ(muon_test_status_string_of_int(3), "INVALID_ARGUMENT");
  EXPECT_STREQ(muon_test_status_string_of_int(14), "UNAVAILABLE");
  // absl codes the header does not declare, numbers past the enum's range,
  // negative ones: one text, never NULL, and no read of the value as a
  // muon_status_t inside the library (undefined in C++ for values past the
  // enum's range: clang's -fsanitize=enum reports it; GCC's UBSan, which
  // --config=asan uses, does not instrument it).
  for (int v : {4, 7, 10, 15, 16, 17, 255, 999, 1 << 20, INT_MAX, -1, -999, INT_MIN}) {
    const char* s = muon_test_status_string_of_int(v);
    ASSERT_NE(s, nullptr) << v;
    EXPECT_STREQ(s, "UNRECOGNIZED_STATUS") << v;
  }
}

}  // namespace
