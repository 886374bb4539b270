// The CPU's fp32 helpers of Gram Newton-Schulz and of the standard update:
// S W with S read as symmetric, and Gram's workspace size. (Gram
// Newton-Schulz itself is muon/math/split_ns.h's GramNewtonSchulzOn, on any
// backend's steps.)
#ifndef MUON_MATH_CPU_GRAM_NS_H_
#define MUON_MATH_CPU_GRAM_NS_H_

#include <cstddef>
#include <cstdint>

#include "muon/math/ns_program.h"

namespace muon {
namespace cpu {

// out = S W in the program's layout (W^T when wide, W when tall), S (m x m,
// column-major) read as the symmetric matrix its upper triangle is: the
// update of the standard fp32 iteration and Gram's X = Q W alike.
void SymmetricTimesW(const NsProgram& program, const float* s, const float* x, float* out);

// The fp32 workspace Gram Newton-Schulz takes: X' (m x n) and four m x m.
size_t GramWorkFloats(const NsProgram& program);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_GRAM_NS_H_
