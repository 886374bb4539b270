// The optimizer's memory through the C API: every buffer it allocates comes
// from the host's allocator when one is set (muon_options_t.allocate), goes
// back to it by muon_destroy, and muon_get_stats reports what it holds; the
// custom path's working copy too, whatever size its declaration asks for.
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "tests/c_api/host_matrix.h"

namespace {

constexpr DLDataType kF32{kDLFloat, 32, 1};

// A counting allocator handing out 64-byte aligned blocks (what the header
// asks of a host allocator), with a switch that makes it refuse and one that
// makes its blocks from the `misaligned_from`-th on start `offset` bytes past
// a 64-byte boundary.
struct Pool {
  std::map<void*, size_t> live;
  std::map<void*, void*> base;  // block handed out -> the aligned_alloc block
  int64_t allocations = 0, releases = 0;
  size_t bytes_released = 0;
  bool refuse = false;
  int64_t misaligned_from = -1;
  size_t offset = 0;
  size_t largest = SIZE_MAX;   // blocks larger than this are refused
  std::vector<size_t> asked;  // every request, in order
  std::string bad;  // a contract violation seen, if any

  int64_t live_bytes() const {
    int64_t n = 0;
    for (const auto& [p, b] : live) n += static_cast<int64_t>(b);
    return n;
  }
  static void* Allocate(void* ctx, size_t bytes, int32_t type, int32_t id, void* stream) {
    auto* pool = static_cast<Pool*>(ctx);
    if (type != kDLCPU || id != 0 || stream != nullptr) pool->bad = "unexpected device or stream";
    pool->asked.push_back(bytes);
    if (pool->refuse || bytes > pool->largest) return nullptr;
    const bool misaligned =
        pool->misaligned_from >= 0 && pool->allocations >= pool->misaligned_from;
    const size_t shift = misaligned ? pool->offset : 0;
    void* block = std::aligned_alloc(64, (bytes + shift + 63) / 64 * 64);
    if (block == nullptr) return nullptr;
    void* p = static_cast<unsigned char*>(block) + shift;
    std::memset(p, 0x5a, bytes);  // not zero: the library must zero what it needs
    pool->live[p] = bytes;
    pool->base[p] = block;
    ++pool->allocations;
    return p;
  }
  static void Release(void* ctx, void* ptr, size_t bytes, int32_t, int32_t, void*) {
    auto* pool = static_cast<Pool*>(ctx);
    auto it = pool->live.find(ptr);
    if (it == pool->live.end()) {
      pool->bad = "release of memory the pool did not hand out";
      return;
    }
    if (it->second != bytes) pool->bad = "release with another size";
    pool->bytes_released += bytes;
    pool->live.erase(it);
    ++pool->releases;
    std::free(pool->base[ptr]);
    pool->base.erase(ptr);
  }
};

using Matrix = muon_test::HostMatrix;

muon_optimizer_t* Create(Pool* pool, int update_in_grad = 0, int momentum_fp32 = 0,
                         int ns_dtype = MUON_NS_DTYPE_BF16) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.update_in_grad = update_in_grad;
  o.momentum_fp32 = momentum_fp32;
  o.ns_dtype = ns_dtype;
  if (pool != nullptr) {
    o.allocate = &Pool::Allocate;
    o.release = &Pool::Release;
    o.allocator_ctx = pool;
  }
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_OK) << muon_last_error_message();
  return opt;
}

void Register(muon_optimizer_t* opt, Matrix& m, const char* name) {
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = name;
  int64_t id = -1;
  ASSERT_EQ(muon_register_param(opt, &m.v, &m.g, &po, &id), MUON_OK) << muon_last_error_message();
}

muon_stats_t Stats(const muon_optimizer_t* opt) {
  muon_stats_t s;
  muon_stats_init(&s, sizeof s);
  EXPECT_EQ(muon_get_stats(opt, &s), MUON_OK);
  return s;
}

