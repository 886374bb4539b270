// The optimizer's memory through the C API: every buffer it allocates comes
// from the host's allocator when one is set (muon_options_t.allocate), goes
// back to it by muon_destroy, and muon_get_stats reports what it holds.
#include <dlpack/dlpack.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "capi/muon.h"
#include "gtest/gtest.h"

namespace {

constexpr DLDataType kF32{kDLFloat, 32, 1};

// A counting allocator over malloc, with a switch that makes it refuse.
struct Pool {
  std::map<void*, size_t> live;
  int64_t allocations = 0, releases = 0;
  size_t bytes_released = 0;
  bool refuse = false;
  std::string bad;  // a contract violation seen, if any

  int64_t live_bytes() const {
    int64_t n = 0;
    for (const auto& [p, b] : live) n += static_cast<int64_t>(b);
    return n;
  }
  static void* Allocate(void* ctx, size_t bytes, int32_t type, int32_t id, void* stream) {
    auto* pool = static_cast<Pool*>(ctx);
    if (type != kDLCPU || id != 0 || stream != nullptr) pool->bad = "unexpected device or stream";
    if (pool->refuse) return nullptr;
    void* p = std::malloc(bytes);
    std::memset(p, 0x5a, bytes);  // not zero: the library must zero what it needs
    pool->live[p] = bytes;
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
    std::free(ptr);
  }
};

struct Matrix {
  std::vector<int64_t> shape;
  std::vector<float> value, grad;
  DLTensor v{}, g{};
  Matrix(int64_t rows, int64_t cols) : shape{rows, cols} {
    const size_t n = static_cast<size_t>(rows * cols);
    value.resize(n);
    grad.resize(n);
    for (size_t i = 0; i < n; ++i) {
      value[i] = std::sin(0.1f * static_cast<float>(i));
      grad[i] = std::cos(0.37f * static_cast<float>(i));
    }
    for (DLTensor* t : {&v, &g}) {
      t->device = {kDLCPU, 0};
      t->ndim = 2;
      t->dtype = kF32;
      t->shape = shape.data();
    }
    v.data = value.data();
    g.data = grad.data();
  }
};

muon_optimizer_t* Create(Pool* pool) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
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

}  // namespace
