#include "muon/math/cpu/native_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include <omp.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/cpu/bf16_gemm.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/cpu/growing_block.h"
#include "muon/math/cpu/onednn_library.h"

namespace muon {
namespace {

// oneDNN's functions: called only after Create has loaded them.
const OneDnn& Dnnl() { return **LoadOneDnn(); }

#define MUON_DNNL(call)                                                                   \
  do {                                                                                   \
    const dnnl_status_t dnnl_status_ = (call);                                           \
    if (dnnl_status_ != dnnl_success) {                                                  \
      return absl::InternalError(absl::StrCat("oneDNN: ", #call, " failed (status ",     \
                                              static_cast<int>(dnnl_status_), ")"));     \
    }                                                                                    \
  } while (0)

}  // namespace

// One cached product: the geometry and scalars it was built for.
struct NativeBf16Gemm::Key {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldd;
  float alpha, beta;
  bool operator==(const Key& o) const {
    return trans_a == o.trans_a && trans_b == o.trans_b && m == o.m && n == o.n && k == o.k &&
           lda == o.lda && ldb == o.ldb && ldd == o.ldd && alpha == o.alpha && beta == o.beta;
  }
};

struct NativeBf16Gemm::Entry {
  Key key;
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_t src = nullptr, weights = nullptr, dst = nullptr, scratch = nullptr;
  size_t scratch_bytes = 0;
};

namespace {

using Entry = NativeBf16Gemm::Entry;
using Key = NativeBf16Gemm::Key;

void Destroy(Entry& e) {
  if (e.scratch) Dnnl().memory_destroy(e.scratch);
  if (e.src) Dnnl().memory_destroy(e.src);
  if (e.weights) Dnnl().memory_destroy(e.weights);
  if (e.dst) Dnnl().memory_destroy(e.dst);
  if (e.primitive) Dnnl().primitive_destroy(e.primitive);
  e = Entry{};
}

}  // namespace

struct NativeBf16Gemm::Impl {
  Engine engine_kind = Engine::kOneDnn;
  bool own_kernel() const { return engine_kind != Engine::kOneDnn; }
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::vector<Entry> cache;
  MemorySource source;
  // oneDNN's scratchpad, ours (user mode): one block for every product,
  // grown to the largest.
  GrowingBlock scratch{&source, "the bf16 product scratchpad"};
  // One block of a symmetric product, dense (oneDNN 2.x multiplies on AMX
  // only into a dense destination).
  GrowingBlock block{&source, "the bf16 symmetric product's block"};
  // libmuon's kernels' packed operands and accumulators.
  GrowingBlock workspace{&source, "the bf16 product's packed operands"};

  absl::StatusOr<void*> Scratch(size_t bytes) { return scratch.Get(bytes); }

  ~Impl() {
    for (Entry& e : cache) Destroy(e);
    if (stream) Dnnl().stream_destroy(stream);
    if (engine) Dnnl().engine_destroy(engine);
  }

