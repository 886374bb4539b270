// Each rank's exchange tables: what it sends to and receives from each peer,
// where each owned matrix sits in the working buffer, and that nothing moves
// beyond the lower bound; then a bound exchange run on one rank.
#include "muon/sharding/exchange.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "muon/comm/comm.h"
#include "muon/comm/self_comm.h"
#include "muon/common/dtype.h"
#include "muon/sharding/testing/job.h"

namespace muon {
namespace {

using testjob::DescribeRank;
using testjob::ParamSpec;
using testjob::Replicate;
using testjob::Shard;

// Every rank's tables for a job where `owner` orthogonalizes every matrix.
std::vector<std::vector<RoundTable>> Tables(int n, const std::vector<ParamSpec>& params, int owner,
                                            DType ns_wire = DType::kF32) {
  std::vector<RankDesc> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(DescribeRank(r, n, {}, params));
  PlanOptions o;
  o.assignment = Assignment::kCustom;
  o.custom = [owner](const std::vector<MatrixInfo>& infos, std::vector<int>* owners) {
    owners->assign(infos.size(), owner);
    return absl::OkStatus();
  };
  std::vector<std::vector<RoundTable>> out;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<Plan> plan = BuildPlan(ranks, r, o);
    EXPECT_TRUE(plan.ok()) << plan.status();
    out.push_back(BuildRoundTables(*plan, r, n, ns_wire));
  }
  return out;
}

int64_t Elements(const std::vector<LocalSpan>& spans) {
  int64_t n = 0;
  for (const LocalSpan& s : spans) n += s.length;
  return n;
}
int64_t Elements(const std::vector<SlotSpan>& spans) {
  int64_t n = 0;
  for (const SlotSpan& s : spans) n += s.length;
  return n;
}

TEST(RoundTables, RowShardsGoToTheOwnerAndComeBack) {
  // 4 x 3, rows split over 2 ranks: rank 1's 6 elements travel to owner 0.
  const auto t = Tables(2, {{"w", {4, 3}, {Shard(0, 0)}}}, 0, DType::kBF16);
  ASSERT_EQ(t[0].size(), 1u);
  const RoundTable& owner = t[0][0];
  const RoundTable& other = t[1][0];
  EXPECT_EQ(owner.owned, 1);
  EXPECT_EQ(owner.slot_floats, 12);
  ASSERT_EQ(owner.batches.size(), 1u);
  EXPECT_EQ(owner.batches[0].rows, 4);
  EXPECT_EQ(owner.batches[0].count, 1);
  EXPECT_EQ(other.owned, 0);
  // The owner copies its own rows to itself and receives rank 1's.
  EXPECT_EQ(Elements(owner.gather_send[0]), 6);
  EXPECT_EQ(Elements(owner.gather_recv[0]), 6);
  ASSERT_EQ(owner.gather_recv[1].size(), 1u);
  EXPECT_EQ(owner.gather_recv[1][0].pos, 6);  // rows 2..3 of the matrix in the slot
  EXPECT_EQ(owner.gather_recv[1][0].length, 6);
  EXPECT_EQ(Elements(other.gather_send[0]), 6);
  EXPECT_EQ(Elements(other.gather_send[1]), 0);
  // Results go back in the Newton-Schulz dtype; nothing else moves.
  EXPECT_EQ(Elements(owner.scatter_send[1]), 6);
  EXPECT_EQ(owner.scatter_send[1][0].wire, DType::kBF16);
  EXPECT_EQ(Elements(other.scatter_recv[0]), 6);
  EXPECT_EQ(Elements(other.gather_recv[0]) + Elements(other.gather_recv[1]), 0);
  EXPECT_EQ(other.units, (std::vector<int>{0}));
}

TEST(RoundTables, AnOwnerHoldingACopyTakesItFromItself) {
  // Replicated over 3 ranks, owned by rank 2: no gather traffic at all, and
  // every copy receives the result.
  const auto t = Tables(3, {{"w", {5, 2}, {Replicate(0)}}}, 2);
  for (int r = 0; r < 3; ++r) {
    for (int p = 0; p < 3; ++p) {
      const int64_t sent = Elements(t[r][0].gather_send[p]);
      EXPECT_EQ(sent, r == 2 && p == 2 ? 10 : 0) << "rank " << r << " to " << p;
    }
  }
  for (int p = 0; p < 3; ++p) EXPECT_EQ(Elements(t[2][0].scatter_send[p]), 10);
  EXPECT_EQ(Elements(t[0][0].scatter_recv[2]), 10);
  EXPECT_EQ(MaxExchangeBytes(t[2]), 3u * 10 * 4);
  EXPECT_EQ(MaxExchangeBytes(t[0]), 10u * 4);
}

TEST(RoundTables, ColumnShardsInterleaveRowByRow) {
  // 2 x 4, columns split over 2 ranks: rank 1 holds columns 2..3 of each row.
  const auto t = Tables(2, {{"w", {2, 4}, {Shard(0, 1)}}}, 0);
  const auto& recv = t[0][0].gather_recv[1];
  ASSERT_EQ(recv.size(), 2u);
  EXPECT_EQ(recv[0].pos, 2);
  EXPECT_EQ(recv[0].length, 2);
  EXPECT_EQ(recv[1].pos, 6);
  const auto& send = t[1][0].gather_send[0];
  ASSERT_EQ(send.size(), 2u);
  EXPECT_EQ(send[0].pos, 0);  // local positions in rank 1's 2 x 2 piece
  EXPECT_EQ(send[1].pos, 2);
}

TEST(BoundExchange, OneRankMovesAndConvertsThroughItsBuffers) {
  const auto t = Tables(1, {{"a", {2, 3}, {}}, {"b", {3, 2}, {}}}, 0, DType::kBF16);
  ASSERT_EQ(t[0].size(), 1u);
  const RoundTable& table = t[0][0];
  std::shared_ptr<Device> device = MakeHostDevice();
  std::vector<float> a(6), b(6), slots(table.slot_floats, -1.0f);
  std::iota(a.begin(), a.end(), 1.0f);
  std::iota(b.begin(), b.end(), 10.0f);
  const size_t bytes = MaxExchangeBytes(t[0]);
  std::vector<unsigned char> send(bytes), recv(bytes);
  absl::StatusOr<BoundExchange> bound =
      BindExchange(table, *device, {{a.data(), DType::kF32}, {b.data(), DType::kF32}},
                   {slots.data(), DType::kF32}, send.data(), recv.data(), /*single_rank=*/true);
  ASSERT_TRUE(bound.ok()) << bound.status();
  auto self = Comm::Create(SelfCommTable(), "self");
  ASSERT_TRUE(self.ok());
  ASSERT_TRUE(RunExchange(*bound, bound->gather, **self, *device, send.data(), recv.data(),
                          nullptr).ok());
  // Both matrices, whole, in the working buffer (the fp32 state travels as is).
  std::vector<float> in_slots(slots);
  std::sort(in_slots.begin(), in_slots.end());
  std::vector<float> want(a);
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(in_slots, want);
  // "Orthogonalize", then the results come back rounded to bf16.
  for (float& x : slots) x = x / 3.0f;
  ASSERT_TRUE(RunExchange(*bound, bound->scatter, **self, *device, send.data(), recv.data(),
                          nullptr).ok());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(a[i], RoundToBf16((i + 1.0f) / 3.0f)) << i;
    EXPECT_EQ(b[i], RoundToBf16((i + 10.0f) / 3.0f)) << i;
  }
  EXPECT_EQ((*self)->counters().collectives, 0);  // a world of one calls no collective
}

