#include "muon/engine/optimizer.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/testing/reference_ns.h"
#include "muon/comm/self_comm.h"
#include "muon/common/dtype.h"

namespace muon {
namespace {

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// A host-owned tensor of any stored dtype. Values go in and out as float.
class HostTensor {
 public:
  HostTensor(std::vector<int64_t> shape, DType dtype = DType::kF32)
      : shape_(std::move(shape)), dtype_(dtype) {
    bytes_.assign(static_cast<size_t>(numel()) * SizeOf(dtype_), 0);
  }
  HostTensor(const HostTensor&) = default;
  HostTensor& operator=(const HostTensor&) = default;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  float at(int64_t i) const { return LoadAsFloat(dtype_, bytes_.data(), i); }
  void set(int64_t i, float v) { StoreFromFloat(dtype_, bytes_.data(), i, v); }
  void* data() { return bytes_.data(); }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

  // Fills with N(0, scale^2) values drawn from `seed`.
  void FillRandom(uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, scale);
    for (int64_t i = 0; i < numel(); ++i) set(i, d(rng));
  }

  DLTensor dl() {
    DLTensor t{};
    t.data = bytes_.data();
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape_.size());
    t.dtype = ToDLDataType(dtype_);
    t.shape = shape_.data();
    return t;
  }

 private:
  std::vector<int64_t> shape_;
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

bool SameBytes(const HostTensor& a, const HostTensor& b) {
  return a.bytes().size() == b.bytes().size() &&
         std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()) == 0;
}

std::unique_ptr<Optimizer> MakeOptimizer(const Options& o = Options()) {
  auto created = Optimizer::Create(o);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(created).value() : nullptr;
}

absl::StatusOr<int64_t> Register(Optimizer* opt, HostTensor* p, HostTensor* g,
                                 const std::string& name = "", int view = 0) {
  DLTensor pt = p->dl(), gt = g->dl();
  return opt->RegisterParam(&pt, &gt, name, view);
}

std::vector<unsigned char> SaveBlob(const Optimizer& opt) {
  std::vector<unsigned char> blob(opt.StateBlobSize());
  const absl::Status saved = opt.SaveState(blob.data());
  EXPECT_TRUE(saved.ok()) << saved;
  return blob;
}

// ---------------------------------------------------------------------------
// Independent reference: the update of the design notes in double, with naive
// loops (momentum, Newton-Schulz straight from the definition, decay, update).
// ---------------------------------------------------------------------------

struct ReferenceParam {
  int64_t rows, cols;
  std::vector<double> buf;  // momentum, starts at zero
};

// One reference step; returns the new parameter values from `p`.
std::vector<double> ReferenceStep(ReferenceParam* r, const std::vector<double>& p,
                                  const std::vector<double>& g, const Options& o,
                                  double adjusted_lr) {
  const double mu = o.momentum;
  std::vector<double> u(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    r->buf[i] = r->buf[i] + (1 - mu) * (g[i] - r->buf[i]);
    u[i] = o.nesterov ? g[i] + mu * (r->buf[i] - g[i]) : r->buf[i];
  }
  const std::vector<double> ortho = ReferenceNewtonSchulz(u, r->rows, r->cols, o.ns);
  std::vector<double> out(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    out[i] = p[i] * (1 - o.lr * o.weight_decay) - adjusted_lr * ortho[i];
  }
  return out;
}

std::vector<double> AsDouble(const HostTensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.at(i);
  return v;
}

// ---------------------------------------------------------------------------
// Creation and hyper-parameters
// ---------------------------------------------------------------------------

TEST(Optimizer, CreateRejectsBadOptions) {
  Options o;
  o.momentum = 1.0;
  auto created = Optimizer::Create(o);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(created.status(), "momentum")) << created.status();

  Options n;
  n.ns.steps = 100;
  created = Optimizer::Create(n);
  ASSERT_FALSE(created.ok());
  EXPECT_TRUE(Mentions(created.status(), "ns_steps")) << created.status();
}

TEST(Optimizer, SettersValidateAndKeepTheOldValueOnError) {
  auto opt = MakeOptimizer();
  ASSERT_TRUE(opt->SetLr(0.5).ok());
  EXPECT_EQ(opt->options().lr, 0.5);
  absl::Status s = opt->SetLr(-1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "lr")) << s;
  EXPECT_EQ(opt->options().lr, 0.5);
  s = opt->SetLr(std::nan(""));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(opt->options().lr, 0.5);

  ASSERT_TRUE(opt->SetWeightDecay(0.25).ok());
  s = opt->SetWeightDecay(-0.1);
  EXPECT_TRUE(Mentions(s, "weight_decay")) << s;
  EXPECT_EQ(opt->options().weight_decay, 0.25);

  ASSERT_TRUE(opt->SetMomentum(0.5).ok());
  s = opt->SetMomentum(1.0);
  EXPECT_TRUE(Mentions(s, "momentum")) << s;
  EXPECT_EQ(opt->options().momentum, 0.5);
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

TEST(Optimizer, RegisterAssignsIdsAndDefaultNames) {
  auto opt = MakeOptimizer();
  HostTensor p0({4, 6}), g0({4, 6}), p1({6, 4}), g1({6, 4}), p2({3, 3}), g2({3, 3});
  auto id0 = Register(opt.get(), &p0, &g0);
  auto id1 = Register(opt.get(), &p1, &g1, "named");
  auto id2 = Register(opt.get(), &p2, &g2);
  ASSERT_TRUE(id0.ok() && id1.ok() && id2.ok());
  EXPECT_EQ(*id0, 0);
  EXPECT_EQ(*id1, 1);
  EXPECT_EQ(*id2, 2);
  EXPECT_EQ(opt->num_params(), 3u);
  EXPECT_EQ((*opt->GetParam(0))->name, "param0");
  EXPECT_EQ((*opt->GetParam(1))->name, "named");
  EXPECT_EQ((*opt->GetParam(2))->name, "param2");
}

TEST(Optimizer, DuplicateNamesAreRefused) {
  auto opt = MakeOptimizer();
  HostTensor p0({4, 6}), g0({4, 6}), p1({4, 6}), g1({4, 6});
  ASSERT_TRUE(Register(opt.get(), &p0, &g0, "layer.w").ok());
  auto dup = Register(opt.get(), &p1, &g1, "layer.w");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Mentions(dup.status(), "'layer.w'")) << dup.status();
  EXPECT_EQ(opt->num_params(), 1u);

  // A default name collides with an explicit one the same way.
  auto opt2 = MakeOptimizer();
  ASSERT_TRUE(Register(opt2.get(), &p0, &g0, "param1").ok());
  auto dflt = Register(opt2.get(), &p1, &g1);
  ASSERT_FALSE(dflt.ok());
  EXPECT_EQ(dflt.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Mentions(dflt.status(), "'param1'")) << dflt.status();
}

