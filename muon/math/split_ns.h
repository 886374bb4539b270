// A member's block of a matrix orthogonalized by several ranks (split
// Newton-Schulz) as steps of any backend: the program that
// MathBackend::OrthogonalizeBlock and NorMuonBlock define (backend.h), run
// through the backend's RowSquares, NormDivisor, DivideRows, RunProduct and
// ScaleRounded with the members' sums in between, on memory the caller
// provides. The engine runs it on backends without an OrthogonalizeBlock of
// their own (GPUs); on the CPU backend's steps it gives the bits of the CPU's
// OrthogonalizeBlock (split_ns_test.cc holds it to that).
#ifndef MUON_MATH_SPLIT_NS_H_
#define MUON_MATH_SPLIT_NS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "muon/math/backend.h"
#include "muon/math/ns_config.h"

namespace muon {

// The block's workspace, in backend memory: X' (the block's elements), the
// gram and the polynomial (m x m), and per row of the whole its squares and
// divisor.
struct SplitWork {
  double* squares = nullptr;
  float* divisors = nullptr;
  float* x_next = nullptr;
  float* gram = nullptr;
  float* poly = nullptr;
};

// The bytes of the workspace for a block of m x width elements of a matrix
// of `rows` rows, and the workspace laid out at `base` (8-byte aligned).
size_t SplitWorkBytes(int64_t m, int64_t width, int64_t rows);
SplitWork SplitWorkAt(void* base, int64_t m, int64_t width, int64_t rows);

// InvalidArgument unless `block` is a block of its whole (data set, m and
// width positive, its columns inside the whole's n).
absl::Status CheckSplitBlock(const MatrixBlock& block);

// OK when these steps run `config` on an m x n wide orientation; else
// Unimplemented naming what runs only on the CPU backend so far (AOL's
// pre-scaling; Gram Newton-Schulz on a matrix that is not square).
absl::Status SplitStepsSupport(const NsConfig& config, int64_t m, int64_t n);

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
