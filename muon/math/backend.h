// The math every backend provides: the elementwise momentum and parameter
// updates on local pieces, and Newton-Schulz on whole matrices. The engine
// decides what to compute where; a backend only computes.
#ifndef MUON_MATH_BACKEND_H_
#define MUON_MATH_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "muon/common/dtype.h"
#include "muon/math/ns_config.h"
#include "muon/math/ns_program.h"

namespace muon {

// A run of `count` row-major matrices of rows x cols, one after the other, as
// values of `dtype`: fp32, or bf16 for a backend whose SlotDtype says so.
struct MatrixBatch {
  void* data = nullptr;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;
};

// One member's block of a matrix orthogonalized by several ranks together
// (split Newton-Schulz), fp32: columns of the whole's wide orientation W (m x
// n), stored as PlanNewtonSchulzBlock (ns_program.h) says: `width` rows of a
// tall matrix (rows > cols, m = cols) or `width` columns of a wide one (m =
// rows), packed row-major: the whole's columns [first, first + width) of its
// n.
struct MatrixBlock {
  float* data = nullptr;
  int64_t m = 0;
  int64_t width = 0;
  bool tall = false;
  int64_t first = 0;
  int64_t n = 0;
};

// The sums a split Newton-Schulz takes over its members: each call replaces
// values[0, count) with the element-wise sum of every member's values. Every
// member makes the same calls in the same order (a collective among them:
// BlockSums in ns_program.h lists OrthogonalizeBlock's, NorMuonBlock adds
// one), and every member must get the same sums, bit for bit.
struct MemberSums {
  std::function<absl::Status(double* values, int64_t count)> f64;
  std::function<absl::Status(float* values, int64_t count)> f32;
};

// The hyper-parameters the element-wise kernels read at the time they run,
// from the backend's memory (device memory on a GPU): StoreScalars writes them
// on the stream, so a CUDA graph replay of a step reads the values written
// last, not values baked into the graph (torch's `capturable`).
struct StepScalars {
  double lr = 0.0;
  double weight_decay = 0.0;
  double momentum = 0.0;
};

// One tensor's momentum step on n elements (see the C header for the
// formulas):
//   buf <- lerp(buf, grad, 1 - momentum)             stored in buf_dtype
//   out <- nesterov ? lerp(grad, buf, momentum) : buf
// `out` receives values already rounded to buf_dtype (the precision torch's
// update tensor has), stored as out_dtype; `out` may be `grad` itself (each
// element is read before it is written).
struct MomentumArgs {
  DType grad_dtype = DType::kF32;
  const void* grad = nullptr;
  DType buf_dtype = DType::kF32;
  void* buf = nullptr;
  int64_t n = 0;
  void* out = nullptr;
  DType out_dtype = DType::kF32;
};

// What every tensor of one Momentum call shares.
struct MomentumStep {
  const StepScalars* scalars = nullptr;  // backend memory: `momentum` read from it
  bool nesterov = true;
  // When set: += the non-finite elements of the grads, counted in the same
  // pass. In the backend's memory (a device counter on a GPU, added to by the
  // kernel, stream-ordered).
  int64_t* nonfinite = nullptr;
};

// Decoupled decay and the update on n elements of a parameter:
//   param <- param * (1 - lr * weight_decay);  param <- param - lr * lr_ratio * update
// each rounded to the parameter's dtype, as torch's mul_ and add_ do.
struct ApplyArgs {
  DType param_dtype = DType::kF32;
  void* param = nullptr;
  int64_t n = 0;
  const void* update = nullptr;
  double lr_ratio = 1.0;  // the shape's lr adjustment: adjusted lr = lr * lr_ratio
  DType update_dtype = DType::kF32;
  // Cautious weight decay: the decay only where update * param >= 0
  // (ew::CautiousDecay).
  bool cautious = false;
  // The parameter's decay: weight_decay * weight_decay_scale (1 exactly: the
  // step's weight decay as it is).
  double weight_decay_scale = 1.0;
};

// One tensor of a CountNonFiniteAll call: n elements of `dtype` at `data`
// (backend memory).
struct CountArgs {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t n = 0;
};

// What every tensor of one Apply call shares.
struct ApplyStep {
  const StepScalars* scalars = nullptr;  // backend memory: lr and weight_decay read from it
  // When set: the step's go-ahead in the backend's memory (VerdictGate's
  // flag): nothing is applied unless *gate == 0.
  const int32_t* gate = nullptr;
};

// NorMuon's settings (muon/math/normuon.h): the moments' decay, the root's
// eps, and the dtype whose precision the normalized update keeps.
struct NorMuonStep {
  double beta2 = 0.95;
  double eps = 1e-8;
  NsDtype ns_dtype = NsDtype::kBF16;
};

// Where a backend's own memory (its Newton-Schulz workspace) comes from: the
// device's Allocate (counted, and served by the host's allocator when one is
// set). Unset: the backend allocates by itself.
struct MemorySource {
  std::function<absl::StatusOr<void*>(size_t bytes, const std::string& what)> allocate;
  std::function<void(void*)> free;
};

class MathBackend {
 public:
  virtual ~MathBackend() = default;