TEST(Optimizer, SameStorageTwiceIsRefused) {
  auto opt = MakeOptimizer();
  HostTensor p({4, 6}), g({4, 6}), g2({4, 6});
  ASSERT_TRUE(Register(opt.get(), &p, &g, "first").ok());
  auto again = Register(opt.get(), &p, &g2, "second");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(again.status(), "'second'")) << again.status();
  EXPECT_TRUE(Mentions(again.status(), "'first'")) << again.status();
  EXPECT_TRUE(Mentions(again.status(), "overlaps the param")) << again.status();
  EXPECT_EQ(opt->num_params(), 1u);
}

TEST(Optimizer, OverlappingStorageIsRefused) {
  auto opt = MakeOptimizer();
  HostTensor big({8, 6}), g({4, 6}), other_p({4, 6}), other_g({4, 6});
  int64_t half[2] = {4, 6};
  // A view of rows 2..5 of `big` overlaps a registered view of rows 0..3.
  DLTensor top = big.dl();
  top.shape = half;
  DLTensor gt = g.dl();
  ASSERT_TRUE(opt->RegisterParam(&top, &gt, "top", 0).ok());
  DLTensor mid = big.dl();
  mid.shape = half;
  mid.byte_offset = 2 * 6 * sizeof(float);
  DLTensor og = other_g.dl();
  auto r = opt->RegisterParam(&mid, &og, "mid", 0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Mentions(r.status(), "'mid'")) << r.status();
  EXPECT_TRUE(Mentions(r.status(), "'top'")) << r.status();

  // A grad aliasing another parameter's grad is refused too.
  DLTensor op = other_p.dl();
  DLTensor shared_grad = g.dl();
  auto r2 = opt->RegisterParam(&op, &shared_grad, "alias", 0);
  ASSERT_FALSE(r2.ok());
  EXPECT_TRUE(Mentions(r2.status(), "grad storage overlaps the grad of param 'top'")) << r2.status();
  EXPECT_EQ(opt->num_params(), 1u);
}

TEST(Optimizer, ParamAndGradSharingStorageIsRefused) {
  auto opt = MakeOptimizer();
  HostTensor p({4, 6});
  DLTensor a = p.dl(), b = p.dl();
  auto r = opt->RegisterParam(&a, &b, "self", 0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Mentions(r.status(), "param and grad share storage")) << r.status();
}

TEST(Optimizer, FailedRegistrationLeavesNothingBehind) {
  auto opt = MakeOptimizer();
  HostTensor p({4, 6}), g({4, 6});
  ASSERT_TRUE(Register(opt.get(), &p, &g, "ok").ok());

  HostTensor vec({8}), vec_g({8});
  HostTensor cube({2, 3, 4}), cube_g({2, 3, 4});
  HostTensor w({5, 7}), w_t({7, 5}), w_bf16({5, 7}, DType::kBF16);
  struct Case {
    const char* what;
    HostTensor* p;
    HostTensor* g;
    int view;
    const char* expect;
  };
  const Case cases[] = {
      {"1-D", &vec, &vec_g, 0, "AdamW"},
      {"3-D without a view", &cube, &cube_g, 0, "matrix view"},
      {"shape mismatch", &w, &w_t, 0, "grad shape"},
      {"dtype mismatch", &w, &w_bf16, 0, "grad dtype"},
      {"unknown view", &w, &w, 7, "matrix_view"},
      {"batched view on 2-D", &w, &w, 2, "at least 3"},
  };
  for (const Case& c : cases) {
    auto id = Register(opt.get(), c.p, c.g, "bad", c.view);
    ASSERT_FALSE(id.ok()) << c.what;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(Mentions(id.status(), "'bad'")) << c.what << ": " << id.status();
    EXPECT_TRUE(Mentions(id.status(), c.expect)) << c.what << ": " << id.status();
    EXPECT_EQ(opt->num_params(), 1u) << c.what;
  }
  DLTensor wt = w.dl();
  auto null_grad = opt->RegisterParam(&wt, nullptr, "bad", 0);
  EXPECT_FALSE(null_grad.ok());
  EXPECT_EQ(opt->num_params(), 1u);

  // The failed attempts used neither an id nor the name.
  HostTensor w_g({5, 7});
  auto id = Register(opt.get(), &w, &w_g, "bad");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 1);
  EXPECT_EQ(opt->num_params(), 2u);
}

// Found by fuzz/api_sequence_fuzzer: registration computed every run of the
// piece a (wrong, huge) global shape gives this rank before comparing it with
// the local tensor, for minutes (or until memory ran out).
TEST(Optimizer, AGlobalShapeTheLocalTensorDoesNotMatchIsRefusedAtOnce) {
  auto opt = MakeOptimizer();
  absl::StatusOr<std::shared_ptr<Comm>> world = Comm::Create(SelfCommTable(), "world");
  ASSERT_TRUE(world.ok()) << world.status();
  ASSERT_TRUE(opt->SetWorld(*world).ok());
  HostTensor p({3, 4}), g({3, 4});
  DLTensor pt = p.dl(), gt = g.dl();
  DistSpec dist;
  dist.global_shape = {int64_t{1} << 40, 4};
  Placement shard;
  shard.kind = PlacementKind::kShard;
  shard.dim = 1;
  shard.split = ShardSplit::kChunk;
  dist.placements = {shard};
  absl::StatusOr<int64_t> id = opt->RegisterParam(&pt, &gt, "w", 0, &dist);
  ASSERT_FALSE(id.ok());
  EXPECT_TRUE(Mentions(id.status(), "the local tensor has 12 elements (shape [3, 4]) but its "
                                    "layout gives this rank 4398046511104"))
      << id.status();
  EXPECT_EQ(opt->num_params(), 0u);
}

TEST(Optimizer, RegistrationClosesAtTheFirstStep) {
  auto opt = MakeOptimizer();
  HostTensor p({4, 6}), g({4, 6}), q({4, 6}), qg({4, 6});
  ASSERT_TRUE(Register(opt.get(), &p, &g, "w").ok());
  ASSERT_TRUE(opt->Step().ok());
  auto late = Register(opt.get(), &q, &qg, "late");
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(late.status(), "'late'")) << late.status();
  EXPECT_TRUE(Mentions(late.status(), "first step")) << late.status();
  EXPECT_EQ(opt->num_params(), 1u);
}

TEST(Optimizer, StepWithoutParamsFails) {
  auto opt = MakeOptimizer();
  absl::Status s = opt->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(s, "no parameters")) << s;
  EXPECT_EQ(opt->step_count(), 0);
  // Registration is still open after the failed step.
  HostTensor p({2, 2}), g({2, 2});
  EXPECT_TRUE(Register(opt.get(), &p, &g).ok());
  EXPECT_TRUE(opt->Step().ok());
  EXPECT_EQ(opt->step_count(), 1);
}