// An update buffer has the Newton-Schulz dtype: 2 bytes per parameter
// element in bf16 (the default), 4 in fp32, against the same optimizer with
// its updates in the gradients (everything else equal).
TEST(Memory, UpdateBuffersHaveTheNewtonSchulzDtype) {
  for (const auto& [ns_dtype, bytes] : {std::pair<int, int64_t>{MUON_NS_DTYPE_BF16, 2},
                                        std::pair<int, int64_t>{MUON_NS_DTYPE_FP32, 4}}) {
    Matrix a(24, 40), b(64, 16), a2(24, 40), b2(64, 16);
    muon_optimizer_t* buffered = Create(nullptr, 0, 0, ns_dtype);
    muon_optimizer_t* in_grad = Create(nullptr, 1, 0, ns_dtype);
    Register(buffered, a, "a");
    Register(buffered, b, "b");
    Register(in_grad, a2, "a");
    Register(in_grad, b2, "b");
    ASSERT_EQ(muon_step(buffered, nullptr), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_step(in_grad, nullptr), MUON_OK) << muon_last_error_message();
    EXPECT_EQ(a.value, a2.value);
    const muon_stats_t with = Stats(buffered), without = Stats(in_grad);
    EXPECT_EQ(with.param_elements, 24 * 40 + 64 * 16);
    EXPECT_EQ(with.memory_bytes - without.memory_bytes, bytes * with.param_elements)
        << "ns_dtype " << ns_dtype;
    muon_destroy(buffered);
    muon_destroy(in_grad);
  }
}

TEST(Memory, EveryBufferComesFromTheHostsAllocatorAndGoesBack) {
  Pool pool;
  Matrix a(24, 40), b(64, 16), a2(24, 40), b2(64, 16);
  muon_optimizer_t* mine = Create(&pool);
  muon_optimizer_t* own = Create(nullptr);
  Register(mine, a, "a");
  Register(mine, b, "b");
  Register(own, a2, "a");
  Register(own, b2, "b");
  const int64_t after_registration = pool.allocations;
  EXPECT_GE(after_registration, 2);  // the two momentum buffers
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(muon_step(mine, nullptr), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_step(own, nullptr), MUON_OK) << muon_last_error_message();
  }
  // The same numbers (the pool's memory was not zero: the library zeroed it).
  EXPECT_EQ(a.value, a2.value);
  EXPECT_EQ(b.value, b2.value);
  const int64_t after_steps = pool.allocations;
  EXPECT_GT(after_steps, after_registration);  // the first step's buffers
  ASSERT_EQ(muon_step(mine, nullptr), MUON_OK);
  EXPECT_EQ(pool.allocations, after_steps);  // later steps allocate nothing

  // What the stats report is what the pool holds, with the library's own
  // allocation the same amount.
  const muon_stats_t st = Stats(mine);
  EXPECT_EQ(st.memory_bytes, pool.live_bytes());
  EXPECT_EQ(Stats(own).memory_bytes, st.memory_bytes);
  EXPECT_EQ(st.param_elements, 24 * 40 + 64 * 16);
  EXPECT_EQ(st.momentum_bytes, st.param_elements * 4);  // fp32 parameters: fp32 momentum
  EXPECT_DOUBLE_EQ(st.bytes_per_param,
                   static_cast<double>(st.memory_bytes) / static_cast<double>(st.param_elements));
  // momentum (4) + the update buffer (4) + the Newton-Schulz workspace
  EXPECT_GE(st.bytes_per_param, 8.0);

  muon_destroy(mine);
  muon_destroy(own);
  EXPECT_TRUE(pool.live.empty()) << pool.live.size() << " buffers never released";
  EXPECT_EQ(pool.releases, pool.allocations);
  EXPECT_EQ(pool.bad, "");
}

