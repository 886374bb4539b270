#include "muon/math/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/cuda/aol_kernels.h"
#include "muon/math/cuda/cuda_backend_impl.h"
#include "muon/math/cuda/cuda_status.h"
#include "muon/math/cuda/normuon_kernels.h"
#include "muon/math/cuda/ns_kernels.h"
#include "muon/math/ns_program.h"

namespace muon {
namespace {

absl::Status MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, const NsOperand& o,
                        int32_t count, cublasLtMatrixLayout_t* out) {
  MUON_CUBLAS(cublasLtMatrixLayoutCreate(out, type, static_cast<uint64_t>(rows),
                                         static_cast<uint64_t>(cols), o.ld),
              "cuBLASLt matrix layout");
  const int64_t stride = o.stride;
  MUON_CUBLAS(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof(count)),
              "cuBLASLt batch count");
  MUON_CUBLAS(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof(stride)),
              "cuBLASLt batch stride");
  return absl::OkStatus();
}

absl::Status MakeProduct(cublasLtHandle_t lt, const NsGemm& g, cudaDataType_t type, int32_t count,
                         size_t workspace_bytes, LtProduct* p, uint32_t align_bytes = 256) {
  MUON_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              "cuBLASLt matmul descriptor");
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MUON_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
              "cuBLASLt op(A)");
  MUON_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
              "cuBLASLt op(B)");
  // A and B as stored (before op); C and D as D is.
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  auto st = MakeLayout(type, a_rows, a_cols, g.a, count, &p->layout[0]);
  if (st.ok()) st = MakeLayout(type, b_rows, b_cols, g.b, count, &p->layout[1]);
  if (st.ok()) st = MakeLayout(type, g.m, g.n, g.c, count, &p->layout[2]);
  if (st.ok()) st = MakeLayout(type, g.m, g.n, g.d, count, &p->layout[3]);
  if (!st.ok()) return st;
  cublasLtMatmulPreference_t pref = nullptr;
  MUON_CUBLAS(cublasLtMatmulPreferenceCreate(&pref), "cuBLASLt preference");
  const uint64_t ws = workspace_bytes;
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  // The operands' alignment (a tile of a matrix starts inside it): the
  // heuristic then leaves out algorithms that need more.
  for (cublasLtMatmulPreferenceAttributes_t a :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulPreferenceSetAttribute(pref, a, &align_bytes, sizeof(align_bytes));
    }
  }
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->layout[0], p->layout[1], p->layout[2],
                                       p->layout[3], pref, 1, &p->heuristic, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  MUON_CUBLAS(s, absl::StrCat("cuBLASLt heuristic for the ", g.name, " product").c_str());
  if (found == 0) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for the ", g.name,
                                            " product (", g.m, " x ", g.n, " x ", g.k, ")"));
  }
  return absl::OkStatus();
}

// The side of the tiles a symmetric m x m product runs in (0: whole):
// `forced` tiles a side when it divides m into 16-byte multiples (tests,
// the benchmark; 1: whole); else by libmuon's rule, 2 x 2 tiles from m =
// 4096 and 4 x 4 from 8192, where each tile's product still fills the GPU.
int64_t SymmetricTile(int64_t m, int forced, size_t elem) {
  const int64_t t = forced > 0 ? forced : (m >= 8192 ? 4 : m >= 4096 ? 2 : 1);
  if (t <= 1 || m % t != 0) return 0;
  const int64_t b = m / t;
  return (static_cast<size_t>(b) * elem) % 16 == 0 ? b : 0;
}

// The largest power of two (at most 256) that divides `bytes`.
uint32_t AlignmentOf(size_t bytes) {
  uint32_t a = 256;
  while (a > 1 && bytes % a != 0) a /= 2;
  return a;
}

// What a failed product says (a literal: nothing is made per call).
const char* ProductWhat(size_t index) {
  static const char* const kWhat[] = {"Newton-Schulz gram product",
                                      "Newton-Schulz polynomial product",
                                      "Newton-Schulz update product",
                                      "Newton-Schulz cubic update product"};
  return kWhat[index];
}

// Gram Newton-Schulz runs here (UsesGramNewtonSchulz, with iterations to run).
bool RunsGram(const NsConfig& config, int64_t rows, int64_t cols) {
  return UsesGramNewtonSchulz(config, rows, cols) && config.steps > 0;
}

}  // namespace

