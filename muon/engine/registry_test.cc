// Registration's refusals among many parameters: duplicate names and storage
// shared with any registered tensor (not only the last one), with the exact
// messages, against a plain model of the rule (every registered tensor
// compared with the new one, in registration order).
#include "muon/engine/registry.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "muon/comm/inprocess_comm.h"
#include "muon/comm/self_comm.h"
#include "muon/math/cpu/cpu_threads.h"

namespace muon {
namespace {

std::unique_ptr<Registry> MakeRegistry() {
  absl::StatusOr<std::shared_ptr<Comm>> self = Comm::Create(SelfCommTable(), "self");
  EXPECT_TRUE(self.ok()) << self.status();
  return std::make_unique<Registry>(std::move(self).value());
}

// A 1 x n float32 tensor at `data` (shape kept alive by the struct).
struct Span {
  float* data = nullptr;
  int64_t shape[2] = {1, 0};
  DLTensor dl{};
  Span(float* at, int64_t n) : data(at) {
    shape[1] = n;
    dl.data = at;
    dl.device = {kDLCPU, 0};
    dl.ndim = 2;
    dl.dtype = {kDLFloat, 32, 1};
    dl.shape = shape;
  }
  Span(const Span& o) : Span(o.data, o.shape[1]) {}
};

// One parameter as the model sees it: element ranges of one arena.
struct Model {
  struct Tensor {
    int64_t begin = 0, end = 0;  // in floats
  };
  struct P {
    std::string name;
    Tensor value, grad;
  };
  std::vector<P> params;

  static bool Meet(const Tensor& a, const Tensor& b) {
    return a.end > a.begin && b.end > b.begin && a.begin < b.end && b.begin < a.end;
  }
  // The outcome of registering `p`: "" or the error message.
  std::string Register(const P& p) const {
    for (const P& q : params) {
      if (q.name == p.name) {
        return absl::StrCat("param '", p.name, "': a parameter with this name is registered");
      }
    }
    if (Meet(p.value, p.grad)) return absl::StrCat("param '", p.name, "': param and grad share storage");
    for (const P& q : params) {
      for (int mine = 0; mine < 2; ++mine) {
        for (int theirs = 0; theirs < 2; ++theirs) {
          if (Meet(mine ? p.grad : p.value, theirs ? q.grad : q.value)) {
            return absl::StrCat("param '", p.name, "': its ", mine ? "grad" : "param",
                                " storage overlaps the ", theirs ? "grad" : "param",
                                " of param '", q.name, "'");
          }
        }
      }
    }
    return "";
  }
};

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = MakeRegistry(); }

  // Registers `name` at element ranges of the arena; returns "" or the error.
  std::string Register(const std::string& name, int64_t v0, int64_t g0, int64_t n) {
    Span value(arena_.data() + v0, n), grad(arena_.data() + g0, n);
    absl::StatusOr<int64_t> id =
        registry_->Register(&value.dl, &grad.dl, name, 0, nullptr, false);
    if (id.ok()) {
      EXPECT_EQ(*id, static_cast<int64_t>(registry_->params().size()) - 1);
      return "";
    }
    return std::string(id.status().message());
  }
  // The same through the model, which then records it when accepted.
  std::string Expect(const std::string& name, int64_t v0, int64_t g0, int64_t n) {
    Model::P p{name, {v0, v0 + n}, {g0, g0 + n}};
    std::string outcome = model_.Register(p);
    if (outcome.empty()) model_.params.push_back(p);
    return outcome;
  }
  absl::Status Rebind(int64_t id, int64_t v0, int64_t g0, int64_t n) {
    Span value(arena_.data() + v0, n), grad(arena_.data() + g0, n);
    absl::Status st = registry_->Rebind(id, &value.dl, &grad.dl);
    if (st.ok()) model_.params[id].value = {v0, v0 + n}, model_.params[id].grad = {g0, g0 + n};
    return st;
  }

  std::vector<float> arena_ = std::vector<float>(1 << 20);
  std::unique_ptr<Registry> registry_;
  Model model_;
};

