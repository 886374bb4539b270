#include "muon/device/device.h"
#include "muon/device/host_device.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace muon {
namespace {

TEST(HostDevice, AllocatesZeroedBuffersAndFreesThem) {
  auto dev = MakeHostDevice();
  auto b = DeviceBuffer::Make(dev, 64, "test buffer");
  ASSERT_TRUE(b.ok()) << b.status();
  const auto* bytes = b->as<unsigned char>();
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(bytes[i], 0) << i;
  DeviceBuffer moved = std::move(*b);
  EXPECT_EQ(moved.size(), 64u);
  EXPECT_EQ(b->data(), nullptr);
  auto empty = DeviceBuffer::Make(dev, 0, "nothing");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(HostDevice, OutOfMemoryNamesTheBuffer) {
  auto dev = MakeHostDevice();
  auto b = DeviceBuffer::Make(dev, std::numeric_limits<size_t>::max() / 2, "the huge slab");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(b.status().message()).find("the huge slab"), std::string::npos);
}

TEST(CopyOps, ConvertAndRoundThroughTheWireType) {
  // bf16 keeps 7 fraction bits, so the neighbours are 1 and 1 + 2^-7; 1 + 2^-8 + 2^-10 is
  // above the midpoint 1 + 2^-8 and rounds up.
  const float src[3] = {1.0f + 0x1p-8f + 0x1p-10f, -2.0f, 1.0f + 0x1p-9f};
  uint16_t bf16[3] = {};
  float through[3] = {};
  float plain[3] = {};
  std::vector<CopyOp> ops = {
      {src, bf16, 3, DType::kF32, DType::kBF16, DType::kF32},
      {src, through, 3, DType::kF32, DType::kF32, DType::kBF16},
      {src, plain, 3, DType::kF32, DType::kF32, DType::kF32},
  };
  auto dev = MakeHostDevice();
  auto prog = dev->Prepare(ops);
  ASSERT_TRUE(prog.ok());
  EXPECT_EQ((*prog)->elements(), 9);
  ASSERT_TRUE(dev->Run(**prog).ok());
  // bf16 bit patterns: 1 + 2^-7 is 0x3F81, -2 is 0xC000, 1 (tie to even) is 0x3F80.
  EXPECT_EQ(bf16[0], 0x3F81);
  EXPECT_EQ(bf16[1], 0xC000);
  EXPECT_EQ(bf16[2], 0x3F80);
  EXPECT_EQ(through[0], 1.0f + 0x1p-7f);
  EXPECT_EQ(through[1], -2.0f);
  EXPECT_EQ(through[2], 1.0f);
  EXPECT_EQ(std::memcmp(plain, src, sizeof src), 0);
}

TEST(CopyOps, WidenHalfTypes) {
  const uint16_t f16[2] = {0x3C00, 0xC100};  // 1.0, -2.5
  const uint16_t bf16[2] = {0x3F80, 0x4040};  // 1.0, 3.0
  float a[2] = {}, b[2] = {};
  RunCopiesOnHost({{f16, a, 2, DType::kF16, DType::kF32, DType::kF32},
                   {bf16, b, 2, DType::kBF16, DType::kF32, DType::kF32}});
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -2.5f);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 3.0f);
}

}  // namespace
}  // namespace muon
