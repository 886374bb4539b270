// A step allocates no host memory once the optimizer is warm: this binary
// replaces operator new / delete and malloc / calloc / realloc / free (over
// glibc's own __libc_* functions) and counts every call made while a window
// is open; the window holds only libmuon calls (muon_step, and a training
// loop's muon_set_lr and muon_get_stats between steps), steps 3 .. 10 after
// two warm-up steps, on the CPU device through libmuon.so. Every operator new
// counts, whoever calls it, and every malloc but those OpenBLAS makes itself
// (its caller's address inside libopenblas): OpenBLAS 0.3.21's small-matrix
// SGEMM kernel for SKYLAKEX mallocs a buffer on each call for some shapes
// (e.g. 40 x 40 x 40, 24 x 24 x 80 NN), which libmuon does not control.
// Likewise oneDNN (the native bf16 products) and its OpenMP runtime allocate
// inside each matmul execution (operator new from their own code). Those are
// counted apart and printed; MUON_ALLOC_COUNT_BLAS=1 counts them with the rest. The cases:
//   - a world of one (no communicator), with parameters of every kind a
//     single process registers (tall, wide, square, 1 x n and n x 1 vectors
//     as matrices, batched and flattened views, bf16 and fp16), under
//     several option sets;
//   - a world of one in-process rank with layout, ZeRO-2 and custom-path
//     parameters;
//   - two in-process ranks (threads) with sharded, flat-range, replicated
//     and batched parameters over several exchange rounds (the prefetch
//     pipeline's worker thread), with skip_nonfinite (every rank's count
//     gathered), and with ZeRO-2 parameters.
//
// Finding an allocation: MUON_ALLOC_TRACE=<n> prints the call stack of the
// first n counted allocations to stderr (backtrace_symbols_fd: libmuon.so's
// hidden functions show as libmuon.so.1(+0xOFFSET); addr2line -f -C -i -e
// bazel-bin/libmuon.so 0xOFFSET names them):
//   bazel test //tests/c_api:alloc_count_test --test_env=MUON_ALLOC_TRACE=3
#include <dlpack/dlpack.h>
#include <execinfo.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void __libc_free(void*);
void* __libc_memalign(size_t, size_t);
}

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_news{0};     // operator new, every form
std::atomic<int64_t> g_mallocs{0};  // malloc, calloc, realloc, aligned forms
std::atomic<int64_t> g_blas_mallocs{0};  // of which OpenBLAS's own
std::atomic<int> g_traces_left{0};
thread_local bool t_in_trace = false;

// OpenBLAS's code, where its own mallocs come from (found before counting).
struct Range {
  uintptr_t begin = 0, end = 0;
};
Range g_blas_code[32];
int g_num_blas_code = 0;
bool g_count_blas = false;  // MUON_ALLOC_COUNT_BLAS=1

int FindBlasCode(dl_phdr_info* info, size_t, void*) {
  if (info->dlpi_name == nullptr) return 0;
  // OpenBLAS, and oneDNN (native bf16 products) with its OpenMP runtime.
  const char* const libraries[] = {"openblas", "dnnl", "gomp"};
  bool ours = false;
  for (const char* l : libraries) ours = ours || std::strstr(info->dlpi_name, l) != nullptr;
  if (!ours) return 0;
  for (int i = 0; i < info->dlpi_phnum && g_num_blas_code < 32; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const uintptr_t at = info->dlpi_addr + ph.p_vaddr;
    g_blas_code[g_num_blas_code++] = {at, at + ph.p_memsz};
  }
  return 0;
}

bool InBlas(const void* caller) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(caller);
  for (int i = 0; i < g_num_blas_code; ++i) {
    if (at >= g_blas_code[i].begin && at < g_blas_code[i].end) return true;
  }
  return false;
}