TEST(Memory, AnAllocatorThatRefusesFailsTheCallNamingTheBuffer) {
  Pool pool;
  pool.refuse = true;
  Matrix a(8, 8);
  muon_optimizer_t* opt = Create(&pool);
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = "a";
  int64_t id = -1;
  EXPECT_EQ(muon_register_param(opt, &a.v, &a.g, &po, &id), MUON_RESOURCE_EXHAUSTED);
  const std::string why = muon_last_error_message();
  EXPECT_NE(why.find("momentum buffer of param 'a'"), std::string::npos) << why;
  EXPECT_NE(why.find("muon_options_t.allocate"), std::string::npos) << why;
  size_t n = 99;
  ASSERT_EQ(muon_num_params(opt, &n), MUON_OK);
  EXPECT_EQ(n, 0u);  // nothing half-registered
  pool.refuse = false;
  Register(opt, a, "a");
  EXPECT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
  muon_destroy(opt);
  EXPECT_TRUE(pool.live.empty());
  EXPECT_EQ(pool.bad, "");
}

// A block from the host's allocator that is not 64-byte aligned (the header's
// rule) is handed back at once and refused, naming the hook, the buffer and
// the block's alignment: at registration (the momentum buffer) and at the
// first step (its buffers and the Newton-Schulz workspace), changing nothing.
TEST(Memory, AMisalignedBlockFromTheAllocatorIsRefusedNamingTheHook) {
  for (size_t offset : {size_t{4}, size_t{8}, size_t{16}, size_t{32}}) {
    Pool pool;
    pool.misaligned_from = 0;
    pool.offset = offset;
    Matrix a(24, 40), b(16, 16);
    muon_optimizer_t* opt = Create(&pool);
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = "a";
    int64_t id = -1;
    EXPECT_EQ(muon_register_param(opt, &a.v, &a.g, &po, &id), MUON_INVALID_ARGUMENT) << offset;
    std::string why = muon_last_error_message();
    EXPECT_NE(why.find("muon_options_t.allocate"), std::string::npos) << why;
    EXPECT_NE(why.find("momentum buffer of param 'a'"), std::string::npos) << why;
    EXPECT_NE(why.find("aligned to " + std::to_string(offset) + " bytes"), std::string::npos)
        << why;
    EXPECT_NE(why.find("64"), std::string::npos) << why;
    EXPECT_EQ(id, -1);
    size_t n = 99;
    ASSERT_EQ(muon_num_params(opt, &n), MUON_OK);
    EXPECT_EQ(n, 0u);
    EXPECT_TRUE(pool.live.empty()) << "the refused block was not handed back";
    EXPECT_EQ(pool.releases, pool.allocations);

    // Aligned blocks for the momentum buffers, then misaligned ones for the
    // first step's buffers.
    pool.misaligned_from = pool.allocations + 2;
    Register(opt, a, "a");
    Register(opt, b, "b");
    const std::vector<float> a_before = a.value, b_before = b.value;
    EXPECT_EQ(muon_step(opt, nullptr), MUON_INVALID_ARGUMENT) << offset;
    why = muon_last_error_message();
    EXPECT_NE(why.find("muon_options_t.allocate"), std::string::npos) << why;
    EXPECT_NE(why.find("aligned to " + std::to_string(offset) + " bytes"), std::string::npos)
        << why;
    EXPECT_EQ(a.value, a_before);
    EXPECT_EQ(b.value, b_before);
    int64_t steps = -1;
    ASSERT_EQ(muon_step_count(opt, &steps), MUON_OK);
    EXPECT_EQ(steps, 0);
    // Aligned again: the step goes.
    pool.misaligned_from = -1;
    ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
    muon_destroy(opt);
    EXPECT_TRUE(pool.live.empty()) << pool.live.size() << " buffers never released";
    EXPECT_EQ(pool.releases, pool.allocations);
    EXPECT_EQ(pool.bad, "");
  }
}

