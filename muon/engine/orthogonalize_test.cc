// Newton-Schulz on its own, on the host device, against the double-precision
// reference: one matrix, a batch, out in another dtype, in place, and the
// errors.
#include "muon/engine/orthogonalize.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/dtype.h"
#include "muon/device/host_device.h"
#include "muon/math/testing/reference_ns.h"

namespace muon {
namespace {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  DType dtype;
  DLTensor dl{};

  Tensor(std::vector<int64_t> s, DType t) : shape(std::move(s)), dtype(t) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.assign(static_cast<size_t>(n) * SizeOf(t), 0);
    dl.data = bytes.data();
    dl.device = {kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = ToDLDataType(t);
    dl.shape = shape.data();
  }
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / SizeOf(dtype)); }
  float at(int64_t i) const { return LoadAsFloat(dtype, bytes.data(), i); }
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    for (int64_t i = 0; i < numel(); ++i) StoreFromFloat(dtype, bytes.data(), i, d(rng));
  }
};

NsConfig Fp32() {
  NsConfig c;
  c.dtype = NsDtype::kFP32;
  return c;
}

// The reference of matrix b (rows x cols) of `in`.
std::vector<double> Want(const Tensor& in, int64_t b, int64_t rows, int64_t cols,
                         const NsConfig& c) {
  std::vector<double> u(rows * cols);
  for (int64_t k = 0; k < rows * cols; ++k) u[k] = in.at(b * rows * cols + k);
  return ReferenceNewtonSchulz(u, rows, cols, c);
}

TEST(OrthogonalizeTensor, OneMatrixWideAndTall) {
  for (auto shape : {std::vector<int64_t>{6, 10}, std::vector<int64_t>{12, 5}}) {
    Tensor in(shape, DType::kF32), out(shape, DType::kF32);
    in.Fill(7);
    ASSERT_TRUE(OrthogonalizeTensor(MakeHostDevice(), Fp32(), &in.dl, &out.dl, 0, nullptr).ok());
    const auto want = Want(in, 0, shape[0], shape[1], Fp32());
    for (int64_t i = 0; i < in.numel(); ++i) ASSERT_NEAR(out.at(i), want[i], 2e-6) << i;
  }
}

TEST(OrthogonalizeTensor, ABatchInPlaceAndIntoBf16) {
  Tensor in({3, 4, 6}, DType::kF32), bf16({3, 4, 6}, DType::kBF16);
  in.Fill(11);
  const Tensor original = in;
  ASSERT_TRUE(OrthogonalizeTensor(MakeHostDevice(), Fp32(), &in.dl, &bf16.dl, 2, nullptr).ok());
  ASSERT_TRUE(OrthogonalizeTensor(MakeHostDevice(), Fp32(), &in.dl, &in.dl, 2, nullptr).ok());
  for (int64_t b = 0; b < 3; ++b) {
    const auto want = Want(original, b, 4, 6, Fp32());
    for (int64_t k = 0; k < 24; ++k) {
      ASSERT_NEAR(in.at(b * 24 + k), want[k], 2e-6) << b << "," << k;
      EXPECT_EQ(bf16.at(b * 24 + k), RoundToBf16(in.at(b * 24 + k)));
    }
  }
}

TEST(OrthogonalizeTensor, Bf16NewtonSchulzStaysCloseToTheReference) {
  Tensor in({8, 16}, DType::kF32), out({8, 16}, DType::kF32);
  in.Fill(3);
  NsConfig bf16;  // the default: bf16, as torch
  ASSERT_TRUE(OrthogonalizeTensor(MakeHostDevice(), bf16, &in.dl, &out.dl, 0, nullptr).ok());
  const auto want = Want(in, 0, 8, 16, Fp32());
  double worst = 0;
  for (int64_t i = 0; i < in.numel(); ++i) worst = std::max(worst, std::fabs(out.at(i) - want[i]));
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(worst, 0.0);  // it really ran in bf16
}

std::string Error(const Tensor& in, const Tensor& out, int view) {
  const absl::Status s = OrthogonalizeTensor(MakeHostDevice(), Fp32(), &in.dl, &out.dl, view,
                                             nullptr);
  EXPECT_FALSE(s.ok());
  return std::string(s.message());
}

TEST(OrthogonalizeTensor, ErrorsNameTheTensorAndTheCause) {
  Tensor a({4, 6}, DType::kF32), b({6, 4}, DType::kF32), v({5}, DType::kF32);
  EXPECT_EQ(Error(a, b, 0), "out: shape [6, 4] differs from in's [4, 6]");
  EXPECT_NE(Error(v, v, 0).find("in: has 1 dimension(s)"), std::string::npos);
  Tensor shifted = a;
  shifted.dl.data = a.bytes.data() + 4;  // overlaps a, not a itself
  shifted.shape = a.shape;
  shifted.dl.shape = shifted.shape.data();
  EXPECT_EQ(Error(a, shifted, 0), "out: overlaps in without being the same tensor");
  Tensor gpu({4, 6}, DType::kF32);
  gpu.dl.device = {kDLCUDA, 0};
  EXPECT_EQ(Error(gpu, a, 0), "in: is on cuda:0, the backend on cpu");
}

}  // namespace
}  // namespace muon