// ---------------------------------------------------------------------------
// The update
// ---------------------------------------------------------------------------

struct UpdateCase {
  AdjustLr adjust;
  bool nesterov;
};

class StepMatchesReference : public ::testing::TestWithParam<UpdateCase> {};

TEST_P(StepMatchesReference, WideAndTallFp32) {
  Options o;
  o.lr = 0.05;
  o.weight_decay = 0.3;
  o.momentum = 0.9;
  o.nesterov = GetParam().nesterov;
  o.adjust_lr = GetParam().adjust;
  o.ns.dtype = NsDtype::kFP32;
  auto opt = MakeOptimizer(o);

  struct Shape {
    int64_t rows, cols;
    double adjusted;  // computed here from the formulas of the header
  };
  const double lr = o.lr;
  auto adjusted = [&](int64_t a, int64_t b) {
    switch (o.adjust_lr) {
      case AdjustLr::kOriginal:
        return a > b ? lr * std::sqrt(double(a) / double(b)) : lr;
      case AdjustLr::kMatchRmsAdamW:
        return lr * 0.2 * std::sqrt(double(std::max(a, b)));
      default:
        return lr;
    }
  };
  const std::vector<Shape> shapes = {
      {6, 20, adjusted(6, 20)}, {24, 6, adjusted(24, 6)}, {9, 9, adjusted(9, 9)}};
  std::vector<HostTensor> params, grads;
  std::vector<ReferenceParam> refs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    params.emplace_back(std::vector<int64_t>{shapes[k].rows, shapes[k].cols});
    grads.emplace_back(std::vector<int64_t>{shapes[k].rows, shapes[k].cols});
    params.back().FillRandom(100 + k);
    refs.push_back({shapes[k].rows, shapes[k].cols,
                    std::vector<double>(shapes[k].rows * shapes[k].cols, 0.0)});
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    ASSERT_TRUE(Register(opt.get(), &params[k], &grads[k]).ok());
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<double>> want;
    for (size_t k = 0; k < shapes.size(); ++k) {
      grads[k].FillRandom(1000 * step + k, 0.1f);
      want.push_back(
          ReferenceStep(&refs[k], AsDouble(params[k]), AsDouble(grads[k]), o, shapes[k].adjusted));
    }
    ASSERT_TRUE(opt->Step().ok());
    for (size_t k = 0; k < shapes.size(); ++k) {
      for (int64_t i = 0; i < params[k].numel(); ++i) {
        ASSERT_NEAR(params[k].at(i), want[k][i], 2e-6)
            << "step " << step << " param " << k << " element " << i;
      }
    }
  }
  EXPECT_EQ(opt->step_count(), 3);
}

INSTANTIATE_TEST_SUITE_P(Modes, StepMatchesReference,
                         ::testing::Values(UpdateCase{AdjustLr::kOriginal, true},
                                           UpdateCase{AdjustLr::kOriginal, false},
                                           UpdateCase{AdjustLr::kMatchRmsAdamW, true},
                                           UpdateCase{AdjustLr::kNone, true}));

TEST(Optimizer, DecayUsesTheUnadjustedLr) {
  // With a zero gradient the momentum and the orthogonalized update are zero:
  // only the decay acts. The matrix is tall (16 x 4), so the adjusted lr is
  // twice the lr; the decay must use the plain lr.
  Options o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  auto opt = MakeOptimizer(o);
  HostTensor p({16, 4}), g({16, 4});
  p.FillRandom(7);
  const HostTensor before = p;
  ASSERT_TRUE(Register(opt.get(), &p, &g).ok());
  ASSERT_TRUE(opt->Step().ok());
  for (int64_t i = 0; i < p.numel(); ++i) {
    EXPECT_FLOAT_EQ(p.at(i), before.at(i) * 0.95f) << i;
  }
}

TEST(Optimizer, MomentumBufferAfterOneStep) {
  // From a zero buffer: B = (1 - mu) g.
  Options o;
  o.momentum = 0.8;
  auto opt = MakeOptimizer(o);
  HostTensor p({5, 8}), g({5, 8});
  g.FillRandom(3);
  ASSERT_TRUE(Register(opt.get(), &p, &g).ok());
  ASSERT_TRUE(opt->Step().ok());
  HostTensor state({5, 8});
  DLTensor st = state.dl();
  ASSERT_TRUE(opt->CopyStateOut(0, &st).ok());
  for (int64_t i = 0; i < g.numel(); ++i) {
    EXPECT_NEAR(state.at(i), 0.2 * g.at(i), 1e-6) << i;
  }
}

TEST(Optimizer, NewLrAppliesFromTheNextStep) {
  auto opt = MakeOptimizer();
  HostTensor p({8, 12}), g({8, 12});
  p.FillRandom(1);
  g.FillRandom(2);
  ASSERT_TRUE(Register(opt.get(), &p, &g).ok());
  HostTensor before = p;
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_FALSE(SameBytes(p, before));

  // lr = 0: no decay and no update, whatever the gradient and momentum.
  ASSERT_TRUE(opt->SetLr(0).ok());
  before = p;
  g.FillRandom(3);
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_TRUE(SameBytes(p, before));
  EXPECT_EQ(opt->step_count(), 2);

  ASSERT_TRUE(opt->SetLr(0.01).ok());
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_FALSE(SameBytes(p, before));
}

TEST(Optimizer, ParamsOfEveryDtypeMoveAndStayFinite) {
  // lr large enough that the update is visible in bf16 (8 significant bits).
  Options o;
  o.lr = 0.1;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto opt = MakeOptimizer(o);
    HostTensor p({16, 32}, dt), g({16, 32}, dt);
    p.FillRandom(5);
    g.FillRandom(6);
    const HostTensor before = p;
    ASSERT_TRUE(Register(opt.get(), &p, &g).ok());
    ASSERT_TRUE(opt->Step().ok());
    int changed = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(p.at(i)));
      changed += p.at(i) != before.at(i);
    }
    EXPECT_GT(changed, p.numel() / 2) << DTypeName(dt);
  }
}

TEST(Optimizer, EmptyMatricesStepAlongsideOthers) {
  // A (0, 4) and a (4, 0) parameter hold no elements; they register, step and
  // leave the real matrix's update alone.
  HostTensor e0({0, 4}), e0g({0, 4}), e1({4, 0}), e1g({4, 0});
  HostTensor w({3, 4}), wg({3, 4}), w_alone({3, 4}), wg_alone({3, 4});
  w.FillRandom(1);
  w_alone = w;
  wg.FillRandom(2);
  wg_alone = wg;
  auto with_empty = MakeOptimizer(), alone = MakeOptimizer();
  ASSERT_TRUE(Register(with_empty.get(), &e0, &e0g, "e0").ok());
  ASSERT_TRUE(Register(with_empty.get(), &w, &wg, "w").ok());
  ASSERT_TRUE(Register(with_empty.get(), &e1, &e1g, "e1").ok());
  ASSERT_TRUE(Register(alone.get(), &w_alone, &wg_alone, "w").ok());
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(with_empty->Step().ok());
    ASSERT_TRUE(alone->Step().ok());
  }
  EXPECT_TRUE(SameBytes(w, w_alone));
  const std::vector<unsigned char> blob = SaveBlob(*with_empty);
  EXPECT_TRUE(with_empty->LoadState(blob.data(), blob.size()).ok());
}