  // Set once, before any other call.
  virtual void SetMemorySource(MemorySource source) { (void)source; }
  // The optimizer is rank `world_rank` of a world of more than one rank:
  // the CPU backends of different ranks in one process divide its cores
  // (muon/math/cpu/cpu_threads.h).
  virtual void JoinWorld(int world_rank) { (void)world_rank; }

  // Every tensor of `tensors` (one launch on a GPU, however many).
  virtual absl::Status Momentum(const MomentumStep& step, absl::Span<const MomentumArgs> tensors) = 0;
  virtual absl::Status Apply(const ApplyStep& step, absl::Span<const ApplyArgs> tensors) = 0;
  // dst[0, bytes) (backend memory) <- src[0, bytes) (host memory, at most
  // kMaxStoreBytes), stream-ordered; the bytes are taken at the call (a
  // graph captures them as they are now), so src may change after.
  static constexpr size_t kMaxStoreBytes = 64;
  virtual absl::Status StoreBytes(void* dst, const void* src, size_t bytes) = 0;
  absl::Status StoreScalars(StepScalars* dst, const StepScalars& value) {
    return StoreBytes(dst, &value, sizeof value);
  }

  // dst <- src as `height` runs of `width` bytes: run i from src + i *
  // src_pitch to dst + i * dst_pitch (width <= both pitches; backend memory,
  // regions apart; stream-ordered). Split blocks gather and scatter so.
  virtual absl::Status CopyRuns(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                size_t width, size_t height) = 0;
  // Every element of `batch` (any dtype, backend memory) multiplied by
  // `factor` in fp32 and rounded to `precision`, then to the batch's dtype:
  // a split block's lr factor (rounded as the result of Newton-Schulz is),
  // QK-Clip's factor of a head's weights (precision fp32).
  virtual absl::Status ScaleRounded(const MatrixBatch& batch, float factor, NsDtype precision) = 0;

