// Each rank's exchange tables: what it sends to and receives from each peer,
// where each owned matrix sits in the working buffer, and that nothing moves
// beyond the lower bound; then a bound exchange run on one rank.
#include "muon/sharding/exchange.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "muon/comm/comm.h"
#include "muon/comm/self_comm.h"
#include "muon/common/dtype.h"
#include "muon/device/host_device.h"
#include "muon/math/backend.h"
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

// ---- Split matrices (Unit::parts > 1) ----

// Every rank's plan of a job where rank 0 owns every matrix, then unit
// `unit` split among `owners`, and every rank's tables.
struct SplitJob {
  std::vector<Plan> plans;
  std::vector<std::vector<RoundTable>> tables;
};

SplitJob MakeSplitJob(int n, const std::vector<ParamSpec>& params, size_t unit,
                      const std::vector<int>& owners) {
  std::vector<RankDesc> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(DescribeRank(r, n, {}, params));
  PlanOptions o;
  o.assignment = Assignment::kCustom;
  o.custom = [](const std::vector<MatrixInfo>& infos, std::vector<int>* out) {
    out->assign(infos.size(), infos.front().holders.front());
    return absl::OkStatus();
  };
  SplitJob job;
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<Plan> plan = BuildPlan(ranks, r, o);
    EXPECT_TRUE(plan.ok()) << plan.status();
    const absl::Status split = SplitUnit(&*plan, unit, owners, n, 5);
    EXPECT_TRUE(split.ok()) << split;
    job.tables.push_back(BuildRoundTables(*plan, r, n, DType::kF32));
    job.plans.push_back(std::move(*plan));
  }
  return job;
}

// Each rank's local storage per registered param: element e of the global
// tensor holds e + 1 (exact in float).
std::vector<std::vector<float>> LocalValues(const Plan& plan) {
  std::vector<std::vector<float>> out(plan.params.size());
  for (const PlanParam& pp : plan.params) {
    if (pp.local < 0 || pp.local_holder < 0) continue;
    std::vector<float>& v = out[static_cast<size_t>(pp.local)];
    for (const Run& run : ExpandBlocks(pp.Blocks(pp.holders[pp.local_holder]))) {
      for (int64_t k = 0; k < run.length; ++k) v.push_back(static_cast<float>(run.offset + k + 1));
    }
  }
  return out;
}

// One direction between every pair of ranks, span by span in table order:
// `send` spans of a rank read `from`, the peer's matching `recv` spans write
// `to`. Returns false when a pair's element counts differ.
template <typename SendSpan, typename RecvSpan, typename ReadFn, typename WriteFn>
bool Move(int n, const std::function<const std::vector<SendSpan>&(int, int)>& send,
          const std::function<const std::vector<RecvSpan>&(int, int)>& recv, ReadFn read,
          WriteFn write) {
  for (int from = 0; from < n; ++from) {
    for (int to = 0; to < n; ++to) {
      std::vector<float> wire;
      for (const SendSpan& s : send(from, to)) {
        for (int64_t k = 0; k < s.length; ++k) wire.push_back(read(from, s, k));
      }
      size_t at = 0;
      for (const RecvSpan& s : recv(to, from)) {
        for (int64_t k = 0; k < s.length; ++k) {
          if (at >= wire.size()) return false;
          write(to, s, k, wire[at++]);
        }
      }
      if (at != wire.size()) return false;
    }
  }
  return true;
}

// Gathers round 0 into every rank's slots, checks each owned part holds its
// block packed as PlanNewtonSchulzBlock stores it (and whole matrices
// whole), then scatters the negated slots back and checks every holder's
// every element came back negated, once.
void CheckSplitRound(int n, const SplitJob& job) {
  std::vector<std::vector<std::vector<float>>> local(static_cast<size_t>(n));
  std::vector<std::vector<float>> slots(static_cast<size_t>(n));
  std::vector<std::vector<int>> writes(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    local[r] = LocalValues(job.plans[r]);
    slots[r].assign(static_cast<size_t>(job.tables[r][0].slot_floats), NAN);
    writes[r].assign(slots[r].size(), 0);
  }
  ASSERT_TRUE((Move<LocalSpan, SlotSpan>(
      n, [&](int r, int p) -> const std::vector<LocalSpan>& { return job.tables[r][0].gather_send[p]; },
      [&](int r, int p) -> const std::vector<SlotSpan>& { return job.tables[r][0].gather_recv[p]; },
      [&](int r, const LocalSpan& s, int64_t k) { return local[r][s.param][s.pos + k]; },
      [&](int r, const SlotSpan& s, int64_t k, float v) {
        slots[r][s.pos + k] = v;
        ++writes[r][s.pos + k];
      })));
  for (int r = 0; r < n; ++r) {
    const Plan& plan = job.plans[r];
    const RoundTable& t = job.tables[r][0];
    for (size_t i = 0; i < slots[r].size(); ++i) {
      ASSERT_EQ(writes[r][i], 1) << "rank " << r << " slot element " << i;
    }
    for (const BlockSlot& b : t.blocks) {
      const Unit& u = plan.units[b.unit];
      const PlanParam& pp = plan.params[u.param];
      EXPECT_EQ(u.owner, r);
      EXPECT_EQ(b.m, std::min(pp.rows, pp.cols));
      EXPECT_EQ(b.width, u.width);
      EXPECT_EQ(b.tall, pp.rows > pp.cols);
      const int64_t base = u.index * pp.rows * pp.cols;
      for (int64_t i = 0; i < (b.tall ? b.width : b.m); ++i) {
        for (int64_t j = 0; j < (b.tall ? b.m : b.width); ++j) {
          const int64_t global = b.tall ? base + (u.first + i) * pp.cols + j
                                        : base + i * pp.cols + u.first + j;
          ASSERT_EQ(slots[r][b.offset + i * (b.tall ? b.m : b.width) + j], global + 1.0f)
              << "rank " << r << " part " << u.part << " (" << i << ", " << j << ")";
        }
      }
    }
  }
  // The scatter: each holder's update storage starts as NaN.
  std::vector<std::vector<std::vector<float>>> updates = local;
  for (auto& per_rank : updates) {
    for (auto& v : per_rank) std::fill(v.begin(), v.end(), NAN);
  }
  ASSERT_TRUE((Move<SlotSpan, LocalSpan>(
      n, [&](int r, int p) -> const std::vector<SlotSpan>& { return job.tables[r][0].scatter_send[p]; },
      [&](int r, int p) -> const std::vector<LocalSpan>& { return job.tables[r][0].scatter_recv[p]; },
      [&](int r, const SlotSpan& s, int64_t k) { return -slots[r][s.pos + k]; },
      [&](int r, const LocalSpan& s, int64_t k, float v) {
        float& at = updates[r][s.param][s.pos + k];
        EXPECT_TRUE(std::isnan(at)) << "rank " << r << " written twice at " << s.pos + k;
        at = v;
      })));
  for (int r = 0; r < n; ++r) {
    for (size_t p = 0; p < local[r].size(); ++p) {
      for (size_t e = 0; e < local[r][p].size(); ++e) {
        ASSERT_EQ(updates[r][p][e], -local[r][p][e]) << "rank " << r << " param " << p << " " << e;
      }
    }
  }
}