constexpr int kMany = 2000;
constexpr int64_t kLen = 8;  // floats per tensor
constexpr int64_t kFar = 100000;  // free storage, far from every parameter

// Param i (named p<i>) at [2 i kLen, (2 i + 1) kLen), its grad right after:
// every tensor touches the next, none overlaps.
int64_t ValueAt(int i) { return 2 * i * kLen; }
int64_t GradAt(int i) { return (2 * i + 1) * kLen; }

TEST_F(RegistryTest, ManyAdjacentParamsThenDuplicatesAndOverlapsWithOlderOnes) {
  for (int i = 0; i < kMany; ++i) {
    if (i == 100) continue;  // a gap, filled later
    ASSERT_EQ(Register(absl::StrCat("p", i), ValueAt(i), GradAt(i), kLen), "") << i;
  }
  const size_t n = registry_->params().size();
  ASSERT_EQ(n, static_cast<size_t>(kMany - 1));
  // A name registered long ago.
  EXPECT_EQ(Register("p7", kFar, kFar + kLen, kLen),
            "param 'p7': a parameter with this name is registered");
  // The last float of p17's grad (not the most recent parameter) and p18's
  // value: p17's grad is named.
  EXPECT_EQ(Register("x", GradAt(17) + kLen - 1, kFar, kLen),
            "param 'x': its param storage overlaps the grad of param 'p17'");
  // The last float of p500's value and most of its grad, by the new grad.
  EXPECT_EQ(Register("x", kFar, ValueAt(500) + kLen - 1, kLen),
            "param 'x': its grad storage overlaps the param of param 'p500'");
  // The new grad over an earlier param's value, the new value clear.
  EXPECT_EQ(Register("x", kFar, ValueAt(3), kLen),
            "param 'x': its grad storage overlaps the param of param 'p3'");
  // A tensor holding p10 .. p20 whole: named by the earliest, p10's value.
  EXPECT_EQ(Register("x", ValueAt(10), kFar, 22 * kLen),
            "param 'x': its param storage overlaps the param of param 'p10'");
  // From the middle of p10's grad over p11 .. p20: p10's grad.
  EXPECT_EQ(Register("x", GradAt(10) + 3, kFar, 20 * kLen),
            "param 'x': its param storage overlaps the grad of param 'p10'");
  // A new grad holding p1500 .. p1599 whole, from the middle of p1499's
  // grad: p1499's grad.
  EXPECT_EQ(Register("x", kFar, GradAt(1499) + 1, 200 * kLen),
            "param 'x': its grad storage overlaps the grad of param 'p1499'");
  // Both tensors overlap: the earlier parameter (p5, met by the grad) first.
  EXPECT_EQ(Register("x", ValueAt(30), GradAt(5), kLen),
            "param 'x': its grad storage overlaps the grad of param 'p5'");
  // The new parameter's own two tensors overlap.
  EXPECT_EQ(Register("x", kFar, kFar + kLen, 2 * kLen), "param 'x': param and grad share storage");
  // Nothing was left behind by the refusals.
  EXPECT_EQ(registry_->params().size(), n);
  // The gap between p99's grad and p101's value, touching both, and a new
  // parameter touching the last one's grad.
  EXPECT_EQ(Register("p100", ValueAt(100), GradAt(100), kLen), "");
  EXPECT_EQ(Register("x", ValueAt(kMany), GradAt(kMany), kLen), "");
  // Empty tensors share no storage, wherever they point.
  EXPECT_EQ(Register("empty", ValueAt(40) + 1, ValueAt(40) + 1, 0), "");
  EXPECT_EQ(registry_->params().size(), n + 3);
}