  // The column-major product D = op(A) op(B) is, read row-major, the product
  // D^T = op(B)^T op(A)^T: oneDNN's src is op(B)^T (n x k), its weights
  // op(A)^T (k x m), its dst D^T (n x m); every operand is addressed by strides
  // in place (no copies).
  absl::Status Build(const Key& key, Entry* e) {
    e->key = key;
    dnnl_memory_desc_t src_md, weights_md, dst_md;
    const dnnl_dims_t src_dims = {key.n, key.k}, weights_dims = {key.k, key.m},
                      dst_dims = {key.n, key.m};
    // op(B)^T (j, p) = op(B)(p, j): B(p, j) at p + j ldb, or B(j, p) at j + p ldb.
    const dnnl_dims_t src_strides = {key.trans_b ? 1 : key.ldb, key.trans_b ? key.ldb : 1};
    // op(A)^T (p, i) = op(A)(i, p): A(i, p) at i + p lda, or A(p, i) at p + i lda.
    const dnnl_dims_t weights_strides = {key.trans_a ? 1 : key.lda, key.trans_a ? key.lda : 1};
    const dnnl_dims_t dst_strides = {key.ldd, 1};
    MUON_DNNL(Dnnl().memory_desc_init_by_strides(&src_md, 2, src_dims, dnnl_bf16, src_strides));
    MUON_DNNL(Dnnl().memory_desc_init_by_strides(&weights_md, 2, weights_dims, dnnl_bf16,
                                               weights_strides));
    MUON_DNNL(Dnnl().memory_desc_init_by_strides(&dst_md, 2, dst_dims, dnnl_bf16, dst_strides));
    dnnl_matmul_desc_t desc;
    MUON_DNNL(Dnnl().matmul_desc_init(&desc, &src_md, &weights_md, nullptr, &dst_md));

    dnnl_primitive_attr_t attr = nullptr;
    dnnl_post_ops_t post_ops = nullptr;
    dnnl_primitive_desc_t pd = nullptr;
    absl::Status status = [&]() -> absl::Status {
      MUON_DNNL(Dnnl().primitive_attr_create(&attr));
      MUON_DNNL(Dnnl().primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
      if (key.alpha != 1.0f) MUON_DNNL(Dnnl().primitive_attr_set_output_scales(attr, 1, 0, &key.alpha));
      if (key.beta != 0.0f) {
        MUON_DNNL(Dnnl().post_ops_create(&post_ops));
        MUON_DNNL(Dnnl().post_ops_append_sum(post_ops, key.beta));
        MUON_DNNL(Dnnl().primitive_attr_set_post_ops(attr, post_ops));
      }
      MUON_DNNL(Dnnl().primitive_desc_create(&pd, &desc, attr, engine, nullptr));
      MUON_DNNL(Dnnl().primitive_create(&e->primitive, pd));
      MUON_DNNL(Dnnl().memory_create(&e->src, &src_md, engine, DNNL_MEMORY_NONE));
      MUON_DNNL(Dnnl().memory_create(&e->weights, &weights_md, engine, DNNL_MEMORY_NONE));
      MUON_DNNL(Dnnl().memory_create(&e->dst, &dst_md, engine, DNNL_MEMORY_NONE));
      const dnnl_memory_desc_t* scratch_md = Dnnl().primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
      if (scratch_md != nullptr) {
        e->scratch_bytes = Dnnl().memory_desc_get_size(scratch_md);
        MUON_DNNL(Dnnl().memory_create(&e->scratch, scratch_md, engine, DNNL_MEMORY_NONE));
      }
      return absl::OkStatus();
    }();
    if (pd) Dnnl().primitive_desc_destroy(pd);
    if (post_ops) Dnnl().post_ops_destroy(post_ops);
    if (attr) Dnnl().primitive_attr_destroy(attr);
    if (!status.ok()) Destroy(*e);
    return status;
  }
};

std::unique_ptr<NativeBf16Gemm> NativeBf16Gemm::Create(MemorySource source, Engine engine) {
  if (engine == Engine::kEmulated) return nullptr;
  const uint32_t need = cpu::FeaturesFor(engine);
  if ((cpu::Features() & need) != need) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source);
  impl->engine_kind = engine;
  if (engine != Engine::kOneDnn) {
    return std::unique_ptr<NativeBf16Gemm>(new NativeBf16Gemm(std::move(impl)));
  }
  if (!LoadOneDnn().ok()) return nullptr;
  // oneDNN asks the CPU itself (ONEDNN_MAX_CPU_ISA caps it).
  const unsigned isa = static_cast<unsigned>(Dnnl().get_effective_cpu_isa());
  const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  if ((isa & bf16) != bf16) return nullptr;
  if (Dnnl().engine_create(&impl->engine, dnnl_cpu, 0) != dnnl_success) return nullptr;
  if (Dnnl().stream_create(&impl->stream, impl->engine, dnnl_stream_default_flags) != dnnl_success) {
    return nullptr;
  }
  return std::unique_ptr<NativeBf16Gemm>(new NativeBf16Gemm(std::move(impl)));
}

NativeBf16Gemm::NativeBf16Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NativeBf16Gemm::~NativeBf16Gemm() = default;

NativeBf16Gemm::Engine NativeBf16Gemm::engine() const { return impl_->engine_kind; }
const char* NativeBf16Gemm::EngineName() const { return cpu::Bf16EngineName(impl_->engine_kind); }
bool NativeBf16Gemm::PrefersWide() const { return !impl_->own_kernel(); }
bool NativeBf16Gemm::ResultsIndependentOfThreads() const { return impl_->own_kernel(); }

namespace {

// Symmetric products at least 1.5 times this wide run as blocks of about this
// width: only the blocks on and above the diagonal are multiplied, the others
// mirrored.
constexpr int64_t kSymmetricBlock = 512;

bool ReadAsSymmetric(const NsOperand& o) {
  return o.buffer == NsBuffer::kGram || o.buffer == NsBuffer::kPoly;
}

// Copies column-major rows x cols from src (leading dimension ld_src) to dst
// (ld_dst).
void CopyBlock(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, uint16_t* dst,
               int64_t ld_dst) {
  for (int64_t j = 0; j < cols; ++j) {
    std::copy(src + j * ld_src, src + j * ld_src + rows, dst + j * ld_dst);
  }
}

}  // namespace

// The product as oneDNN runs it whole: gram and poly (symmetric, both
// triangles stored) read as themselves, not transposed, which oneDNN
// multiplies fastest (up to 2.9x).
NativeBf16Gemm::Key NativeBf16Gemm::WholeKey(const NsGemm& g, float alpha, float beta) {
  return Key{g.trans_a && !ReadAsSymmetric(g.a), g.trans_b && !ReadAsSymmetric(g.b), g.m, g.n,
             g.k, g.a.ld, g.b.ld, g.d.ld, alpha, beta};
}

// The block width of a symmetric product, or 0 when it runs whole. Blocks
// need op(A) transposed and packed (lda == k: A's rows I are then one dense
// piece of oneDNN's weights), which the gram (X^T stored) and the poly (gram
// symmetric, read transposed) both are on the wide program.
int64_t NativeBf16Gemm::SymmetricBlock(const NsGemm& g) {
  if (!g.symmetric || g.m < kSymmetricBlock + kSymmetricBlock / 2) return 0;
  const bool a_transposed = g.trans_a || ReadAsSymmetric(g.a);
  if (!a_transposed || g.a.ld != g.k || g.n != g.m) return 0;
  const int64_t parts = (g.m + kSymmetricBlock - 1) / kSymmetricBlock;
  return ((g.m + parts - 1) / parts + 31) / 32 * 32;  // AMX tiles: multiples of 32
}

// Block (I, J) of D, rows x cols, into a dense block (leading dimension rows).
NativeBf16Gemm::Key NativeBf16Gemm::BlockKey(const NsGemm& g, int64_t rows, int64_t cols,
                                             float alpha, float beta) {
  return Key{true, g.trans_b && !ReadAsSymmetric(g.b), rows, cols, g.k, g.a.ld, g.b.ld, rows,
             alpha, beta};
}

absl::StatusOr<NativeBf16Gemm::Entry*> NativeBf16Gemm::Find(const NsGemm& g, const Key& key) {
  for (Entry& e : impl_->cache) {
    if (e.key == key) return &e;
  }
  Entry built;
  absl::Status status = impl_->Build(key, &built);
  if (status.ok() && built.scratch_bytes > 0) status = impl_->Scratch(built.scratch_bytes).status();
  if (!status.ok()) {
    Destroy(built);
    return absl::Status(status.code(),
                        absl::StrCat("Newton-Schulz ", g.name, " product (bf16, ", key.m, " x ",
                                     key.n, " x ", key.k, "): ", status.message()));
  }
  impl_->cache.push_back(built);
  return &impl_->cache.back();
}

namespace {

// The product as libmuon's kernels see it: D column-major is D^T row-major, and
// D^T = op(B)^T op(A)^T. Gram and poly (symmetric) are read in the order the
// kernel packs fastest.
cpu::Bf16Product KernelProductOf(const NsGemm& g, float alpha, float beta,
                             uint16_t* const* buffers) {
  cpu::Bf16Product p;
  p.rows = g.n;
  p.cols = g.m;
  p.k = g.k;
  // op(B)^T (j, p) = op(B)(p, j): B(p, j) at p + j ldb (row-major), or B(j, p)
  // at j + p ldb (transposed).
  p.left = {buffers[static_cast<int>(g.b.buffer)], g.b.ld, g.trans_b && !ReadAsSymmetric(g.b)};
  // op(A)^T (p, i) = op(A)(i, p): A(i, p) at i + p lda (row-major), or A(p, i)
  // at p + i lda (transposed).
  p.right = {buffers[static_cast<int>(g.a.buffer)], g.a.ld, g.trans_a && !ReadAsSymmetric(g.a)};
  p.alpha = alpha;
  p.beta = beta;
  p.c = buffers[static_cast<int>(g.c.buffer)];
  p.ld_c = g.c.ld;
  p.out = buffers[static_cast<int>(g.d.buffer)];
  p.ld_out = g.d.ld;
  p.symmetric = g.symmetric && g.m == g.n;
  return p;
}

}  // namespace

absl::Status NativeBf16Gemm::RunKernel(const NsGemm& g, float alpha, float beta,
                                       uint16_t* const* buffers) {
  const cpu::Bf16Product p = KernelProductOf(g, alpha, beta, buffers);
  const int threads = omp_get_max_threads();
  absl::StatusOr<void*> workspace = impl_->workspace.Get(cpu::Bf16WorkspaceBytes(p, threads));
  if (!workspace.ok()) return workspace.status();
  cpu::Bf16Multiply(impl_->engine_kind == Engine::kAmx ? cpu::Bf16Kernel::kAmx
                                                       : cpu::Bf16Kernel::kAvx512Bf16,
                    p, *workspace, threads);
  return absl::OkStatus();
}

absl::Status NativeBf16Gemm::Prepare(const NsGemm& g, float alpha, float beta) {
  if (impl_->own_kernel()) {
    uint16_t* none[4] = {nullptr, nullptr, nullptr, nullptr};
    const cpu::Bf16Product p = KernelProductOf(g, alpha, beta, none);
    return impl_->workspace.Get(cpu::Bf16WorkspaceBytes(p, omp_get_max_threads())).status();
  }
  const int64_t bs = SymmetricBlock(g);
  if (bs == 0) return Find(g, WholeKey(g, alpha, beta)).status();
  const int64_t last = g.m - (g.m - 1) / bs * bs;  // the last block's width
  for (int64_t rows : {bs, last}) {
    for (int64_t cols : {bs, last}) {
      MUON_RETURN_IF_ERROR(Find(g, BlockKey(g, rows, cols, alpha, beta)).status());
    }
  }
  return impl_->block.Get(static_cast<size_t>(bs * bs) * sizeof(uint16_t)).status();
}

absl::Status NativeBf16Gemm::Execute(const NsGemm& g, const Key& key, const uint16_t* a,
                                     const uint16_t* b, uint16_t* d) {
  absl::StatusOr<Entry*> found = Find(g, key);
  if (!found.ok()) return found.status();
  Entry* entry = *found;
  MUON_DNNL(Dnnl().memory_set_data_handle(entry->src, const_cast<uint16_t*>(b)));
  MUON_DNNL(Dnnl().memory_set_data_handle(entry->weights, const_cast<uint16_t*>(a)));
  MUON_DNNL(Dnnl().memory_set_data_handle(entry->dst, d));
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, entry->src},
                            {DNNL_ARG_WEIGHTS, entry->weights},
                            {DNNL_ARG_DST, entry->dst},
                            {DNNL_ARG_SCRATCHPAD, entry->scratch}};
  int nargs = 3;
  if (entry->scratch != nullptr && entry->scratch_bytes > 0) {
    absl::StatusOr<void*> scratch = impl_->Scratch(entry->scratch_bytes);
    if (!scratch.ok()) return scratch.status();
    MUON_DNNL(Dnnl().memory_set_data_handle(entry->scratch, *scratch));
    nargs = 4;
  }
  MUON_DNNL(Dnnl().primitive_execute(entry->primitive, impl_->stream, nargs, args));
  MUON_DNNL(Dnnl().stream_wait(impl_->stream));
  return absl::OkStatus();
}

