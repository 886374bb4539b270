// The custom-path stepper: the host's gather_fn and redistribute_fn move the
// data (here over an in-process communicator of the test's own), the owner
// orthogonalizes, and every holder ends with its piece of the result.
// Errors of the callbacks, and a gathered matrix of the wrong shape, name
// the parameter.
#include "muon/engine/custom_stepper.h"

#include <algorithm>
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

}  // namespace
}  // namespace muon
