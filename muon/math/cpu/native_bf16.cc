#include "muon/math/cpu/native_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.h"

namespace muon {
namespace {

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
  if (e.scratch) dnnl_memory_destroy(e.scratch);
  if (e.src) dnnl_memory_destroy(e.src);
  if (e.weights) dnnl_memory_destroy(e.weights);
  if (e.dst) dnnl_memory_destroy(e.dst);
  if (e.primitive) dnnl_primitive_destroy(e.primitive);
  e = Entry{};
}

}  // namespace

struct NativeBf16Gemm::Impl {
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::vector<Entry> cache;
  // oneDNN's scratchpad, ours (user mode): one block for every product,
  // grown to the largest, from the backend's memory source.
  MemorySource source;
  void* scratch_block = nullptr;
  size_t scratch_bytes = 0;

  void FreeScratch() {
    if (scratch_block == nullptr) return;
    if (source.free) {
      source.free(scratch_block);
    } else {
      ::operator delete(scratch_block);
    }
    scratch_block = nullptr;
    scratch_bytes = 0;
  }

  // A 64-byte aligned scratchpad of at least `bytes`.
  absl::StatusOr<void*> Scratch(size_t bytes) {
    if (bytes > scratch_bytes) {
      FreeScratch();
      const size_t want = bytes + 64;
      if (source.allocate) {
        absl::StatusOr<void*> p = source.allocate(want, "the bf16 product scratchpad");
        if (!p.ok()) return p.status();
        scratch_block = *p;
      } else {
        scratch_block = ::operator new(want, std::nothrow);
        if (scratch_block == nullptr) {
          return absl::ResourceExhaustedError("bf16 product scratchpad: out of host memory");
        }
      }
      scratch_bytes = bytes;
    }
    const auto at = reinterpret_cast<uintptr_t>(scratch_block);
    return reinterpret_cast<void*>((at + 63) & ~uintptr_t{63});
  }

  ~Impl() {
    for (Entry& e : cache) Destroy(e);
    FreeScratch();
    if (stream) dnnl_stream_destroy(stream);
    if (engine) dnnl_engine_destroy(engine);
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
    MUON_DNNL(dnnl_memory_desc_init_by_strides(&src_md, 2, src_dims, dnnl_bf16, src_strides));
    MUON_DNNL(dnnl_memory_desc_init_by_strides(&weights_md, 2, weights_dims, dnnl_bf16,
                                               weights_strides));
    MUON_DNNL(dnnl_memory_desc_init_by_strides(&dst_md, 2, dst_dims, dnnl_bf16, dst_strides));
    dnnl_matmul_desc_t desc;
    MUON_DNNL(dnnl_matmul_desc_init(&desc, &src_md, &weights_md, nullptr, &dst_md));

    dnnl_primitive_attr_t attr = nullptr;
    dnnl_post_ops_t post_ops = nullptr;
    dnnl_primitive_desc_t pd = nullptr;
    absl::Status status = [&]() -> absl::Status {
      MUON_DNNL(dnnl_primitive_attr_create(&attr));
      MUON_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
      if (key.alpha != 1.0f) MUON_DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key.alpha));
      if (key.beta != 0.0f) {
        MUON_DNNL(dnnl_post_ops_create(&post_ops));
        MUON_DNNL(dnnl_post_ops_append_sum(post_ops, key.beta));
        MUON_DNNL(dnnl_primitive_attr_set_post_ops(attr, post_ops));
      }
      MUON_DNNL(dnnl_primitive_desc_create(&pd, &desc, attr, engine, nullptr));
      MUON_DNNL(dnnl_primitive_create(&e->primitive, pd));
      MUON_DNNL(dnnl_memory_create(&e->src, &src_md, engine, DNNL_MEMORY_NONE));
      MUON_DNNL(dnnl_memory_create(&e->weights, &weights_md, engine, DNNL_MEMORY_NONE));
      MUON_DNNL(dnnl_memory_create(&e->dst, &dst_md, engine, DNNL_MEMORY_NONE));
      const dnnl_memory_desc_t* scratch_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
      if (scratch_md != nullptr) {
        e->scratch_bytes = dnnl_memory_desc_get_size(scratch_md);
        MUON_DNNL(dnnl_memory_create(&e->scratch, scratch_md, engine, DNNL_MEMORY_NONE));
      }
      return absl::OkStatus();
    }();
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!status.ok()) Destroy(*e);
    return status;
  }
};

