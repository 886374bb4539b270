#include "muon/device/testing/strict_cpu_runtime.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/dtype.h"

namespace muon {
namespace {

bool Mentions(const absl::Status& st, const std::string& words) {
  return std::string(st.message()).find(words) != std::string::npos;
}

std::vector<float> Iota(int n, float from) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

constexpr int kN = 64;
constexpr size_t kBytes = kN * sizeof(float);

TEST(StrictCpuRuntime, TheHostReadsACopysResultOnlyAfterWaiting) {
  StrictCpuRuntime rt;
  void* d = *rt.Malloc(kBytes, "d");
  const std::vector<float> a = Iota(kN, 1);
  std::vector<float> b(kN, 0.0f);
  ASSERT_TRUE(rt.MemcpyAsync(d, a.data(), kBytes, CopyKind::kHostToDevice, nullptr, "up").ok());
  ASSERT_TRUE(rt.MemcpyAsync(b.data(), d, kBytes, CopyKind::kDeviceToHost, nullptr, "down").ok());
  EXPECT_EQ(rt.pending(), 2);
  // Read before the wait: what was there before.
  EXPECT_EQ(b, std::vector<float>(kN, 0.0f));
  ASSERT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  EXPECT_EQ(rt.pending(), 0);
  EXPECT_EQ(b, a);
  rt.Free(d);
}

TEST(StrictCpuRuntime, AStreamSeesAnothersResultsOnlyThroughAnEvent) {
  StrictCpuRuntime rt;
  GpuStream s1 = *rt.StreamCreate(), s2 = *rt.StreamCreate();
  void* d1 = *rt.Malloc(kBytes, "d1");
  void* d2 = *rt.Malloc(kBytes, "d2");
  const std::vector<float> a = Iota(kN, 5);
  std::vector<float> b(kN, 0.0f);
  // Without an event: s2 copies d1 before s1 wrote it (fresh memory is a
  // pattern, never the values).
  ASSERT_TRUE(rt.MemcpyAsync(d1, a.data(), kBytes, CopyKind::kHostToDevice, s1, "up").ok());
  ASSERT_TRUE(rt.MemcpyAsync(d2, d1, kBytes, CopyKind::kDeviceToDevice, s2, "d2d").ok());
  ASSERT_TRUE(rt.MemcpyAsync(b.data(), d2, kBytes, CopyKind::kDeviceToHost, s2, "down").ok());
  ASSERT_TRUE(rt.StreamSynchronize(s2, "wait").ok());
  EXPECT_NE(b, a);
  EXPECT_EQ(rt.pending(), 1);  // s1's copy has not run
  ASSERT_TRUE(rt.StreamSynchronize(s1, "wait").ok());

  // With one: s2 waits for s1's record, and only up to it.
  const std::vector<float> c = Iota(kN, 100);
  GpuEvent e = *rt.EventCreate();
  ASSERT_TRUE(rt.MemcpyAsync(d1, c.data(), kBytes, CopyKind::kHostToDevice, s1, "up").ok());
  ASSERT_TRUE(rt.EventRecord(e, s1).ok());
  std::vector<float> later(kN, 0.0f);
  ASSERT_TRUE(rt.MemcpyAsync(later.data(), d1, kBytes, CopyKind::kDeviceToHost, s1, "after").ok());
  ASSERT_TRUE(rt.StreamWaitEvent(s2, e).ok());
  ASSERT_TRUE(rt.MemcpyAsync(d2, d1, kBytes, CopyKind::kDeviceToDevice, s2, "d2d").ok());
  ASSERT_TRUE(rt.MemcpyAsync(b.data(), d2, kBytes, CopyKind::kDeviceToHost, s2, "down").ok());
  EXPECT_FALSE(*rt.EventQuery(e));
  ASSERT_TRUE(rt.StreamSynchronize(s2, "wait").ok());
  EXPECT_EQ(b, c);
  EXPECT_TRUE(*rt.EventQuery(e));
  EXPECT_EQ(later, std::vector<float>(kN, 0.0f));  // after the record: still pending
  EXPECT_EQ(rt.pending(), 1);
  rt.Free(d1);  // waits for every stream, as cudaFree
  EXPECT_EQ(later, c);
  rt.Free(d2);
  rt.EventDestroy(e);
  rt.StreamDestroy(s1);
  rt.StreamDestroy(s2);
}

TEST(StrictCpuRuntime, EventSynchronizeRunsUpToTheRecord) {
  StrictCpuRuntime rt;
  void* d = *rt.Malloc(kBytes, "d");
  const std::vector<float> a = Iota(kN, 1), z(kN, 0.0f);
  std::vector<float> b(kN, -1.0f), c(kN, -1.0f);
  GpuEvent e = *rt.EventCreate();
  EXPECT_TRUE(*rt.EventQuery(e));  // never recorded: complete
  ASSERT_TRUE(rt.MemcpyAsync(d, a.data(), kBytes, CopyKind::kHostToDevice, nullptr, "up").ok());
  ASSERT_TRUE(rt.MemcpyAsync(b.data(), d, kBytes, CopyKind::kDeviceToHost, nullptr, "b").ok());
  ASSERT_TRUE(rt.EventRecord(e, nullptr).ok());
  ASSERT_TRUE(rt.MemsetAsync(d, 0, kBytes, nullptr, "zero").ok());
  ASSERT_TRUE(rt.MemcpyAsync(c.data(), d, kBytes, CopyKind::kDeviceToHost, nullptr, "c").ok());
  ASSERT_TRUE(rt.EventSynchronize(e, "wait").ok());
  EXPECT_EQ(b, a);
  EXPECT_EQ(c, std::vector<float>(kN, -1.0f));
  ASSERT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  EXPECT_EQ(c, z);
  rt.Free(d);
}

TEST(StrictCpuRuntime, HostMemoryIsReadWhenTheStreamRuns) {
  StrictCpuRuntime rt;
  void* d = *rt.Malloc(kBytes, "d");
  std::vector<float> a = Iota(kN, 1), b(kN, 0.0f);
  ASSERT_TRUE(rt.MemcpyAsync(d, a.data(), kBytes, CopyKind::kHostToDevice, nullptr, "up").ok());
  a[3] = -7.0f;  // the host changed its source before waiting
  ASSERT_TRUE(rt.MemcpyAsync(b.data(), d, kBytes, CopyKind::kDeviceToHost, nullptr, "down").ok());
  ASSERT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  EXPECT_EQ(b[3], -7.0f);
  rt.Free(d);
}

TEST(StrictCpuRuntime, PointersOnTheWrongSideAreRefusedNamingTheCall) {
  StrictCpuRuntime rt;
  void* d = *rt.Malloc(kBytes, "d");
  std::vector<float> h(kN);
  auto refused = [](const absl::Status& st, const std::string& words) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Mentions(st, words)) << st;
  };
  refused(rt.MemcpyAsync(d, h.data(), kBytes, CopyKind::kDeviceToDevice, nullptr, "setup gather"),
          "setup gather: copy source");
  refused(rt.MemcpyAsync(d, h.data(), kBytes, CopyKind::kDeviceToDevice, nullptr, "x"),
          "is not device memory (host memory)");
  refused(rt.MemcpyAsync(h.data(), d, kBytes, CopyKind::kHostToDevice, nullptr, "y"),
          "y: copy source");
  refused(rt.MemcpyAsync(d, static_cast<char*>(d) + 128, 16, CopyKind::kDeviceToHost, nullptr,
                         "z"),
          "z: copy destination: ");
  refused(rt.MemcpyAsync(d, static_cast<char*>(d) + 128, 16, CopyKind::kDeviceToHost, nullptr,
                         "z"),
          "is device memory (device 0) where host memory belongs");
  refused(rt.MemsetAsync(static_cast<char*>(d) + 4, 0, kBytes, nullptr, "zeroing"),
          "runs past the end of its device allocation");
  EXPECT_TRUE(rt.IsDeviceMemory(d, kBytes));
  EXPECT_FALSE(rt.IsDeviceMemory(h.data(), 4));
  EXPECT_EQ(rt.pending(), 0);  // nothing refused was issued
  rt.Free(d);
  refused(rt.MemsetAsync(d, 0, 4, nullptr, "after free"), "is not device memory (freed");
  // kDefault tells the sides from the pointers.
  void* e = *rt.Malloc(kBytes, "e");
  EXPECT_TRUE(rt.MemcpyAsync(e, h.data(), kBytes, CopyKind::kDefault, nullptr, "up").ok());
  EXPECT_TRUE(rt.MemcpyAsync(h.data(), e, kBytes, CopyKind::kDefault, nullptr, "down").ok());
  EXPECT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  rt.Free(e);
}