// A bf16 span of odd length, then a float32 one: each span starts 4-byte
// aligned on the wire (2 bytes of padding after the 3 bf16 elements), so the
// floats are read and written aligned (a GPU faults on a misaligned float).
// The update buffers are bf16, as with Newton-Schulz in bf16.
TEST(BoundExchange, SpansStartAlignedOnTheWire) {
  ParamSpec a{"a", {1, 3}, {}};
  a.dtype = static_cast<uint8_t>(DType::kBF16);  // bf16 state: a bf16 gather wire
  ParamSpec b{"b", {2, 2}, {}};                   // float32 state: a float32 wire
  const auto t = Tables(1, {a, b}, 0, DType::kBF16);
  ASSERT_EQ(t[0].size(), 1u);
  const RoundTable& table = t[0][0];
  std::shared_ptr<Device> device = MakeHostDevice();
  std::vector<uint16_t> ua = {FloatToBf16Bits(1.0f), FloatToBf16Bits(2.0f), FloatToBf16Bits(3.0f)};
  std::vector<uint16_t> ub = {FloatToBf16Bits(4.0f), FloatToBf16Bits(5.0f), FloatToBf16Bits(6.0f), FloatToBf16Bits(7.0f)};
  std::vector<float> slots(table.slot_floats, -1.0f);
  const size_t bytes = MaxExchangeBytes(t[0]);
  EXPECT_EQ(bytes, 8u + 16u);  // 6 bytes padded to 8, then 4 floats
  std::vector<float> send_words(bytes / sizeof(float)), recv_words(bytes / sizeof(float));
  auto* send = reinterpret_cast<unsigned char*>(send_words.data());
  auto* recv = reinterpret_cast<unsigned char*>(recv_words.data());
  absl::StatusOr<BoundExchange> bound =
      BindExchange(table, *device, {{ua.data(), DType::kBF16}, {ub.data(), DType::kBF16}},
                   {slots.data(), DType::kF32}, send, recv,
                   /*single_rank=*/false);  // through the wire
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_EQ(bound->gather.send_bytes.size(), 1u);
  EXPECT_EQ(bound->gather.send_bytes[0], 24u);
  auto self = Comm::Create(SelfCommTable(), "self");
  ASSERT_TRUE(self.ok());
  ASSERT_TRUE(RunExchange(*bound, bound->gather, **self, *device, send, recv, nullptr).ok());
  // The float32 span sits at byte 8 of the wire, whole.
  EXPECT_EQ(send_words[2], 4.0f);
  EXPECT_EQ(send_words[5], 7.0f);
  std::vector<float> in_slots(slots);
  std::sort(in_slots.begin(), in_slots.end());
  EXPECT_EQ(in_slots, (std::vector<float>{1, 2, 3, 4, 5, 6, 7}));
  for (float& x : slots) x = x * 2.0f;
  ASSERT_TRUE(RunExchange(*bound, bound->scatter, **self, *device, send, recv, nullptr).ok());
  EXPECT_EQ(ua[2], FloatToBf16Bits(6.0f));
  EXPECT_EQ(ub[3], FloatToBf16Bits(14.0f));
}

