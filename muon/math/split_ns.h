// A member's block of a matrix orthogonalized by several ranks (split
// Newton-Schulz) as steps of any backend: the program that
// MathBackend::OrthogonalizeBlock and NorMuonBlock define (backend.h), run
// through the backend's RowSquares, NormDivisor, DivideRows, RunProduct,
// ScaleRounded, CopyRuns, AolScale and AddIdentity with the members' sums in
// between, on memory the caller provides: the standard iteration, AOL's
// pre-scaling and Gram Newton-Schulz alike. The engine runs it on a GPU's
// steps; the CPU backend's OrthogonalizeBlock and NorMuonBlock are this
// program on its own steps, so one program serves every backend.
#ifndef MUON_MATH_SPLIT_NS_H_
#define MUON_MATH_SPLIT_NS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "muon/math/backend.h"
#include "muon/math/ns_config.h"

namespace muon {

// The block's workspace, in backend memory: per row of the whole its
// squares and divisor, AOL's scales (m), X' (the block's elements), the gram
// and the polynomial (m x m), and Gram Newton-Schulz's Q and its scratch
// (m x m each; null unless the block runs it).
struct SplitWork {
  double* squares = nullptr;
  double* scales = nullptr;
  float* divisors = nullptr;
  float* x_next = nullptr;
  float* gram = nullptr;
  float* poly = nullptr;
  float* q = nullptr;
  float* t = nullptr;
};

// The bytes of the workspace under `config` for a block of m x width
// elements of a matrix whose wide orientation is m x n, with `rows` rows, and
// the workspace laid out at `base` (8-byte aligned).
size_t SplitWorkBytes(const NsConfig& config, int64_t m, int64_t width, int64_t n,
                      int64_t rows);
SplitWork SplitWorkAt(void* base, const NsConfig& config, int64_t m, int64_t width, int64_t n,
                      int64_t rows);

// InvalidArgument unless `block` is a block of its whole (data set, m and
// width positive, its columns inside the whole's n).
absl::Status CheckSplitBlock(const MatrixBlock& block);

// Gram Newton-Schulz (NsAlgorithm::kGram) of x on `backend`'s steps, in
// place: x already normalized (rounded to the dtype), stored as `program`
// says (a whole matrix's PlanNewtonSchulz(1, ...) or a block's
// PlanNewtonSchulzBlock); R = W W^T goes through `sums` where it is formed
// (the start and each restart; a whole matrix's sums leave it as it is),
// then is rounded. Uses work's x_next, gram, poly, q and t. The program, as
// cuBLASLt or CBLAS calls on m x m operands, per iteration i with (a, b, c):
//   Z = b R + c R R                    (one symmetric product, beta = b)
//   Q = Z + a I (i = 0 or a restart), else Q = Q Z + a Q
//   if i + 1 is not a restart nor the end: T = R Z + a R; R = Z T + a T
//   at a restart (before the above): X = Q X (m x n), R = X X^T
// and X = Q X at the end: two m x n products per restart and at the ends
// where the standard iteration runs three per iteration.
absl::Status GramNewtonSchulzOn(MathBackend& backend, const NsConfig& config,
                                const NsProgram& program, float* x, const MemberSums& sums,
                                const SplitWork& work);

// MathBackend::OrthogonalizeBlock's program on `backend`'s steps.
absl::Status OrthogonalizeBlockOn(MathBackend& backend, const NsConfig& config,
                                  const MatrixBlock& block, const MemberSums& sums,
                                  const SplitWork& work);

// MathBackend::NorMuonBlock's on `backend`'s steps, after it.
absl::Status NorMuonBlockOn(MathBackend& backend, const NorMuonStep& step,
                            const MatrixBlock& block, float* moments, const MemberSums& sums,
                            const SplitWork& work);

}  // namespace muon

#endif  // MUON_MATH_SPLIT_NS_H_