// ---------------------------------------------------------------------------
// Matrix views
// ---------------------------------------------------------------------------

// Runs `steps` steps over one registration each and returns nothing; the
// caller compares the parameters. Gradients are refreshed before every step
// by `fill(step)`.
template <typename Fill>
void RunSteps(Optimizer* opt, int steps, Fill fill) {
  for (int s = 0; s < steps; ++s) {
    fill(s);
    ASSERT_TRUE(opt->Step().ok());
  }
}

TEST(MatrixView, FlattenTrailingEqualsTheTwoDMatrix) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    // (6, 2, 2, 3) seen as (6, 12); and a tall (20, 3, 1) seen as (20, 3).
    for (auto shape : {std::vector<int64_t>{6, 2, 2, 3}, std::vector<int64_t>{20, 3, 1}}) {
      int64_t cols = 1;
      for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
      HostTensor p4(shape, dt), g4(shape, dt);
      HostTensor p2({shape[0], cols}, dt), g2({shape[0], cols}, dt);
      p4.FillRandom(11);
      p2.FillRandom(11);
      ASSERT_TRUE(SameBytes(p4, p2));
      const HostTensor initial = p2;

      auto a = MakeOptimizer(), b = MakeOptimizer();
      ASSERT_TRUE(Register(a.get(), &p4, &g4, "conv", 1).ok());
      ASSERT_TRUE(Register(b.get(), &p2, &g2, "conv", 0).ok());
      RunSteps(a.get(), 4, [&](int s) { g4.FillRandom(50 + s); });
      RunSteps(b.get(), 4, [&](int s) { g2.FillRandom(50 + s); });
      EXPECT_TRUE(SameBytes(p4, p2)) << DTypeName(dt) << " shape rank " << shape.size();
      EXPECT_FALSE(SameBytes(p2, initial));
    }
  }
}

TEST(MatrixView, BatchedLeadingEqualsSeparateMatrices) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    // 3 wide experts (3, 4, 2, 3) -> 3 x (4, 6), and 2 tall ones (2, 10, 3).
    for (auto shape : {std::vector<int64_t>{3, 4, 2, 3}, std::vector<int64_t>{2, 10, 3}}) {
      const int64_t n = shape[0], rows = shape[1];
      int64_t cols = 1;
      for (size_t i = 2; i < shape.size(); ++i) cols *= shape[i];
      const int64_t per = rows * cols;

      HostTensor p(shape, dt), g(shape, dt);
      p.FillRandom(21);
      auto batched = MakeOptimizer();
      ASSERT_TRUE(Register(batched.get(), &p, &g, "experts", 2).ok());

      // The same matrices, each in an optimizer of its own.
      std::vector<HostTensor> ps, gs;
      for (int64_t k = 0; k < n; ++k) {
        ps.emplace_back(std::vector<int64_t>{rows, cols}, dt);
        gs.emplace_back(std::vector<int64_t>{rows, cols}, dt);
      }
      std::vector<std::unique_ptr<Optimizer>> alone;
      for (int64_t k = 0; k < n; ++k) {
        for (int64_t i = 0; i < per; ++i) ps[k].set(i, p.at(k * per + i));
        alone.push_back(MakeOptimizer());
        ASSERT_TRUE(Register(alone.back().get(), &ps[k], &gs[k], "expert").ok());
      }
      for (int s = 0; s < 4; ++s) {
        g.FillRandom(70 + s);
        for (int64_t k = 0; k < n; ++k) {
          for (int64_t i = 0; i < per; ++i) gs[k].set(i, g.at(k * per + i));
          ASSERT_TRUE(alone[k]->Step().ok());
        }
        ASSERT_TRUE(batched->Step().ok());
      }
      for (int64_t k = 0; k < n; ++k) {
        ASSERT_EQ(0, std::memcmp(static_cast<unsigned char*>(p.data()) + k * per * SizeOf(dt),
                                 ps[k].data(), per * SizeOf(dt)))
            << DTypeName(dt) << " matrix " << k;
      }
    }
  }
}

TEST(MatrixView, SameShapeParamsBatchedTogetherEqualAlone) {
  // Two same-shape matrices in one optimizer are orthogonalized in one batch;
  // the result must not depend on that.
  HostTensor a({8, 16}), ag({8, 16}), b({8, 16}), bg({8, 16});
  HostTensor a1({8, 16}), a1g({8, 16}), b1({8, 16}), b1g({8, 16});
  a.FillRandom(1);
  b.FillRandom(2);
  a1 = a;
  b1 = b;
  auto both = MakeOptimizer(), only_a = MakeOptimizer(), only_b = MakeOptimizer();
  ASSERT_TRUE(Register(both.get(), &a, &ag, "a").ok());
  ASSERT_TRUE(Register(both.get(), &b, &bg, "b").ok());
  ASSERT_TRUE(Register(only_a.get(), &a1, &a1g, "a").ok());
  ASSERT_TRUE(Register(only_b.get(), &b1, &b1g, "b").ok());
  for (int s = 0; s < 3; ++s) {
    ag.FillRandom(10 + s);
    bg.FillRandom(20 + s);
    a1g.FillRandom(10 + s);
    b1g.FillRandom(20 + s);
    ASSERT_TRUE(both->Step().ok());
    ASSERT_TRUE(only_a->Step().ok());
    ASSERT_TRUE(only_b->Step().ok());
  }
  EXPECT_TRUE(SameBytes(a, a1));
  EXPECT_TRUE(SameBytes(b, b1));
}

// ---------------------------------------------------------------------------
// State tensors
// ---------------------------------------------------------------------------

