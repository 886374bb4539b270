// The C API at the ends of its ranges: muon_status_string over every int a
// C host can pass, the step counter at the largest count a state blob
// holds, and the matrices a declaration may ask for (muon.h, "Matrices a
// declaration may ask for").
#include <dlpack/dlpack.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "tests/c_api/host_matrix.h"
#include "tests/c_api/status_of_int.h"

namespace {

TEST(StatusString, EveryIntGetsStaticTextAndUndeclaredOnesSaySo) {
  EXPECT_STREQ(muon_test_status_string_of_int(0), "OK");
  EXPECT_STREQ(muon_test_status_string_of_int(3), "INVALID_ARGUMENT");
  EXPECT_STREQ(muon_test_status_string_of_int(14), "UNAVAILABLE");
  // absl codes the header does not declare, numbers past the enum's range,
  // negative ones: one text, never NULL, and no read of the value as a
  // muon_status_t inside the library (undefined in C++ for values past the
  // enum's range: clang's -fsanitize=enum reports it; GCC's UBSan, which
  // --config=asan uses, does not instrument it).
  for (int v : {4, 7, 10, 15, 16, 17, 255, 999, 1 << 20, INT_MAX, -1, -999, INT_MIN}) {
    const char* s = muon_test_status_string_of_int(v);
    ASSERT_NE(s, nullptr) << v;
    EXPECT_STREQ(s, "UNRECOGNIZED_STATUS") << v;
  }
}

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr int64_t kMaxSaved = std::numeric_limits<int64_t>::max() - 1;  // a blob's largest
constexpr size_t kStepCountAt = 16;  // magic (8), format (4), reserved (4), then the count

struct Model {
  std::vector<int64_t> shape{6, 4};
  std::vector<float> value, grad;
  DLTensor v{}, g{};
  muon_optimizer_t* opt = nullptr;
  Model() : value(24), grad(24) {
    for (size_t i = 0; i < value.size(); ++i) {
      value[i] = std::sin(0.5f * static_cast<float>(i));
      grad[i] = std::cos(0.9f * static_cast<float>(i));
    }
    for (DLTensor* t : {&v, &g}) {
      t->device = {kDLCPU, 0};
      t->ndim = 2;
      t->dtype = kF32;
      t->shape = shape.data();
    }
    v.data = value.data();
    g.data = grad.data();
    muon_options_t o;
    EXPECT_EQ(muon_options_init(&o, sizeof o), MUON_OK);
    EXPECT_EQ(muon_create(&o, &opt), MUON_OK);
    muon_param_options_t po;
    EXPECT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
    po.name = "w";
    int64_t id = -1;
    EXPECT_EQ(muon_register_param(opt, &v, &g, &po, &id), MUON_OK) << muon_last_error_message();
  }
  ~Model() { muon_destroy(opt); }