// Parameters registered from the top of the arena down: the earliest
// parameter is the highest address, and is still the one named.
TEST_F(RegistryTest, NamesTheEarliestParameterNotTheLowestAddress) {
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(Register(absl::StrCat("p", i), ValueAt(99 - i), GradAt(99 - i), kLen), "");
  }
  // Over the slots of p60 .. p50 (slots 39 .. 49).
  EXPECT_EQ(Register("x", ValueAt(39), kFar, 11 * 2 * kLen),
            "param 'x': its param storage overlaps the param of param 'p50'");
  // The value meets p45's grad (slot 54) first and p44 (slot 55) after; the
  // grad p89 (slot 10) and p88: p44's value is named.
  EXPECT_EQ(Register("x", GradAt(54), ValueAt(10) + 1, 3 * kLen),
            "param 'x': its param storage overlaps the param of param 'p44'");
  // With the grad over p39 and p38 (slots 60 and 61), p38's value.
  EXPECT_EQ(Register("x", GradAt(54), ValueAt(60) + 1, 3 * kLen),
            "param 'x': its grad storage overlaps the param of param 'p38'");
}

// Before the first step a parameter may be rebound, into storage another one
// holds too (a rebinding is not compared with the other parameters): later
// registrations see every tensor as it is bound now.
TEST_F(RegistryTest, RegistrationSeesRebindings) {
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(Register(absl::StrCat("p", i), ValueAt(i), GradAt(i), kLen), "");
    Expect(absl::StrCat("p", i), ValueAt(i), GradAt(i), kLen);
  }
  // p2 leaves for fresh storage: its old storage is free, its new one not.
  ASSERT_TRUE(Rebind(2, ValueAt(300), GradAt(300), kLen).ok());
  EXPECT_EQ(Register("a", ValueAt(2), GradAt(2), kLen), "");
  EXPECT_EQ(Register("b", GradAt(300), kFar, kLen),
            "param 'b': its param storage overlaps the grad of param 'p2'");
  // p50's value onto p40's (allowed): both are named in registration order.
  ASSERT_TRUE(Rebind(50, ValueAt(40), GradAt(50), kLen).ok());
  EXPECT_EQ(Register("c", ValueAt(40) + 2, kFar, 2),
            "param 'c': its param storage overlaps the param of param 'p40'");
  // p40 leaves: p50 is still there.
  ASSERT_TRUE(Rebind(40, ValueAt(500), GradAt(500), kLen).ok());
  EXPECT_EQ(Register("c", ValueAt(40) + 2, kFar, 2),
            "param 'c': its param storage overlaps the param of param 'p50'");
  // p50 leaves too: the storage is free.
  ASSERT_TRUE(Rebind(50, ValueAt(600), GradAt(50), kLen).ok());
  EXPECT_EQ(Register("c", ValueAt(40), kFar, kLen), "");
  // Without a gradient (single process), the param's value is rebound and
  // its grad kept.
  Span moved(arena_.data() + ValueAt(700), kLen);
  ASSERT_TRUE(registry_->Rebind(60, &moved.dl, nullptr).ok());
  EXPECT_EQ(Register("d", ValueAt(60), kFar + kLen, kLen), "");
  EXPECT_EQ(Register("e", kFar + 2 * kLen, GradAt(60), kLen),
            "param 'e': its grad storage overlaps the grad of param 'p60'");
  EXPECT_EQ(Register("e", kFar + 2 * kLen, ValueAt(700), kLen),
            "param 'e': its grad storage overlaps the param of param 'p60'");
}

