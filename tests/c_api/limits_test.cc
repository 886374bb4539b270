// The C API at the ends of its ranges: muon_status_string over every int a
// C host can pass, and the step counter at the largest count a state blob
// holds.
#include <dlpack/dlpack.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "capi/muon.h"
#include "gtest/gtest.h"
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

}  // namespace