  std::vector<unsigned char> Save() const {
    size_t n = 0;
    EXPECT_EQ(muon_save_state(opt, nullptr, 0, &n), MUON_OK);
    std::vector<unsigned char> blob(n);
    EXPECT_EQ(muon_save_state(opt, blob.data(), blob.size(), &n), MUON_OK)
        << muon_last_error_message();
    return blob;
  }
  int64_t Steps() const {
    int64_t n = -1;
    EXPECT_EQ(muon_step_count(opt, &n), MUON_OK);
    return n;
  }
  std::vector<float> Momentum() const {
    std::vector<float> m(24, -1.0f);
    DLTensor t = v;
    t.data = m.data();
    EXPECT_EQ(muon_get_state(opt, 0, &t), MUON_OK) << muon_last_error_message();
    return m;
  }
};

int64_t CountIn(const std::vector<unsigned char>& blob) {
  int64_t c = 0;
  std::memcpy(&c, blob.data() + kStepCountAt, sizeof c);
  return c;
}

// This library's own blob at `steps` steps (the step count is the header's
// word; the rest is a real optimizer's state after one step).
std::vector<unsigned char> BlobAt(int64_t steps) {
  Model m;
  EXPECT_EQ(muon_step(m.opt, nullptr), MUON_OK);
  std::vector<unsigned char> blob = m.Save();
  EXPECT_EQ(CountIn(blob), 1);
  std::memcpy(blob.data() + kStepCountAt, &steps, sizeof steps);
  return blob;
}

TEST(StepCount, TheLastStepABlobCanHoldIsTakenAndItsBlobLoads) {
  Model m;
  const std::vector<unsigned char> blob = BlobAt(kMaxSaved - 1);
  ASSERT_EQ(muon_load_state(m.opt, blob.data(), blob.size()), MUON_OK)
      << muon_last_error_message();
  ASSERT_EQ(muon_step(m.opt, nullptr), MUON_OK) << muon_last_error_message();
  EXPECT_EQ(m.Steps(), kMaxSaved);
  const std::vector<unsigned char> saved = m.Save();
  EXPECT_EQ(CountIn(saved), kMaxSaved);
  Model resumed;
  EXPECT_EQ(muon_load_state(resumed.opt, saved.data(), saved.size()), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(resumed.Steps(), kMaxSaved);
}

// At the largest count a blob holds, muon_step refuses before changing
// anything (the next count could not be saved and loaded again), saying why;
// the state it keeps still saves and loads.
TEST(StepCount, AStepPastTheLargestCountABlobHoldsIsRefusedAndChangesNothing) {
  Model m;
  const std::vector<unsigned char> blob = BlobAt(kMaxSaved);
  ASSERT_EQ(muon_load_state(m.opt, blob.data(), blob.size()), MUON_OK)
      << muon_last_error_message();
  ASSERT_EQ(m.Steps(), kMaxSaved);
  const std::vector<float> value = m.value, grad = m.grad, momentum = m.Momentum();
  muon_stats_t before;
  ASSERT_EQ(muon_stats_init(&before, sizeof before), MUON_OK);
  ASSERT_EQ(muon_get_stats(m.opt, &before), MUON_OK);

  for (int attempt = 0; attempt < 2; ++attempt) {  // refused again, not poisoned
    EXPECT_EQ(muon_step(m.opt, nullptr), MUON_OUT_OF_RANGE) << attempt;
    const std::string msg = muon_last_error_message();
    EXPECT_NE(msg.find("muon_step"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step count"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(kMaxSaved)), std::string::npos) << msg;
    EXPECT_NE(msg.find("state blob"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("poison"), std::string::npos) << msg;
  }
  EXPECT_EQ(m.Steps(), kMaxSaved);
  EXPECT_EQ(m.value, value);
  EXPECT_EQ(m.grad, grad);
  EXPECT_EQ(m.Momentum(), momentum);
  muon_stats_t after;
  ASSERT_EQ(muon_stats_init(&after, sizeof after), MUON_OK);
  ASSERT_EQ(muon_get_stats(m.opt, &after), MUON_OK);
  EXPECT_EQ(after.steps, before.steps);

  // What it keeps is a loadable blob.
  const std::vector<unsigned char> saved = m.Save();
  EXPECT_EQ(CountIn(saved), kMaxSaved);
  Model resumed;
  EXPECT_EQ(muon_load_state(resumed.opt, saved.data(), saved.size()), MUON_OK)
      << muon_last_error_message();

  // Loading an earlier blob makes it step again.
  const std::vector<unsigned char> earlier = BlobAt(5);
  ASSERT_EQ(muon_load_state(m.opt, earlier.data(), earlier.size()), MUON_OK);
  EXPECT_EQ(muon_step(m.opt, nullptr), MUON_OK) << muon_last_error_message();
  EXPECT_EQ(m.Steps(), 6);
}

// ---- Matrices a declaration may ask for ----

// A float32 tensor of `shape` with no data (an empty one, or a flat range of
// nothing).
struct Declared {
  std::vector<int64_t> shape;
  DLTensor t{};
  explicit Declared(std::vector<int64_t> s) : shape(std::move(s)) {
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = kF32;
    t.shape = shape.data();
  }
};

muon_optimizer_t* Create() {
  muon_options_t o;
  EXPECT_EQ(muon_options_init(&o, sizeof o), MUON_OK);
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_OK) << muon_last_error_message();
  return opt;
}

muon_stats_t StatsOf(const muon_optimizer_t* opt) {
  muon_stats_t s;
  EXPECT_EQ(muon_stats_init(&s, sizeof s), MUON_OK);
  EXPECT_EQ(muon_get_stats(opt, &s), MUON_OK);
  return s;
}

// An empty batch of 2^32 matrices: an empty matrix's update is empty, so
// nothing is planned, allocated or computed for it; the step does the rest
// of the job, as without it, at once. (Before, the first step planned a unit
// per matrix: more than 27 s and 8 GiB, then failed naming no parameter.)
TEST(Declarations, AnEmptyBatchOfAnySizeStepsDoingNothing) {
  const int64_t huge = int64_t{1} << 32;
  muon_test::HostMatrix w(6, 4), w_alone(6, 4);
  Declared stack({huge, 0, 3}), stack_grad({huge, 0, 3});
  muon_optimizer_t* opt = Create();
  muon_optimizer_t* alone = Create();
  muon_param_options_t po;
  ASSERT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
  int64_t id = -1;
  po.name = "stack";
  po.matrix_view = MUON_MATRIX_VIEW_BATCHED_LEADING;
  ASSERT_EQ(muon_register_param(opt, &stack.t, &stack_grad.t, &po, &id), MUON_OK)
      << muon_last_error_message();
  po.name = "w";
  po.matrix_view = MUON_MATRIX_VIEW_2D;
  ASSERT_EQ(muon_register_param(opt, &w.v, &w.g, &po, &id), MUON_OK) << muon_last_error_message();
  ASSERT_EQ(muon_register_param(alone, &w_alone.v, &w_alone.g, &po, &id), MUON_OK);
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_step(alone, nullptr), MUON_OK) << muon_last_error_message();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0);  // a few milliseconds; the bound only catches per-matrix work
  EXPECT_EQ(w.value, w_alone.value);
  const muon_stats_t with = StatsOf(opt), without = StatsOf(alone);
  EXPECT_EQ(with.matrices_total, huge + 1);  // declared: the empty ones count
  EXPECT_EQ(with.matrices_owned, 1);         // orthogonalized: none of them
  EXPECT_EQ(with.matrices_orthogonalized, 1);
  EXPECT_EQ(with.memory_bytes, without.memory_bytes);  // nothing per empty matrix
  muon_destroy(opt);
  muon_destroy(alone);
}

// One parameter may declare at most 2^20 matrices with elements: more is
// refused at registration, naming the parameter, its shape and the cause,
// whatever this rank holds of it (here nothing: an empty flat range).
// The job may declare at most 2^22: more is refused by the first step,
// before anything is planned, naming the parameter that crosses the cap;
// nothing changes and registration stays open.
TEST(Declarations, MatricesWithElementsAreCappedPerParameterAndPerJob) {
  const int64_t per = int64_t{1} << 20;
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(1, &world), MUON_OK);
  muon_comm_t comm;
  ASSERT_EQ(muon_inprocess_comm(world, nullptr, 0, 0, &comm), MUON_OK);
  muon_optimizer_t* opt = Create();
  int32_t group = -1;
  ASSERT_EQ(muon_set_world(opt, &comm, &group), MUON_OK) << muon_last_error_message();
  muon_placement_t nothing{};
  nothing.kind = MUON_PLACEMENT_FLAT_RANGE;
  nothing.group = group;
  nothing.start = 0;
  nothing.length = 0;
  Declared piece({0}), piece_grad({0});
  auto declare = [&](const char* name, std::vector<int64_t> global) {
    muon_param_options_t po;
    EXPECT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
    po.name = name;
    po.matrix_view = MUON_MATRIX_VIEW_BATCHED_LEADING;
    po.global_ndim = static_cast<int32_t>(global.size());
    po.global_shape = global.data();
    po.num_placements = 1;
    po.placements = &nothing;
    int64_t id = -1;
    return muon_register_param(opt, &piece.t, &piece_grad.t, &po, &id);
  };
  EXPECT_EQ(declare("over", {per + 1, 2, 2}), MUON_INVALID_ARGUMENT);
  std::string why = muon_last_error_message();
  EXPECT_NE(why.find("param 'over': shape [1048577, 2, 2] declares 1048577 matrices of 2 x 2, "
                     "more than the 1048576 one parameter may declare"),
            std::string::npos)
      << why;
  size_t n = 99;
  ASSERT_EQ(muon_num_params(opt, &n), MUON_OK);
  EXPECT_EQ(n, 0u);
  // Empty matrices: any number.
  EXPECT_EQ(declare("empty", {int64_t{1} << 40, 0, 2}), MUON_OK) << muon_last_error_message();
  // Five at the cap: each registers, the job crosses its cap at the fifth.
  for (const char* name : {"p1", "p3", "p0", "p4", "p2"}) {
    EXPECT_EQ(declare(name, {per, 2, 2}), MUON_OK) << name << ": " << muon_last_error_message();
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(muon_step(opt, nullptr), MUON_INVALID_ARGUMENT);
  why = muon_last_error_message();
  EXPECT_NE(why.find("param 'p4': with its 1048576 matrices the job declares 5242880 matrices "
                     "with elements"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("more than the 4194304 one job may declare"), std::string::npos) << why;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
  int64_t steps = -1;
  ASSERT_EQ(muon_step_count(opt, &steps), MUON_OK);
  EXPECT_EQ(steps, 0);
  // Registration is still open (the step's setup failed).
  EXPECT_EQ(declare("p5", {4, 2, 2}), MUON_OK) << muon_last_error_message();
  muon_destroy(opt);
  muon_inprocess_world_destroy(world);
}

}  // namespace
