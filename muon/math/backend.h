// The math every backend provides: the elementwise momentum and parameter
// updates on local pieces, and Newton-Schulz on whole matrices. The engine
// decides what to compute where; a backend only computes.
#ifndef MUON_MATH_BACKEND_H_
#define MUON_MATH_BACKEND_H_

#include <cstdint>

#include "absl/status/status.h"
#include "muon/common/dtype.h"
#include "muon/math/ns_config.h"

namespace muon {

// A run of `count` row-major matrices of rows x cols, one after the other, as
// fp32 values.
struct MatrixBatch {
  float* data = nullptr;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// One momentum step on n elements (see the C header for the formulas):
//   buf <- lerp(buf, grad, 1 - momentum)             stored in buf_dtype
//   out <- nesterov ? lerp(grad, buf, momentum) : buf
// `out` receives fp32 values already rounded to buf_dtype, the precision
// torch's update tensor has.
struct MomentumArgs {
  DType grad_dtype = DType::kF32;
  const void* grad = nullptr;
  DType buf_dtype = DType::kF32;
  void* buf = nullptr;
  int64_t n = 0;
  double momentum = 0.95;
  bool nesterov = true;
  float* out = nullptr;
  // When set: += the non-finite elements of grad, counted in the same pass.
  // In the backend's memory (a device counter on a GPU, added to by the
  // kernel, stream-ordered).
  int64_t* nonfinite = nullptr;
};

// Decoupled decay and the update on n elements of a parameter:
//   param <- param * decay;  param <- param - lr_adjusted * update
// each rounded to the parameter's dtype, as torch's mul_ and add_ do.
struct ApplyArgs {
  DType param_dtype = DType::kF32;
  void* param = nullptr;
  int64_t n = 0;
  const float* update = nullptr;
  double decay = 1.0;        // 1 - lr * weight_decay
  double lr_adjusted = 0.0;  // adjusted lr
  // When set: the step's go-ahead in the backend's memory (VerdictGate's
  // flag): nothing is applied unless *gate == 0.
  const int32_t* gate = nullptr;
};

class MathBackend {
 public:
  virtual ~MathBackend() = default;

  virtual absl::Status Momentum(const MomentumArgs& args) = 0;
  virtual absl::Status Apply(const ApplyArgs& args) = 0;

  // Orthogonalizes every matrix of `batch` in place with `config`.
  virtual absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) = 0;

  // Grows the workspace for a batch of `count` rows x cols matrices, so that
  // later Orthogonalize calls up to that size allocate nothing.
  // ResourceExhausted when memory is short.
  virtual absl::Status Reserve(const NsConfig& config, int64_t count, int64_t rows,
                               int64_t cols) = 0;
  // *counter += the non-finite elements of n elements of `dtype` at `data`
  // (both in the backend's memory; stream-ordered): skip_nonfinite's count
  // before a step changes anything.
  virtual absl::Status CountNonFinite(DType dtype, const void* data, int64_t n,
                                      int64_t* counter) = 0;

  // The step's go-ahead, computed where the verdicts are (no host wait on a
  // GPU): *flag = 0 when every one of the `n` 16-byte records at `verdicts`
  // (u32 magic, i32 status code, u64 digest; see muon/engine/outcome.h) has
  // `magic`, code 0 and record 0's digest; else 1. Both in the backend's
  // memory; stream-ordered.
  virtual absl::Status VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                                   int32_t* flag) = 0;

  // Orders every later call on `stream` (a cudaStream_t on a GPU); the host
  // backend has no streams.
  virtual absl::Status SetStream(void* stream) {
    (void)stream;
    return absl::OkStatus();
  }
};

// FLOPs of one Newton-Schulz orthogonalization of a rows x cols matrix with
// `steps` iterations, counting 4 m^2 n + 2 m^3 per iteration (m <= n).
double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps);

}  // namespace muon

#endif  // MUON_MATH_BACKEND_H_