TEST(State, CopyOutAndInChecksIdShapeAndDtype) {
  Options o;
  auto opt = MakeOptimizer(o);
  HostTensor p({4, 6}, DType::kBF16), g({4, 6}, DType::kBF16);
  ASSERT_TRUE(Register(opt.get(), &p, &g, "w").ok());

  HostTensor good({4, 6}, DType::kBF16), wrong_shape({6, 4}, DType::kBF16),
      wrong_dtype({4, 6}, DType::kF32);
  DLTensor gt = good.dl(), ws = wrong_shape.dl(), wd = wrong_dtype.dl();

  auto missing = opt->CopyStateOut(1, &gt);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Mentions(missing, "param_id 1")) << missing;
  EXPECT_EQ(opt->CopyStateIn(-1, &gt).code(), absl::StatusCode::kNotFound);

  absl::Status s = opt->CopyStateOut(0, &ws);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "'w'")) << s;
  EXPECT_TRUE(Mentions(s, "shape")) << s;
  s = opt->CopyStateIn(0, &wd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "dtype float32")) << s;
  EXPECT_TRUE(Mentions(s, "bfloat16")) << s;

  good.FillRandom(9);
  ASSERT_TRUE(opt->CopyStateIn(0, &gt).ok());
  HostTensor back({4, 6}, DType::kBF16);
  DLTensor bt = back.dl();
  ASSERT_TRUE(opt->CopyStateOut(0, &bt).ok());
  EXPECT_TRUE(SameBytes(good, back));
}

TEST(State, SetStateChangesTheNextStep) {
  // With momentum 0.5, no Nesterov and a zero gradient, the step uses
  // U = 0.5 * B: a loaded buffer must move the parameter, a zero one not.
  Options o;
  o.momentum = 0.5;
  o.nesterov = false;
  o.weight_decay = 0;
  auto opt = MakeOptimizer(o);
  HostTensor p({4, 4}), g({4, 4});
  ASSERT_TRUE(Register(opt.get(), &p, &g).ok());
  ASSERT_TRUE(opt->Step().ok());
  for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(p.at(i), 0.f);
  HostTensor buf({4, 4});
  buf.FillRandom(4);
  DLTensor bt = buf.dl();
  ASSERT_TRUE(opt->CopyStateIn(0, &bt).ok());
  ASSERT_TRUE(opt->Step().ok());
  int moved = 0;
  for (int64_t i = 0; i < p.numel(); ++i) moved += p.at(i) != 0.f;
  EXPECT_GT(moved, 8);
}

// ---------------------------------------------------------------------------
// State blob
// ---------------------------------------------------------------------------

// Two parameters: "embed.w" fp32 (4, 6) and "experts" bf16 (2, 3, 5) batched.
struct Model {
  explicit Model(const Options& o = Options(), bool swapped = false,
                 std::vector<int64_t> first_shape = {4, 6})
      : a(first_shape), ag(first_shape), b({2, 3, 5}, DType::kBF16), bg({2, 3, 5}, DType::kBF16) {
    opt = MakeOptimizer(o);
    a.FillRandom(1);
    b.FillRandom(2);
    if (swapped) {
      EXPECT_TRUE(Register(opt.get(), &b, &bg, "experts", 2).ok());
      EXPECT_TRUE(Register(opt.get(), &a, &ag, "embed.w").ok());
    } else {
      EXPECT_TRUE(Register(opt.get(), &a, &ag, "embed.w").ok());
      EXPECT_TRUE(Register(opt.get(), &b, &bg, "experts", 2).ok());
    }
  }
  void Steps(int n, uint32_t seed) {
    for (int s = 0; s < n; ++s) {
      ag.FillRandom(seed + 2 * s);
      bg.FillRandom(seed + 2 * s + 1);
      ASSERT_TRUE(opt->Step().ok());
    }
  }
  HostTensor a, ag, b, bg;
  std::unique_ptr<Optimizer> opt;
};

TEST(StateBlob, SizeFollowsTheDocumentedLayout) {
  Model m;
  // header 8 + 4 + 4 + 8 + 8; per param (format 2): 4 + name + 4 (dtype, view, kind, 0)
  // + 4 + 8 ndim (local) + 4 + 8 ndim (global) + 8 + 16 (one run) + 8 + bytes.
  const size_t want = 32 + (4 + 7 + 4 + 4 + 8 * 2 + 4 + 8 * 2 + 8 + 16 + 8 + 24 * 4) +
                      (4 + 7 + 4 + 4 + 8 * 3 + 4 + 8 * 3 + 8 + 16 + 8 + 30 * 2);
  EXPECT_EQ(m.opt->StateBlobSize(), want);
}

TEST(StateBlob, RoundTrip) {
  Model src;
  src.Steps(3, 100);
  const std::vector<unsigned char> blob = SaveBlob(*src.opt);

  Model dst;
  ASSERT_TRUE(dst.opt->LoadState(blob.data(), blob.size()).ok());
  EXPECT_EQ(dst.opt->step_count(), 3);
  EXPECT_EQ(SaveBlob(*dst.opt), blob);
  for (int64_t id : {0, 1}) {
    const Param* ps = *src.opt->GetParam(id);
    const Param* pd = *dst.opt->GetParam(id);
    ASSERT_EQ(ps->momentum.size(), pd->momentum.size()) << id;
    EXPECT_EQ(0, std::memcmp(ps->momentum.data(), pd->momentum.data(), ps->momentum.size())) << id;
  }
  // The state is not trivially zero.
  const Param* p0 = *src.opt->GetParam(0);
  const auto* m0 = p0->momentum.as<unsigned char>();
  EXPECT_TRUE(std::any_of(m0, m0 + p0->momentum.size(), [](unsigned char c) { return c != 0; }));
}

Options NorMuonOptions() {
  Options o;
  o.normuon = true;
  o.normuon_beta2 = 0.8;
  return o;
}

// NorMuon's moments travel in the blob (format 3): a blob loaded after the
// first step (the setup's moments overwritten) and one loaded before it
// (handed to the owner at setup) both continue bit for bit.
TEST(StateBlob, NorMuonMomentsResumeBitForBit) {
  Model src(NorMuonOptions());
  src.Steps(3, 100);
  const std::vector<unsigned char> blob = SaveBlob(*src.opt);
  uint32_t format = 0;
  std::memcpy(&format, blob.data() + 8, 4);
  EXPECT_EQ(format, 3u);
  const HostTensor a = src.a, b = src.b;
  src.Steps(2, 200);

  Model later(NorMuonOptions());  // stepped, then restored
  later.Steps(1, 7);
  ASSERT_TRUE(later.opt->LoadState(blob.data(), blob.size()).ok());
  Model fresh(NorMuonOptions());  // restored before its first step
  ASSERT_TRUE(fresh.opt->LoadState(blob.data(), blob.size()).ok());
  EXPECT_EQ(SaveBlob(*fresh.opt), blob);  // held, not yet owned, and saved again alike
  for (Model* m : {&later, &fresh}) {
    std::memcpy(m->a.data(), a.bytes().data(), a.bytes().size());  // the values saved with it
    std::memcpy(m->b.data(), b.bytes().data(), b.bytes().size());
    m->Steps(2, 200);
    EXPECT_TRUE(SameBytes(m->a, src.a));
    EXPECT_TRUE(SameBytes(m->b, src.b));
  }
  // Without the moments (a plain Muon blob, format 2) they start at zero:
  // the same momentum, another update.
  Model plain;
  plain.Steps(3, 100);
  const std::vector<unsigned char> muon_blob = SaveBlob(*plain.opt);
  Model zeroed(NorMuonOptions());
  ASSERT_TRUE(zeroed.opt->LoadState(muon_blob.data(), muon_blob.size()).ok());
  std::memcpy(zeroed.a.data(), a.bytes().data(), a.bytes().size());
  std::memcpy(zeroed.b.data(), b.bytes().data(), b.bytes().size());
  zeroed.Steps(2, 200);
  EXPECT_FALSE(SameBytes(zeroed.a, src.a));
}