absl::Status CudaBackend::Impl::Symmetric(const NsProgram& p, int which,
                                          const PlannedShape& planned, int x_type, float alpha,
                                          const void* a, const void* b, float beta,
                                          const void* c, void* d, const char* what) {
  const NsGemm& g = p.iteration[static_cast<size_t>(which)];
  if (planned.tile == 0) {
    return Matmul(planned.whole[static_cast<size_t>(which)], alpha, a, b, beta, c, d, what);
  }
  const int64_t t = planned.tile, tiles = g.m / t;
  const size_t elem = x_type == cuda::kF32 ? 4 : 2;
  const LtProduct& tile = which == 0 ? planned.gram_tile : planned.poly_tile;
  auto at = [elem](const void* p, int64_t offset) {
    return static_cast<const char*>(p) + static_cast<size_t>(offset) * elem;
  };
  for (int64_t i = 0; i < tiles; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      // Row block i of op(A), column block j of op(B), tile (i, j) of C, D.
      const int64_t a_at = g.trans_a ? i * t * g.a.ld : i * t;
      const int64_t b_at = g.trans_b ? j * t : j * t * g.b.ld;
      const int64_t d_at = i * t + j * t * g.d.ld;
      MUON_RETURN_IF_ERROR(Matmul(tile, alpha, at(a, a_at), at(b, b_at), beta, at(c, d_at),
                                  const_cast<char*>(at(d, d_at)), what));
    }
  }
  MUON_CUDA_LAUNCH(cuda::LaunchMirrorTiles(x_type, d, p.count, g.m, t, stream),
                   "Newton-Schulz symmetric tiles' mirror kernel");
  return absl::OkStatus();
}

// Gram Newton-Schulz (muon/math/split_ns.h's program, batched) on
// X, normalized in buffers[kX]; the result is left there. Every m x m
// product reuses the polynomial's planned shape and every m x n one the
// update's, on other buffers: R (gram), Z (poly), Q and its scratch T. In
// bf16 each product's result is rounded to bf16, as the CPU's rounds it.
absl::Status CudaBackend::Impl::GramNewtonSchulz(const NsConfig& config, const NsProgram& p,
                                                 const PlannedShape& planned, int x_type,
                                                 void** buffers) {
  void* x = buffers[static_cast<int>(NsBuffer::kX)];
  void* x_next = buffers[static_cast<int>(NsBuffer::kXNext)];
  void* const r = buffers[static_cast<int>(NsBuffer::kGram)];
  void* const z = buffers[static_cast<int>(NsBuffer::kPoly)];
  void* q = gram_q.ptr;
  void* t = gram_t.ptr;
  const LtProduct &square = planned.whole[1], &update = planned.whole[2];
  auto form_r = [&] {  // R = X X^T (symmetric)
    return Symmetric(p, 0, planned, x_type, 1.0f, x, x, 0.0f, r, r,
                     "Gram Newton-Schulz R = X X^T product");
  };
  auto apply_q = [&]() -> absl::Status {  // X = Q X (X^T Q as stored when wide)
    MUON_RETURN_IF_ERROR(Matmul(update, 1.0f, p.tall ? q : x, p.tall ? x : q, 0.0f, x_next,
                                x_next, "Gram Newton-Schulz X = Q X product"));
    std::swap(x, x_next);
    return absl::OkStatus();
  };
  MUON_RETURN_IF_ERROR(form_r());
  for (int i = 0; i < config.steps; ++i) {
    const NsCoefficients& abc = config.ForIteration(i);
    const float a = static_cast<float>(abc[0]), b = static_cast<float>(abc[1]),
                c = static_cast<float>(abc[2]);
    const bool restart = config.RestartsAt(i);
    if (restart) {
      MUON_RETURN_IF_ERROR(apply_q());
      MUON_RETURN_IF_ERROR(form_r());
    }
    MUON_RETURN_IF_ERROR(Symmetric(p, 1, planned, x_type, c, r, r, b, r, z,
                                   "Gram Newton-Schulz Z = b R + c R R product"));
    if (i == 0 || restart) {  // Q = Z + a I
      MUON_CUDA_LAUNCH(cuda::LaunchAddIdentity(x_type, z, q, p.count, p.m, a, stream),
                       "Gram Newton-Schulz Q = Z + a I kernel");
    } else {  // Q = Q Z + a Q
      MUON_RETURN_IF_ERROR(
          Matmul(square, 1.0f, q, z, a, q, t, "Gram Newton-Schulz Q = Q Z + a Q product"));
      std::swap(q, t);
    }
    if (i + 1 < config.steps && !config.RestartsAt(i + 1)) {
      // R = (a I + Z) R (a I + Z): T = R Z + a R, then R = Z T + a T.
      MUON_RETURN_IF_ERROR(
          Matmul(square, 1.0f, r, z, a, r, t, "Gram Newton-Schulz R Z + a R product"));
      MUON_RETURN_IF_ERROR(
          Matmul(square, 1.0f, z, t, a, t, r, "Gram Newton-Schulz Z (R Z + a R) product"));
    }
  }
  MUON_RETURN_IF_ERROR(apply_q());
  buffers[static_cast<int>(NsBuffer::kX)] = x;
  buffers[static_cast<int>(NsBuffer::kXNext)] = x_next;
  return absl::OkStatus();
}

