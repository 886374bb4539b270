#include "muon/engine/param.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// A host tensor: owns its shape and storage, hands out a DLTensor.
struct HostTensor {
  HostTensor(std::vector<int64_t> dims, DLDataType dt = {kDLFloat, 32, 1})
      : shape(std::move(dims)), dtype(dt) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.assign(static_cast<size_t>(n) * (dtype.bits / 8) + 1, 0);
  }
  DLTensor dl() {
    DLTensor t{};
    t.data = bytes.data();
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    return t;
  }
  std::vector<int64_t> shape;
  DLDataType dtype;
  std::vector<unsigned char> bytes;
};

constexpr DLDataType kF32 = {kDLFloat, 32, 1};
constexpr DLDataType kBF16 = {kDLBfloat, 16, 1};
constexpr DLDataType kF16 = {kDLFloat, 16, 1};

constexpr int kView2D = 0, kFlatten = 1, kBatched = 2;

TEST(MakeParam, PlainMatrix) {
  HostTensor v({6, 10}), g({6, 10});
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "layer.w", kView2D, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "layer.w");
  EXPECT_EQ(p->view, MatrixView::k2D);
  EXPECT_EQ(p->batch, 1);
  EXPECT_EQ(p->rows, 6);
  EXPECT_EQ(p->cols, 10);
  EXPECT_EQ(p->numel(), 60);
  EXPECT_EQ(p->value.data, static_cast<void*>(v.bytes.data()));
  EXPECT_EQ(p->grad.data, static_cast<void*>(g.bytes.data()));
  EXPECT_EQ(p->state_dtype, DType::kF32);
  EXPECT_EQ(p->momentum_bytes(), 60u * 4);
  EXPECT_TRUE(p->momentum.empty());  // the optimizer allocates it on its device
}

TEST(MakeParam, StateDtypeFollowsGradUnlessFp32) {
  struct Case {
    DLDataType dt;
    bool fp32;
    DType want;
    size_t bytes_per;
  };
  for (const Case& c : {Case{kBF16, false, DType::kBF16, 2}, Case{kBF16, true, DType::kF32, 4},
                        Case{kF16, false, DType::kF16, 2}, Case{kF16, true, DType::kF32, 4},
                        Case{kF32, true, DType::kF32, 4}}) {
    HostTensor v({3, 5}, c.dt), g({3, 5}, c.dt);
    DLTensor vt = v.dl(), gt = g.dl();
    auto p = MakeParam(&vt, &gt, "w", kView2D, c.fp32);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->state_dtype, c.want);
    EXPECT_EQ(p->momentum_bytes(), 15u * c.bytes_per);
  }
}

TEST(MakeParam, OneAndZeroDimsBelongToAdamW) {
  HostTensor v({16}), g({16});
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "ln.bias", kView2D, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(p.status(), "'ln.bias'")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "AdamW")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "1 dimension")) << p.status();

  // A matrix view does not make a vector a matrix.
  for (int view : {kFlatten, kBatched}) {
    auto q = MakeParam(&vt, &gt, "ln.bias", view, false);
    ASSERT_FALSE(q.ok());
    EXPECT_TRUE(Mentions(q.status(), "AdamW")) << q.status();
  }

  HostTensor s(std::vector<int64_t>{}), sg(std::vector<int64_t>{});
  DLTensor st = s.dl(), sgt = sg.dl();
  auto z = MakeParam(&st, &sgt, "scale", kView2D, false);
  ASSERT_FALSE(z.ok());
  EXPECT_TRUE(Mentions(z.status(), "'scale'")) << z.status();
  EXPECT_TRUE(Mentions(z.status(), "AdamW")) << z.status();
  EXPECT_TRUE(Mentions(z.status(), "0 dimension")) << z.status();
}

TEST(MakeParam, ThreeDimsNeedAMatrixView) {
  HostTensor v({4, 3, 5}), g({4, 3, 5});
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "conv.w", kView2D, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(p.status(), "'conv.w'")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "[4, 3, 5]")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "matrix view")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "FLATTEN_TRAILING")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "BATCHED_LEADING")) << p.status();
}

TEST(MakeParam, FlattenTrailing) {
  HostTensor v({8, 3, 2, 5}), g({8, 3, 2, 5});
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "conv", kFlatten, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->view, MatrixView::kFlattenTrailing);
  EXPECT_EQ(p->batch, 1);
  EXPECT_EQ(p->rows, 8);
  EXPECT_EQ(p->cols, 30);
  EXPECT_EQ(p->momentum_bytes(), 240u * 4);

  // On a 2-D parameter the view is the parameter itself.
  HostTensor m({7, 2}), mg({7, 2});
  DLTensor mt = m.dl(), mgt = mg.dl();
  auto q = MakeParam(&mt, &mgt, "m", kFlatten, false);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->rows, 7);
  EXPECT_EQ(q->cols, 2);
}