// A tensor's DLTensor, kept alive for the call.
struct Dl {
  explicit Dl(HostTensor& t) : dl(t.dl()) {}
  operator const DLTensor*() const { return &dl; }
  DLTensor dl;
};

// muon_get_moments / muon_set_moments: zeros before anything, values set
// before the first step handed to the owner (a world of one: this rank) and
// changing the steps, read back after them as the blob holds them.
TEST(State, NorMuonMomentsGetAndSet) {
  Model m(NorMuonOptions());
  HostTensor embed({4}), experts({2, 3});  // embed.w: 4 rows; experts: 2 matrices of 3
  ASSERT_TRUE(m.opt->CopyMomentsOut(0, Dl(embed)).ok());
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(embed.at(i), 0.0f);
  for (int64_t i = 0; i < 4; ++i) embed.set(i, 0.5f + static_cast<float>(i));
  ASSERT_TRUE(m.opt->CopyMomentsIn(0, Dl(embed)).ok());
  HostTensor back({2, 2});  // any shape of 4 elements
  ASSERT_TRUE(m.opt->CopyMomentsOut(0, Dl(back)).ok());
  EXPECT_EQ(back.bytes(), embed.bytes());
  m.Steps(2, 300);
  Model plain_start(NorMuonOptions());
  plain_start.Steps(2, 300);
  EXPECT_FALSE(SameBytes(m.a, plain_start.a)) << "the moments set did not count";
  EXPECT_TRUE(SameBytes(m.b, plain_start.b)) << "experts' moments were not set";
  // After the steps: what the blob holds, matrix after matrix.
  ASSERT_TRUE(m.opt->CopyMomentsOut(1, Dl(experts)).ok());
  const std::vector<unsigned char> blob = SaveBlob(*m.opt);
  absl::StatusOr<SavedState> saved = ParseStateBlob(blob.data(), blob.size(), "blob");
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->moments.size(), 3u);  // embed.w's one matrix, experts' two
  for (const SavedMoments& sm : saved->moments) {
    if (sm.name != "experts") continue;
    for (size_t r = 0; r < 3; ++r) {
      EXPECT_EQ(sm.values[r], experts.at(sm.index * 3 + static_cast<int64_t>(r)));
      EXPECT_GT(sm.values[r], 0.0f);
    }
  }
  // Refusals name the parameter and the cause, and change nothing.
  HostTensor wrong_count({5}), wrong_dtype({4}, DType::kBF16), negative({4});
  negative.set(2, -1.0f);
  absl::Status st = m.opt->CopyMomentsIn(0, Dl(wrong_count));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(st, "param 'embed.w'") && Mentions(st, "of 4 elements")) << st;
  st = m.opt->CopyMomentsOut(0, Dl(wrong_dtype));
  EXPECT_TRUE(Mentions(st, "float32 host tensor")) << st;
  st = m.opt->CopyMomentsIn(0, Dl(negative));
  EXPECT_TRUE(Mentions(st, "element 2 is -1")) << st;
  EXPECT_EQ(SaveBlob(*m.opt), blob);
  Model plain;
  st = plain.opt->CopyMomentsOut(0, Dl(embed));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(st, "NorMuon is off")) << st;
}

// A NorMuon blob whose moments section is cut or lies is refused whole.
TEST(StateBlob, NorMuonMomentsAreValidated) {
  Model src(NorMuonOptions());
  src.Steps(2, 100);
  const std::vector<unsigned char> blob = SaveBlob(*src.opt);
  Model dst(NorMuonOptions());
  dst.Steps(1, 9);
  const std::vector<unsigned char> before = SaveBlob(*dst.opt);
  // The last entry is experts' matrix 1: 3 rows of fp32 at the very end.
  auto negative = blob;
  const float bad = -1.0f;
  std::memcpy(negative.data() + negative.size() - 4, &bad, 4);
  absl::Status st = dst.opt->LoadState(negative.data(), negative.size());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(st, "param 'experts' matrix 1 (NorMuon moments)")) << st;
  EXPECT_TRUE(Mentions(st, "holds the moment -1")) << st;
  auto cut = blob;
  cut.resize(cut.size() - 4);
  st = dst.opt->LoadState(cut.data(), cut.size());
  EXPECT_TRUE(Mentions(st, "truncated")) << st;
  auto longer = blob;
  longer.push_back(0);
  st = dst.opt->LoadState(longer.data(), longer.size());
  EXPECT_TRUE(Mentions(st, "unexpected bytes after the last NorMuon moments")) << st;
  EXPECT_EQ(SaveBlob(*dst.opt), before);
}

// Found by fuzz/api_sequence_fuzzer: the stats went on counting the steps
// taken before a blob was loaded.
TEST(StateBlob, LoadingSetsTheStepCountOfTheStats) {
  Model src;
  src.Steps(3, 100);
  const std::vector<unsigned char> blob = SaveBlob(*src.opt);
  Model dst;
  dst.Steps(5, 200);
  ASSERT_EQ(dst.opt->stats().steps, 5);
  ASSERT_TRUE(dst.opt->LoadState(blob.data(), blob.size()).ok());
  EXPECT_EQ(dst.opt->step_count(), 3);
  EXPECT_EQ(dst.opt->stats().steps, 3);
}

// Byte offsets in the blob of Model, from the documented layout.
constexpr size_t kCountAt = 24;
constexpr size_t kFirstParam = 32;
constexpr size_t kNameAt = kFirstParam + 4;              // "embed.w"
constexpr size_t kDtypeAt = kNameAt + 7;                 // u8
constexpr size_t kViewAt = kDtypeAt + 1;                 // u8
constexpr size_t kNdimAt = kViewAt + 3;                  // after the kind and padding bytes
constexpr size_t kDimsAt = kNdimAt + 4;                  // i64[2]
// global ndim, i64[2], run count, one run (offset, length)
constexpr size_t kNbytesAt = kDimsAt + 16 + 4 + 16 + 8 + 16;  // u64
constexpr size_t kSecondParam = kNbytesAt + 8 + 24 * 4;  // "experts"
constexpr size_t kSecondDtypeAt = kSecondParam + 4 + 7;

template <typename T>
void Poke(std::vector<unsigned char>* blob, size_t at, T v) {
  std::memcpy(blob->data() + at, &v, sizeof v);
}