TEST(Memory, AllocateAndReleaseComeTogether) {
  Pool pool;
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.allocate = &Pool::Allocate;
  o.allocator_ctx = &pool;
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_INVALID_ARGUMENT);
  const std::string why = muon_last_error_message();
  EXPECT_NE(why.find("options->release is NULL"), std::string::npos) << why;
  EXPECT_EQ(opt, nullptr);
}

// The options handed out carry the allocator back.
TEST(Memory, GetOptionsReturnsTheAllocator) {
  Pool pool;
  muon_optimizer_t* opt = Create(&pool);
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  ASSERT_EQ(muon_get_options(opt, &o), MUON_OK);
  EXPECT_EQ(o.allocate, &Pool::Allocate);
  EXPECT_EQ(o.release, &Pool::Release);
  EXPECT_EQ(o.allocator_ctx, &pool);
  muon_destroy(opt);
}

// bf16 storage of a float tensor's values (round to nearest even).
uint16_t Bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// A matrix whose tensors are bf16 (or both `type`).
struct Bf16Matrix {
  std::vector<int64_t> shape;
  std::vector<uint16_t> value, grad;
  DLTensor v{}, g{};
  Bf16Matrix(int64_t rows, int64_t cols, DLDataType type = {kDLBfloat, 16, 1})
      : shape{rows, cols} {
    const size_t n = static_cast<size_t>(rows * cols);
    for (size_t i = 0; i < n; ++i) {
      value.push_back(Bf16(std::sin(0.1f * static_cast<float>(i))));
      grad.push_back(Bf16(std::cos(0.37f * static_cast<float>(i))));
    }
    for (DLTensor* t : {&v, &g}) {
      t->device = {kDLCPU, 0};
      t->ndim = 2;
      t->shape = shape.data();
    }
    v.dtype = type;
    g.dtype = type;
    v.data = value.data();
    g.data = grad.data();
  }
};

// update_in_grad: the same steps bit for bit, in fp32 and in bf16, with 4
// bytes per parameter element less, and each gradient holding its step's
// orthogonalized update afterwards.
TEST(UpdateInGrad, StepsAsWithUpdateBuffersInLessMemory) {
  Matrix a(24, 40), b(64, 16), a2(24, 40), b2(64, 16);
  Bf16Matrix c(16, 48), c2(16, 48);
  muon_optimizer_t* in_grad = Create(nullptr, /*update_in_grad=*/1);
  muon_optimizer_t* buffered = Create(nullptr);
  Register(in_grad, a, "a");
  Register(in_grad, b, "b");
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = "c";
  int64_t id = -1;
  ASSERT_EQ(muon_register_param(in_grad, &c.v, &c.g, &po, &id), MUON_OK) << muon_last_error_message();
  Register(buffered, a2, "a");
  Register(buffered, b2, "b");
  ASSERT_EQ(muon_register_param(buffered, &c2.v, &c2.g, &po, &id), MUON_OK);
  for (int s = 0; s < 3; ++s) {
    // Fresh gradients each step (the in-grad optimizer overwrote its own).
    for (Matrix* m : {&a, &b, &a2, &b2}) {
      for (size_t i = 0; i < m->grad.size(); ++i) {
        m->grad[i] = std::cos(0.37f * static_cast<float>(i) + 0.5f * static_cast<float>(s));
      }
    }
    for (Bf16Matrix* m : {&c, &c2}) {
      for (size_t i = 0; i < m->grad.size(); ++i) {
        m->grad[i] = Bf16(std::cos(0.37f * static_cast<float>(i) + 0.5f * static_cast<float>(s)));
      }
    }
    const std::vector<float> a_grad = a.grad;
    ASSERT_EQ(muon_step(in_grad, nullptr), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_step(buffered, nullptr), MUON_OK) << muon_last_error_message();
    EXPECT_EQ(a.value, a2.value) << "step " << s;
    EXPECT_EQ(b.value, b2.value) << "step " << s;
    EXPECT_EQ(c.value, c2.value) << "step " << s;
    EXPECT_EQ(b2.grad[5], std::cos(0.37f * 5 + 0.5f * static_cast<float>(s)));  // only read
    if (s == 0) {
      // Step 1 from zero momentum: the update is NS((1 - m) g m + g (1 - m))
      // as the momentum pass computes it; orthogonalized alone, it equals
      // what the gradient now holds.
      std::vector<float> u(a_grad.size());
      for (size_t i = 0; i < u.size(); ++i) {
        const float buf = 0.0f + 0.05f * (a_grad[i] - 0.0f);   // lerp(0, g, 1 - 0.95)
        u[i] = a_grad[i] + 0.95f * (buf - a_grad[i]);           // lerp(g, buf, 0.95)
      }
      std::vector<int64_t> shape = {24, 40};
      DLTensor t{};
      t.data = u.data();
      t.device = {kDLCPU, 0};
      t.ndim = 2;
      t.dtype = kF32;
      t.shape = shape.data();
      ASSERT_EQ(muon_orthogonalize(buffered, &t, &t, MUON_MATRIX_VIEW_2D, nullptr), MUON_OK);
      EXPECT_EQ(a.grad, u);
    }
  }
  const muon_stats_t mine = Stats(in_grad), theirs = Stats(buffered);
  // The buffered optimizer's update buffers are bf16 (Newton-Schulz in bf16,
  // the default): 2 bytes per parameter element.
  EXPECT_EQ(theirs.memory_bytes - mine.memory_bytes, 2 * mine.param_elements);
  muon_destroy(in_grad);
  muon_destroy(buffered);
}

