#include "muon/common/tensor.h"

#include <dlpack/dlpack.h>

#include <cstring>

#include "gtest/gtest.h"

namespace muon {
namespace {

DLTensor MakeTensor(float* data, int64_t* shape, int ndim, int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = strides;
  return t;
}

bool Mentions(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(ViewCpuTensor, AcceptsContiguous) {
  float data[12];
  int64_t shape[2] = {3, 4};
  int64_t strides[2] = {4, 1};
  DLTensor t = MakeTensor(data, shape, 2, strides);
  t.byte_offset = 4;
  auto v = ViewCpuTensor(&t, "param 'w'");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->numel(), 12);
  EXPECT_EQ(v->data, static_cast<void*>(data + 1));
  EXPECT_EQ(v->shape, (std::vector<int64_t>{3, 4}));
}

TEST(ViewCpuTensor, IgnoresStrideOfUnitDims) {
  float data[4];
  int64_t shape[3] = {1, 4, 1};
  int64_t strides[3] = {99, 1, 7};
  DLTensor t = MakeTensor(data, shape, 3, strides);
  EXPECT_TRUE(ViewCpuTensor(&t, "p").ok());
}

TEST(ViewCpuTensor, RefusesTransposedStrides) {
  float data[12];
  int64_t shape[2] = {3, 4};
  int64_t strides[2] = {1, 3};
  DLTensor t = MakeTensor(data, shape, 2, strides);
  auto v = ViewCpuTensor(&t, "param 'w'");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(v.status(), "param 'w'"));
  EXPECT_TRUE(Mentions(v.status(), "contiguous"));
}

TEST(ViewCpuTensor, RefusesBadInput) {
  float data[4];
  int64_t shape[2] = {2, 2};
  EXPECT_TRUE(Mentions(ViewCpuTensor(nullptr, "grad of 'x'").status(), "NULL"));

  DLTensor gpu = MakeTensor(data, shape, 2);
  gpu.device = {kDLCUDA, 0};
  EXPECT_TRUE(Mentions(ViewCpuTensor(&gpu, "p").status(), "is on cuda:0"));

  DLTensor vulkan = MakeTensor(data, shape, 2);
  vulkan.device = {kDLVulkan, 0};
  EXPECT_TRUE(Mentions(ViewTensor(&vulkan, "p").status(), "device type 7"));

  DLTensor ints = MakeTensor(data, shape, 2);
  ints.dtype = {kDLInt, 32, 1};
  EXPECT_TRUE(Mentions(ViewCpuTensor(&ints, "p").status(), "unsupported dtype"));

  int64_t neg[2] = {2, -1};
  DLTensor negative = MakeTensor(data, neg, 2);
  EXPECT_TRUE(Mentions(ViewCpuTensor(&negative, "p").status(), "negative"));

  DLTensor null_data = MakeTensor(nullptr, shape, 2);
  EXPECT_TRUE(Mentions(ViewCpuTensor(&null_data, "p").status(), "data pointer is NULL"));

  DLTensor null_shape = MakeTensor(data, nullptr, 2);
  EXPECT_TRUE(Mentions(ViewCpuTensor(&null_shape, "p").status(), "shape pointer is NULL"));
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

TEST(ViewTensor, KeepsTheCudaDevice) {
  float data[4];
  int64_t shape[2] = {2, 2};
  DLTensor t = MakeTensor(data, shape, 2);
  t.device = {kDLCUDA, 3};
  auto v = ViewTensor(&t, "p");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->on_host());
  EXPECT_EQ(v->device.device_id, 3);
  EXPECT_EQ(DeviceString(v->device), "cuda:3");
  // Pinned host memory is host memory.
  t.device = {kDLCUDAHost, 0};
  v = ViewCpuTensor(&t, "p");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->on_host());
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

TEST(ViewTensor, RefusesADeviceCodeDLPackDoesNotList) {
  float data[4];
  int64_t shape[2] = {2, 2};
  DLTensor t = MakeTensor(data, shape, 2);
  const int32_t unknown = 12345;  // no DLDeviceType has it: read as an integer
  std::memcpy(&t.device.device_type, &unknown, sizeof(unknown));
  auto v = ViewTensor(&t, "param 'w'");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(v.status(), "param 'w'"));
  EXPECT_TRUE(Mentions(v.status(), "device type 12345"));
}

TEST(ViewTensor, RefusesByteSizesA64BitSizeCannotHold) {
  int64_t shape[2] = {int64_t{1} << 31, int64_t{1} << 31};  // 2^62 floats: 2^64 bytes
  float data[1];
  DLTensor t = MakeTensor(data, shape, 2);
  auto v = ViewTensor(&t, "param 'huge'");
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(Mentions(v.status(), "param 'huge'"));
  EXPECT_TRUE(Mentions(v.status(), "[2147483648, 2147483648]"));
  EXPECT_TRUE(Mentions(v.status(), "64-bit"));
  // 2^60 floats (2^62 bytes) fit, and are viewed (nothing is read).
  shape[1] = (int64_t{1} << 29);
  EXPECT_TRUE(ViewTensor(&t, "p").ok());
}

TEST(ViewTensor, EmptyTensorsMayHaveNoDataButNoOffsetFromNull) {
  int64_t shape[2] = {0, 4};
  DLTensor t = MakeTensor(nullptr, shape, 2);
  auto v = ViewTensor(&t, "p");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->data, nullptr);
  t.byte_offset = 16;
  v = ViewTensor(&t, "grad of 'e'");
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(Mentions(v.status(), "grad of 'e'"));
  EXPECT_TRUE(Mentions(v.status(), "NULL with byte_offset 16"));
}

}  // namespace
}  // namespace muon