// Random parameters and rebindings over a small arena (many overlaps of every
// kind), each outcome against the model.
TEST_F(RegistryTest, MatchesTheModelOnRandomRegistrations) {
  std::mt19937 rng(7);
  const int64_t space = 6000;  // floats
  std::uniform_int_distribution<int64_t> at(0, space - 1), len(0, 40), name(0, 2999);
  int accepted = 0, refused = 0, rebound = 0;
  for (int k = 0; k < 3000; ++k) {
    if (k % 10 == 9 && !model_.params.empty()) {
      // A rebinding (param and grad apart, as Rebind requires).
      const int64_t id = rng() % model_.params.size();
      const int64_t n = model_.params[id].value.end - model_.params[id].value.begin;
      ASSERT_TRUE(Rebind(id, at(rng), 2 * space + at(rng), n).ok());
      ++rebound;
      continue;
    }
    const std::string who = absl::StrCat("n", name(rng));
    const int64_t n = len(rng), v0 = at(rng), g0 = at(rng) + (k % 3 == 0 ? space : 0);
    const std::string want = Expect(who, v0, g0, n);
    ASSERT_EQ(Register(who, v0, g0, n), want) << "registration " << k;
    ++(want.empty() ? accepted : refused);
    ASSERT_EQ(registry_->params().size(), model_.params.size());
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(rebound, 100);
}

// The process's cores are divided among the ranks of a world of more than
// one rank that live in it (in-process ranks); optimizers without such a
// world (e.g. one per param group of one rank, stepping one after another)
// each keep the whole share.
TEST(Registry, RanksOfAWorldDivideTheCoresOptimizersAloneDoNot) {
  ::unsetenv("MUON_CPU_THREADS");
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::unsetenv("OMP_NUM_THREADS");
  const int alone = cpu::ThreadsPerRankHere();
  std::unique_ptr<Registry> a = MakeRegistry(), b = MakeRegistry();
  EXPECT_EQ(cpu::ThreadsPerRankHere(), alone);
  absl::StatusOr<std::shared_ptr<InProcessWorld>> world = InProcessWorld::Create(2);
  ASSERT_TRUE(world.ok());
  std::vector<std::unique_ptr<Registry>> ranks;
  for (int r = 0; r < 2; ++r) {
    muon_comm_t table;
    ASSERT_TRUE(MakeInProcessComm(*world, {}, r, &table).ok());
    absl::StatusOr<std::shared_ptr<Comm>> comm = Comm::Create(table, "world");
    ASSERT_TRUE(comm.ok()) << comm.status();
    ranks.push_back(MakeRegistry());
    ASSERT_TRUE(ranks.back()->SetWorld(*comm).ok());
  }
  EXPECT_EQ(cpu::ThreadsPerRankHere(), std::max(1, alone / 2));
  ranks.clear();
  EXPECT_EQ(cpu::ThreadsPerRankHere(), alone);
}

// A float32 tensor of `shape` over `data` (NULL for an empty one).
struct Tensor {
  std::vector<int64_t> shape;
  DLTensor dl{};
  Tensor(std::vector<int64_t> s, float* data) : shape(std::move(s)) {
    dl.data = data;
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = {kDLFloat, 32, 1};
    dl.shape = shape.data();
  }
};

std::unique_ptr<Registry> RegistryWithAWorld() {
  std::unique_ptr<Registry> r = MakeRegistry();
  absl::StatusOr<std::shared_ptr<Comm>> world = Comm::Create(SelfCommTable(), "world");
  EXPECT_TRUE(world.ok()) << world.status();
  EXPECT_TRUE(r->SetWorld(*world).ok());
  return r;
}

// A declaration may ask for at most kMaxParamMatrices matrices with elements
// (refused at registration, naming the parameter, the shape and the cause),
// and for any number of empty ones (they cost nothing).
TEST(Registry, AParameterDeclaresAtMostTheCapOfMatricesWithElements) {
  const int64_t cap = kMaxParamMatrices;
  std::unique_ptr<Registry> r = MakeRegistry();
  Tensor empty({int64_t{1} << 32, 0, 3}, nullptr), empty_grad({int64_t{1} << 32, 0, 3}, nullptr);
  absl::StatusOr<int64_t> id = r->Register(&empty.dl, &empty_grad.dl, "empty", 2, nullptr, false);
  EXPECT_TRUE(id.ok()) << id.status();

  std::vector<float> value(cap + 1, 1.0f), grad(cap + 1, 0.5f);
  Tensor over({cap + 1, 1, 1}, value.data()), over_grad({cap + 1, 1, 1}, grad.data());
  id = r->Register(&over.dl, &over_grad.dl, "over", 2, nullptr, false);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("param 'over': shape [1048577, 1, 1] declares 1048577 "
                                       "matrices of 1 x 1, more than the 1048576"),
            std::string::npos)
      << id.status();
  EXPECT_EQ(r->params().size(), 1u);  // nothing half-registered
  Tensor at({cap, 1, 1}, value.data()), at_grad({cap, 1, 1}, grad.data());
  id = r->Register(&at.dl, &at_grad.dl, "at", 2, nullptr, false);
  EXPECT_TRUE(id.ok()) << id.status();
  // The same shape flattened is one matrix.
  std::vector<float> value2(cap + 1, 1.0f), grad2(cap + 1, 0.5f);
  Tensor flat2({cap + 1, 1, 1}, value2.data()), flat2_grad({cap + 1, 1, 1}, grad2.data());
  id = r->Register(&flat2.dl, &flat2_grad.dl, "flat", 1, nullptr, false);
  EXPECT_TRUE(id.ok()) << id.status();

  // A global shape is a declaration too, whatever this rank holds of it.
  std::unique_ptr<Registry> w = RegistryWithAWorld();
  DistSpec dist;
  dist.global_shape = {2 * cap, 2, 2};
  Placement flat;
  flat.kind = PlacementKind::kFlatRange;
  flat.group = 0;
  flat.start = 0;
  flat.length = 0;
  dist.placements = {flat};
  Tensor none({0}, nullptr), none_grad({0}, nullptr);
  id = w->Register(&none.dl, &none_grad.dl, "declared", 2, &dist, false);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("param 'declared': shape [2097152, 2, 2] declares "
                                       "2097152 matrices of 2 x 2"),
            std::string::npos)
      << id.status();
  dist.global_shape = {int64_t{1} << 40, 2, 0};
  id = w->Register(&none.dl, &none_grad.dl, "declared", 2, &dist, false);
  EXPECT_TRUE(id.ok()) << id.status();
}