  // Orthogonalizes every matrix of `batch` in place with `config`. Every
  // backend takes fp32 batches; bf16 ones only where SlotDtype says so.
  virtual absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) = 0;
  // Orthogonalizes, with the other members, the matrix `block` is this
  // member's part of; `block` receives its part of the result. The whole's
  // norm is the root of the members' summed squares; each iteration sums the
  // members' unrounded gram products before the polynomial (which every
  // member computes, m x m), so the result is the whole matrix's up to the
  // order of fp32 sums. Gram Newton-Schulz sums R = W W^T where it forms it
  // (at the start and at each restart); every member then runs the m x m
  // iterations and multiplies its own block by Q. bf16 and fp16 round as the
  // emulated path does (fp32 products rounded). The sums are BlockSums'.
  // Unimplemented on backends that lack it.
  virtual absl::Status OrthogonalizeBlock(const NsConfig& config, const MatrixBlock& block,
                                          const MemberSums& sums) {
    (void)config;
    (void)block;
    (void)sums;
    return absl::UnimplementedError("split Newton-Schulz (one matrix over several ranks) is not "
                                    "available on this backend");
  }
  // NorMuon on one member's block of a split matrix, after OrthogonalizeBlock:
  // the parameter's rows' sums of squares are summed over the members (one
  // f64 sum of `rows` values: the whole's n when tall, m when wide), so that
  // every member updates all of `moments` (backend memory) alike, as NorMuon
  // on the whole would, and divides its block's part of each row.
  // Unimplemented on backends that lack it.
  virtual absl::Status NorMuonBlock(const NorMuonStep& step, const MatrixBlock& block,
                                    float* moments, const MemberSums& sums) {
    (void)step;
    (void)block;
    (void)moments;
    (void)sums;
    return absl::UnimplementedError("NorMuon on a split matrix is not available on this backend");
  }
  // The steps of a member's block, for a backend without an OrthogonalizeBlock
  // and NorMuonBlock of its own (a GPU's): muon/math/split_ns.h runs the
  // block's program through them, with the members' sums in between. Each is
  // stream-ordered, on backend memory; Unimplemented on backends that lack
  // them.
  //
  // out[0, out_rows) <- 0, then out[row0 + i] <- the sum of the squares of
  // row i of x (rows x cols fp32, row-major), in double.
  virtual absl::Status RowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                                  int64_t out_rows, int64_t row0) {
    (void)x, (void)rows, (void)cols, (void)out, (void)out_rows, (void)row0;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // *divisor <- what Newton-Schulz under `config` divides a matrix by whose
  // squares sum to *squares (of its values rounded to bf16 when bf16): the
  // norm, rounded as the whole matrix's normalization rounds it.
  virtual absl::Status NormDivisor(const NsConfig& config, const double* squares,
                                   float* divisor) {
    (void)config, (void)squares, (void)divisor;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // NorMuonRowDivisors (muon/math/normuon.h) of one rows x cols matrix from
  // its rows' sums of squares: updates `moments`, writes `divisors`.
  virtual absl::Status NorMuonDivisors(const double* row_sq, int64_t rows, int64_t cols,
                                       double beta2, double eps, float* moments,
                                       float* divisors) {
    (void)row_sq, (void)rows, (void)cols, (void)beta2, (void)eps, (void)moments, (void)divisors;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // Row i of x (rows x cols fp32) <- x_i / divisors[i], rounded to `dtype`'s
  // precision as the normalization rounds its division (bf16 in it, fp16
  // after it).
  virtual absl::Status DivideRows(NsDtype dtype, float* x, int64_t rows, int64_t cols,
                                  const float* divisors) {
    (void)dtype, (void)x, (void)rows, (void)cols, (void)divisors;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // One product of a program (count 1) on `buffers` (indexed by NsBuffer,
  // fp32) with the scalars `abc` gives it, its D then rounded to `round`'s
  // precision (fp32: as it is).
  virtual absl::Status RunProduct(const NsGemm& g, const NsCoefficients& abc,
                                  float* const* buffers, NsDtype round) {
    (void)g, (void)abc, (void)buffers, (void)round;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // out[e] <- parts[0][e] + parts[1][e] + ... + parts[count - 1][e], added in
  // that order (so every member that adds the same parts gets the same
  // bits), for e < len: `count` rows of `len` doubles (f64) or floats at
  // `parts`; out may be one of the rows.
  virtual absl::Status SumInOrder(bool f64, const void* parts, int64_t count, int64_t len,
                                  void* out) {
    (void)f64, (void)parts, (void)count, (void)len, (void)out;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // q <- z + a I (both m x m fp32), rounded to `round`'s precision: Gram
  // Newton-Schulz's Q at its first iteration and at each restart.
  virtual absl::Status AddIdentity(const float* z, int64_t m, float a, NsDtype round, float* q) {
    (void)z, (void)m, (void)a, (void)round, (void)q;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // AOL's pre-scaling (muon/math/cpu/aol.h) of a split block: x (rows x cols
  // fp32, row-major; W's columns, or W^T's rows when `tall`) and `gram` (m x
  // m, the whole's W W^T summed over the members) scaled by the scales from
  // that gram, rounded to config.dtype's precision; `scales`: m doubles of
  // workspace. Unimplemented where `config` is not Supports'.
  virtual absl::Status AolScale(const NsConfig& config, float* x, int64_t rows, int64_t cols,
                                bool tall, float* gram, double* scales) {
    (void)config, (void)x, (void)rows, (void)cols, (void)tall, (void)gram, (void)scales;
    return absl::UnimplementedError("split Newton-Schulz's steps are not available on this "
                                    "backend");
  }
  // OK when this backend runs Newton-Schulz under `config`, whole or split;
  // else Unimplemented naming what it lacks (a GPU's AOL before it is
  // proven). Setup asks it, so that every rank refuses alike before a step.
  virtual absl::Status Supports(const NsConfig& config) const {
    (void)config;
    return absl::OkStatus();
  }
  // NorMuon on every matrix of `batch` (orthogonalized updates, in place),
  // matrix k with its rows' second moments at moments[k] (fp32, `rows`
  // each, backend memory), as muon/math/normuon.h defines it; a NULL
  // moments[k] passes over matrix k (its parameter is not stepped).
  // Unimplemented on backends that lack it.
  virtual absl::Status NorMuon(const NorMuonStep& step, const MatrixBatch& batch,
                               float* const* moments) {
    (void)step;
    (void)batch;
    (void)moments;
    return absl::UnimplementedError("NorMuon is not available on this backend yet");
  }
  // The dtype Orthogonalize takes its matrices in with the least work for
  // `config`: kBF16 where bf16 Newton-Schulz multiplies bf16 natively and
  // would only round fp32 input to bf16 first and widen its bf16 result
  // (the CPU's AMX kernel), else kF32. The results are the same either way.
  virtual DType SlotDtype(const NsConfig& config) {
    (void)config;
    return DType::kF32;
  }

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
  // The same over every tensor of `tensors` into one counter: one launch on
  // a GPU, however many (skip_nonfinite's count of a step's gradients).
  virtual absl::Status CountNonFiniteAll(absl::Span<const CountArgs> tensors, int64_t* counter) {
    for (const CountArgs& t : tensors) {
      absl::Status st = CountNonFinite(t.dtype, t.data, t.n, counter);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

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

}  // namespace muon

#endif  // MUON_MATH_BACKEND_H_
