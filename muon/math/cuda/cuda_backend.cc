#include "muon/math/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/math/cuda/cuda_status.h"
#include "muon/math/cuda/ns_kernels.h"

namespace muon {
namespace {

absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": cuBLAS error ", static_cast<int>(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg + ": out of GPU memory");
  return absl::InternalError(msg);
}

#define MUON_CUDA(expr, what) \
  do {                        \
    auto _s = CudaStatus((expr), what); \
    if (!_s.ok()) return _s;  \
  } while (0)

#define MUON_CUBLAS(expr, what) \
  do {                          \
    auto _s = CublasStatus((expr), what); \
    if (!_s.ok()) return _s;    \
  } while (0)

// A device buffer that only grows.
struct WorkBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  absl::Status Reserve(size_t want) {
    if (want <= bytes) return absl::OkStatus();
    if (ptr != nullptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    MUON_CUDA(cudaMalloc(&ptr, want), "allocating the Newton-Schulz workspace");
    bytes = want;
    return absl::OkStatus();
  }
  ~WorkBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

}  // namespace

struct CudaBackend::Impl {
  cublasHandle_t blas = nullptr;
  cudaStream_t stream = nullptr;
  WorkBuffer x, x_next, gram, poly;
  // cuBLAS's own workspace, set explicitly so that it never allocates inside
  // a step (cublasSetStream drops the workspace it had; 32 MiB as cuBLAS
  // advises for Hopper).
  WorkBuffer blas_workspace;
  static constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
  ~Impl() {
    if (blas != nullptr) cublasDestroy(blas);
  }
};

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (", e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->impl_ = std::make_unique<Impl>();
  MUON_CUBLAS(cublasCreate(&b->impl_->blas), "creating the cuBLAS handle");
  MUON_CUBLAS(cublasSetPointerMode(b->impl_->blas, CUBLAS_POINTER_MODE_HOST), "cuBLAS pointer mode");
  auto ws = b->impl_->blas_workspace.Reserve(Impl::kBlasWorkspaceBytes);
  if (!ws.ok()) return ws;
  MUON_CUBLAS(cublasSetWorkspace(b->impl_->blas, b->impl_->blas_workspace.ptr,
                                 b->impl_->blas_workspace.bytes),
              "setting the cuBLAS workspace");
  return b;
}

CudaBackend::~CudaBackend() = default;

absl::Status CudaBackend::SetStream(void* stream) {
  impl_->stream = static_cast<cudaStream_t>(stream);
  MUON_CUBLAS(cublasSetStream(impl_->blas, impl_->stream), "binding cuBLAS to the stream");
  MUON_CUBLAS(cublasSetWorkspace(impl_->blas, impl_->blas_workspace.ptr, impl_->blas_workspace.bytes),
              "setting the cuBLAS workspace");
  return absl::OkStatus();
}

absl::Status CudaBackend::Momentum(const MomentumArgs& a) {
  MUON_CUDA(cuda::LaunchMomentum(static_cast<int>(a.grad_dtype), a.grad,
                                 static_cast<int>(a.buf_dtype), a.buf, a.n,
                                 static_cast<float>(1.0 - a.momentum),
                                 static_cast<float>(a.momentum), a.nesterov, a.out, a.nonfinite,
                                 impl_->stream),
            "momentum kernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::Apply(const ApplyArgs& a) {
  MUON_CUDA(cuda::LaunchApply(static_cast<int>(a.param_dtype), a.param, a.n, a.update,
                              static_cast<float>(a.decay), static_cast<float>(-a.lr_adjusted),
                              a.gate, impl_->stream),
            "update kernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::CountNonFinite(DType dtype, const void* data, int64_t n,
                                         int64_t* counter) {
  MUON_CUDA(cuda::LaunchCountNonFinite(static_cast<int>(dtype), data, n, counter, impl_->stream),
            "counting non-finite gradients");
  return absl::OkStatus();
}

absl::Status CudaBackend::VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                                      int32_t* flag) {
  MUON_CUDA(cuda::LaunchVerdictGate(verdicts, n, magic, flag, impl_->stream), "verdict kernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::Reserve(const NsConfig& config, int64_t count, int64_t rows,
                                  int64_t cols) {
  const NsDtype dtype = config.dtype;
  const size_t m = static_cast<size_t>(std::min(rows, cols));
  const size_t n = static_cast<size_t>(std::max(rows, cols));
  const size_t elem = dtype == NsDtype::kBF16 ? 2 : 4;
  const size_t k = static_cast<size_t>(count);
  for (WorkBuffer* b : {&impl_->x, &impl_->x_next}) {
    auto st = b->Reserve(k * m * n * elem);
    if (!st.ok()) return st;
  }
  for (WorkBuffer* b : {&impl_->gram, &impl_->poly}) {
    auto st = b->Reserve(k * m * m * elem);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Orthogonalize(const NsConfig& config, const MatrixBatch& batch) {
  if (batch.count == 0 || batch.rows == 0 || batch.cols == 0) return absl::OkStatus();
  auto reserved = Reserve(config, batch.count, batch.rows, batch.cols);
  if (!reserved.ok()) return reserved;
  const bool bf16 = config.dtype == NsDtype::kBF16;
  const int x_type = bf16 ? cuda::kBF16 : cuda::kF32;
  const cudaDataType_t dt = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const size_t elem = bf16 ? 2 : 4;
  const int64_t m = std::min(batch.rows, batch.cols), n = std::max(batch.rows, batch.cols);
  const int count = static_cast<int>(batch.count);
  cudaStream_t s = impl_->stream;
  void* x = impl_->x.ptr;
  void* x_next = impl_->x_next.ptr;
  void* gram = impl_->gram.ptr;
  void* poly = impl_->poly.ptr;

  MUON_CUDA(cuda::LaunchPrepare(batch.data, batch.count, batch.rows, batch.cols, x_type, x, s),
            "Newton-Schulz input kernel");
  MUON_CUDA(cuda::LaunchNormalize(x_type, x, batch.count, m * n, static_cast<float>(config.eps), s),
            "Newton-Schulz norm kernel");
  // Row-major X (m x n) is column-major X^T: cuBLAS sees Xc = X^T (n x m).
  const int mi = static_cast<int>(m), ni = static_cast<int>(n);
  const float one = 1.0f, zero = 0.0f;
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    const float a = static_cast<float>(abc[0]), b = static_cast<float>(abc[1]),
                c = static_cast<float>(abc[2]);
    // gram = X X^T = Xc^T Xc (m x m, symmetric).
    MUON_CUBLAS(cublasGemmStridedBatchedEx(impl_->blas, CUBLAS_OP_T, CUBLAS_OP_N, mi, mi, ni, &one,
                                           x, dt, ni, m * n, x, dt, ni, m * n, &zero, gram, dt, mi,
                                           m * m, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "gram GEMM");
    // poly = b * gram + c * gram @ gram
    MUON_CUDA(cudaMemcpyAsync(poly, gram, static_cast<size_t>(count) * m * m * elem,
                              cudaMemcpyDeviceToDevice, s),
              "copying the Gram matrix");
    MUON_CUBLAS(cublasGemmStridedBatchedEx(impl_->blas, CUBLAS_OP_N, CUBLAS_OP_N, mi, mi, mi, &c,
                                           gram, dt, mi, m * m, gram, dt, mi, m * m, &b, poly, dt,
                                           mi, m * m, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "polynomial GEMM");
    // X <- a * X + poly @ X, i.e. Xc <- a * Xc + Xc @ poly (poly is symmetric).
    MUON_CUDA(cudaMemcpyAsync(x_next, x, static_cast<size_t>(count) * m * n * elem,
                              cudaMemcpyDeviceToDevice, s),
              "copying X");
    MUON_CUBLAS(cublasGemmStridedBatchedEx(impl_->blas, CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, mi, &one,
                                           x, dt, ni, m * n, poly, dt, mi, m * m, &a, x_next, dt,
                                           ni, m * n, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "update GEMM");
    std::swap(x, x_next);
  }
  MUON_CUDA(cuda::LaunchFinish(x_type, x, batch.count, batch.rows, batch.cols, batch.data, s),
            "Newton-Schulz output kernel");
  return absl::OkStatus();
}

}  // namespace muon