// A custom-path declaration is bounded by what its owner can hold (an fp32
// copy and the Newton-Schulz workspace, counted in 64 bits), and is at least
// this rank's piece.
TEST(Registry, ACustomPathMatrixIsBoundedByWhatItsOwnerCanHold) {
  auto path = std::make_shared<CustomPath>();
  path->assign = [](int, std::string*) { return 0; };
  path->gather = [](const float*, int64_t, int, const float**, int64_t*, int64_t*, void*) {
    return absl::OkStatus();
  };
  path->redistribute = [](const float*, int64_t, int64_t, int, float*, int64_t, void*) {
    return absl::OkStatus();
  };
  std::vector<float> value(8), grad(8);
  Tensor v({2, 4}, value.data()), g({2, 4}, grad.data());
  std::unique_ptr<Registry> r = RegistryWithAWorld();
  const int64_t max = std::numeric_limits<int64_t>::max();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {max, 2}, {max / 4, 4}, {kMaxCustomElements + 1, 1}, {kMaxCustomElements / 2 + 1, 2}}) {
    absl::StatusOr<int64_t> id = r->RegisterCustom(&v.dl, &g.dl, "c", rows, cols, path, false);
    ASSERT_FALSE(id.ok()) << rows << " x " << cols;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(absl::StrCat("param 'c': a ", rows, " x ", cols,
                                                      " custom-path matrix has more than the ",
                                                      kMaxCustomElements, " elements")),
              std::string::npos)
        << id.status();
  }
  absl::StatusOr<int64_t> id = r->RegisterCustom(&v.dl, &g.dl, "c", 2, 3, path, false);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("param 'c': the local tensor has 8 elements, more than "
                                       "the 2 x 3 matrix it is a piece of"),
            std::string::npos)
      << id.status();
  EXPECT_TRUE(r->params().empty());
  // The largest declaration passes registration (its owner's allocation, at
  // the first step, goes through the device).
  id = r->RegisterCustom(&v.dl, &g.dl, "c", kMaxCustomElements, 1, path, false);
  EXPECT_TRUE(id.ok()) << id.status();
}

}  // namespace
}  // namespace muon