TEST(StrictCpuRuntime, FreshMemoryIsNeverZero) {
  StrictCpuRuntime rt;
  void* d = *rt.Malloc(16, "d");
  unsigned char b[16] = {};
  ASSERT_TRUE(rt.MemcpyAsync(b, d, 16, CopyKind::kDeviceToHost, nullptr, "down").ok());
  ASSERT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  for (unsigned char c : b) EXPECT_EQ(c, 0xA5);
  rt.Free(d);
}

// The host cannot touch device memory itself, as on a GPU: it faults.
TEST(StrictCpuRuntimeDeathTest, TheHostTouchingDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  StrictCpuRuntime rt;
  float* d = static_cast<float*>(*rt.Malloc(kBytes, "d"));
  EXPECT_DEATH({ volatile float x = d[0]; (void)x; }, "");
  EXPECT_DEATH({ d[1] = 1.0f; }, "");
  rt.Free(d);
}

TEST(StrictCpuRuntime, DevicesHaveTheirOwnMemoryStreamsAndCurrentDevice) {
  StrictCpuRuntime rt(2);
  ASSERT_TRUE(rt.SetDevice(1).ok());
  void* d1 = *rt.Malloc(kBytes, "d1");
  GpuStream s1 = *rt.StreamCreate();
  ASSERT_TRUE(rt.SetDevice(0).ok());
  void* d0 = *rt.Malloc(kBytes, "d0");
  EXPECT_EQ(rt.DeviceOf(d0), 0);
  EXPECT_EQ(rt.DeviceOf(d1), 1);
  EXPECT_EQ(rt.DeviceOfStream(s1), 1);
  EXPECT_EQ(rt.DeviceOfStream(nullptr), 0);
  EXPECT_FALSE(rt.SetDevice(2).ok());
  const std::vector<float> a = Iota(kN, 3);
  std::vector<float> b(kN);
  ASSERT_TRUE(rt.MemcpyAsync(d0, a.data(), kBytes, CopyKind::kHostToDevice, nullptr, "up").ok());
  ASSERT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  // Work goes on a stream only while its device is current.
  EXPECT_TRUE(Mentions(rt.MemcpyAsync(d1, d0, kBytes, CopyKind::kDeviceToDevice, s1, "peer"),
                       "peer: work issued on a stream of device 1 while device 0 is this "
                       "thread's current device"));
  ASSERT_TRUE(rt.SetDevice(1).ok());
  // A memset of device 0 memory on device 1's stream is refused; a peer copy runs.
  EXPECT_TRUE(Mentions(rt.MemsetAsync(d0, 0, kBytes, s1, "zero"), "memset of device 0 memory"));
  ASSERT_TRUE(rt.MemcpyAsync(d1, d0, kBytes, CopyKind::kDeviceToDevice, s1, "peer").ok());
  ASSERT_TRUE(rt.MemcpyAsync(b.data(), d1, kBytes, CopyKind::kDeviceToHost, s1, "down").ok());
  ASSERT_TRUE(rt.StreamSynchronize(s1, "wait").ok());
  EXPECT_EQ(b, a);
  rt.StreamDestroy(s1);
  rt.Free(d1);
  ASSERT_TRUE(rt.SetDevice(0).ok());
  rt.Free(d0);
}