void Note(std::atomic<int64_t>* counter, const char* what, size_t bytes,
          const void* caller = nullptr) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  if (caller != nullptr && InBlas(caller)) {
    g_blas_mallocs.fetch_add(1, std::memory_order_relaxed);
    if (!g_count_blas) return;
  }
  counter->fetch_add(1, std::memory_order_relaxed);
  if (t_in_trace || g_traces_left.load(std::memory_order_relaxed) <= 0) return;
  if (g_traces_left.fetch_sub(1) <= 0) return;
  t_in_trace = true;
  char line[96];
  const int n = std::snprintf(line, sizeof line, "\n=== counted %s of %zu bytes:\n", what, bytes);
  if (n > 0) (void)!write(2, line, static_cast<size_t>(n));
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
  t_in_trace = false;
}

void* New(size_t bytes, const void* caller) {
  Note(&g_news, "operator new", bytes, caller);
  void* p = __libc_malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* NewAligned(size_t bytes, std::align_val_t align, const void* caller) {
  Note(&g_news, "operator new (aligned)", bytes, caller);
  void* p = __libc_memalign(static_cast<size_t>(align), bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// ---- The process's allocation functions ----

extern "C" {
void* malloc(size_t bytes) {
  Note(&g_mallocs, "malloc", bytes, __builtin_return_address(0));
  return __libc_malloc(bytes);
}
void* calloc(size_t n, size_t size) {
  Note(&g_mallocs, "calloc", n * size, __builtin_return_address(0));
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t bytes) {
  Note(&g_mallocs, "realloc", bytes, __builtin_return_address(0));
  return __libc_realloc(p, bytes);
}
void free(void* p) { __libc_free(p); }
void* memalign(size_t align, size_t bytes) {
  Note(&g_mallocs, "memalign", bytes, __builtin_return_address(0));
  return __libc_memalign(align, bytes);
}
void* aligned_alloc(size_t align, size_t bytes) {
  Note(&g_mallocs, "aligned_alloc", bytes, __builtin_return_address(0));
  return __libc_memalign(align, bytes);
}
int posix_memalign(void** out, size_t align, size_t bytes) {
  Note(&g_mallocs, "posix_memalign", bytes, __builtin_return_address(0));
  void* p = __libc_memalign(align, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}

void* operator new(size_t n) { return New(n, __builtin_return_address(0)); }
void* operator new[](size_t n) { return New(n, __builtin_return_address(0)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return New(n, __builtin_return_address(0));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return New(n, __builtin_return_address(0));
  } catch (...) {
    return nullptr;
  }
}
void* operator new(size_t n, std::align_val_t a) { return NewAligned(n, a, __builtin_return_address(0)); }
void* operator new[](size_t n, std::align_val_t a) { return NewAligned(n, a, __builtin_return_address(0)); }
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }

namespace {

struct Counts {
  int64_t news = 0, mallocs = 0, blas_mallocs = 0;
};

// Opens the window (every thread's allocations count from now on).
void StartCounting() {
  g_news = 0;
  g_mallocs = 0;
  g_blas_mallocs = 0;
  g_counting = true;
}
Counts StopCounting() {
  g_counting = false;
  return {g_news.load(), g_mallocs.load(), g_blas_mallocs.load()};
}

// Stack traces of the first MUON_ALLOC_TRACE counted allocations.
class TraceFromEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* n = std::getenv("MUON_ALLOC_TRACE");
    void* frames[4];
    (void)backtrace(frames, 4);  // loads the unwinder now, not in a window
    g_traces_left = n != nullptr ? std::atoi(n) : 0;
    const char* blas = std::getenv("MUON_ALLOC_COUNT_BLAS");
    g_count_blas = blas != nullptr && std::strcmp(blas, "1") == 0;
    dl_iterate_phdr(FindBlasCode, nullptr);
  }
};
const auto* const kTrace = ::testing::AddGlobalTestEnvironment(new TraceFromEnvironment);

constexpr int kWarmUp = 2;
constexpr int kCounted = 8;  // steps 3 .. 10

// A host tensor: one buffer, deterministic non-zero contents.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<uint16_t> half;  // bf16 / fp16
  std::vector<float> f32;
  DLTensor dl{};
  Tensor(std::vector<int64_t> s, DLDataType type, uint32_t seed) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    void* data = nullptr;
    if (type.bits == 16) {
      half.resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
      for (int64_t i = 0; i < n; ++i) {
        // Small values of either sign (bf16: 0x3c00 ~ 0.0078; fp16: 0x2000 ~ 0.0078).
        half[i] = static_cast<uint16_t>(((i + seed) % 7 < 3 ? 0x8000 : 0) + 0x2000 +
                                        (i * 37 + seed) % 200);
        if (type.code == kDLBfloat) half[i] = static_cast<uint16_t>(half[i] + 0x1c00);
      }
      data = half.data();
    } else {
      f32.resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
      for (int64_t i = 0; i < n; ++i) f32[i] = std::sin(0.37f * (i + 1) + seed) * 0.01f;
      data = f32.data();
    }
    dl.data = data;
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = type;
    dl.shape = shape.data();
  }
};

const DLDataType kF32{kDLFloat, 32, 1}, kBF16{kDLBfloat, 16, 1}, kF16{kDLFloat, 16, 1};

struct ParamSpec {
  const char* name;
  std::vector<int64_t> shape;
  DLDataType type;
  int view;
};

// What a single process registers.
const std::vector<ParamSpec>& SingleProcessParams() {
  static const std::vector<ParamSpec> specs = {
      {"tall", {96, 32}, kF32, MUON_MATRIX_VIEW_2D},
      {"wide", {24, 80}, kF32, MUON_MATRIX_VIEW_2D},
      {"square", {40, 40}, kBF16, MUON_MATRIX_VIEW_2D},
      {"row_vector", {1, 50}, kF32, MUON_MATRIX_VIEW_2D},
      {"column_vector", {50, 1}, kF32, MUON_MATRIX_VIEW_2D},
      {"experts", {3, 16, 12}, kF32, MUON_MATRIX_VIEW_BATCHED_LEADING},
      {"conv", {8, 3, 3, 3}, kF16, MUON_MATRIX_VIEW_FLATTEN_TRAILING},
      {"tall_again", {96, 32}, kF32, MUON_MATRIX_VIEW_2D},  // a second of one shape
  };
  return specs;
}

bool Ok(muon_status_t s, const char* what) {
  if (s == MUON_OK) return true;
  ADD_FAILURE() << what << ": " << muon_status_string(s) << ": " << muon_last_error_message();
  return false;
}

// The calls of one training-loop iteration: an lr schedule, the step, the
// stats. Records a failure in *failed (no assertion inside a window).
void Iterate(muon_optimizer_t* opt, int step, muon_status_t* failed) {
  muon_status_t s = muon_set_lr(opt, 0.02 / (1 + 0.1 * step));
  if (s == MUON_OK) s = muon_step(opt, nullptr);
  muon_stats_t stats;
  stats.struct_size = sizeof stats;
  if (s == MUON_OK) s = muon_get_stats(opt, &stats);
  if (s != MUON_OK && *failed == MUON_OK) *failed = s;
}

void ExpectNoAllocations(const Counts& c, const std::string& what) {
  EXPECT_EQ(c.news, 0) << what << ": operator new called " << c.news << " times in "
                       << kCounted << " steps (MUON_ALLOC_TRACE=1 shows where)";
  EXPECT_EQ(c.mallocs, 0) << what << ": malloc and co. called " << c.mallocs << " times in "
                          << kCounted << " steps (MUON_ALLOC_TRACE=1 shows where"
                          << (g_count_blas ? "; OpenBLAS's own included" : "") << ")";
  if (c.blas_mallocs > 0) {
    std::printf("note: %s: OpenBLAS itself called malloc %lld times in %d steps (%s)\n",
                what.c_str(), static_cast<long long>(c.blas_mallocs), kCounted,
                g_count_blas ? "counted above" : "not counted; MUON_ALLOC_COUNT_BLAS=1 counts them");
  }
  ::testing::Test::RecordProperty("openblas_mallocs", std::to_string(c.blas_mallocs));
}

// ---- A world of one, without a communicator ----

struct OptionCase {
  const char* name;
  void (*set)(muon_options_t*);
};
void PrintTo(const OptionCase& c, std::ostream* os) { *os << c.name; }

class SingleProcess : public ::testing::TestWithParam<OptionCase> {};

TEST_P(SingleProcess, StepsAfterTheSecondAllocateNothing) {
  muon_options_t o;
  ASSERT_TRUE(Ok(muon_options_init(&o, sizeof o), "muon_options_init"));
  GetParam().set(&o);
  muon_optimizer_t* opt = nullptr;
  ASSERT_TRUE(Ok(muon_create(&o, &opt), "muon_create"));
  std::vector<std::unique_ptr<Tensor>> tensors;
  uint32_t seed = 1;
  for (const ParamSpec& p : SingleProcessParams()) {
    // update_in_grad: a float16 gradient cannot hold the update; such a
    // parameter's gradient is float32 there (as a host would choose).
    DLDataType type = p.type;
    if (o.update_in_grad && type.code == kDLFloat && type.bits == 16) type = kF32;
    if (o.update_in_grad && type.code == kDLBfloat && (o.momentum_fp32 || o.ns_dtype != MUON_NS_DTYPE_BF16)) {
      type = kF32;
    }
    tensors.push_back(std::make_unique<Tensor>(p.shape, type, seed++));
    Tensor& value = *tensors.back();
    tensors.push_back(std::make_unique<Tensor>(p.shape, type, seed++));
    Tensor& grad = *tensors.back();
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = p.name;
    po.matrix_view = p.view;
    int64_t id = -1;
    ASSERT_TRUE(Ok(muon_register_param(opt, &value.dl, &grad.dl, &po, &id), p.name));
  }
  muon_status_t failed = MUON_OK;
  for (int step = 0; step < kWarmUp; ++step) Iterate(opt, step, &failed);
  ASSERT_EQ(failed, MUON_OK) << muon_last_error_message();
  StartCounting();
  for (int step = kWarmUp; step < kWarmUp + kCounted; ++step) Iterate(opt, step, &failed);
  const Counts c = StopCounting();
  EXPECT_EQ(failed, MUON_OK) << muon_last_error_message();
  ExpectNoAllocations(c, GetParam().name);
  int64_t steps = 0;
  EXPECT_EQ(muon_step_count(opt, &steps), MUON_OK);
  EXPECT_EQ(steps, kWarmUp + kCounted);
  muon_destroy(opt);
}

INSTANTIATE_TEST_SUITE_P(
    Options, SingleProcess,
    ::testing::Values(
        OptionCase{"defaults", [](muon_options_t*) {}},
        OptionCase{"ns_fp32_no_nesterov",
                   [](muon_options_t* o) {
                     o->ns_dtype = MUON_NS_DTYPE_FP32;
                     o->nesterov = 0;
                   }},
        OptionCase{"momentum_fp32", [](muon_options_t* o) { o->momentum_fp32 = 1; }},
        OptionCase{"update_in_grad", [](muon_options_t* o) { o->update_in_grad = 1; }},
        OptionCase{"skip_nonfinite", [](muon_options_t* o) { o->skip_nonfinite = 1; }}),
    [](const ::testing::TestParamInfo<OptionCase>& info) { return std::string(info.param.name); });

// ---- In-process ranks ----

// A barrier for the rank threads (a mutex and a condition variable: waiting
// allocates nothing).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

struct RankParam {
  const char* name;
  std::vector<int64_t> global;  // the global shape
  int view;
  // The placement over the world (group 0); FLAT_RANGE: rank r holds
  // [cuts[r], cuts[r + 1]) of the flattened tensor.
  int kind;
  int dim;
  int split;
  std::vector<int64_t> cuts;
  int replicated_mode;
  bool custom;  // on the custom path (whole matrix on every rank; rank 0 owns it)
};

// The local shape rank r of n holds.
std::vector<int64_t> LocalShape(const RankParam& p, int r, int n) {
  std::vector<int64_t> s = p.global;
  if (p.custom || p.kind == MUON_PLACEMENT_REPLICATE) return s;
  if (p.kind == MUON_PLACEMENT_FLAT_RANGE) return {p.cuts[r + 1] - p.cuts[r]};
  const int64_t d = s[p.dim];
  int64_t a, b;
  if (p.split == MUON_SPLIT_CHUNK) {
    const int64_t c = (d + n - 1) / n;
    a = std::min(r * c, d);
    b = std::min(a + c, d);
  } else {
    a = r * (d / n);
    b = a + d / n;
  }
  s[p.dim] = b - a;
  return s;
}

// Custom path over a world of one: the local tensor is the whole matrix.
int32_t AssignToZero(void*, const char*, int32_t) { return 0; }
muon_status_t GatherWhole(void* state, const float* local, int64_t n, int32_t, muon_gathered_t* out,
                          void*) {
  const int64_t* shape = static_cast<const int64_t*>(state);
  (void)n;
  out->data = local;
  out->rows = shape[0];
  out->cols = shape[1];
  return MUON_OK;
}
muon_status_t RedistributeWhole(void*, const float* full, int64_t, int64_t, int32_t, float* local,
                                int64_t n, void*) {
  std::memcpy(local, full, static_cast<size_t>(n) * sizeof(float));
  return MUON_OK;
}

// Runs `params` on `ranks` in-process ranks (one thread each) with `set`
// applied to the options; every rank steps twice, then the window covers
// every rank's steps 3 .. 10.
void RunRanks(int ranks, const std::vector<RankParam>& params, void (*set)(muon_options_t*),
              const std::string& what) {
  muon_inprocess_world_t* world = nullptr;
  ASSERT_TRUE(Ok(muon_inprocess_world_create(ranks, &world), "muon_inprocess_world_create"));
  Barrier barrier(ranks);
  std::vector<std::string> errors(ranks);
  Counts counts;
  auto rank_main = [&](int r) {
    auto fail = [&](const std::string& e) {
      if (errors[r].empty()) errors[r] = e + ": " + muon_last_error_message();
    };
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    set(&o);
    muon_optimizer_t* opt = nullptr;
    std::vector<std::unique_ptr<Tensor>> tensors;
    bool ok = muon_create(&o, &opt) == MUON_OK;
    if (!ok) fail("muon_create");
    muon_comm_t comm;
    int32_t group = -1;
    if (ok && (muon_inprocess_comm(world, nullptr, 0, r, &comm) != MUON_OK ||
               muon_set_world(opt, &comm, &group) != MUON_OK)) {
      ok = false;
      fail("the world");
    }
    uint32_t seed = 100;
    for (const RankParam& p : params) {
      if (!ok) break;
      const std::vector<int64_t> local = LocalShape(p, r, ranks);
      tensors.push_back(std::make_unique<Tensor>(local, kF32, seed++ + 10 * r));
      Tensor& value = *tensors.back();
      tensors.push_back(std::make_unique<Tensor>(local, kF32, seed++ + 10 * r));
      Tensor& grad = *tensors.back();
      muon_param_options_t po;
      muon_param_options_init(&po, sizeof po);
      po.name = p.name;
      po.matrix_view = p.view;
      // "split..." parameters: blocks of 2 and 2 (rows, or columns for "splitcol").
      static const int64_t kSplit[] = {2, 2};
      if (std::strncmp(p.name, "split", 5) == 0) {
        po.split_dim = std::strncmp(p.name, "splitcol", 8) == 0 ? 1 : 0;
        po.num_split_sizes = 2;
        po.split_sizes = kSplit;
      }
      muon_status_t s;
      if (p.custom) {
        muon_custom_layout_t cl{};
        cl.struct_size = sizeof cl;
        cl.state = const_cast<int64_t*>(p.global.data());
        cl.global_rows = p.global[0];
        cl.global_cols = p.global[1];
        cl.assign_fn = AssignToZero;
        cl.gather_fn = GatherWhole;
        cl.redistribute_fn = RedistributeWhole;
        int64_t id = -1;
        s = muon_register_param_custom(opt, &value.dl, &grad.dl, &po, &cl, &id);
      } else {
        muon_placement_t pl{};
        pl.kind = p.kind;
        pl.group = group;
        pl.dim = p.dim;
        pl.split = p.split;
        if (p.kind == MUON_PLACEMENT_FLAT_RANGE) {
          pl.start = p.cuts[r];
          pl.length = p.cuts[r + 1] - p.cuts[r];
        }
        po.global_ndim = static_cast<int32_t>(p.global.size());
        po.global_shape = p.global.data();
        po.num_placements = 1;
        po.placements = &pl;
        po.replicated_mode = p.replicated_mode;
        int64_t id = -1;
        s = muon_register_param(opt, &value.dl, &grad.dl, &po, &id);
      }
      if (s != MUON_OK) {
        ok = false;
        fail(p.name);
      }
    }
    // Every rank steps, whatever failed on this one (the others would wait).
    muon_status_t failed = ok ? MUON_OK : MUON_INTERNAL;
    for (int step = 0; step < kWarmUp; ++step) Iterate(opt, step, &failed);
    if (failed != MUON_OK) fail("a warm-up step");
    barrier.Wait();
    if (r == 0) StartCounting();
    barrier.Wait();
    muon_status_t counted = MUON_OK;
    for (int step = kWarmUp; step < kWarmUp + kCounted; ++step) Iterate(opt, step, &counted);
    barrier.Wait();
    if (r == 0) counts = StopCounting();
    barrier.Wait();
    if (counted != MUON_OK) fail("a counted step");
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[r], "") << what << ", rank " << r;
  ExpectNoAllocations(counts, what);
}

RankParam Layout(const char* name, std::vector<int64_t> global, int kind, int dim = 0,
                 int split = MUON_SPLIT_EVEN, std::vector<int64_t> cuts = {},
                 int view = MUON_MATRIX_VIEW_2D) {
  return {name, std::move(global), view, kind, dim, split, std::move(cuts),
          MUON_REPLICATED_HOST_AVERAGED, false};
}

RankParam Zero2(const char* name, std::vector<int64_t> global) {
  return {name, std::move(global), MUON_MATRIX_VIEW_2D, MUON_PLACEMENT_REPLICATE, 0, 0, {},
          MUON_REPLICATED_ZERO2, false};
}

RankParam Custom(const char* name, std::vector<int64_t> global) {
  return {name, std::move(global), MUON_MATRIX_VIEW_2D, 0, 0, 0, {}, 0, true};
}

// Several rounds (round_bytes small), the exchange running one round ahead
// on the pipeline's worker thread.
void SeveralRounds(muon_options_t* o) {
  o->prefetch_count = 1;
  o->round_bytes = 8192;
}

TEST(InProcessRanks, OneRankWithLayoutZero2AndCustomParamsAllocatesNothing) {
  RunRanks(1,
           {Layout("sharded", {48, 20}, MUON_PLACEMENT_SHARD),
            Layout("flat", {12, 10}, MUON_PLACEMENT_FLAT_RANGE, 0, 0, {0, 120}),
            Zero2("zero2_a", {16, 8}), Zero2("zero2_b", {16, 8}), Zero2("zero2_c", {8, 30}),
            Custom("custom", {20, 12})},
           [](muon_options_t*) {}, "a world of one in-process rank");
}

TEST(InProcessRanks, TwoRanksShardedOverSeveralRoundsAllocateNothing) {
  RunRanks(2,
           {Layout("rows", {64, 32}, MUON_PLACEMENT_SHARD, 0),
            Layout("cols", {30, 40}, MUON_PLACEMENT_SHARD, 1, MUON_SPLIT_CHUNK),
            Layout("replicated", {16, 16}, MUON_PLACEMENT_REPLICATE),
            Layout("flat", {20, 10}, MUON_PLACEMENT_FLAT_RANGE, 0, 0, {0, 70, 200}),
            Layout("experts", {4, 8, 12}, MUON_PLACEMENT_SHARD, 0, MUON_SPLIT_EVEN, {},
                   MUON_MATRIX_VIEW_BATCHED_LEADING),
            Layout("wide", {8, 96}, MUON_PLACEMENT_SHARD, 1)},
           SeveralRounds, "two in-process ranks");
}

TEST(InProcessRanks, TwoRanksSkippingNonFiniteStepsAllocateNothing) {
  RunRanks(2,
           {Layout("rows", {64, 32}, MUON_PLACEMENT_SHARD, 0),
            Layout("flat", {20, 10}, MUON_PLACEMENT_FLAT_RANGE, 0, 0, {0, 70, 200})},
           [](muon_options_t* o) { o->skip_nonfinite = 1; }, "two ranks with skip_nonfinite");
}

void SplitOptions(muon_options_t* o) {
  o->normuon = 1;
  o->adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW;  // block factors other than 1
}

TEST(InProcessRanks, TwoRanksSplitBlocksWithNorMuonAllocateNothing) {
  RunRanks(2,
           {Layout("split_rows", {16, 12}, MUON_PLACEMENT_SHARD, 0),
            Layout("splitcol", {12, 16}, MUON_PLACEMENT_SHARD, 1),
            Zero2("split_zero2", {16, 8})},
           SplitOptions, "two ranks with split blocks and NorMuon");
  // (The custom path's callbacks here serve a world of one.)
  RunRanks(1, {Custom("split_custom", {20, 12})}, SplitOptions,
           "a custom-path parameter with split blocks and NorMuon");
}

// MUON_ASSIGNMENT_SPLIT: "big" is orthogonalized by the 4 ranks together
// (the model of equivalence_test's Split cases), its members summing its
// norm, grams and NorMuon's row squares at every step; then Gram
// Newton-Schulz's R.
TEST(InProcessRanks, FourRanksSplittingAMatrixAllocateNothing) {
  static const char* const kSmall[] = {"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7",
                                       "s8", "s9", "s10", "s11", "s12", "s13", "s14"};
  std::vector<RankParam> model = {Layout("big", {16, 96}, MUON_PLACEMENT_SHARD, 0)};
  for (const char* name : kSmall) model.push_back(Layout(name, {8, 8}, MUON_PLACEMENT_REPLICATE));
  RunRanks(4, model,
           [](muon_options_t* o) {
             o->assignment = MUON_ASSIGNMENT_SPLIT;
             o->normuon = 1;
           },
           "four ranks splitting a matrix, with NorMuon");
  RunRanks(4, model,
           [](muon_options_t* o) {
             o->assignment = MUON_ASSIGNMENT_SPLIT;
             o->ns_algorithm = MUON_NS_GRAM;
           },
           "four ranks splitting a matrix, Gram Newton-Schulz");
}

TEST(InProcessRanks, TwoRanksZero2AllocateNothing) {
  RunRanks(2, {Zero2("a", {16, 8}), Zero2("b", {16, 8}), Zero2("c", {16, 8}), Zero2("d", {8, 30})},
           [](muon_options_t*) {}, "two in-process ZeRO-2 ranks");
}

}  // namespace
