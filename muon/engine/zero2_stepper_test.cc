// The ZeRO-2 stepper on two in-process ranks: same-shape parameters form
// blocks with block-cyclic owners, each owner steps its parameters from the
// averaged gradients (momentum, Newton-Schulz, decay, update) and keeps
// their momentum alone, and every replica ends with the same new values.
#include "muon/engine/zero2_stepper.h"

#include <cmath>
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

// Rank r's own (un-averaged) gradient of `name`.
float GradOf(const std::string& name, int64_t i, int rank) { return ValueOf(name, i, 10 + rank); }

TEST(Zero2Stepper, OwnersStepFromTheAverageAndEveryReplicaAgrees) {
  // p0, p1, p2 (4 x 3) and q (5 x 2), replicated over the world of 2.
  // Blocks by name: [p0 -> 0, p1 -> 1], [p2 -> 0, -], [-, q -> 1].
  const std::vector<std::string> names = {"p0", "p1", "p2", "q"};
  const std::vector<int> owner = {0, 1, 0, 1};
  testranks::World world(2);
  std::vector<std::vector<std::vector<float>>> values(2);
  Options o;
  o.ns.dtype = NsDtype::kFP32;
  o.lr = 0.05;
  o.weight_decay = 0.2;
  testranks::OnThreads(2, [&](int rank) {
    std::shared_ptr<Comm> w = world.Join(rank);
    ASSERT_NE(w, nullptr);
    HostJob job;
    for (const std::string& name : names) {
      Param& p = job.Add(name, name == "q" ? std::vector<int64_t>{5, 2} : std::vector<int64_t>{4, 3},
                         0);
      p.zero2_group = 0;
      for (int64_t i = 0; i < p.numel(); ++i) job.grad(job.params().size() - 1)[i] =
          GradOf(name, i, rank);
    }
    auto stepper = Zero2Stepper::Create({w}, {{0, 1}}, 4, job.Context(&o));
    ASSERT_TRUE(stepper.ok()) << stepper.status();
    EXPECT_EQ((*stepper)->stats().matrices_total, 4);
    EXPECT_EQ((*stepper)->stats().matrices_owned, 2);
    EXPECT_TRUE((*stepper)->has_blocks());
    for (size_t j = 0; j < names.size(); ++j) {
      const bool mine = owner[j] == rank;
      EXPECT_EQ(job.params()[j].holds_state, mine) << names[j];
      EXPECT_EQ(job.params()[j].momentum.empty(), !mine) << names[j];
    }
    absl::Status st = (*stepper)->Run(nullptr, false);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ((*stepper)->stats().orthogonalized, 2);
    for (size_t j = 0; j < names.size(); ++j) values[rank].push_back(job.value(j));
  });
  ASSERT_EQ(values[0].size(), names.size());
  ASSERT_EQ(values[1].size(), names.size());
  for (size_t j = 0; j < names.size(); ++j) {
    SCOPED_TRACE(names[j]);
    EXPECT_EQ(values[0][j], values[1][j]) << "the replicas differ";
    // The reference: the average of both ranks' gradients (fp32 sum in rank
    // order, divided by 2), momentum from a zero buffer, Nesterov, NS, decay
    // with the plain lr, the update with the adjusted one.
    const int64_t rows = names[j] == "q" ? 5 : 4, cols = names[j] == "q" ? 2 : 3;
    const double mu = o.momentum;
    const auto u = ReferenceOf(rows, cols, o.ns, [&](int64_t i) {
      const double avg = static_cast<float>(GradOf(names[j], i, 0) + GradOf(names[j], i, 1)) / 2.0f;
      const double buf = (1 - mu) * avg;
      return avg + mu * (buf - avg);
    });
    const double adjusted = o.lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double v0 = ValueOf(names[j], i, 1);
      const double want = v0 * (1 - o.lr * o.weight_decay) - adjusted * u[i];
      EXPECT_NEAR(values[0][j][i], want, 2e-6) << "element " << i;
    }
  }
}

// Found by fuzz/api_sequence_fuzzer: an empty ZeRO-2 parameter, whose
// tensors may have NULL data, was copied with memcpy(dst, NULL, 0) (undefined
// behaviour). Its blocks still issue their collectives on every rank.
TEST(Zero2Stepper, EmptyParamsWithNullDataStep) {
  testranks::World world(2);
  Options o;
  testranks::OnThreads(2, [&](int rank) {
    std::shared_ptr<Comm> w = world.Join(rank);
    ASSERT_NE(w, nullptr);
    HostJob job;
    for (const std::string name : {"e0", "e1", "e2"}) {
      Param& p = job.Add(name, {0, 3}, 0);
      p.zero2_group = 0;
      p.value.data = nullptr;
      p.grad.data = nullptr;
    }
    auto stepper = Zero2Stepper::Create({w}, {{0, 1}}, 3, job.Context(&o));
    ASSERT_TRUE(stepper.ok()) << stepper.status();
    EXPECT_TRUE((*stepper)->has_blocks());
    absl::Status st = (*stepper)->Run(nullptr, false);
    EXPECT_TRUE(st.ok()) << st;
  });
}

}  // namespace
}  // namespace muon
