// CudaBackend's steps of a split matrix's block (muon/math/split_ns.h runs
// them, with the members' sums in between): launches of split_kernels.h and
// normuon_kernels.h, and fp32 cuBLASLt products rounded after.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/cuda/cuda_backend.h"
#include "muon/math/cuda/cuda_backend_impl.h"
#include "muon/math/cuda/aol_kernels.h"
#include "muon/math/cuda/normuon_kernels.h"
#include "muon/math/cuda/ns_kernels.h"
#include "muon/math/cuda/split_kernels.h"

namespace muon {
namespace {

int TypeOf(NsDtype dtype) {
  return dtype == NsDtype::kBF16 ? cuda::kBF16 : dtype == NsDtype::kFP16 ? cuda::kF16 : cuda::kF32;
}

}  // namespace

absl::Status CudaBackend::RowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                                     int64_t out_rows, int64_t row0) {
  if (rows < 0 || cols < 0 || row0 < 0 || row0 + rows > out_rows) {
    return absl::InvalidArgumentError(absl::StrCat("the squares of ", rows, " rows at row ", row0,
                                                   " of ", out_rows));
  }
  const size_t partials =
      static_cast<size_t>(rows > 0 ? rows : 1) * static_cast<size_t>(cuda::SquareChunks(cols));
  MUON_RETURN_IF_ERROR(
      impl_->square_partials.Reserve(partials * sizeof(double), "a split block's squares"));
  MUON_CUDA_LAUNCH(cuda::LaunchRowSquares(x, rows, cols, out, out_rows, row0,
                                          static_cast<double*>(impl_->square_partials.ptr),
                                          impl_->stream),
                   "a split block's squares");
  return absl::OkStatus();
}

absl::Status CudaBackend::NormDivisor(const NsConfig& config, const double* squares,
                                      float* divisor) {
  if (config.aol) return absl::InternalError("AOL divides by no norm");
  MUON_CUDA_LAUNCH(cuda::LaunchNormDivisor(squares, config.dtype == NsDtype::kBF16 ? 1 : 0,
                                           static_cast<float>(config.eps), divisor,
                                           impl_->stream),
                   "a split block's norm");
  return absl::OkStatus();
}

absl::Status CudaBackend::NorMuonDivisors(const double* row_sq, int64_t rows, int64_t cols,
                                          double beta2, double eps, float* moments,
                                          float* divisors) {
  MUON_CUDA_LAUNCH(cuda::LaunchNorMuonRowDivisors(row_sq, rows, cols, beta2, eps, moments,
                                                  divisors, impl_->stream),
                   "NorMuon's divisors of a split matrix");
  return absl::OkStatus();
}

absl::Status CudaBackend::DivideRows(NsDtype dtype, float* x, int64_t rows, int64_t cols,
                                     const float* divisors) {
  MUON_CUDA_LAUNCH(cuda::LaunchDivideRows(x, rows, cols, divisors, TypeOf(dtype), impl_->stream),
                   "dividing a split block's rows");
  return absl::OkStatus();
}

absl::Status CudaBackend::RunProduct(const NsGemm& g, const NsCoefficients& abc,
                                     float* const* buffers, NsDtype round) {
  MUON_ASSIGN_OR_RETURN(const LtProduct* lp, impl_->BlockProduct(g));
  float* const d = buffers[static_cast<int>(g.d.buffer)];
  MUON_RETURN_IF_ERROR(impl_->Matmul(*lp, NsScalarValue(g.alpha, abc),
                                     buffers[static_cast<int>(g.a.buffer)],
                                     buffers[static_cast<int>(g.b.buffer)],
                                     NsScalarValue(g.beta, abc),
                                     buffers[static_cast<int>(g.c.buffer)], d,
                                     "a split block's product"));
  if (round == NsDtype::kFP32) return absl::OkStatus();
  MUON_CUDA_LAUNCH(cuda::LaunchScaleRounded(cuda::kF32, d, g.d.ld * g.n, 1.0f, TypeOf(round),
                                            impl_->stream),
                   "rounding a split block's product");
  return absl::OkStatus();
}

absl::Status CudaBackend::SumInOrder(bool f64, const void* parts, int64_t count, int64_t len,
                                     void* out) {
  MUON_CUDA_LAUNCH(cuda::LaunchSumInOrder(f64 ? 1 : 0, parts, count, len, out, impl_->stream),
                   "summing the members' parts");
  return absl::OkStatus();
}

absl::Status CudaBackend::AddIdentity(const float* z, int64_t m, float a, NsDtype round,
                                      float* q) {
  MUON_CUDA_LAUNCH(cuda::LaunchAddIdentity(cuda::kF32, z, q, 1, m, a, impl_->stream),
                   "Gram Newton-Schulz's Q = Z + a I of a split block");
  if (round == NsDtype::kFP32) return absl::OkStatus();
  MUON_CUDA_LAUNCH(cuda::LaunchScaleRounded(cuda::kF32, q, m * m, 1.0f, TypeOf(round),
                                            impl_->stream),
                   "rounding a split block's Q");
  return absl::OkStatus();
}

absl::Status CudaBackend::AolScale(const NsConfig& config, float* x, int64_t rows, int64_t cols,
                                   bool tall, float* gram, double* scales) {
  MUON_RETURN_IF_ERROR(Supports(config));
  // In double, each value stored as fp32 (cpu/aol.h's order), then rounded
  // to the dtype as the CPU rounds its fp32 results.
  MUON_CUDA_LAUNCH(cuda::LaunchAolScale(cuda::kF32, x, gram, 1, rows, cols, tall, config.eps,
                                        scales, impl_->stream),
                   "AOL's scaling of a split block");
  if (config.dtype == NsDtype::kFP32) return absl::OkStatus();
  const int64_t m = tall ? cols : rows;
  MUON_CUDA_LAUNCH(cuda::LaunchScaleRounded(cuda::kF32, x, rows * cols, 1.0f,
                                            TypeOf(config.dtype), impl_->stream),
                   "rounding a split block's AOL-scaled values");
  MUON_CUDA_LAUNCH(cuda::LaunchScaleRounded(cuda::kF32, gram, m * m, 1.0f, TypeOf(config.dtype),
                                            impl_->stream),
                   "rounding a split block's AOL-scaled gram");
  return absl::OkStatus();
}

}  // namespace muon
