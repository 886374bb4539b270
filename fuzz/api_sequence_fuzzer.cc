// Fuzzes the C API as a host could drive it: the input is a sequence of calls
// on one optimizer, on host memory. The optimizer is created with fuzzed
// options; then each call is one of: register a parameter (fuzzed shape,
// dtype, device code, strides, offset, aliasing, name, matrix view and, with
// a world, global shape, placements and replicated mode), rebind one, set
// lr / weight decay / momentum, write gradients and step, get or set a
// momentum buffer, save or load the state (the last saved blob, possibly
// damaged, or fuzzed bytes; through muon_load_state, or muon_load_states
// alone or beside the last saved blob), read the stats and options, orthogonalize,
// set a world of one in-process rank or add a group, or destroy the optimizer
// and create another, or register a custom-path parameter (the host's
// callbacks; a declared matrix of any size when the optimizer has the
// fuzzer's allocator, which refuses blocks over 1 MiB). Shapes stay small:
// at most 4 dimensions of at most 4 elements, except shapes the library must
// refuse without touching memory.
//
// Versioned structs (muon_options_t, muon_param_options_t, muon_stats_t,
// muon_custom_layout_t, muon_comm_t) are passed with a struct_size from the
// input anywhere in 0 .. sizeof + 64, in a heap block of exactly that many
// bytes (at least the struct_size field), so that AddressSanitizer sees any
// byte read or written past it: the sizes muon.h publishes, and larger
// multiples of 8 (a newer header's struct), are accepted; every other size is
// refused, naming the struct_size, with nothing written (the *_init
// functions included) and, for a communicator table, nothing of it read,
// its release included.
//
// Never crash or leak. Every status is one of the header's codes, with a
// message exactly when it is not MUON_OK. A failed call changes nothing the
// host can observe (parameter count, step count, options, the state blob),
// and the optimizer stays usable: queries succeed after it. Calls that
// succeed do what they say (ids in order, one more step or, with
// skip_nonfinite, a counted skip that changed nothing, the new lr, a saved
// blob that loads back unchanged, set_state then get_state).
//
// Seeds: MUON_FUZZ_WRITE_SEEDS=<dir> <binary> -runs=0 writes a few call
// sequences into <dir>.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "libmuon/muon.h"
#include "fuzz/fuzz_util.h"

namespace {

bool verbose = false;

// ---- Versioned structs: what muon.h's "Conventions" publishes (LP64) ----

struct Versions {
  const char* type;
  std::vector<size_t> published;  // ascending; the last is this header's sizeof
  // A size the library must accept: a published one, or a larger multiple of 8.
  bool Accepts(size_t size) const {
    for (size_t p : published) {
      if (size == p) return true;
    }
    return size > published.back() && size % 8 == 0;
  }
};
const Versions kOptionsVersions{"muon_options_t", {104, 144, 152, 184, 200, 240}};
const Versions kParamOptionsVersions{"muon_param_options_t", {24, 56, 88}};
const Versions kStatsVersions{"muon_stats_t", {80, 96, 128}};
const Versions kCustomLayoutVersions{"muon_custom_layout_t", {56}};
const Versions kCommVersions{"muon_comm_t", {72}};
static_assert(sizeof(muon_options_t) == 240 && sizeof(muon_param_options_t) == 88 &&
                  sizeof(muon_stats_t) == 128 && sizeof(muon_custom_layout_t) == 56 &&
                  sizeof(muon_comm_t) == 72,
              "a struct grew: add its new size to the lists above");

// A caller's struct of `size` bytes in a heap block of exactly that size (at
// least its struct_size field, which the library reads to learn the size),
// holding the first bytes of `full`, struct_size set to `size`, and a
// pattern past sizeof(T) (a newer header's fields, which are not read).
template <typename T>
class Sized {
 public:
  Sized(const T& full, size_t size)
      : size_(size), bytes_(std::max(size, sizeof(size_t))), block_(new unsigned char[bytes_]) {
    std::memset(block_.get(), 0xa5, bytes_);
    std::memcpy(block_.get(), &full, std::min(bytes_, sizeof(T)));
    std::memcpy(block_.get(), &size_, sizeof(size_t));  // struct_size, the first field
  }
  T* get() { return reinterpret_cast<T*>(block_.get()); }
  // The int64 at `offset` when the caller's struct holds it, else `fallback`.
  int64_t Int64At(size_t offset, int64_t fallback) const {
    if (offset + sizeof(int64_t) > size_) return fallback;
    int64_t v;
    std::memcpy(&v, block_.get() + offset, sizeof v);
    return v;
  }

 private:
  size_t size_, bytes_;
  std::unique_ptr<unsigned char[]> block_;
};

// The refusal of a struct_size says so.
void CheckSizeRefusal(muon_status_t st, size_t size) {
  FUZZ_CHECK(st == MUON_INVALID_ARGUMENT);
  const std::string why = muon_last_error_message();
  FUZZ_CHECK(why.find("struct_size is " + std::to_string(size)) != std::string::npos);
}

// Every call's status: a code of the header, and a message exactly on failure.
muon_status_t Checked(const char* call, muon_status_t st) {
  if (verbose) {
    std::fprintf(stderr, "%s -> %s %s\n", call, muon_status_string(st), muon_last_error_message());
  }
  return CheckStatus(st);
}

double FuzzDouble(FuzzedDataProvider& in) {
  static const double kValues[] = {0.0,
                                   1e-3,
                                   0.02,
                                   0.1,
                                   0.5,
                                   0.9,
                                   0.95,
                                   0.999999,
                                   1.0,
                                   2.0,
                                   -0.1,
                                   -0.0,
                                   1e300,
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN(),
                                   1e-300};
  return kValues[in.ConsumeIntegralInRange<size_t>(0, sizeof kValues / sizeof kValues[0] - 1)];
}

// Storage the host owns; kept until the optimizer that may point at it is gone.
struct Storage {
  std::vector<unsigned char> bytes;
  std::vector<int64_t> shape, strides;
};

struct Tensor {
  DLTensor t{};
  Storage* storage = nullptr;
  bool owns_memory = false;  // bytes describe the tensor (not a fake or shared buffer)
  int64_t numel = 0;
};

constexpr DLDataType kDTypes[] = {
    {kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 16, 1},  // accepted
    {kDLInt, 32, 1},   {kDLFloat, 64, 1},  {kDLFloat, 32, 2},  // refused
};

// numel, or -1 when a dimension is negative or the byte count overflows.
int64_t CheckedBytes(const std::vector<int64_t>& shape, int64_t width, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  *numel = n;
  int64_t bytes;
  if (__builtin_mul_overflow(n, width, &bytes)) return -1;
  return bytes;
}

struct Registered {
  std::vector<int64_t> shape;
  DLDataType dtype;
  Storage* grad = nullptr;  // the grad the host writes before each step
  void* grad_at = nullptr;  // where its bytes start (data + byte_offset)
  size_t grad_bytes = 0;
};

class Session {
 public:
  explicit Session(FuzzedDataProvider& in) : in_(in) {}
  ~Session() { Destroy(); }