absl::Status NativeBf16Gemm::Run(const NsGemm& g, float alpha, float beta,
                                 uint16_t* const* buffers) {
  if (impl_->own_kernel()) return RunKernel(g, alpha, beta, buffers);
  const uint16_t* a = buffers[static_cast<int>(g.a.buffer)];
  const uint16_t* b = buffers[static_cast<int>(g.b.buffer)];
  const uint16_t* c = buffers[static_cast<int>(g.c.buffer)];
  uint16_t* d = buffers[static_cast<int>(g.d.buffer)];
  const int64_t bs = SymmetricBlock(g);
  if (bs == 0) {
    if (beta != 0.0f) std::copy(c, c + g.d.ld * g.n, d);  // the sum post-op adds to D
    return Execute(g, WholeKey(g, alpha, beta), a, b, d);
  }
  // D and C symmetric: the blocks on and above the diagonal, each multiplied
  // over the whole k as the product would, into a dense block, which goes to
  // its place and, mirrored, to the transposed one.
  absl::StatusOr<void*> got = impl_->block.Get(static_cast<size_t>(bs * bs) * sizeof(uint16_t));
  if (!got.ok()) return got.status();
  auto* block = static_cast<uint16_t*>(*got);
  const int64_t ld = g.d.ld, lda = g.a.ld, ldb = g.b.ld;
  const bool b_transposed = g.trans_b && !ReadAsSymmetric(g.b);
  for (int64_t j0 = 0; j0 < g.m; j0 += bs) {
    const int64_t cols = std::min(bs, g.m - j0);
    for (int64_t i0 = 0; i0 <= j0; i0 += bs) {
      const int64_t rows = std::min(bs, g.m - i0);
      if (beta != 0.0f) CopyBlock(c + i0 + j0 * ld, ld, rows, cols, block, rows);
      // op(A)'s rows i0..: columns of the stored A^T; op(B)'s columns j0..
      MUON_RETURN_IF_ERROR(Execute(g, BlockKey(g, rows, cols, alpha, beta), a + i0 * lda,
                                   b + (b_transposed ? j0 : j0 * ldb), block));
      CopyBlock(block, rows, rows, cols, d + i0 + j0 * ld, ld);
      if (i0 != j0) cpu::TransposeBlockBf16(block, rows, rows, cols, d + j0 + i0 * ld, ld);
    }
  }
  return absl::OkStatus();
}

}  // namespace muon