TEST(MakeParam, BatchedLeading) {
  HostTensor v({4, 6, 2, 3}), g({4, 6, 2, 3});
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "experts", kBatched, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->view, MatrixView::kBatchedLeading);
  EXPECT_EQ(p->batch, 4);
  EXPECT_EQ(p->rows, 6);
  EXPECT_EQ(p->cols, 6);
  EXPECT_EQ(p->numel(), 144);
  EXPECT_EQ(p->momentum_bytes(), 144u * 4);

  HostTensor m({5, 9}), mg({5, 9});
  DLTensor mt = m.dl(), mgt = mg.dl();
  auto q = MakeParam(&mt, &mgt, "flat", kBatched, false);
  ASSERT_FALSE(q.ok());
  EXPECT_TRUE(Mentions(q.status(), "'flat'")) << q.status();
  EXPECT_TRUE(Mentions(q.status(), "at least 3 dimensions")) << q.status();
}

TEST(MakeParam, UnknownView) {
  HostTensor v({3, 3}), g({3, 3});
  DLTensor vt = v.dl(), gt = g.dl();
  for (int view : {-1, 3, 1000}) {
    auto p = MakeParam(&vt, &gt, "w", view, false);
    ASSERT_FALSE(p.ok()) << view;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Mentions(p.status(), "matrix_view")) << p.status();
    EXPECT_TRUE(Mentions(p.status(), "unknown")) << p.status();
  }
}

TEST(MakeParam, GradShapeMismatch) {
  HostTensor v({4, 6}), g({6, 4});
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "proj", kView2D, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(p.status(), "'proj'")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "grad shape [6, 4]")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "[4, 6]")) << p.status();

  HostTensor g3({4, 6, 1});
  DLTensor g3t = g3.dl();
  auto q = MakeParam(&vt, &g3t, "proj", kView2D, false);
  ASSERT_FALSE(q.ok());
  EXPECT_TRUE(Mentions(q.status(), "grad shape")) << q.status();
}

TEST(MakeParam, GradDtypeMismatch) {
  HostTensor v({4, 6}, kF32), g({4, 6}, kBF16);
  DLTensor vt = v.dl(), gt = g.dl();
  auto p = MakeParam(&vt, &gt, "proj", kView2D, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(p.status(), "'proj'")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "grad dtype bfloat16")) << p.status();
  EXPECT_TRUE(Mentions(p.status(), "float32")) << p.status();
}

TEST(MakeParam, BadTensorsNameWhichOne) {
  HostTensor v({4, 6}), g({4, 6});
  DLTensor vt = v.dl(), gt = g.dl();

  auto no_grad = MakeParam(&vt, nullptr, "w", kView2D, false);
  ASSERT_FALSE(no_grad.ok());
  EXPECT_TRUE(Mentions(no_grad.status(), "grad of param 'w'")) << no_grad.status();
  EXPECT_TRUE(Mentions(no_grad.status(), "NULL")) << no_grad.status();

  auto no_value = MakeParam(nullptr, &gt, "w", kView2D, false);
  ASSERT_FALSE(no_value.ok());
  EXPECT_TRUE(Mentions(no_value.status(), "param 'w'")) << no_value.status();
  EXPECT_FALSE(Mentions(no_value.status(), "grad of")) << no_value.status();

  DLTensor gpu = vt;
  gpu.device = {kDLCUDA, 0};
  auto on_gpu = MakeParam(&gpu, &gt, "w", kView2D, false);
  ASSERT_FALSE(on_gpu.ok());
  EXPECT_TRUE(Mentions(on_gpu.status(), "grad is on cpu, param on cuda:0")) << on_gpu.status();

  DLTensor ints = gt;
  ints.dtype = {kDLInt, 32, 1};
  auto int_grad = MakeParam(&vt, &ints, "w", kView2D, false);
  ASSERT_FALSE(int_grad.ok());
  EXPECT_TRUE(Mentions(int_grad.status(), "grad of param 'w'")) << int_grad.status();

  int64_t transposed[2] = {1, 4};
  DLTensor strided = vt;
  strided.strides = transposed;
  auto not_contiguous = MakeParam(&strided, &gt, "w", kView2D, false);
  ASSERT_FALSE(not_contiguous.ok());
  EXPECT_TRUE(Mentions(not_contiguous.status(), "contiguous")) << not_contiguous.status();
}

}  // namespace
}  // namespace muon