class CorruptBlob : public ::testing::Test {
 protected:
  void SetUp() override {
    Model src;
    src.Steps(2, 300);
    blob_ = SaveBlob(*src.opt);
    target_.Steps(1, 500);  // non-zero state of its own, step_count 1
    snapshot_ = SaveBlob(*target_.opt);
  }

  // Loading `bad` into `opt` fails with InvalidArgument mentioning `cause`
  // and leaves the optimizer exactly as it was.
  void ExpectRefused(Optimizer* opt, const std::vector<unsigned char>& bad,
                     const std::string& cause) {
    const std::vector<unsigned char> before = SaveBlob(*opt);
    const int64_t steps = opt->step_count();
    absl::Status s = opt->LoadState(bad.data(), bad.size());
    ASSERT_FALSE(s.ok()) << cause;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Mentions(s, cause)) << s;
    EXPECT_EQ(opt->step_count(), steps);
    EXPECT_EQ(SaveBlob(*opt), before) << cause;
  }
  void ExpectRefused(const std::vector<unsigned char>& bad, const std::string& cause) {
    ExpectRefused(target_.opt.get(), bad, cause);
  }

  std::vector<unsigned char> blob_;
  Model target_;
  std::vector<unsigned char> snapshot_;
};

TEST_F(CorruptBlob, TheIntactBlobLoads) {
  // The fixtures are right: the untouched blob loads into the target.
  ASSERT_TRUE(target_.opt->LoadState(blob_.data(), blob_.size()).ok());
  EXPECT_EQ(SaveBlob(*target_.opt), blob_);
}

TEST_F(CorruptBlob, BadMagic) {
  auto bad = blob_;
  bad[0] = 'X';
  ExpectRefused(bad, "magic");
  bad = blob_;
  bad[7] ^= 0x20;
  ExpectRefused(bad, "magic");
}

TEST_F(CorruptBlob, EveryTruncation) {
  for (size_t n = 0; n < blob_.size(); ++n) {
    std::vector<unsigned char> bad(blob_.begin(), blob_.begin() + n);
    // Short prefixes fail on the magic bytes, the rest as truncated.
    ExpectRefused(bad, n < 8 ? "magic" : "truncated");
    if (HasFatalFailure() || HasNonfatalFailure()) {
      ADD_FAILURE() << "at length " << n;
      return;
    }
  }
}

// Found by fuzz/state_blob_fuzzer: this rank's own blob loaded whatever
// global shape an entry recorded (and saved the registered one back).
TEST_F(CorruptBlob, AnotherGlobalShape) {
  auto bad = blob_;
  const size_t global_dims = kDimsAt + 16 + 4;
  Poke<int64_t>(&bad, global_dims, int64_t{16777218});
  // The run [0, 24) still lies inside the larger shape, so only the shape is wrong.
  ExpectRefused(bad, "param 'embed.w': saved global shape [16777218, 6] differs from the "
                     "registered [4, 6]");
}

TEST_F(CorruptBlob, UnsupportedFormat) {
  auto bad = blob_;
  Poke<uint32_t>(&bad, 8, 4);
  ExpectRefused(bad, "format version 4");
}

TEST_F(CorruptBlob, WrongCount) {
  auto bad = blob_;
  Poke<uint64_t>(&bad, kCountAt, 3);  // the entries run out
  ExpectRefused(bad, "truncated");
  Poke<uint64_t>(&bad, kCountAt, 1);  // the second entry is left over
  ExpectRefused(bad, "after the last parameter");
  Poke<uint64_t>(&bad, kCountAt, ~uint64_t{0});
  ExpectRefused(bad, "truncated");

  // An optimizer with one parameter cannot take a two-parameter blob.
  HostTensor p({4, 6}), g({4, 6});
  auto one = MakeOptimizer();
  ASSERT_TRUE(Register(one.get(), &p, &g, "embed.w").ok());
  ExpectRefused(one.get(), blob_, "the optimizer has 1");
}

TEST_F(CorruptBlob, WrongNameOrder) {
  Model swapped(Options(), /*swapped=*/true);
  ExpectRefused(swapped.opt.get(), blob_, "order");
  auto bad = blob_;
  bad[kNameAt] = 'E';
  ExpectRefused(bad, "'Embed.w'");
}

TEST_F(CorruptBlob, HugeLengthsAreTruncationNotAllocation) {
  auto bad = blob_;
  Poke<uint32_t>(&bad, kFirstParam, 0xffffffffu);  // name length
  ExpectRefused(bad, "truncated");
  bad = blob_;
  Poke<uint32_t>(&bad, kNdimAt, 0xffffffffu);  // ndim
  ExpectRefused(bad, "embed.w");
  bad = blob_;
  Poke<uint64_t>(&bad, kNbytesAt, ~uint64_t{0});  // momentum bytes
  ExpectRefused(bad, "momentum bytes");
}

TEST_F(CorruptBlob, WrongShape) {
  auto bad = blob_;
  Poke<int64_t>(&bad, kDimsAt, 6);
  Poke<int64_t>(&bad, kDimsAt + 8, 4);
  ExpectRefused(bad, "shape [6, 4]");
  bad = blob_;
  bad[kViewAt] = 1;
  ExpectRefused(bad, "view");
  // The same name registered with another shape.
  Model other_shape(Options(), false, {6, 4});
  ExpectRefused(other_shape.opt.get(), blob_, "differs from the registered [6, 4]");
}

TEST_F(CorruptBlob, WrongDtype) {
  auto bad = blob_;
  bad[kSecondDtypeAt] = 2;  // float16 instead of bfloat16: same byte count
  ExpectRefused(bad, "dtype float16");
  bad[kSecondDtypeAt] = 200;
  ExpectRefused(bad, "unknown");
  // momentum_fp32 makes the bf16 parameter keep an fp32 buffer.
  Options o;
  o.momentum_fp32 = true;
  Model fp32_state(o);
  ExpectRefused(fp32_state.opt.get(), blob_, "momentum_fp32");
}

TEST_F(CorruptBlob, WrongByteCount) {
  auto bad = blob_;
  Poke<uint64_t>(&bad, kNbytesAt, 24 * 4 - 1);
  ExpectRefused(bad, "holds 95 momentum bytes for 24 elements");
}

TEST_F(CorruptBlob, TrailingBytes) {
  auto bad = blob_;
  bad.push_back(0);
  ExpectRefused(bad, "after the last parameter");
  bad.insert(bad.end(), 64, 0xab);
  ExpectRefused(bad, "after the last parameter");
}

// ---------------------------------------------------------------------------
// Checkpoint and resume, bit for bit
// ---------------------------------------------------------------------------

struct ResumeCase {
  DType dtype;
  bool momentum_fp32;
  NsDtype ns;
};

class Resume : public ::testing::TestWithParam<ResumeCase> {};