// A world of one copies each piece once, straight between the update storage
// and the slots, rounded to the wire's dtype on the way; the send buffer is
// not touched.
TEST(BoundExchange, ASingleRankCopiesStraightAndRoundsToTheWire) {
  ParamSpec a{"a", {2, 3}, {}};  // float32 state: a float32 gather wire, bf16 scatter wire
  const auto t = Tables(1, {a}, 0, DType::kBF16);
  const RoundTable& table = t[0][0];
  std::shared_ptr<Device> device = MakeHostDevice();
  // 1 + 2^-9 is no bf16 value: it crosses the float32 gather wire whole.
  std::vector<float> ua = {1.0f + 1.0f / 512, 2.0f, -3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<float> slots(table.slot_floats, -1.0f);
  const size_t bytes = MaxExchangeBytes(t[0]);
  std::vector<unsigned char> send(bytes, 0xAB), recv(bytes, 0xCD);
  absl::StatusOr<BoundExchange> bound =
      BindExchange(table, *device, {{ua.data(), DType::kF32}}, {slots.data(), DType::kF32},
                   send.data(), recv.data(), /*single_rank=*/true);
  ASSERT_TRUE(bound.ok()) << bound.status();
  auto self = Comm::Create(SelfCommTable(), "self");
  ASSERT_TRUE(self.ok());
  ASSERT_TRUE(RunExchange(*bound, bound->gather, **self, *device, send.data(), recv.data(),
                          nullptr).ok());
  EXPECT_EQ(slots, ua);
  for (float& x : slots) x = x / 7.0f;  // no bf16 values: the scatter rounds them
  ASSERT_TRUE(RunExchange(*bound, bound->scatter, **self, *device, send.data(), recv.data(),
                          nullptr).ok());
  for (size_t i = 0; i < ua.size(); ++i) {
    EXPECT_NE(ua[i], slots[i]) << i;
    EXPECT_EQ(ua[i], Bf16BitsToFloat(FloatToBf16Bits(slots[i]))) << i;
  }
  EXPECT_EQ(send, std::vector<unsigned char>(bytes, 0xAB));
  EXPECT_EQ(recv, std::vector<unsigned char>(bytes, 0xCD));
}

// Slots of bf16 (a backend whose SlotDtype is bf16): the gather rounds the
// fp32 pieces into them, the scatter widens them back; in a world of one and
// through the wire alike.
TEST(BoundExchange, Bf16SlotsRoundOnTheWayIn) {
  ParamSpec a{"a", {2, 3}, {}};  // float32 state: a float32 gather wire, bf16 scatter wire
  const auto t = Tables(1, {a}, 0, DType::kBF16);
  const RoundTable& table = t[0][0];
  std::shared_ptr<Device> device = MakeHostDevice();
  for (bool single : {true, false}) {
    std::vector<float> ua = {1.0f + 1.0f / 512, 2.0f, -3.0f, 1.0f / 3, 5.0f, 6.0f};
    std::vector<uint16_t> slots(table.slot_floats, 0xFFFF);
    const size_t bytes = MaxExchangeBytes(t[0]);
    std::vector<unsigned char> send(bytes), recv(bytes);
    absl::StatusOr<BoundExchange> bound =
        BindExchange(table, *device, {{ua.data(), DType::kF32}}, {slots.data(), DType::kBF16},
                     send.data(), recv.data(), single);
    ASSERT_TRUE(bound.ok()) << bound.status();
    auto self = Comm::Create(SelfCommTable(), "self");
    ASSERT_TRUE(self.ok());
    ASSERT_TRUE(RunExchange(*bound, bound->gather, **self, *device, send.data(), recv.data(),
                            nullptr).ok());
    for (size_t i = 0; i < ua.size(); ++i) EXPECT_EQ(slots[i], FloatToBf16Bits(ua[i])) << i;
    for (uint16_t& v : slots) v = FloatToBf16Bits(Bf16BitsToFloat(v) * 0.5f);
    ASSERT_TRUE(RunExchange(*bound, bound->scatter, **self, *device, send.data(), recv.data(),
                            nullptr).ok());
    for (size_t i = 0; i < ua.size(); ++i) EXPECT_EQ(ua[i], Bf16BitsToFloat(slots[i])) << i;
  }
}

}  // namespace
}  // namespace muon