TEST(SplitRoundTables, AWideMatrixsColumnBlocksGoToTheirOwners) {
  // 6 x 10, rows over 3 ranks; its wide orientation's 10 columns cut 4, 3, 3
  // among ranks 2, 0, 1. Another matrix stays whole beside it.
  const SplitJob job =
      MakeSplitJob(3, {{"a", {6, 4}, {Shard(0, 0)}}, {"w", {6, 10}, {Shard(0, 0)}}}, 1, {2, 0, 1});
  const Unit& part0 = job.plans[0].units[1];
  EXPECT_EQ(part0.parts, 3);
  EXPECT_EQ(part0.first, 0);
  EXPECT_EQ(part0.width, 4);
  EXPECT_EQ(job.plans[0].units[3].first, 7);
  EXPECT_EQ(job.plans[0].units[3].width, 3);
  EXPECT_EQ(part0.flops, NewtonSchulzBlockFlops(6, 4, 5));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.tables[r][0].blocks.size(), 1u) << r;
    EXPECT_EQ(job.plans[r].digest, job.plans[0].digest);
  }
  CheckSplitRound(3, job);
}

TEST(SplitRoundTables, ATallMatrixsRowBlocksGoToTheirOwners) {
  // 10 x 6, columns over 2 ranks (each row interleaves them); rows cut 5, 5.
  const SplitJob job = MakeSplitJob(2, {{"w", {10, 6}, {Shard(0, 1)}}}, 0, {1, 0});
  EXPECT_TRUE(job.tables[1][0].blocks[0].tall);
  EXPECT_EQ(job.tables[1][0].blocks[0].width, 5);
  CheckSplitRound(2, job);
}

TEST(SplitRoundTables, ReplicasGiveEachOwnerItsBlockFromItsOwnCopy) {
  // Replicated over 3 ranks (DDP): no gather traffic, every copy receives
  // every block.
  const SplitJob job = MakeSplitJob(3, {{"w", {4, 9}, {Replicate(0)}}}, 0, {0, 1, 2});
  for (int r = 0; r < 3; ++r) {
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(Elements(job.tables[r][0].gather_send[p]), r == p ? 12 : 0) << r << " to " << p;
      EXPECT_EQ(Elements(job.tables[r][0].scatter_send[p]), 12) << r << " to " << p;
    }
  }
  CheckSplitRound(3, job);
}

TEST(SplitUnit, RefusesWhatCannotBeSplit) {
  std::vector<RankDesc> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(DescribeRank(r, 2, {}, {{"w", {3, 4}, {Replicate(0)}}}));
  absl::StatusOr<Plan> plan = BuildPlan(ranks, 0, PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint64_t digest = plan->digest;
  EXPECT_EQ(SplitUnit(&*plan, 0, {0}, 2, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitUnit(&*plan, 0, {0, 0}, 2, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitUnit(&*plan, 0, {0, 2}, 2, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitUnit(&*plan, 1, {0, 1}, 2, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan->digest, digest);
  EXPECT_EQ(plan->units.size(), 1u);
  ASSERT_TRUE(SplitUnit(&*plan, 0, {1, 0}, 2, 5).ok());
  EXPECT_NE(plan->digest, digest);
  const absl::Status again = SplitUnit(&*plan, 0, {0, 1}, 2, 5);
  EXPECT_NE(again.message().find("already split"), std::string::npos) << again;
}

}  // namespace
}  // namespace muon