// A wide, a tall and a batched parameter of the case's dtype.
struct Net {
  explicit Net(DType dt) : shapes{{12, 40}, {40, 12}, {3, 8, 8}} {
    for (const auto& s : shapes) {
      params.emplace_back(s, dt);
      grads.emplace_back(s, dt);
    }
  }
  void Register(Optimizer* opt) {
    ASSERT_TRUE(muon::Register(opt, &params[0], &grads[0], "wide").ok());
    ASSERT_TRUE(muon::Register(opt, &params[1], &grads[1], "tall").ok());
    ASSERT_TRUE(muon::Register(opt, &params[2], &grads[2], "experts", 2).ok());
  }
  // Gradients of global step `s` (the same in every run).
  void Grads(int s) {
    for (size_t k = 0; k < grads.size(); ++k) grads[k].FillRandom(1000 * s + k, 0.5f);
  }
  std::vector<std::vector<int64_t>> shapes;
  std::vector<HostTensor> params, grads;
};

TEST_P(Resume, TenStepsAfterLoadAreBitIdentical) {
  const ResumeCase c = GetParam();
  Options o;
  o.lr = 0.02;
  o.momentum_fp32 = c.momentum_fp32;
  o.ns.dtype = c.ns;

  Net a(c.dtype);
  for (size_t k = 0; k < a.params.size(); ++k) a.params[k].FillRandom(7 + k);
  auto first = MakeOptimizer(o);
  a.Register(first.get());
  for (int s = 0; s < 10; ++s) {
    a.Grads(s);
    ASSERT_TRUE(first->Step().ok());
  }
  const std::vector<unsigned char> blob = SaveBlob(*first);
  const std::vector<HostTensor> saved = a.params;
  for (int s = 10; s < 20; ++s) {
    a.Grads(s);
    ASSERT_TRUE(first->Step().ok());
  }

  Net b(c.dtype);
  b.params = saved;
  auto resumed = MakeOptimizer(o);
  b.Register(resumed.get());
  ASSERT_TRUE(resumed->LoadState(blob.data(), blob.size()).ok());
  EXPECT_EQ(resumed->step_count(), 10);
  for (int s = 10; s < 20; ++s) {
    b.Grads(s);
    ASSERT_TRUE(resumed->Step().ok());
  }
  EXPECT_EQ(resumed->step_count(), 20);
  for (size_t k = 0; k < a.params.size(); ++k) {
    const size_t n = a.params[k].bytes().size();
    EXPECT_EQ(0, std::memcmp(a.params[k].bytes().data(), b.params[k].bytes().data(), n))
        << "param " << k;
    // The run really moved the parameter since the save.
    EXPECT_NE(0, std::memcmp(a.params[k].bytes().data(), saved[k].bytes().data(), n));
  }
  EXPECT_EQ(SaveBlob(*first), SaveBlob(*resumed));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Resume,
                         ::testing::Values(ResumeCase{DType::kF32, false, NsDtype::kBF16},
                                           ResumeCase{DType::kF32, false, NsDtype::kFP32},
                                           ResumeCase{DType::kBF16, false, NsDtype::kBF16},
                                           ResumeCase{DType::kBF16, true, NsDtype::kBF16},
                                           ResumeCase{DType::kF16, false, NsDtype::kFP32}));

TEST(Resume, WithoutTheBlobTheRunDiffers) {
  // The control for the test above: resuming with a zero momentum buffer
  // does not reproduce the run, so the blob carries what matters.
  Options o;
  o.lr = 0.02;
  Net a(DType::kF32), b(DType::kF32);
  for (size_t k = 0; k < a.params.size(); ++k) a.params[k].FillRandom(7 + k);
  auto first = MakeOptimizer(o);
  a.Register(first.get());
  for (int s = 0; s < 10; ++s) {
    a.Grads(s);
    ASSERT_TRUE(first->Step().ok());
  }
  b.params = a.params;
  auto fresh = MakeOptimizer(o);
  b.Register(fresh.get());
  for (int s = 10; s < 12; ++s) {
    a.Grads(s);
    b.Grads(s);
    ASSERT_TRUE(first->Step().ok());
    ASSERT_TRUE(fresh->Step().ok());
  }
  EXPECT_FALSE(SameBytes(a.params[0], b.params[0]));
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

TEST(Rebind, NewStorageIsUsedAndNullGradSkips) {
  auto a = Optimizer::Create(Options());
  ASSERT_TRUE(a.ok());
  auto b = Optimizer::Create(Options());
  ASSERT_TRUE(b.ok());
  // `a` steps tensors it was rebound to; `b` steps the same values registered directly.
  HostTensor p_old({6, 4}), g_old({6, 4}), p_new({6, 4}), g_new({6, 4}), p_ref({6, 4}),
      g_ref({6, 4});
  p_new.FillRandom(1);
  p_ref.FillRandom(1);
  ASSERT_TRUE(Register(a->get(), &p_old, &g_old, "w").ok());
  ASSERT_TRUE(Register(b->get(), &p_ref, &g_ref, "w").ok());
  DLTensor pn = p_new.dl(), gn = g_new.dl();
  ASSERT_TRUE((*a)->RebindParam(0, &pn, &gn).ok());
  for (int s = 0; s < 3; ++s) {
    g_new.FillRandom(10 + s);
    g_ref.FillRandom(10 + s);
    ASSERT_TRUE((*a)->Step().ok());
    ASSERT_TRUE((*b)->Step().ok());
  }
  EXPECT_TRUE(SameBytes(p_new, p_ref));

  // Without a gradient the parameter is left alone.
  const HostTensor before = p_new;
  ASSERT_TRUE((*a)->RebindParam(0, &pn, nullptr).ok());
  ASSERT_TRUE((*a)->Step().ok());
  EXPECT_TRUE(SameBytes(p_new, before));
  // Bound again, it continues exactly like the reference stepping once more.
  ASSERT_TRUE((*a)->RebindParam(0, &pn, &gn).ok());
  g_new.FillRandom(20);
  g_ref.FillRandom(20);
  ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*b)->Step().ok());
  EXPECT_TRUE(SameBytes(p_new, p_ref));

  HostTensor wrong({4, 6});
  DLTensor w = wrong.dl();
  auto st = (*a)->RebindParam(0, &w, &gn);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("param 'w'"), std::string::npos) << st;
  st = (*a)->RebindParam(0, &pn, &w);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("grad of param 'w': the new tensor is float32 [4, 6]"),
            std::string::npos)
      << st;
  DLTensor on_gpu = pn;
  on_gpu.device = {kDLCUDA, 0};
  st = (*a)->RebindParam(0, &on_gpu, &gn);
  EXPECT_NE(st.message().find("param 'w': the new tensor is on cuda:0, the optimizer's on cpu"),
            std::string::npos)
      << st;
  EXPECT_EQ((*a)->RebindParam(7, &pn, &gn).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace muon
