// An independent reference for tests: Newton-Schulz in double precision with
// naive loops, straight from the definition in include/libmuon/muon.h (transpose
// tall matrices, normalize with the eps clamp, iterate, transpose back).
#ifndef MUON_MATH_TESTING_REFERENCE_NS_H_
#define MUON_MATH_TESTING_REFERENCE_NS_H_

#include <cstdint>
#include <vector>

#include "muon/math/ns_config.h"

namespace muon {

// `u` is a rows x cols row-major matrix; the result has the same layout.
std::vector<double> ReferenceNewtonSchulz(const std::vector<double>& u, int64_t rows,
                                          int64_t cols, const NsConfig& config);
// The same loops in float (torch's formula in fp32, naively summed): how far
// any fp32 Newton-Schulz may land from the double one, for schedules that
// amplify round-off (CANS).
std::vector<float> ReferenceNewtonSchulzFp32(const std::vector<float>& u, int64_t rows,
                                             int64_t cols, const NsConfig& config);

}  // namespace muon

#endif  // MUON_MATH_TESTING_REFERENCE_NS_H_