TEST(UpdateInGrad, GradientsThatCannotHoldTheUpdateAreRefused) {
  struct Case {
    DLDataType grad;
    int momentum_fp32, ns_dtype;
    const char* why;
  };
  const Case cases[] = {
      {{kDLFloat, 16, 1}, 0, MUON_NS_DTYPE_BF16, "float16 gradient"},
      {{kDLBfloat, 16, 1}, 1, MUON_NS_DTYPE_BF16, "momentum_fp32"},
      {{kDLBfloat, 16, 1}, 0, MUON_NS_DTYPE_FP32, "ns_dtype FP32"},
  };
  for (const Case& k : cases) {
    Bf16Matrix m(8, 8, k.grad);
    muon_optimizer_t* opt = Create(nullptr, 1, k.momentum_fp32, k.ns_dtype);
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = "w";
    int64_t id = -1;
    EXPECT_EQ(muon_register_param(opt, &m.v, &m.g, &po, &id), MUON_INVALID_ARGUMENT) << k.why;
    const std::string why = muon_last_error_message();
    EXPECT_NE(why.find("param 'w'"), std::string::npos) << why;
    EXPECT_NE(why.find(k.why), std::string::npos) << why;
    size_t n = 9;
    ASSERT_EQ(muon_num_params(opt, &n), MUON_OK);
    EXPECT_EQ(n, 0u);
    muon_destroy(opt);
  }
}

TEST(UpdateInGrad, AParameterKeepsItsGradientStorage) {
  Matrix a(8, 12), other(8, 12);
  muon_optimizer_t* opt = Create(nullptr, 1);
  Register(opt, a, "a");
  EXPECT_EQ(muon_rebind_param(opt, 0, &a.v, nullptr), MUON_FAILED_PRECONDITION);
  EXPECT_NE(std::string(muon_last_error_message()).find("bind a zero gradient"), std::string::npos);
  ASSERT_EQ(muon_rebind_param(opt, 0, &a.v, &other.g), MUON_OK);  // before the first step: free
  ASSERT_EQ(muon_rebind_param(opt, 0, &a.v, &a.g), MUON_OK);
  ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
  EXPECT_EQ(muon_rebind_param(opt, 0, &a.v, &other.g), MUON_FAILED_PRECONDITION);
  const std::string why = muon_last_error_message();
  EXPECT_NE(why.find("param 'a'"), std::string::npos) << why;
  EXPECT_NE(why.find("same gradient storage"), std::string::npos) << why;
  EXPECT_EQ(muon_rebind_param(opt, 0, &other.v, &a.g), MUON_OK);  // the value may move
  ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
  muon_destroy(opt);
}