absl::StatusOr<const LtProduct*> CudaBackend::Impl::BlockProduct(const NsGemm& g) {
  const std::vector<int64_t> key = {g.m,    g.n,    g.k,    g.trans_a, g.trans_b,
                                    g.a.ld, g.b.ld, g.c.ld, g.d.ld};
  auto found = block_products.find(key);
  if (found != block_products.end()) return &found->second;
  MUON_RETURN_IF_ERROR(lt_workspace.Reserve(kLtWorkspaceBytes, "the cuBLASLt workspace"));
  LtProduct& p = block_products[key];
  // Alignment 4: a block starts anywhere in the round's slots, and the
  // workspace's buffers follow its rows' squares and divisors.
  const absl::Status st = MakeProduct(lt, g, CUDA_R_32F, 1, kLtWorkspaceBytes, &p, 4);
  if (!st.ok()) {
    block_products.erase(key);
    return st;
  }
  return &p;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (", e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->impl_ = std::make_unique<Impl>();
  MUON_CUBLAS(cublasLtCreate(&b->impl_->lt), "creating the cuBLASLt handle");
  return b;
}

CudaBackend::~CudaBackend() = default;

absl::Status CudaBackend::SetStream(void* stream) {
  impl_->stream = static_cast<cudaStream_t>(stream);  // cuBLASLt takes it per call
  return absl::OkStatus();
}

void CudaBackend::SetMemorySource(MemorySource source) { impl_->source = std::move(source); }

void CudaBackend::SetSymmetricTiles(int tiles) {
  impl_->forced_tiles = tiles;
  impl_->products.clear();  // planned again, with the tiles
}

static_assert(sizeof(StepScalars) == 3 * sizeof(double) && offsetof(StepScalars, lr) == 0 &&
                  offsetof(StepScalars, weight_decay) == 8 && offsetof(StepScalars, momentum) == 16,
              "the kernels read StepScalars as three doubles: lr, weight_decay, momentum");

void CudaBackend::EnableUnprovenAol(bool on) { impl_->aol_enabled = on; }

absl::Status CudaBackend::Supports(const NsConfig& config) const {
  if (config.aol && (!impl_->aol_enabled || config.dtype == NsDtype::kFP16)) {
    return absl::UnimplementedError(
        config.dtype == NsDtype::kFP16
            ? "ns_coefficients AOL with ns_dtype fp16 runs on the CPU backend only"
            : "ns_coefficients AOL (its pre-scaling) runs on the CPU backend only so far");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Reserve(const NsConfig& config, int64_t count, int64_t rows,
                                  int64_t cols) {
  if (absl::Status st = Supports(config); !st.ok()) return st;
  const NsProgram p = PlanNewtonSchulz(count, rows, cols);
  const size_t elem = config.dtype == NsDtype::kFP32 ? 4 : 2;
  const size_t k = static_cast<size_t>(count);
  const char* what = "the Newton-Schulz workspace";
  for (WorkBuffer* b : {&impl_->x, &impl_->x_next}) {
    auto st = b->Reserve(k * static_cast<size_t>(p.x_elems) * elem, what);
    if (!st.ok()) return st;
  }
  for (WorkBuffer* b : {&impl_->gram, &impl_->poly}) {
    auto st = b->Reserve(k * static_cast<size_t>(p.gram_elems) * elem, what);
    if (!st.ok()) return st;
  }
  if (RunsGram(config, rows, cols)) {  // Q and its scratch
    for (WorkBuffer* b : {&impl_->gram_q, &impl_->gram_t}) {
      auto st = b->Reserve(k * static_cast<size_t>(p.gram_elems) * elem, what);
      if (!st.ok()) return st;
    }
  }
  if (config.aol) {
    auto st = impl_->aol_scales.Reserve(k * static_cast<size_t>(p.m) * sizeof(double),
                                        "AOL's scales");
    if (!st.ok()) return st;
  }
  auto st = impl_->partials.Reserve(
      k * static_cast<size_t>(cuda::NormBlocks(p.x_elems)) * sizeof(float), what);
  if (st.ok()) st = impl_->lt_workspace.Reserve(Impl::kLtWorkspaceBytes, "the cuBLASLt workspace");
  if (!st.ok()) return st;
  // The products' descriptors and algorithms, once per shape.
  const ShapeKey key{static_cast<int>(config.dtype), count, rows, cols};
  if (impl_->products.count(key) != 0) return absl::OkStatus();
  PlannedShape& planned = impl_->products[key];
  const cudaDataType_t type = config.dtype == NsDtype::kBF16   ? CUDA_R_16BF
                              : config.dtype == NsDtype::kFP16 ? CUDA_R_16F
                                                               : CUDA_R_32F;
  const std::array<const NsGemm*, 4> all = {&p.iteration[0], &p.iteration[1], &p.iteration[2],
                                             &p.cubic_update};
  for (size_t i = 0; i < all.size() && st.ok(); ++i) {
    st = MakeProduct(impl_->lt, *all[i], type, static_cast<int32_t>(count),
                     Impl::kLtWorkspaceBytes, &planned.whole[i]);
  }
  planned.tile = SymmetricTile(p.m, impl_->forced_tiles, elem);
  if (planned.tile > 0) {  // b x b tiles of gram and polynomial
    const uint32_t align = AlignmentOf(static_cast<size_t>(planned.tile) * elem);
    for (int which = 0; which < 2 && st.ok(); ++which) {
      NsGemm tile = p.iteration[static_cast<size_t>(which)];
      tile.m = tile.n = planned.tile;
      st = MakeProduct(impl_->lt, tile, type, static_cast<int32_t>(count),
                       Impl::kLtWorkspaceBytes,
                       which == 0 ? &planned.gram_tile : &planned.poly_tile, align);
    }
  }
  if (!st.ok()) impl_->products.erase(key);
  return st;
}

DType CudaBackend::SlotDtype(const NsConfig& config) {
  // bf16 Newton-Schulz rounds its input to bf16 first and returns bf16: a bf16
  // slot holds the same values in half the bytes (and half the traffic).
  return config.dtype == NsDtype::kBF16 ? DType::kBF16 : DType::kF32;
}

absl::Status CudaBackend::Orthogonalize(const NsConfig& config, const MatrixBatch& batch) {
  if (batch.count == 0 || batch.rows == 0 || batch.cols == 0) return absl::OkStatus();
  if (absl::Status st = Supports(config); !st.ok()) return st;
  if (batch.dtype != DType::kF32 && batch.dtype != SlotDtype(config)) {
    return absl::InternalError("the CUDA backend orthogonalizes fp32 batches, and bf16 ones for "
                               "bf16 Newton-Schulz");
  }
  void* const data = batch.data;
  const int u_type = batch.dtype == DType::kF32 ? cuda::kF32 : cuda::kBF16;
  if (batch.count > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", batch.count, " matrices exceeds cuBLASLt's batch count"));
  }
  auto reserved = Reserve(config, batch.count, batch.rows, batch.cols);
  if (!reserved.ok()) return reserved;
  const NsProgram p = PlanNewtonSchulz(batch.count, batch.rows, batch.cols);
  const PlannedShape& planned =
      impl_->products.at(ShapeKey{static_cast<int>(config.dtype), batch.count, batch.rows,
                                  batch.cols});
  const int x_type = config.dtype == NsDtype::kBF16   ? cuda::kBF16
                     : config.dtype == NsDtype::kFP16 ? cuda::kF16
                                                      : cuda::kF32;
  cudaStream_t s = impl_->stream;
  void* buffers[4] = {impl_->x.ptr, impl_->x_next.ptr, impl_->gram.ptr, impl_->poly.ptr};

  // X <- U / max(||U||, eps), no transpose: the program reads either
  // orientation as stored. AOL instead: X <- U, its gram, then both scaled
  // (the first iteration takes that gram instead of its product).
  if (config.aol) {
    const NsGemm& g = p.iteration[0];
    const NsCoefficients& abc = config.ForIteration(0);
    MUON_CUDA_LAUNCH(cuda::LaunchAolInput(data, u_type, batch.count * p.x_elems, buffers[0],
                                          x_type, s),
                     "AOL's input kernel");
    MUON_RETURN_IF_ERROR(impl_->Symmetric(
        p, 0, planned, x_type, NsScalarValue(g.alpha, abc),
        buffers[static_cast<int>(g.a.buffer)], buffers[static_cast<int>(g.b.buffer)],
        NsScalarValue(g.beta, abc), buffers[static_cast<int>(g.c.buffer)],
        buffers[static_cast<int>(g.d.buffer)], ProductWhat(0)));
    MUON_CUDA_LAUNCH(cuda::LaunchAolScale(x_type, buffers[0],
                                          buffers[static_cast<int>(NsBuffer::kGram)],
                                          batch.count, batch.rows, batch.cols, p.tall,
                                          config.eps, static_cast<double*>(impl_->aol_scales.ptr),
                                          s),
                     "AOL's scaling kernels");
  } else {
    MUON_CUDA_LAUNCH(cuda::LaunchPrepare(data, u_type, batch.count, p.x_elems, x_type,
                                         static_cast<float>(config.eps),
                                         static_cast<float*>(impl_->partials.ptr), buffers[0],
                                         s),
                     "Newton-Schulz input kernels");
  }
  if (RunsGram(config, batch.rows, batch.cols)) {
    MUON_RETURN_IF_ERROR(impl_->GramNewtonSchulz(config, p, planned, x_type, buffers));
    MUON_CUDA_LAUNCH(
        cuda::LaunchFinish(x_type, buffers[0], batch.count * p.x_elems, data, u_type, s),
        "Newton-Schulz output kernel");
    return absl::OkStatus();
  }
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    for (const NsGemm* gp : ProductsFor(p, abc)) {  // a cubic iteration runs two
      const NsGemm& g = *gp;
      const size_t index =
          &g == &p.cubic_update ? 3 : static_cast<size_t>(&g - p.iteration.data());
      if (config.aol && it == 0 && index == 0) continue;  // AOL's scaled gram
      const float alpha = NsScalarValue(g.alpha, abc), beta = NsScalarValue(g.beta, abc);
      void* const a = buffers[static_cast<int>(g.a.buffer)];
      void* const b = buffers[static_cast<int>(g.b.buffer)];
      void* const c = buffers[static_cast<int>(g.c.buffer)];
      void* const d = buffers[static_cast<int>(g.d.buffer)];
      // Out of place: with beta zero C is not read; D is its own buffer.
      if (g.symmetric) {  // gram, polynomial
        MUON_RETURN_IF_ERROR(impl_->Symmetric(p, static_cast<int>(index), planned, x_type, alpha,
                                              a, b, beta, c, d, ProductWhat(index)));
      } else {
        MUON_RETURN_IF_ERROR(impl_->Matmul(planned.whole[index], alpha, a, b, beta, c, d,
                                           ProductWhat(index)));
      }
    }
    std::swap(buffers[static_cast<int>(NsBuffer::kX)], buffers[static_cast<int>(NsBuffer::kXNext)]);
  }
  MUON_CUDA_LAUNCH(cuda::LaunchFinish(x_type, buffers[0], batch.count * p.x_elems, data, u_type, s),
            "Newton-Schulz output kernel");
  return absl::OkStatus();
}

}  // namespace muon