  void Create() {
    muon_options_t full;
    FUZZ_CHECK(Checked("muon_options_init", muon_options_init(&full, sizeof full)) == MUON_OK);
    muon_options_t* o = &full;
    size_t size = sizeof full;  // the caller's struct_size
    if (in_.ConsumeBool()) {
      // Any size: an older header's (read as that version), a newer one's, or
      // one no header had (refused).
      if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) size = FuzzSize(kOptionsVersions);
      if (in_.ConsumeBool()) o->lr = FuzzDouble(in_);
      if (in_.ConsumeBool()) o->weight_decay = FuzzDouble(in_);
      if (in_.ConsumeBool()) o->momentum = FuzzDouble(in_);
      o->nesterov = in_.ConsumeBool();
      if (in_.ConsumeBool()) o->ns_steps = in_.ConsumeIntegralInRange<int32_t>(-1, 8);
      if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) o->ns_steps = 100;
      if (in_.ConsumeBool()) {
        o->ns_a = FuzzDouble(in_);
        o->ns_b = -FuzzDouble(in_);
        o->ns_c = FuzzDouble(in_);
      }
      if (in_.ConsumeBool()) o->eps = FuzzDouble(in_);
      o->ns_coefficients = in_.ConsumeIntegralInRange<int32_t>(-1, 7);  // every preset, AOL too
      if (o->ns_coefficients == MUON_NS_COEFFICIENTS_TABLE) {
        for (double& c : table_) c = FuzzDouble(in_);
        o->ns_table_rows = in_.ConsumeIntegralInRange<int32_t>(0, 4);  // table_ has 4 rows
        o->ns_table = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? nullptr : table_;
      }
      o->adjust_lr = in_.ConsumeIntegralInRange<int32_t>(-1, 4);
      o->ns_dtype = in_.ConsumeIntegralInRange<int32_t>(-1, 2);
      o->momentum_fp32 = in_.ConsumeBool();
      if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) o->reserved0 = 1;
      if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) o->reserved1 = 1;
      o->assignment = in_.ConsumeIntegralInRange<int32_t>(-1, 3);
      if (o->assignment == MUON_ASSIGNMENT_CUSTOM && in_.ConsumeBool()) {
        o->assign_fn = &Session::Assign;
        o->assign_state = this;
        assign_answer_ = in_.ConsumeIntegralInRange<int32_t>(-1, 1);
        assign_status_ = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? MUON_INTERNAL : MUON_OK;
      }
      o->prefetch_count = in_.ConsumeIntegralInRange<int32_t>(-1, 65);
      o->async_parallelism = in_.ConsumeBool();
      static const size_t kRoundBytes[] = {0, 1, 64, 4096};
      o->round_bytes = kRoundBytes[in_.ConsumeIntegralInRange<int>(0, 3)];
      o->skip_nonfinite = in_.ConsumeIntegralInRange<int32_t>(0, 3) == 0
                              ? in_.ConsumeIntegralInRange<int32_t>(-1, 2)
                              : in_.ConsumeBool();
    }
    if (in_.ConsumeBool()) {  // the fuzzer's allocator (read from 0.5 structs on)
      o->allocate = &Session::Allocate;
      o->release = &Session::Release;
      o->allocator_ctx = this;
    }
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      CheckInit("muon_options_init", &muon_options_init, kOptionsVersions);
    }
    Sized<muon_options_t> caller(full, size);
    muon_status_t st = muon_create(caller.get(), &opt_);
    if (!kOptionsVersions.Accepts(size)) CheckSizeRefusal(st, size);
    if (Checked("muon_create", st) != MUON_OK) {
      FUZZ_CHECK(opt_ == nullptr);
      muon_options_t d;
      Checked("muon_options_init", muon_options_init(&d, sizeof d));
      FUZZ_CHECK(Checked("muon_create", muon_create(&d, &opt_)) == MUON_OK);
    }
    FUZZ_CHECK(opt_ != nullptr);
    // Whether the optimizer's memory comes from the fuzzer's allocator (an
    // options struct older than 0.5 has no allocator fields).
    muon_options_t now;
    Checked("muon_options_init", muon_options_init(&now, sizeof now));
    FUZZ_CHECK(Checked("muon_get_options", muon_get_options(opt_, &now)) == MUON_OK);
    hooked_ = now.allocate == &Session::Allocate;
  }

  void Destroy() {
    muon_destroy(opt_);
    opt_ = nullptr;
    hooked_ = false;
    custom_.clear();  // the callbacks' state: no optimizer calls them any more
    if (world_) muon_inprocess_world_destroy(world_);
    world_ = nullptr;
    has_world_ = false;
    num_groups_ = 0;
    params_.clear();
    blob_.clear();
    storage_.clear();  // nothing points at it any more
  }

  // One call, chosen by the input.
  void Call() {
    switch (in_.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
      case 1: return Register();
      case 2: return Rebind();
      case 3: return SetHyper();
      case 4:
      case 5: return Step();
      case 6: return GetState();
      case 7: return SetState();
      case 8: return SaveState();
      case 9: return LoadState();
      case 10: return Stats();
      case 11: return Orthogonalize();
      case 12: return Queries();
      case 13: return World();
      case 14:
        if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
          Destroy();
          Create();
        }
        return;
      default: return Custom();
    }
  }

 private:
  // A struct_size for a struct of versions `v`: mostly this header's, else a
  // published one or anything in 0 .. sizeof + 64.
  size_t FuzzSize(const Versions& v) {
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: return in_.ConsumeIntegralInRange<size_t>(0, v.published.back() + 64);
      case 1: return v.published[in_.ConsumeIntegralInRange<size_t>(0, v.published.size() - 1)];
      case 2: return v.published.back() + 8 * in_.ConsumeIntegralInRange<size_t>(1, 8);
      default: return v.published.back();
    }
  }

  // `init` on a heap block of exactly a fuzzed struct_size: it fills the
  // accepted sizes (struct_size set, a newer header's tail zeroed) and
  // refuses the others writing nothing.
  template <typename T>
  void CheckInit(const char* call, muon_status_t (*init)(T*, size_t), const Versions& v) {
    const size_t size = FuzzSize(v);
    std::unique_ptr<unsigned char[]> block(new unsigned char[size]);
    std::memset(block.get(), 0xa5, size);
    const muon_status_t st = init(reinterpret_cast<T*>(block.get()), size);
    if (!v.Accepts(size)) {
      CheckSizeRefusal(st, size);
      Checked(call, st);
      for (size_t i = 0; i < size; ++i) FUZZ_CHECK(block[i] == 0xa5);
      return;
    }
    FUZZ_CHECK(Checked(call, st) == MUON_OK);
    size_t written = 0;
    std::memcpy(&written, block.get(), sizeof written);
    FUZZ_CHECK(written == size);
    for (size_t i = sizeof(T); i < size; ++i) FUZZ_CHECK(block[i] == 0);
  }

  // The fuzzer's allocator (muon_options_t.allocate): 64-byte aligned blocks
  // of up to 1 MiB; larger ones are refused, as a host short of memory would.
  static void* Allocate(void*, size_t bytes, int32_t, int32_t, void*) {
    if (bytes > (size_t{1} << 20)) return nullptr;
    return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  }
  static void Release(void*, void* ptr, size_t, int32_t, int32_t, void*) { std::free(ptr); }

  // The host's side of a custom-path parameter in a world of one rank: the
  // declared rows x cols matrix, of which the local tensor is the first
  // elements; the fuzzer holds matrices of up to 2^16 elements.
  struct CustomState {
    int64_t rows = 0, cols = 0;
    std::vector<float> full;
  };
  static int64_t Elements(const CustomState& c) {
    int64_t n = 0;
    return __builtin_mul_overflow(c.rows, c.cols, &n) ? -1 : n;
  }
  static int32_t CustomAssign(void*, const char*, int32_t world_size) {
    FUZZ_CHECK(world_size == 1);
    return 0;
  }
  static muon_status_t CustomGather(void* state, const float* local, int64_t n, int32_t owner,
                                    muon_gathered_t* out, void*) {
    auto* c = static_cast<CustomState*>(state);
    const int64_t elements = Elements(*c);
    // Registration admitted only what its owner can hold, and local pieces
    // no larger than the matrix.
    FUZZ_CHECK(owner == 0 && elements >= 0 && n >= 0 && n <= elements);
    if (elements > (int64_t{1} << 16)) {
      muon_set_callback_error("the fuzzer's host holds no matrix this large");
      return MUON_RESOURCE_EXHAUSTED;
    }
    c->full.assign(static_cast<size_t>(elements), 0.0f);
    if (n > 0) std::memcpy(c->full.data(), local, static_cast<size_t>(n) * sizeof(float));
    out->data = c->full.data();
    out->rows = c->rows;
    out->cols = c->cols;
    return MUON_OK;
  }
  static muon_status_t CustomRedistribute(void* state, const float* full, int64_t rows,
                                          int64_t cols, int32_t owner, float* local, int64_t n,
                                          void*) {
    auto* c = static_cast<CustomState*>(state);
    FUZZ_CHECK(owner == 0 && rows == c->rows && cols == c->cols && n >= 0 && n <= Elements(*c));
    if (full != nullptr && n > 0) std::memcpy(local, full, static_cast<size_t>(n) * sizeof(float));
    return MUON_OK;
  }

  static muon_status_t Assign(void* state, size_t n, const muon_matrix_info_t* m, int32_t* owners) {
    Session* s = static_cast<Session*>(state);
    for (size_t i = 0; i < n; ++i) {
      FUZZ_CHECK(m[i].num_holders >= 1 && m[i].holders != nullptr && m[i].param_name != nullptr);
      owners[i] = s->assign_answer_;
    }
    if (s->assign_status_ != MUON_OK) muon_set_callback_error("the host's assignment failed");
    return s->assign_status_;
  }

  // What the host can observe of the optimizer; every query must succeed.
  struct Snapshot {
    size_t params = 0;
    int64_t steps = 0;
    double lr = 0, weight_decay = 0, momentum = 0;
    std::vector<unsigned char> blob;
    bool operator==(const Snapshot& o) const {
      auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
      return params == o.params && steps == o.steps && same(lr, o.lr) &&
             same(weight_decay, o.weight_decay) && same(momentum, o.momentum) && blob == o.blob;
    }
  };

  Snapshot Observe() {
    Snapshot s;
    FUZZ_CHECK(Checked("muon_num_params", muon_num_params(opt_, &s.params)) == MUON_OK);
    FUZZ_CHECK(s.params == params_.size());
    FUZZ_CHECK(Checked("muon_step_count", muon_step_count(opt_, &s.steps)) == MUON_OK);
    FUZZ_CHECK(s.steps >= 0);
    muon_options_t o;
    Checked("muon_options_init", muon_options_init(&o, sizeof o));
    FUZZ_CHECK(Checked("muon_get_options", muon_get_options(opt_, &o)) == MUON_OK);
    s.lr = o.lr;
    s.weight_decay = o.weight_decay;
    s.momentum = o.momentum;
    size_t size = 0;
    FUZZ_CHECK(Checked("muon_save_state", muon_save_state(opt_, nullptr, 0, &size)) == MUON_OK);
    s.blob.resize(size);
    size_t written = 0;
    FUZZ_CHECK(Checked("muon_save_state", muon_save_state(opt_, s.blob.data(), size, &written)) ==
               MUON_OK);
    FUZZ_CHECK(written == size);
    return s;
  }

  // Runs a call that must change nothing when it fails.
  template <typename Fn>
  muon_status_t Atomic(const char* name, Fn fn) {
    const Snapshot before = Observe();
    const muon_status_t st = Checked(name, fn());
    if (st != MUON_OK) FUZZ_CHECK(Observe() == before);
    return st;
  }

  Storage* NewStorage(size_t bytes) {
    storage_.push_back(std::make_unique<Storage>());
    Storage* s = storage_.back().get();
    s->bytes.resize(bytes);
    for (size_t i = 0; i < bytes; ++i) s->bytes[i] = static_cast<unsigned char>(i * 37 + 11);
    return s;
  }

  // A tensor of `shape` and `dtype`, or (when `fuzz`) one with fuzzed flaws.
  Tensor MakeTensor(std::vector<int64_t> shape, DLDataType dtype, bool fuzz) {
    Tensor x;
    int device = kDLCPU, device_id = 0;
    int64_t byte_offset = 0;
    bool null_data = false, bad_strides = false, explicit_strides = false;
    if (fuzz && in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      switch (in_.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: device = kDLCUDAHost; break;
        case 1:
          device = kDLCUDA;
          device_id = in_.ConsumeIntegralInRange<int>(-1, 1);
          break;
        case 2: device = in_.ConsumeBool() ? 99 : -5; break;
        case 3: byte_offset = 4 * in_.ConsumeIntegralInRange<int64_t>(1, 3); break;
        case 4: null_data = true; break;
        case 5: bad_strides = true; break;
        case 6: explicit_strides = true; break;
        case 7: dtype = kDTypes[in_.ConsumeIntegralInRange<int>(0, 5)]; break;
        case 8:
          if (!shape.empty())
            shape[in_.ConsumeIntegralInRange<size_t>(0, shape.size() - 1)] =
                in_.ConsumeBool() ? SpecialInt(in_) : in_.ConsumeIntegralInRange<int64_t>(0, 4);
          break;
        default: shape.resize(in_.ConsumeIntegralInRange<size_t>(0, 5), 2); break;
      }
    }
    const int64_t width = std::max<int64_t>(1, dtype.bits / 8 * dtype.lanes);
    int64_t numel = 0;
    const int64_t bytes = CheckedBytes(shape, width, &numel);
    size_t alloc = 0;
    if (bytes < 0) {
      alloc = 16;  // refused before any access: a fake small buffer
    } else if (bytes > (int64_t{1} << 16)) {
      null_data = true;  // too big to back: NULL data is refused
    } else {
      alloc = static_cast<size_t>(bytes + byte_offset);
      x.owns_memory = !null_data || numel == 0;
      x.numel = numel;
    }
    Storage* s = NewStorage(alloc);
    s->shape = shape;
    if (explicit_strides || bad_strides) {
      s->strides.assign(shape.size(), 1);
      int64_t stride = 1;
      for (size_t i = shape.size(); i-- > 0;) {
        s->strides[i] = stride;
        stride *= std::max<int64_t>(1, std::min<int64_t>(shape[i], 1 << 16));
      }
      if (bad_strides && !shape.empty()) s->strides[0] += 1;
    }
    x.storage = s;
    x.t.data = null_data ? nullptr : s->bytes.data();
    if (null_data && in_.ConsumeBool()) byte_offset = 8;  // refused: NULL data with an offset
    x.t.byte_offset = static_cast<uint64_t>(byte_offset);
    x.t.device.device_type = static_cast<DLDeviceType>(device);
    x.t.device.device_id = device_id;
    x.t.ndim = static_cast<int32_t>(shape.size());
    x.t.dtype = dtype;
    x.t.shape = s->shape.data();
    x.t.strides = s->strides.empty() ? nullptr : s->strides.data();
    if (verbose) {
      std::string dims;
      for (int64_t d : shape) dims += std::to_string(d) + " ";
      std::fprintf(stderr,
                   "  tensor [%s] dtype %d/%d/%d device %d data %p offset %lld strides %d "
                   "owns %d\n",
                   dims.c_str(), dtype.code, dtype.bits, dtype.lanes, device, x.t.data,
                   static_cast<long long>(byte_offset), !s->strides.empty(), x.owns_memory);
    }
    return x;
  }

  std::vector<int64_t> FuzzShape() {
    std::vector<int64_t> shape(in_.ConsumeIntegralInRange<size_t>(2, 4));
    for (int64_t& d : shape) {
      const int64_t v = in_.ConsumeIntegralInRange<int64_t>(0, 8);
      d = v == 0 ? 0 : (v - 1) % 4 + 1;  // mostly not empty
    }
    return shape;
  }

  int64_t FuzzId() {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: return -1;
      case 1: return static_cast<int64_t>(params_.size());
      case 2: return std::numeric_limits<int64_t>::max();
      default:
        return params_.empty() ? 0
                               : in_.ConsumeIntegralInRange<int64_t>(
                                     0, static_cast<int64_t>(params_.size()) - 1);
    }
  }

  void Register() {
    const std::vector<int64_t> shape = FuzzShape();
    const DLDataType dtype = kDTypes[in_.ConsumeIntegralInRange<int>(0, 2)];
    Tensor value = MakeTensor(shape, dtype, true);
    Tensor grad = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 3) == 0);
    // Aliasing: grad over the param, or over another parameter's gradient.
    switch (in_.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:  // the same memory: refused unless empty
        if (value.t.data != nullptr && grad.t.data != nullptr &&
            value.t.byte_offset == grad.t.byte_offset &&
            value.storage->bytes.size() == grad.storage->bytes.size()) {
          grad.t.data = value.t.data;
          grad.owns_memory = grad.numel == 0 && grad.owns_memory;
        }
        break;
      case 1: {  // over another parameter's grad, both not empty: refused
        const size_t bytes = grad.storage->bytes.size() - grad.t.byte_offset;
        if (!params_.empty() && params_.back().grad_bytes >= bytes && grad.owns_memory &&
            grad.numel > 0) {
          grad.t.data = params_.back().grad_at;
          grad.t.byte_offset = 0;
          grad.owns_memory = false;
        }
        break;
      }
      default: break;
    }
    muon_param_options_t po;
    Checked("muon_param_options_init", muon_param_options_init(&po, sizeof po));
    const muon_param_options_t* options = &po;
    std::string name;
    std::vector<int64_t> global;
    std::vector<muon_placement_t> placements;
    static const int64_t kSizes[] = {0, 1, 2, 3, 4, 5, 6, 7};  // group sizes are 1 here
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: options = nullptr; break;
      case 1: name = ""; break;
      case 2: name = params_.empty() ? "w" : "p0"; break;  // maybe a duplicate
      default: name = "p" + std::to_string(params_.size()); break;
    }
    po.name = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? nullptr : name.c_str();
    po.matrix_view = in_.ConsumeIntegralInRange<int32_t>(0, 3) % 3;
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) po.matrix_view = in_.ConsumeBool() ? 3 : -1;
    if (in_.ConsumeIntegralInRange<int>(0, 31) == 0) po.reserved0 = 1;
    static const int64_t kSplits[] = {1, 2, 3, 0, -1, 4};  // split blocks, some invalid
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      po.split_dim = in_.ConsumeIntegralInRange<int32_t>(-1, 2);
      po.num_split_sizes = in_.ConsumeIntegralInRange<int32_t>(-1, 6);
      po.split_sizes = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? nullptr : kSplits;
    }
    const size_t po_size =
        in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? FuzzSize(kParamOptionsVersions) : sizeof po;
    if (has_world_ && in_.ConsumeBool()) {
      global = shape;
      if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
        for (int64_t& d : global) {
          d = in_.ConsumeBool() ? SpecialInt(in_) : in_.ConsumeIntegralInRange<int64_t>(0, 8);
        }
      }
      po.global_ndim = static_cast<int32_t>(global.size());
      if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) po.global_ndim = in_.ConsumeBool() ? 17 : -1;
      po.global_shape = in_.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : global.data();
      placements.resize(in_.ConsumeIntegralInRange<size_t>(0, 2));
      for (muon_placement_t& p : placements) {
        const bool wild = in_.ConsumeIntegralInRange<int>(0, 3) == 0;  // else plausible
        p.kind = wild ? in_.ConsumeIntegralInRange<int32_t>(-1, 3)
                      : in_.ConsumeIntegralInRange<int32_t>(0, 2);
        p.group = wild ? in_.ConsumeIntegralInRange<int32_t>(-1, num_groups_)
                       : in_.ConsumeIntegralInRange<int32_t>(0, std::max(0, num_groups_ - 1));
        p.dim =
            wild ? in_.ConsumeIntegralInRange<int32_t>(-1, 4)
                 : in_.ConsumeIntegralInRange<int32_t>(0, static_cast<int32_t>(global.size()) - 1);
        p.split = wild ? in_.ConsumeIntegralInRange<int32_t>(-1, 3)
                       : in_.ConsumeIntegralInRange<int32_t>(0, 2);
        p.sizes = in_.ConsumeIntegralInRange<int>(0, 7) == 0
                      ? nullptr
                      : kSizes + in_.ConsumeIntegralInRange<int>(0, 4);  // >= 4 entries readable
        // Mostly the whole tensor (what a world of one rank tiles), else anything.
        int64_t whole = 1;
        for (int64_t d : global) whole = d >= 0 && d <= 64 ? whole * d : -1;
        const bool tile = in_.ConsumeBool();
        p.start = tile                ? 0
                  : in_.ConsumeBool() ? SpecialInt(in_)
                                      : in_.ConsumeIntegralInRange<int64_t>(0, 8);
        p.length = tile                ? whole
                   : in_.ConsumeBool() ? SpecialInt(in_)
                                       : in_.ConsumeIntegralInRange<int64_t>(0, 64);
      }
      po.num_placements = static_cast<int32_t>(placements.size());
      if (in_.ConsumeIntegralInRange<int>(0, 15) == 0)
        po.num_placements = in_.ConsumeBool() ? 65 : -1;
      po.placements = placements.empty() || in_.ConsumeIntegralInRange<int>(0, 15) == 0
                          ? nullptr
                          : placements.data();
      if (po.num_placements > static_cast<int32_t>(placements.size())) po.placements = nullptr;
      po.replicated_mode = in_.ConsumeIntegralInRange<int32_t>(0, 7) == 0
                               ? in_.ConsumeIntegralInRange<int32_t>(-1, 2)
                               : in_.ConsumeIntegralInRange<int32_t>(0, 1);
    }
    if (verbose) {
      std::fprintf(stderr, "  options %s name '%s' view %d global_ndim %d placements %d mode %d\n",
                   options ? "set" : "NULL", po.name ? po.name : "(null)", po.matrix_view,
                   po.global_ndim, po.num_placements, po.replicated_mode);
      for (int64_t d : global)
        std::fprintf(stderr, "    global dim %lld\n", static_cast<long long>(d));
      for (const muon_placement_t& p : placements) {
        std::fprintf(stderr,
                     "    placement kind %d group %d dim %d split %d sizes %s start %lld "
                     "length %lld\n",
                     p.kind, p.group, p.dim, p.split, p.sizes ? "set" : "NULL",
                     static_cast<long long>(p.start), static_cast<long long>(p.length));
      }
    }
    int64_t id = -7;
    Sized<muon_param_options_t> caller(po, po_size);
    const bool refused_size = options != nullptr && !kParamOptionsVersions.Accepts(po_size);
    const muon_status_t st = Atomic("muon_register_param", [&] {
      const muon_status_t r =
          muon_register_param(opt_, &value.t, &grad.t, options ? caller.get() : nullptr, &id);
      if (refused_size) FUZZ_CHECK(r != MUON_OK);
      return r;
    });
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      CheckInit("muon_param_options_init", &muon_param_options_init, kParamOptionsVersions);
    }
    if (st != MUON_OK) {
      FUZZ_CHECK(id == -7);  // out-parameters untouched on error
      return;
    }
    FUZZ_CHECK(id == static_cast<int64_t>(params_.size()));
    FUZZ_CHECK(value.owns_memory && grad.owns_memory);
    params_.push_back({value.storage->shape, value.t.dtype, grad.storage,  // as fuzzed
                       grad.storage->bytes.data() + grad.t.byte_offset,
                       grad.storage->bytes.size() - grad.t.byte_offset});
  }

  void Rebind() {
    const int64_t id = FuzzId();
    std::vector<int64_t> shape = FuzzShape();
    DLDataType dtype = kDTypes[0];
    if (id >= 0 && id < static_cast<int64_t>(params_.size()) &&
        in_.ConsumeIntegralInRange<int>(0, 3) != 0) {
      shape = params_[id].shape;
      dtype = params_[id].dtype;
    }
    Tensor value = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 3) == 0);
    Tensor grad = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 3) == 0);
    const bool null_grad = in_.ConsumeIntegralInRange<int>(0, 3) == 0;
    const muon_status_t st = Atomic("muon_rebind_param", [&] {
      return muon_rebind_param(opt_, id, &value.t, null_grad ? nullptr : &grad.t);
    });
    if (st == MUON_OK) {
      FUZZ_CHECK(value.owns_memory && (null_grad || grad.owns_memory));
      params_[id].grad = null_grad ? nullptr : grad.storage;
      params_[id].grad_at = null_grad ? nullptr : grad.storage->bytes.data() + grad.t.byte_offset;
      params_[id].grad_bytes = null_grad ? 0 : grad.storage->bytes.size() - grad.t.byte_offset;
    }
  }

  void SetHyper() {
    const double v = FuzzDouble(in_);
    const int which = in_.ConsumeIntegralInRange<int>(0, 2);
    const muon_status_t st = Atomic("muon_set_*", [&] {
      return which == 0   ? muon_set_lr(opt_, v)
             : which == 1 ? muon_set_weight_decay(opt_, v)
                          : muon_set_momentum(opt_, v);
    });
    if (st != MUON_OK) return;
    muon_options_t o;
    Checked("muon_options_init", muon_options_init(&o, sizeof o));
    FUZZ_CHECK(Checked("muon_get_options", muon_get_options(opt_, &o)) == MUON_OK);
    FUZZ_CHECK((which == 0 ? o.lr : which == 1 ? o.weight_decay : o.momentum) == v);
  }

  void Step() {
    // The host writes its gradients (any bits: NaN and infinities included).
    const uint8_t salt = in_.ConsumeIntegral<uint8_t>();
    const bool wild = in_.ConsumeIntegralInRange<int>(0, 7) == 0;
    for (const Registered& p : params_) {
      if (p.grad == nullptr) continue;
      for (size_t i = 0; i < p.grad->bytes.size(); ++i) {
        p.grad->bytes[i] = static_cast<unsigned char>(
            wild ? (i * 131 + salt) : (i % 2 == 1 ? 0x3c + (salt & 1) : (i * 7 + salt)));
      }
    }
    const Snapshot before = Observe();
    const int64_t skipped = Skipped();
    const muon_status_t st = Checked("muon_step", muon_step(opt_, nullptr));
    if (st != MUON_OK) {
      const Snapshot now = Observe();
      if (!(now == before)) {
        // A failure once momentum updates began (a host callback failing
        // mid-step) poisons, as muon.h says: the step is not counted, the
        // next one is refused, and loading a whole blob lifts it.
        FUZZ_CHECK(now.steps == before.steps && now.params == before.params);
        FUZZ_CHECK(Checked("muon_step", muon_step(opt_, nullptr)) == MUON_FAILED_PRECONDITION);
        FUZZ_CHECK(std::string(muon_last_error_message()).find("failed mid-way") !=
                   std::string::npos);
        FUZZ_CHECK(Checked("muon_load_state", muon_load_state(opt_, before.blob.data(),
                                                              before.blob.size())) == MUON_OK);
        FUZZ_CHECK(Observe() == before);
      }
    }
    int64_t after = -1;
    FUZZ_CHECK(Checked("muon_step_count", muon_step_count(opt_, &after)) == MUON_OK);
    if (st == MUON_OK && after == before.steps) {
      // Only skip_nonfinite skips a step, counting it, with nothing changed.
      FUZZ_CHECK(Skipped() == skipped + 1);
      FUZZ_CHECK(Observe() == before);
    } else {
      FUZZ_CHECK(after == before.steps + (st == MUON_OK ? 1 : 0));
      FUZZ_CHECK(Skipped() == skipped);
    }
  }

  int64_t Skipped() {
    muon_stats_t s;
    FUZZ_CHECK(Checked("muon_stats_init", muon_stats_init(&s, sizeof s)) == MUON_OK);
    FUZZ_CHECK(Checked("muon_get_stats", muon_get_stats(opt_, &s)) == MUON_OK);
    FUZZ_CHECK(s.steps_skipped >= 0);
    return s.steps_skipped;
  }

  void GetState() {
    const int64_t id = FuzzId();
    DLDataType dtype = kDTypes[0];
    std::vector<int64_t> shape = FuzzShape();
    if (id >= 0 && id < static_cast<int64_t>(params_.size())) {
      if (Checked("muon_get_state_dtype", muon_get_state_dtype(opt_, id, &dtype)) != MUON_OK)
        return;
      if (in_.ConsumeIntegralInRange<int>(0, 3) != 0) shape = params_[id].shape;
    }
    Tensor dst = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 3) == 0);
    const muon_status_t st =
        Atomic("muon_get_state", [&] { return muon_get_state(opt_, id, &dst.t); });
    if (st == MUON_OK) FUZZ_CHECK(dst.owns_memory);
  }

  void SetState() {
    const int64_t id = FuzzId();
    DLDataType dtype = kDTypes[0];
    std::vector<int64_t> shape = FuzzShape();
    if (id >= 0 && id < static_cast<int64_t>(params_.size())) {
      if (Checked("muon_get_state_dtype", muon_get_state_dtype(opt_, id, &dtype)) != MUON_OK)
        return;
      if (in_.ConsumeIntegralInRange<int>(0, 3) != 0) shape = params_[id].shape;
    }
    Tensor src = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 3) == 0);
    const muon_status_t st =
        Atomic("muon_set_state", [&] { return muon_set_state(opt_, id, &src.t); });
    if (st != MUON_OK) return;
    FUZZ_CHECK(src.owns_memory);
    // What was set is what is read back.
    Tensor back = MakeTensor(src.storage->shape, src.t.dtype, false);
    FUZZ_CHECK(Checked("muon_get_state", muon_get_state(opt_, id, &back.t)) == MUON_OK);
    const std::vector<unsigned char>& got = back.storage->bytes;
    FUZZ_CHECK(got.empty() || std::memcmp(got.data(), src.storage->bytes.data() + src.t.byte_offset,
                                          got.size()) == 0);
  }

  void SaveState() {
    size_t needed = 0;
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) {
      Atomic("muon_save_state", [&] { return muon_save_state(opt_, nullptr, 0, nullptr); });
      return;
    }
    FUZZ_CHECK(Checked("muon_save_state", muon_save_state(opt_, nullptr, 0, &needed)) == MUON_OK);
    const size_t capacity = needed + in_.ConsumeIntegralInRange<size_t>(0, 2) -
                            (needed > 0 && in_.ConsumeIntegralInRange<int>(0, 3) == 0 ? 1 : 0);
    std::vector<unsigned char> buffer(capacity + 1);
    size_t size = 12345;
    const muon_status_t st = Atomic(
        "muon_save_state", [&] { return muon_save_state(opt_, buffer.data(), capacity, &size); });
    if (st != MUON_OK) {
      FUZZ_CHECK(capacity < needed);
      FUZZ_CHECK(size == 12345);
      return;
    }
    FUZZ_CHECK(size == needed);
    blob_.assign(buffer.begin(), buffer.begin() + size);
  }

  void LoadState() {
    std::vector<unsigned char> data;
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        data = in_.ConsumeBytes<unsigned char>(in_.ConsumeIntegralInRange<size_t>(0, 300));
        break;
      case 1:
        data = blob_;
        if (!data.empty()) {
          data[in_.ConsumeIntegralInRange<size_t>(0, data.size() - 1)] ^=
              static_cast<unsigned char>(1u << in_.ConsumeIntegralInRange<int>(0, 7));
        }
        break;
      default: data = blob_; break;
    }
    const bool null_buffer = in_.ConsumeIntegralInRange<int>(0, 15) == 0;
    if (in_.ConsumeBool()) {
      // Resume anywhere: the data alone, or with the last saved blob as another rank's.
      const void* buffers[2] = {null_buffer ? nullptr : data.data(), blob_.data()};
      size_t sizes[2] = {data.size(), blob_.size()};
      const size_t count = in_.ConsumeIntegralInRange<size_t>(0, 2);
      const muon_status_t st = Atomic("muon_load_states", [&] {
        return muon_load_states(opt_, in_.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr
                                                                                  : buffers,
                                sizes, count);
      });
      if (st == MUON_OK) {
        FUZZ_CHECK(count >= 1 && data.size() >= 24);
        int64_t steps = -1;
        std::memcpy(&steps, data.data() + 16, sizeof steps);
        FUZZ_CHECK(Observe().steps == steps);  // the blobs' step count
      }
      return;
    }
    const muon_status_t st = Atomic("muon_load_state", [&] {
      return muon_load_state(opt_, null_buffer ? nullptr : data.data(), data.size());
    });
    if (st == MUON_OK) {
      FUZZ_CHECK(Observe().blob == data);  // the state is the blob
    }
  }

  void Stats() {
    muon_stats_t full;
    FUZZ_CHECK(Checked("muon_stats_init", muon_stats_init(&full, sizeof full)) == MUON_OK);
    const size_t size = FuzzSize(kStatsVersions);
    Sized<muon_stats_t> s(full, size);
    const bool accepted = kStatsVersions.Accepts(size);
    const muon_status_t st = Atomic("muon_get_stats", [&] {
      const muon_status_t r = muon_get_stats(opt_, s.get());
      if (!accepted) CheckSizeRefusal(r, size);
      return r;
    });
    FUZZ_CHECK((st == MUON_OK) == accepted);
    if (st == MUON_OK) {
      int64_t steps = 0;
      FUZZ_CHECK(Checked("muon_step_count", muon_step_count(opt_, &steps)) == MUON_OK);
      const int64_t got = s.Int64At(offsetof(muon_stats_t, steps), 0);
      FUZZ_CHECK(got <= steps && got >= 0);
      FUZZ_CHECK(s.Int64At(offsetof(muon_stats_t, matrices_owned), 0) <=
                 s.Int64At(offsetof(muon_stats_t, matrices_total), 0));
    }
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      CheckInit("muon_stats_init", &muon_stats_init, kStatsVersions);
    }
  }

  void Orthogonalize() {
    const std::vector<int64_t> shape = FuzzShape();
    Tensor in = MakeTensor(shape, kDTypes[in_.ConsumeIntegralInRange<int>(0, 2)], true);
    Tensor out = MakeTensor(shape, kDTypes[in_.ConsumeIntegralInRange<int>(0, 2)], true);
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: out = in; break;  // in place
      case 1:                   // overlapping, not the same: refused
        if (in.t.data != nullptr && in.storage->bytes.size() > in.t.byte_offset + 2) {
          out.t.data = in.t.data;
          out.t.byte_offset = in.t.byte_offset + 2;
          out.owns_memory = false;
        }
        break;
      default: break;
    }
    const int32_t view = in_.ConsumeIntegralInRange<int32_t>(-1, 3);
    const muon_status_t st = Atomic("muon_orthogonalize", [&] {
      return muon_orthogonalize(opt_, &in.t, &out.t, view, nullptr);
    });
    if (st == MUON_OK) FUZZ_CHECK((in.owns_memory && out.owns_memory) || in.numel == 0);
  }

  void Queries() {
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: {
        muon_options_t full;
        Checked("muon_options_init", muon_options_init(&full, sizeof full));
        const size_t size = FuzzSize(kOptionsVersions);
        Sized<muon_options_t> o(full, size);
        const bool accepted = kOptionsVersions.Accepts(size);
        const muon_status_t st = Atomic("muon_get_options", [&] {
          const muon_status_t r = muon_get_options(opt_, o.get());
          if (!accepted) CheckSizeRefusal(r, size);
          return r;
        });
        FUZZ_CHECK((st == MUON_OK) == accepted);
        if (st == MUON_OK) {  // the struct_size the caller gave stays
          FUZZ_CHECK(static_cast<size_t>(o.Int64At(0, -1)) == size);
        }
        break;
      }
      case 1: {
        DLDataType dtype;
        const int64_t id = FuzzId();
        Atomic("muon_get_state_dtype", [&] { return muon_get_state_dtype(opt_, id, &dtype); });
        break;
      }
      case 2: Atomic("muon_num_params", [&] { return muon_num_params(opt_, nullptr); }); break;
      default: Observe(); break;
    }
  }

  // A custom-path parameter (with a world): the host's callbacks over a
  // declared rows x cols matrix, small, or (with the fuzzer's allocator, which
  // refuses blocks over 1 MiB) of any size; versioned structs of any size.
  void Custom() {
    const std::vector<int64_t> shape = FuzzShape();
    const DLDataType dtype = kDTypes[in_.ConsumeIntegralInRange<int>(0, 2)];
    Tensor value = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 7) == 0);
    Tensor grad = MakeTensor(shape, dtype, in_.ConsumeIntegralInRange<int>(0, 7) == 0);
    custom_.emplace_back();
    CustomState& c = custom_.back();
    auto extent = [&] {
      if (hooked_ && in_.ConsumeBool()) {
        return in_.ConsumeBool() ? SpecialInt(in_) : int64_t{1} << in_.ConsumeIntegralInRange(8, 40);
      }
      return in_.ConsumeIntegralInRange<int64_t>(-1, 8);
    };
    c.rows = extent();
    c.cols = extent();
    muon_param_options_t po;
    Checked("muon_param_options_init", muon_param_options_init(&po, sizeof po));
    const std::string name = in_.ConsumeIntegralInRange<int>(0, 7) == 0
                                 ? "p0"  // maybe a duplicate
                                 : "c" + std::to_string(params_.size());
    po.name = in_.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : name.c_str();
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) po.global_ndim = 2;  // refused: a layout
    const size_t po_size =
        in_.ConsumeIntegralInRange<int>(0, 3) == 0 ? FuzzSize(kParamOptionsVersions) : sizeof po;
    muon_custom_layout_t layout{sizeof layout, &c,           c.rows,           c.cols,
                                &CustomAssign, &CustomGather, &CustomRedistribute};
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) layout.gather_fn = nullptr;
    const size_t layout_size =
        in_.ConsumeIntegralInRange<int>(0, 3) == 0 ? FuzzSize(kCustomLayoutVersions) : sizeof layout;
    Sized<muon_param_options_t> caller_po(po, po_size);
    Sized<muon_custom_layout_t> caller_layout(layout, layout_size);
    const bool refused_size =
        !kParamOptionsVersions.Accepts(po_size) || !kCustomLayoutVersions.Accepts(layout_size);
    if (verbose) {
      std::fprintf(stderr, "  custom %lld x %lld, struct sizes %zu and %zu%s\n",
                   static_cast<long long>(c.rows), static_cast<long long>(c.cols), po_size,
                   layout_size, hooked_ ? ", the fuzzer's allocator" : "");
    }
    int64_t id = -7;
    const muon_status_t st = Atomic("muon_register_param_custom", [&] {
      const muon_status_t r = muon_register_param_custom(opt_, &value.t, &grad.t, caller_po.get(),
                                                         caller_layout.get(), &id);
      if (refused_size) FUZZ_CHECK(r == MUON_INVALID_ARGUMENT);
      return r;
    });
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      CheckInit("muon_param_options_init", &muon_param_options_init, kParamOptionsVersions);
    }
    if (st != MUON_OK) {
      FUZZ_CHECK(id == -7);
      return;
    }
    FUZZ_CHECK(has_world_);
    FUZZ_CHECK(id == static_cast<int64_t>(params_.size()));
    FUZZ_CHECK(value.owns_memory && grad.owns_memory);
    // What the header promises of the declaration.
    FUZZ_CHECK(c.rows >= 1 && c.cols >= 1);
    const int64_t elements = Elements(c);
    FUZZ_CHECK(elements >= value.numel && elements <= std::numeric_limits<int64_t>::max() / 16);
    params_.push_back({value.storage->shape, value.t.dtype, grad.storage,
                       grad.storage->bytes.data() + grad.t.byte_offset,
                       grad.storage->bytes.size() - grad.t.byte_offset});
  }

  // A world of one in-process rank (placements become possible), or a group.
  void World() {
    if (world_ == nullptr) {
      FUZZ_CHECK(Checked("muon_inprocess_world_create", muon_inprocess_world_create(1, &world_)) ==
                 MUON_OK);
    }
    muon_comm_t comm;
    FUZZ_CHECK(Checked("muon_inprocess_comm", muon_inprocess_comm(world_, nullptr, 0, 0, &comm)) ==
               MUON_OK);
    int32_t group = -7;
    const bool as_world = !has_world_ || in_.ConsumeIntegralInRange<int>(0, 3) == 0;
    const size_t size =
        in_.ConsumeIntegralInRange<int>(0, 3) == 0 ? FuzzSize(kCommVersions) : sizeof comm;
    const bool accepted = kCommVersions.Accepts(size);
    Sized<muon_comm_t> table(comm, size);
    const muon_status_t st = Atomic("muon_set_world/add_group", [&] {
      const muon_status_t r = as_world ? muon_set_world(opt_, table.get(), &group)
                                       : muon_add_group(opt_, table.get(), &group);
      if (!accepted) CheckSizeRefusal(r, size);
      return r;
    });
    // A table of a refused size is not read, its release included: the host
    // releases it (else the library did, or will at muon_destroy).
    if (!accepted) comm.release(comm.ctx);
    if (st != MUON_OK) {
      FUZZ_CHECK(group == -7);
      return;
    }
    FUZZ_CHECK(group == num_groups_ || (as_world && group == 0));
    if (as_world) has_world_ = true;
    num_groups_ = group + 1;
  }

  FuzzedDataProvider& in_;
  muon_optimizer_t* opt_ = nullptr;
  bool hooked_ = false;  // its memory comes from Session::Allocate
  std::deque<CustomState> custom_;  // stable addresses: the callbacks' state
  muon_inprocess_world_t* world_ = nullptr;
  bool has_world_ = false;
  int32_t num_groups_ = 0;
  std::vector<Registered> params_;
  std::vector<unsigned char> blob_;
  std::vector<std::unique_ptr<Storage>> storage_;
  double table_[12] = {};
  int32_t assign_answer_ = 0;
  muon_status_t assign_status_ = MUON_OK;
};

// A few sequences: the bytes that make the calls, read by FuzzedDataProvider
// (integers from the end of the input, so the seeds are written backwards).
void WriteSeeds(const char* dir) {
  // Any bytes make a sequence; these are varied lengths of a simple pattern,
  // which libFuzzer then mutates. They mostly register and step.
  for (int n : {16, 64, 256, 1024}) {
    std::vector<unsigned char> seed(n);
    for (int i = 0; i < n; ++i) seed[i] = static_cast<unsigned char>((i * 29 + n) % 251);
    const std::string path = std::string(dir) + "/sequence_" + std::to_string(n);
    FILE* out = std::fopen(path.c_str(), "wb");
    FUZZ_CHECK(out != nullptr);
    FUZZ_CHECK(std::fwrite(seed.data(), 1, seed.size(), out) == seed.size());
    std::fclose(out);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  verbose = std::getenv("MUON_FUZZ_VERBOSE") != nullptr;
  if (const char* dir = std::getenv("MUON_FUZZ_WRITE_SEEDS")) WriteSeeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Session s(in);
  s.Create();
  for (int calls = 0; calls < 64 && in.remaining_bytes() > 0; ++calls) s.Call();
  return 0;
}