// ---- The custom path ----

// Two in-process ranks, each holding rows [2r, 2r + 2) of a 4 x 4 matrix on
// the custom path, owned by rank 1; the host's callbacks move the pieces
// through a communicator of their own. `declared_rows` x 4 is what each rank
// declares (4: the truth; larger: a declaration far beyond the pieces).
struct CustomHost {
  int64_t declared_rows = 4;
  size_t largest = SIZE_MAX;  // each rank's pool refuses larger blocks
  std::vector<float> gathered = std::vector<float>(16), result = std::vector<float>(16);
  std::vector<muon_comm_t> host_comms = std::vector<muon_comm_t>(2);
  // What each rank saw.
  muon_status_t status[2] = {MUON_OK, MUON_OK};
  std::string error[2];
  std::vector<float> before[2], after[2];
  int64_t steps[2] = {-1, -1};
  int calls[2] = {0, 0};  // gather_fn calls
  muon_stats_t stats[2];
  std::vector<size_t> asked[2];
  int64_t live_after_destroy[2] = {-1, -1};
};

struct CustomRank {
  CustomHost* host;
  int rank;
};

int32_t CustomAssign(void*, const char*, int32_t) { return 1; }

muon_status_t CustomGather(void* s, const float* local, int64_t n, int32_t owner,
                           muon_gathered_t* out, void*) {
  auto* st = static_cast<CustomRank*>(s);
  ++st->host->calls[st->rank];
  muon_comm_t& c = st->host->host_comms[st->rank];
  const muon_status_t rc = c.all_gather(c.ctx, local, st->host->gathered.data(),
                                        static_cast<size_t>(n) * sizeof(float), nullptr);
  if (rc == MUON_OK && st->rank == owner) {
    out->data = st->host->gathered.data();
    out->rows = st->host->declared_rows;
    out->cols = 4;
  }
  return rc;
}

muon_status_t CustomRedistribute(void* s, const float* full, int64_t, int64_t, int32_t owner,
                                 float* local, int64_t n, void*) {
  auto* st = static_cast<CustomRank*>(s);
  muon_comm_t& c = st->host->host_comms[st->rank];
  std::vector<float> mine(16, 0.0f), all(32);
  if (st->rank == owner) std::memcpy(mine.data(), full, 16 * sizeof(float));
  const muon_status_t rc = c.all_gather(c.ctx, mine.data(), all.data(), 16 * sizeof(float), nullptr);
  std::memcpy(local, all.data() + owner * 16 + st->rank * n, static_cast<size_t>(n) * sizeof(float));
  return rc;
}

