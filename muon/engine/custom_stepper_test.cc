// The custom-path stepper: the host's gather_fn and redistribute_fn move the
// data (here over an in-process communicator of the test's own), the owner
// orthogonalizes, and every holder ends with its piece of the result.
// Errors of the callbacks, and a gathered matrix of the wrong shape, name
// the parameter.
#include "muon/engine/custom_stepper.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/engine/testing/host_job.h"
#include "muon/testing/ranks.h"

namespace muon {
namespace {

using testjob::HostJob;
using testjob::ReferenceOf;
using testjob::ValueOf;

float UpdateOf(const std::string& name, int64_t i) { return ValueOf(name, i, 3); }

// "c": 6 x 4, rows split over two ranks (3 each), owned by rank 1.
// "d": 5 x 5, held whole by rank 0 alone, owned by it.
TEST(CustomStepper, TheHostMovesThePiecesAndTheOwnerOrthogonalizes) {
  testranks::World world(2);
  std::vector<absl::Status> status(2);
  testranks::OnThreads(2, [&](int rank) {
    std::shared_ptr<Comm> host = world.Join(rank, {}, "host");  // the host's own communication
    ASSERT_NE(host, nullptr);
    HostJob job;
    std::vector<float> gathered(24), spread(48), full_result(24);
    auto path_c = std::make_shared<CustomPath>();
    path_c->assign = [](int, std::string*) { return 1; };
    path_c->gather = [&](const float* local, int64_t n, int owner, const float** full,
                         int64_t* rows, int64_t* cols, void* stream) -> absl::Status {
      EXPECT_EQ(n, 12);
      absl::Status st = host->AllGather(local, gathered.data(), 12 * 4, stream, "test gather");
      if (st.ok() && rank == owner) {
        *full = gathered.data();
        *rows = 6;
        *cols = 4;
      }
      return st;
    };
    path_c->redistribute = [&](const float* full, int64_t rows, int64_t cols, int owner,
                               float* local, int64_t n, void* stream) -> absl::Status {
      EXPECT_EQ(rows * cols, 24);
      std::fill(full_result.begin(), full_result.end(), 0.0f);
      if (rank == owner) std::copy(full, full + 24, full_result.begin());
      absl::Status st = host->AllGather(full_result.data(), spread.data(), 24 * 4, stream, "x");
      std::copy(spread.begin() + owner * 24 + rank * 12, spread.begin() + owner * 24 + rank * 12 + n,
                local);
      return st;
    };
    Param& c = job.Add("c", {3, 4}, 0);
    c.custom = path_c;
    for (int64_t k = 0; k < 12; ++k) job.update(0)[k] = UpdateOf("c", rank * 12 + k);
    std::vector<CustomUnit> units = {{"c", 1, 6, 4, 0, 1.0}};
    if (rank == 0) {
      auto path_d = std::make_shared<CustomPath>();
      path_d->assign = [](int, std::string*) { return 0; };
      path_d->gather = [](const float* local, int64_t, int, const float** full, int64_t* rows,
                          int64_t* cols, void*) {
        *full = local;
        *rows = *cols = 5;
        return absl::OkStatus();
      };
      path_d->redistribute = [](const float* full, int64_t, int64_t, int, float* local,
                                int64_t n, void*) {
        std::copy(full, full + n, local);
        return absl::OkStatus();
      };
      Param& d = job.Add("d", {5, 5}, 0);
      d.custom = path_d;
      for (int64_t k = 0; k < 25; ++k) job.update(1)[k] = UpdateOf("d", k);
      units.push_back({"d", 0, 5, 5, 1, 2.0});
    } else {
      units.push_back({"d", 0, 5, 5, -1, 2.0});  // not held here
    }
    Options o;
    o.ns.dtype = NsDtype::kFP32;
    auto stepper = CustomStepper::Create(units, rank, job.Context(&o));
    ASSERT_TRUE(stepper.ok()) << stepper.status();
    EXPECT_EQ((*stepper)->stats().matrices_total, 2);
    EXPECT_EQ((*stepper)->stats().matrices_owned, 1);
    status[rank] = (*stepper)->Run(nullptr, false);
    if (!status[rank].ok()) return;
    EXPECT_EQ((*stepper)->stats().orthogonalized, 1);
    EXPECT_EQ((*stepper)->stats().ns_flops, rank == 1 ? 1.0 : 2.0);
    const auto want_c = ReferenceOf(6, 4, o.ns, [](int64_t k) { return UpdateOf("c", k); });
    for (int64_t k = 0; k < 12; ++k) {
      ASSERT_NEAR(job.update(0)[k], want_c[rank * 12 + k], 2e-5) << "rank " << rank << " c " << k;
    }
    if (rank == 0) {
      const auto want_d = ReferenceOf(5, 5, o.ns, [](int64_t k) { return UpdateOf("d", k); });
      for (int64_t k = 0; k < 25; ++k) ASSERT_NEAR(job.update(1)[k], want_d[k], 2e-5) << k;
    }
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
}

// One rank owning a 3 x 2 matrix whose callbacks misbehave as told.
absl::Status RunBroken(int64_t gathered_rows, absl::Status gather, absl::Status redistribute) {
  HostJob job;
  std::vector<float> full(6, 0.5f);
  auto path = std::make_shared<CustomPath>();
  path->assign = [](int, std::string*) { return 0; };
  path->gather = [&](const float*, int64_t, int, const float** out, int64_t* rows, int64_t* cols,
                     void*) {
    *out = full.data();
    *rows = gathered_rows;
    *cols = 2;
    return gather;
  };
  path->redistribute = [&](const float*, int64_t, int64_t, int, float*, int64_t, void*) {
    return redistribute;
  };
  job.Add("m", {3, 2}, 0).custom = path;
  Options o;
  auto stepper = CustomStepper::Create({{"m", 0, 3, 2, 0, 1.0}}, 0, job.Context(&o));
  EXPECT_TRUE(stepper.ok());
  return (*stepper)->Run(nullptr, false);
}

TEST(CustomStepper, CallbackErrorsAndWrongShapesNameTheParam) {
  EXPECT_TRUE(RunBroken(3, absl::OkStatus(), absl::OkStatus()).ok());
  absl::Status s = RunBroken(2, absl::OkStatus(), absl::OkStatus());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "param 'm': gather_fn returned a 2 x 2 matrix; the parameter is registered as 3 x 2");
  s = RunBroken(3, absl::UnavailableError("peer lost"), absl::OkStatus());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "param 'm': gather_fn failed: peer lost");
  s = RunBroken(3, absl::OkStatus(), absl::InternalError("disk full"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "param 'm': redistribute_fn failed: disk full");
}

// A host allocator that counts blocks and refuses those over `limit` bytes.
struct Hook {
  size_t limit = 0;
  std::vector<size_t> asked, given;
  static void* Allocate(void* ctx, size_t bytes, int32_t, int32_t, void*) {
    Hook* h = static_cast<Hook*>(ctx);
    h->asked.push_back(bytes);
    if (bytes > h->limit) return nullptr;
    h->given.push_back(bytes);
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  static void Release(void*, void* p, size_t, int32_t, int32_t, void*) { std::free(p); }
  Device::Allocator allocator() { return {&Hook::Allocate, &Hook::Release, this}; }
};

// The owner's working copy of a custom-path matrix is the declared size,
// whatever the pieces: it comes from the device (through the host's
// allocator, counted), once, at setup; a refusal fails the setup naming the
// parameter and the bytes. Before, it was a std::vector outside the hook: a
// declaration 8 GiB large made the owner allocate 8 GiB the host never saw.
TEST(CustomStepper, TheOwnersWorkingCopyComesFromTheDeviceOnceAtSetup) {
  Hook hook;
  hook.limit = size_t{1} << 20;
  HostJob job;
  ASSERT_TRUE(job.device()->SetAllocator(hook.allocator()).ok());
  std::vector<float> full(6 * 8, 0.25f);
  // The host's callbacks for a rows x cols matrix (the same values each time).
  auto path = [&](int64_t rows, int64_t cols) {
    auto p = std::make_shared<CustomPath>();
    p->assign = [](int, std::string*) { return 0; };
    p->gather = [&full, rows, cols](const float*, int64_t, int, const float** out,
                                    int64_t* r, int64_t* c, void*) {
      *out = full.data();
      *r = rows;
      *c = cols;
      return absl::OkStatus();
    };
    p->redistribute = [](const float*, int64_t, int64_t, int, float* local, int64_t n, void*) {
      std::fill(local, local + n, 0.5f);
      return absl::OkStatus();
    };
    return p;
  };
  job.Add("big", {2, 4}, 0).custom = path(6, 8);    // a 2 x 4 piece of a 6 x 8 matrix
  job.Add("small", {2, 4}, 0).custom = path(4, 4);  // and of a 4 x 4 one
  Options o;
  o.ns.dtype = NsDtype::kFP32;
  const int64_t before = job.device()->allocated_bytes();
  const size_t blocks = hook.given.size();

  // Declared 2048 x 1024 (8 MiB in fp32, over the hook's 1 MiB): refused by
  // the hook, named.
  auto refused = CustomStepper::Create(
      {{"big", 0, 2048, 1024, 0, 1.0}, {"small", 0, 6, 8, 1, 1.0}}, 0, job.Context(&o));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "allocating the working copy of custom-path param 'big' (2048 x 1024 fp32) "
            "(8388608 bytes on cpu): the host's allocator (muon_options_t.allocate) "
            "returned NULL");
  ASSERT_FALSE(hook.asked.empty());
  EXPECT_EQ(hook.asked.back(), size_t{8388608});
  EXPECT_EQ(job.device()->allocated_bytes(), before);  // nothing kept

  // Declared 6 x 8: its 192 bytes come through the hook, counted, at setup.
  auto stepper =
      CustomStepper::Create({{"big", 0, 6, 8, 0, 1.0}, {"small", 0, 4, 4, 1, 1.0}}, 0,
                            job.Context(&o));
  ASSERT_TRUE(stepper.ok()) << stepper.status();
  ASSERT_GT(hook.given.size(), blocks);
  EXPECT_EQ(hook.given[blocks], 6 * 8 * sizeof(float));  // the largest matrix owned
  const int64_t set_up = job.device()->allocated_bytes();
  EXPECT_GE(set_up - before, 6 * 8 * static_cast<int64_t>(sizeof(float)));
  const size_t after_setup = hook.asked.size();
  for (int step = 0; step < 2; ++step) {
    const absl::Status st = (*stepper)->Run(nullptr, false);
    ASSERT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(hook.asked.size(), after_setup);  // a step allocates nothing
  EXPECT_EQ(job.device()->allocated_bytes(), set_up);
  stepper->reset();
  EXPECT_EQ(job.device()->allocated_bytes(), before + (set_up - before) -
                                                 6 * 8 * static_cast<int64_t>(sizeof(float)));
}

// The Newton-Schulz workspace an owned matrix needs is reserved at setup;
// a refusal names the parameter.
TEST(CustomStepper, AWorkspaceRefusalNamesTheParameter) {
  Hook hook;
  hook.limit = 6 * 8 * sizeof(float);  // the working copy, not the workspace
  HostJob job;
  ASSERT_TRUE(job.device()->SetAllocator(hook.allocator()).ok());
  job.Add("m", {2, 4}, 0).custom = std::make_shared<CustomPath>();
  Options o;
  o.ns.dtype = NsDtype::kFP32;
  auto refused = CustomStepper::Create({{"m", 0, 6, 8, 0, 1.0}}, 0, job.Context(&o));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string why(refused.status().message());
  EXPECT_EQ(why.rfind("param 'm': allocating the Newton-Schulz workspace", 0), 0u) << why;
}

}  // namespace
}  // namespace muon