bool NativeBf16Gemm::Available() {
  const char* env = std::getenv("MUON_CPU_NATIVE_BF16");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16) == bf16;
}

std::unique_ptr<NativeBf16Gemm> NativeBf16Gemm::Create(MemorySource source) {
  if (!Available()) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(source);
  if (dnnl_engine_create(&impl->engine, dnnl_cpu, 0) != dnnl_success) return nullptr;
  if (dnnl_stream_create(&impl->stream, impl->engine, dnnl_stream_default_flags) != dnnl_success) {
    return nullptr;
  }
  return std::unique_ptr<NativeBf16Gemm>(new NativeBf16Gemm(std::move(impl)));
}

NativeBf16Gemm::NativeBf16Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NativeBf16Gemm::~NativeBf16Gemm() = default;

absl::StatusOr<NativeBf16Gemm::Entry*> NativeBf16Gemm::Find(const NsGemm& g, float alpha,
                                                             float beta) {
  // Gram and poly are symmetric (both triangles stored): read either one as
  // itself, not transposed, which oneDNN multiplies fastest (up to 2.9x).
  auto symmetric = [](const NsOperand& o) {
    return o.buffer == NsBuffer::kGram || o.buffer == NsBuffer::kPoly;
  };
  const Key key{g.trans_a && !symmetric(g.a), g.trans_b && !symmetric(g.b), g.m, g.n, g.k,
                g.a.ld, g.b.ld, g.d.ld, alpha, beta};
  for (Entry& e : impl_->cache) {
    if (e.key == key) return &e;
  }
  Entry built;
  absl::Status status = impl_->Build(key, &built);
  if (status.ok() && built.scratch_bytes > 0) status = impl_->Scratch(built.scratch_bytes).status();
  if (!status.ok()) {
    Destroy(built);
    return absl::Status(status.code(),
                        absl::StrCat("Newton-Schulz ", g.name, " product (bf16, ", g.m, " x ", g.n,
                                     " x ", g.k, "): ", status.message()));
  }
  impl_->cache.push_back(built);
  return &impl_->cache.back();
}

absl::Status NativeBf16Gemm::Prepare(const NsGemm& g, float alpha, float beta) {
  return Find(g, alpha, beta).status();
}

absl::Status NativeBf16Gemm::Run(const NsGemm& g, float alpha, float beta,
                                 uint16_t* const* buffers) {
  absl::StatusOr<Entry*> found = Find(g, alpha, beta);
  if (!found.ok()) return found.status();
  Entry* entry = *found;
  uint16_t* a = buffers[static_cast<int>(g.a.buffer)];
  uint16_t* b = buffers[static_cast<int>(g.b.buffer)];
  const uint16_t* c = buffers[static_cast<int>(g.c.buffer)];
  uint16_t* d = buffers[static_cast<int>(g.d.buffer)];
  if (beta != 0.0f) std::copy(c, c + g.d.ld * g.n, d);  // the sum post-op adds to D
  MUON_DNNL(dnnl_memory_set_data_handle(entry->src, b));
  MUON_DNNL(dnnl_memory_set_data_handle(entry->weights, a));
  MUON_DNNL(dnnl_memory_set_data_handle(entry->dst, d));
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, entry->src},
                            {DNNL_ARG_WEIGHTS, entry->weights},
                            {DNNL_ARG_DST, entry->dst},
                            {DNNL_ARG_SCRATCHPAD, entry->scratch}};
  int nargs = 3;
  if (entry->scratch != nullptr && entry->scratch_bytes > 0) {
    absl::StatusOr<void*> scratch = impl_->Scratch(entry->scratch_bytes);
    if (!scratch.ok()) return scratch.status();
    MUON_DNNL(dnnl_memory_set_data_handle(entry->scratch, *scratch));
    nargs = 4;
  }
  MUON_DNNL(dnnl_primitive_execute(entry->primitive, impl_->stream, nargs, args));
  MUON_DNNL(dnnl_stream_wait(impl_->stream));
  return absl::OkStatus();
}

}  // namespace muon