TEST(StrictCpuRuntime, TheCopyKernelConvertsAndChecksItsChunksWhenItRuns) {
  StrictCpuRuntime rt;
  const std::vector<float> a = {1.0f, 2.5f, -3.0f, 1.0f / 3.0f};
  void* src = *rt.Malloc(4 * sizeof(float), "src");
  void* dst = *rt.Malloc(4 * sizeof(uint16_t), "dst");
  void* chunks = *rt.Malloc(sizeof(GpuCopyChunk), "chunks");
  GpuCopyChunk c{src, dst, 4, static_cast<uint8_t>(DType::kF32), static_cast<uint8_t>(DType::kBF16),
                 static_cast<uint8_t>(DType::kBF16), 0};
  ASSERT_TRUE(rt.MemcpyAsync(src, a.data(), sizeof(float) * 4, CopyKind::kHostToDevice, nullptr,
                             "up").ok());
  ASSERT_TRUE(rt.MemcpyAsync(chunks, &c, sizeof c, CopyKind::kHostToDevice, nullptr, "chunks").ok());
  // A chunk array in host memory is refused at the launch.
  EXPECT_TRUE(Mentions(rt.LaunchCopyChunks(&c, 1, nullptr, "exchange copy"),
                       "exchange copy: the chunk array"));
  ASSERT_TRUE(rt.LaunchCopyChunks(static_cast<const GpuCopyChunk*>(chunks), 1, nullptr,
                                  "exchange copy").ok());
  std::vector<uint16_t> out(4);
  ASSERT_TRUE(rt.MemcpyAsync(out.data(), dst, sizeof(uint16_t) * 4, CopyKind::kDeviceToHost,
                             nullptr, "down").ok());
  ASSERT_TRUE(rt.StreamSynchronize(nullptr, "wait").ok());
  // bf16 by round-to-nearest-even of the fp32 bits.
  for (int i = 0; i < 4; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &a[i], 4);
    const uint32_t rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
    EXPECT_EQ(out[i], static_cast<uint16_t>(rounded)) << i;
  }

  // A chunk pointing at host memory fails when the kernel runs: the wait
  // reports it, and the runtime stays failed (a GPU fault is sticky).
  std::vector<float> host(4);
  GpuCopyChunk bad = c;
  bad.dst = host.data();
  bad.dst_type = static_cast<uint8_t>(DType::kF32);
  ASSERT_TRUE(rt.MemcpyAsync(chunks, &bad, sizeof bad, CopyKind::kHostToDevice, nullptr, "bad").ok());
  ASSERT_TRUE(rt.LaunchCopyChunks(static_cast<const GpuCopyChunk*>(chunks), 1, nullptr,
                                  "exchange copy").ok());
  absl::Status st = rt.StreamSynchronize(nullptr, "step");
  EXPECT_TRUE(Mentions(st, "step: exchange copy: chunk 0 destination")) << st;
  EXPECT_TRUE(Mentions(st, "is not device memory")) << st;
  EXPECT_FALSE(rt.MemsetAsync(src, 0, 4, nullptr, "later").ok());
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

