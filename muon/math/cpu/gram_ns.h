// Gram Newton-Schulz on the CPU (NsAlgorithm::kGram, ns_config.h): the
// iterations run on the m x m Gram matrix R = W W^T of the wide orientation
// W (m x n), accumulating the polynomial Q that W is multiplied by at the
// end; restarts form W = Q W and R afresh. Every product is an fp32 BLAS
// call (symmetric ones where the math allows: R, R^2, and Q, R, Z read as
// the symmetric matrices they are), each result rounded to the compute
// dtype (bf16 or fp16 tensors with fp32 accumulation, as the reference's
// torch backend computes them; fp32: not rounded).
//
// The GPU program it describes, per iteration i with (a, b, c), as cuBLASLt
// calls on m x m operands (the symmetric ones as SYRK-style half products):
//   Z = b R + c R R                      (one symmetric product, beta = b)
//   Q = Z + a I (i = 0 or a restart), else Q = Q Z + a Q
//   if i + 1 is not a restart nor the end: RZ = R Z + a R; R = Z RZ + a RZ
//   at a restart (before the above): X = Q X (m x n), R = X X^T
// and X = Q X at the end: two m x n products per restart and at the ends
// where the standard iteration runs three per iteration.
#ifndef MUON_MATH_CPU_GRAM_NS_H_
#define MUON_MATH_CPU_GRAM_NS_H_

#include <cstddef>
#include <cstdint>

#include "muon/math/ns_config.h"
#include "muon/math/ns_program.h"

namespace muon {
namespace cpu {

// out = S W in the program's layout (W^T when wide, W when tall), S (m x m,
// column-major) read as the symmetric matrix its upper triangle is: the
// update of the standard fp32 iteration and Gram's X = Q W alike.
void SymmetricTimesW(const NsProgram& program, const float* s, const float* x, float* out);

// The fp32 workspace GramNewtonSchulz takes: X' (m x n) and four m x m.
size_t GramWorkFloats(const NsProgram& program);

// Gram Newton-Schulz of one matrix `u`, already normalized (and rounded to
// `round`, an ew:: type), stored as `program` says (W^T when wide, W when
// tall, column-major: the standard program's layout); the result replaces
// it. `work`: GramWorkFloats(program) floats. (A split matrix's block runs
// the same program on a backend's steps: muon/math/split_ns.h.)
void GramNewtonSchulz(const NsConfig& config, const NsProgram& program, float* u, float* work,
                      int round);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_GRAM_NS_H_
