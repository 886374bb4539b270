// What the libFuzzer targets share: the check that stops a run on a broken
// invariant (so that libFuzzer keeps the input), and int64 edge values.
#ifndef MUON_FUZZ_FUZZ_UTIL_H_
#define MUON_FUZZ_FUZZ_UTIL_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "libmuon/muon.h"

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// One of the int64 values where overflow and sign bugs live.
inline int64_t SpecialInt(FuzzedDataProvider& in) {
  static const int64_t kValues[] = {-1,
                                    0,
                                    1,
                                    int64_t{1} << 31,
                                    int64_t{1} << 32,
                                    int64_t{1} << 62,
                                    std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min()};
  return kValues[in.ConsumeIntegralInRange<size_t>(0, 7)];
}

// A C API call's status: a code of the header, with a message (this
// thread's muon_last_error_message) exactly when it is not MUON_OK.
inline muon_status_t CheckStatus(muon_status_t st) {
  FUZZ_CHECK(std::strcmp(muon_status_string(st), "UNRECOGNIZED_STATUS") != 0);
  if (st == MUON_OK) {
    FUZZ_CHECK(muon_last_error_message()[0] == '\0');
  } else {
    FUZZ_CHECK(muon_last_error_message()[0] != '\0');
  }
  return st;
}

#endif  // MUON_FUZZ_FUZZ_UTIL_H_