void RunCustom(CustomHost& host, int steps) {
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(2, &world), MUON_OK);
  auto body = [&](int rank) {
    CustomRank state{&host, rank};
    Pool pool;
    pool.largest = host.largest;
    muon_optimizer_t* opt = Create(&pool);
    muon_comm_t comm;
    int32_t world_id = -1;
    EXPECT_EQ(muon_inprocess_comm(world, nullptr, 0, rank, &comm), MUON_OK);
    EXPECT_EQ(muon_set_world(opt, &comm, &world_id), MUON_OK);
    EXPECT_EQ(muon_inprocess_comm(world, nullptr, 0, rank, &host.host_comms[rank]), MUON_OK);
    Matrix piece(2, 4, 0.1f + 0.05f * static_cast<float>(rank));
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = "custom";
    muon_custom_layout_t layout{sizeof(muon_custom_layout_t), &state, host.declared_rows, 4,
                                CustomAssign, CustomGather, CustomRedistribute};
    int64_t id = -1;
    muon_status_t st = muon_register_param_custom(opt, &piece.v, &piece.g, &po, &layout, &id);
    EXPECT_EQ(st, MUON_OK) << muon_last_error_message();
    host.before[rank] = piece.value;
    for (int s = 0; s < steps && st == MUON_OK; ++s) st = muon_step(opt, nullptr);
    host.status[rank] = st;
    if (st != MUON_OK) host.error[rank] = muon_last_error_message();
    host.after[rank] = piece.value;
    EXPECT_EQ(muon_step_count(opt, &host.steps[rank]), MUON_OK);
    host.stats[rank] = Stats(opt);
    host.asked[rank] = pool.asked;
    muon_destroy(opt);
    host.host_comms[rank].release(host.host_comms[rank].ctx);
    host.live_after_destroy[rank] = static_cast<int64_t>(pool.live.size());
    EXPECT_EQ(pool.bad, "") << "rank " << rank;
  };
  std::thread other(body, 1);
  body(0);
  other.join();
  muon_inprocess_world_destroy(world);
}

// The owner's copy of the whole matrix comes from the host's allocator, at
// the first step, counted in the stats; later steps allocate nothing.
TEST(Memory, TheCustomPathsWorkingCopyComesFromTheHostsAllocator) {
  CustomHost host;
  RunCustom(host, 3);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(host.status[r], MUON_OK) << "rank " << r << ": " << host.error[r];
    EXPECT_EQ(host.steps[r], 3);
    EXPECT_NE(host.after[r], host.before[r]);
    EXPECT_EQ(host.live_after_destroy[r], 0) << "rank " << r;
  }
  // Only the owner asks for the 4 x 4 fp32 copy (64 bytes).
  const auto count = [](const std::vector<size_t>& v, size_t n) {
    return std::count(v.begin(), v.end(), n);
  };
  EXPECT_EQ(count(host.asked[1], 64), 1) << "the owner";
  EXPECT_EQ(host.stats[1].matrices_owned, 1);
  EXPECT_EQ(host.stats[0].matrices_owned, 0);
  // (Each rank: momentum 32 and update buffer 32 bytes; the owner: the copy
  // and the Newton-Schulz workspace besides.)
  EXPECT_GE(host.stats[1].memory_bytes, host.stats[0].memory_bytes + 64);
}

// A declaration far larger than the pieces (65536 x 4 fp32 here, 1 MiB,
// while each rank holds 8 elements) asks the owner's allocator for that
// much at the first step; an allocator that refuses fails the step on every
// rank, naming the parameter and the bytes, before any callback runs or
// anything changes.
TEST(Memory, AnAllocatorRefusingTheCustomPathsCopyFailsTheStepOnEveryRank) {
  CustomHost host;
  host.declared_rows = 65536;
  host.largest = 64 << 10;  // 64 KiB blocks at most
  RunCustom(host, 1);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(host.status[r], MUON_RESOURCE_EXHAUSTED);
    const std::string& why = host.error[r];
    EXPECT_NE(why.find("the first step's setup"), std::string::npos) << why;
    EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
    EXPECT_NE(why.find("allocating the working copy of custom-path param 'custom' (65536 x 4 "
                       "fp32) (1048576 bytes on cpu): the host's allocator "
                       "(muon_options_t.allocate) returned NULL"),
              std::string::npos)
        << why;
    EXPECT_EQ(host.after[r], host.before[r]);
    EXPECT_EQ(host.steps[r], 0);
    EXPECT_EQ(host.calls[r], 0);
    EXPECT_EQ(host.live_after_destroy[r], 0);
  }
  EXPECT_EQ(std::count(host.asked[1].begin(), host.asked[1].end(), size_t{1} << 20), 1);
  EXPECT_EQ(std::count(host.asked[0].begin(), host.asked[0].end(), size_t{1} << 20), 0);
}

}  // namespace