// Fork and join inside a capture, as CUDA: a stream waiting for an event
// recorded on the capturing stream joins the capture; its work is recorded,
// not run, and replays with the origin's; the capture ends only once the
// origin waited for the joined stream's last work.
TEST(StrictCpuRuntimeCapture, AForkedStreamJoinsTheCaptureAndMustJoinBack) {
  StrictCpuRuntime rt;
  GpuStream main = *rt.StreamCreate(), lane = *rt.StreamCreate();
  GpuEvent fork = *rt.EventCreate(), join = *rt.EventCreate();
  void* a = *rt.Malloc(kBytes, "a");
  void* b = *rt.Malloc(kBytes, "b");
  ASSERT_TRUE(rt.MemsetAsync(a, 0, kBytes, main, "a").ok());
  ASSERT_TRUE(rt.MemsetAsync(b, 0, kBytes, main, "b").ok());
  ASSERT_TRUE(rt.StreamSynchronize(main, "setup").ok());

  ASSERT_TRUE(rt.BeginCapture(main).ok());
  ASSERT_TRUE(rt.MemsetAsync(a, 1, kBytes, main, "a").ok());
  ASSERT_TRUE(rt.EventRecord(fork, main).ok());
  ASSERT_TRUE(rt.StreamWaitEvent(lane, fork).ok());
  EXPECT_TRUE(*rt.IsCapturing(lane));
  ASSERT_TRUE(rt.MemcpyAsync(b, a, kBytes, CopyKind::kDeviceToDevice, lane, "a to b").ok());
  ASSERT_TRUE(rt.EventRecord(join, lane).ok());
  ASSERT_TRUE(rt.StreamWaitEvent(main, join).ok());
  ASSERT_TRUE(rt.MemsetAsync(a, 2, kBytes, main, "a again").ok());
  absl::StatusOr<StrictCpuRuntime::Graph> g = rt.EndCapture(main);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(*rt.IsCapturing(lane));
  EXPECT_EQ(rt.pending(), 0);  // recorded, nothing ran

  ASSERT_TRUE(rt.Replay(*g, main).ok());
  std::vector<unsigned char> host_a(kBytes), host_b(kBytes);
  ASSERT_TRUE(rt.MemcpyAsync(host_a.data(), a, kBytes, CopyKind::kDeviceToHost, main, "a").ok());
  ASSERT_TRUE(rt.MemcpyAsync(host_b.data(), b, kBytes, CopyKind::kDeviceToHost, main, "b").ok());
  ASSERT_TRUE(rt.StreamSynchronize(main, "replay").ok());
  EXPECT_EQ(host_a, std::vector<unsigned char>(kBytes, 2));
  EXPECT_EQ(host_b, std::vector<unsigned char>(kBytes, 1));  // the lane's copy, in order

  // The lane's work after its last join: the capture fails, as CUDA's does.
  ASSERT_TRUE(rt.BeginCapture(main).ok());
  ASSERT_TRUE(rt.EventRecord(fork, main).ok());
  ASSERT_TRUE(rt.StreamWaitEvent(lane, fork).ok());
  ASSERT_TRUE(rt.EventRecord(join, lane).ok());
  ASSERT_TRUE(rt.MemsetAsync(b, 3, kBytes, lane, "late").ok());
  ASSERT_TRUE(rt.StreamWaitEvent(main, join).ok());  // before the late work: not a join
  absl::StatusOr<StrictCpuRuntime::Graph> bad = rt.EndCapture(main);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Mentions(bad.status(), "Unjoined")) << bad.status();
  EXPECT_FALSE(*rt.IsCapturing(lane));

  // A capturing stream may not wait for an event recorded outside the capture.
  ASSERT_TRUE(rt.EventRecord(join, lane).ok());
  ASSERT_TRUE(rt.BeginCapture(main).ok());
  absl::Status isolated = rt.StreamWaitEvent(main, join);
  EXPECT_TRUE(Mentions(isolated, "capture isolation")) << isolated;
  ASSERT_TRUE(rt.EndCapture(main).ok());

  ASSERT_TRUE(rt.StreamSynchronize(lane, "lane").ok());
  rt.Free(a);
  rt.Free(b);
  rt.EventDestroy(fork);
  rt.EventDestroy(join);
  rt.StreamDestroy(main);
  rt.StreamDestroy(lane);
}

}  // namespace
}  // namespace muon
