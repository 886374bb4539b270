// The CUDA backend's private parts, shared by its two files
// (cuda_backend.cc: Newton-Schulz; cuda_backend_steps.cc: the element-wise
// step work): the error macros, the grow-only work buffers, the planned
// cuBLASLt products and the backend's state. Not a public header.
#ifndef MUON_MATH_CUDA_CUDA_BACKEND_IMPL_H_
#define MUON_MATH_CUDA_CUDA_BACKEND_IMPL_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "muon/math/backend.h"
#include "muon/math/cuda/cuda_backend.h"
#include "muon/math/cuda/cuda_status.h"
#include "muon/math/cuda/ns_kernels.h"
#include "muon/math/ns_program.h"

namespace muon {
namespace cuda_impl {

inline absl::Status CublasStatus(cublasStatus_t s, const char* what) {
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

// A kernel launch (cuda::Launch*, which read their error with
// cudaGetLastError): refused while another call's error is pending.
#define MUON_CUDA_LAUNCH(expr, what)                   \
  do {                                                 \
    auto _p = CudaPendingBefore(what);                 \
    if (!_p.ok()) return _p;                           \
    MUON_CUDA(expr, what);                             \
  } while (0)

#define MUON_CUBLAS(expr, what) \
  do {                          \
    auto _s = ::muon::cuda_impl::CublasStatus((expr), what); \
    if (!_s.ok()) return _s;    \
  } while (0)

// A device buffer that only grows, from the device's memory source (its
// Allocate: counted, and the host's allocator when set) or cudaMalloc.
struct WorkBuffer {
  const MemorySource* source = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
  absl::Status Reserve(size_t want, const char* what) {
    if (want <= bytes) return absl::OkStatus();
    Release();
    if (source != nullptr && source->allocate) {
      absl::StatusOr<void*> p = source->allocate(want, what);
      if (!p.ok()) return p.status();
      ptr = *p;
    } else {
      MUON_CUDA(cudaMalloc(&ptr, want), what);
    }
    bytes = want;
    return absl::OkStatus();
  }
  void Release() {
    if (ptr == nullptr) return;
    if (source != nullptr && source->free) {
      source->free(ptr);
    } else {
      cudaFree(ptr);
    }
    ptr = nullptr;
    bytes = 0;
  }
  ~WorkBuffer() { Release(); }
};

// One product of the Newton-Schulz program (muon/math/ns_program.h) as a
// cuBLASLt matmul: its descriptors and the algorithm the heuristic chose, made
// once per (dtype, count, rows, cols) and reused by every later call.
struct LtProduct {
  cublasLtMatmulDesc_t op = nullptr;
  std::array<cublasLtMatrixLayout_t, 4> layout = {};  // A, B, C, D
  cublasLtMatmulHeuristicResult_t heuristic = {};
  LtProduct() = default;
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;
  ~LtProduct() {
    for (cublasLtMatrixLayout_t l : layout) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

using ShapeKey = std::tuple<int, int64_t, int64_t, int64_t>;  // dtype, count, rows, cols

// The products planned for one shape: the program's four, and the b x b
// tiles of its two symmetric ones (gram, polynomial) when it runs them in
// tiles (b > 0: the tiles on and below the diagonal, then their mirror).
struct PlannedShape {
  std::array<LtProduct, 4> whole;  // gram, polynomial, update, cubic update
  int64_t tile = 0;
  LtProduct gram_tile, poly_tile;
};

}  // namespace cuda_impl

using cuda_impl::LtProduct;
using cuda_impl::PlannedShape;
using cuda_impl::ShapeKey;
using cuda_impl::WorkBuffer;

struct CudaBackend::Impl {
  MemorySource source;  // where the work buffers come from (set before any)
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  WorkBuffer x, x_next, gram, poly, partials;
  WorkBuffer gram_q, gram_t;  // Gram Newton-Schulz's Q and its scratch (m x m each)
  WorkBuffer normuon_sums, normuon_divisors;  // NorMuon's per-row sums and divisors
  WorkBuffer aol_scales;                      // AOL's scales (m doubles per matrix)
  WorkBuffer square_partials;                 // RowSquares' chunk sums
  // Split Newton-Schulz's fp32 products, planned once per NsGemm's shape.
  std::map<std::vector<int64_t>, LtProduct> block_products;
  bool aol_enabled = false;                   // EnableUnprovenAol
  // The products of each shape seen, planned once (heuristics cached).
  std::map<ShapeKey, PlannedShape> products;
  int forced_tiles = 0;  // SetSymmetricTiles' (0: libmuon's rule)
  // The multi-tensor launches' host-side lists, kept across calls.
  std::vector<cuda::MomentumTensor> momentum_tensors;
  std::vector<cuda::ApplyTensor> apply_tensors;
  std::vector<cuda::CountTensor> count_tensors;
  // cuBLASLt's workspace, handed to every matmul (32 MiB as cuBLAS advises
  // for Hopper; the heuristics are asked for algorithms within it).
  WorkBuffer lt_workspace;
  static constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
  Impl() {
    for (WorkBuffer* b : {&x, &x_next, &gram, &poly, &partials, &gram_q, &gram_t, &normuon_sums,
                          &normuon_divisors, &aol_scales, &square_partials, &lt_workspace}) {
      b->source = &source;
    }
  }
  // D = alpha op(A) op(B) + beta C, with a product planned for the shape
  // (its descriptors hold no buffer), on the given buffers.
  absl::Status Matmul(const LtProduct& lp, float alpha, const void* a, const void* b, float beta,
                      const void* c, void* d, const char* what) {
    MUON_CUBLAS(cublasLtMatmul(lt, lp.op, &alpha, a, lp.layout[0], b, lp.layout[1], &beta, c,
                               lp.layout[2], d, lp.layout[3], &lp.heuristic.algo,
                               lt_workspace.ptr, lt_workspace.bytes, stream),
                what);
    return absl::OkStatus();
  }
  // The same for program p's symmetric product `which` (0: gram, 1:
  // polynomial; or one of their shape on other buffers): whole, or its tiles
  // on and below the diagonal, then the mirror of those (exactly symmetric).
  absl::Status Symmetric(const NsProgram& p, int which, const PlannedShape& planned, int x_type,
                         float alpha, const void* a, const void* b, float beta, const void* c,
                         void* d, const char* what);
  // The fp32 product for `g` (count 1) in block_products, planned on first
  // use (split Newton-Schulz's RunProduct).
  absl::StatusOr<const LtProduct*> BlockProduct(const NsGemm& g);
  absl::Status GramNewtonSchulz(const NsConfig& config, const NsProgram& p,
                                const PlannedShape& planned, int x_type, void** buffers);
  ~Impl() {
    products.clear();
    block_products.clear();
    if (lt != nullptr) cublasLtDestroy(lt);
  }
};

}  // namespace muon

#endif  // MUON_MATH_CUDA_CUDA_BACKEND_IMPL_H_
