#include "muon/comm/inprocess_comm.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "muon/comm/codes.h"
#include "muon/comm/callback_error.h"
#include "muon/comm/ordered_sum.h"
#include "muon/comm/testing/pattern.h"
#include "muon/common/dtype.h"

namespace muon {
namespace {

// A table that is released when it goes out of scope.
class Table {
 public:
  Table() { std::memset(&t_, 0, sizeof t_); }
  ~Table() { Release(); }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  muon_comm_t* get() { return &t_; }
  muon_comm_t& operator*() { return t_; }
  muon_comm_t* operator->() { return &t_; }
  void Release() {
    if (t_.release != nullptr) t_.release(t_.ctx);
    t_.release = nullptr;
  }

 private:
  muon_comm_t t_;
};

// Runs fn(rank) on n threads and waits for all of them.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

using pattern::Byte;
using pattern::Mix;
using pattern::PairBytes;

// Values whose float sums depend on the order of addition.
float Value(int rank, int iter, size_t i) {
  const uint32_t h = Mix(rank, iter, static_cast<uint32_t>(i), 99);
  const float mantissa = static_cast<float>(h % 100000) / 1000.0f - 50.0f;
  const int exponent = static_cast<int>(h >> 20) % 24 - 12;
  return std::ldexp(mantissa, exponent);
}

// The sum reduce_scatter must produce: rank order, fp32, one rounding.
float Expected(DType t, int n, const std::function<float(int)>& element) {
  float acc = element(0);
  for (int r = 1; r < n; ++r) acc += element(r);
  return RoundTo(t, acc);
}

void RunAllCollectives(muon_comm_t& c, int iters, int salt) {
  const int n = c.size;
  const int me = c.rank;
  for (int iter = 0; iter < iters; ++iter) {
    const int round = iter * 1000 + salt;
    // all_gather, byte counts varying per round, zero included.
    {
      const size_t bytes = static_cast<size_t>(iter % 5 == 0 ? 0 : (iter * 7) % 23 + 1);
      std::vector<unsigned char> send(bytes), recv(bytes * n + 1, 0xee);
      for (size_t k = 0; k < bytes; ++k) send[k] = Byte(me, -1, round, k);
      ASSERT_EQ(c.all_gather(c.ctx, send.data(), recv.data(), bytes, nullptr), MUON_OK)
          << TakeCallbackError();
      for (int r = 0; r < n; ++r)
        for (size_t k = 0; k < bytes; ++k)
          ASSERT_EQ(recv[r * bytes + k], Byte(r, -1, round, k)) << "rank " << r << " byte " << k;
      EXPECT_EQ(recv[bytes * n], 0xee);  // nothing past the end
    }
    // all_gather in place: send is this rank's block of recv.
    {
      const size_t bytes = 5;
      std::vector<unsigned char> recv(bytes * n);
      for (size_t k = 0; k < bytes; ++k) recv[me * bytes + k] = Byte(me, -2, round, k);
      ASSERT_EQ(c.all_gather(c.ctx, recv.data() + me * bytes, recv.data(), bytes, nullptr),
                MUON_OK);
      for (int r = 0; r < n; ++r)
        for (size_t k = 0; k < bytes; ++k) ASSERT_EQ(recv[r * bytes + k], Byte(r, -2, round, k));
    }
    // all_to_all_v: per-pair sizes with zeros, blocks stored in reverse peer order.
    {
      std::vector<size_t> sb(n), so(n), rb(n), ro(n);
      size_t send_total = 0, recv_total = 0;
      for (int p = n - 1; p >= 0; --p) {
        sb[p] = PairBytes(me, p, round);
        so[p] = send_total;
        send_total += sb[p] + 3;  // gaps between blocks
        rb[p] = PairBytes(p, me, round);
        ro[p] = recv_total;
        recv_total += rb[p] + 2;
      }
      std::vector<unsigned char> send(send_total + 1), recv(recv_total + 1, 0xee);
      for (int p = 0; p < n; ++p)
        for (size_t k = 0; k < sb[p]; ++k) send[so[p] + k] = Byte(me, p, round, k);
      ASSERT_EQ(c.all_to_all_v(c.ctx, send.data(), sb.data(), so.data(), recv.data(), rb.data(),
                               ro.data(), nullptr),
                MUON_OK)
          << TakeCallbackError();
      for (int p = 0; p < n; ++p) {
        for (size_t k = 0; k < rb[p]; ++k)
          ASSERT_EQ(recv[ro[p] + k], Byte(p, me, round, k)) << "from " << p << " byte " << k;
        EXPECT_EQ(recv[ro[p] + rb[p]], 0xee);  // the gap is untouched
      }
    }
    // broadcast from a rotating root.
    {
      const int root = iter % n;
      const size_t bytes = static_cast<size_t>(iter % 4 == 3 ? 0 : 17 + iter % 9);
      std::vector<unsigned char> buf(bytes + 1, 0xee);
      for (size_t k = 0; k < bytes; ++k) buf[k] = me == root ? Byte(root, -3, round, k) : 0;
      ASSERT_EQ(c.broadcast(c.ctx, buf.data(), bytes, root, nullptr), MUON_OK);
      for (size_t k = 0; k < bytes; ++k) ASSERT_EQ(buf[k], Byte(root, -3, round, k));
      EXPECT_EQ(buf[bytes], 0xee);
    }
    // reduce_scatter in every dtype, counts varying (zero included).
    for (int d = 0; d < 3; ++d) {
      DType t;
      ASSERT_TRUE(FromCDType(d, &t));
      const size_t count = static_cast<size_t>(iter % 6 == 1 ? 0 : 1 + (iter * 13 + d) % 37);
      const size_t es = SizeOf(t);
      std::vector<unsigned char> send(n * count * es), recv(count * es + 2, 0xee);
      for (size_t i = 0; i < n * count; ++i) StoreFromFloat(t, send.data(), i, Value(me, round, i));
      ASSERT_EQ(c.reduce_scatter(c.ctx, send.data(), recv.data(), count, d, nullptr), MUON_OK)
          << TakeCallbackError();
      for (size_t i = 0; i < count; ++i) {
        const size_t global = me * count + i;
        const float want = Expected(t, n, [&](int r) {
          return RoundTo(t, Value(r, round, global));  // what rank r stored
        });
        const float got = LoadAsFloat(t, recv.data(), i);
        ASSERT_EQ(FloatBits(got), FloatBits(want))
            << DTypeName(t) << " element " << i << ": " << got << " vs " << want;
      }
      EXPECT_EQ(recv[count * es], 0xee);
    }
    ASSERT_EQ(c.barrier(c.ctx, nullptr), MUON_OK);
  }
}

TEST(InProcessComm, EveryCollectiveAtWorldSizes1To8) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto world = InProcessWorld::Create(n);
    ASSERT_TRUE(world.ok());
    OnRanks(n, [&](int rank) {
      Table t;
      ASSERT_TRUE(MakeInProcessComm(*world, {}, rank, t.get()).ok());
      EXPECT_EQ(t->struct_size, sizeof(muon_comm_t));
      EXPECT_EQ(t->rank, rank);
      EXPECT_EQ(t->size, n);
      RunAllCollectives(*t, 30, 0);
    });
  }
}

TEST(InProcessComm, SubGroupsOfArbitraryRankListsRunConcurrently) {
  const int n = 8;
  auto world = InProcessWorld::Create(n);
  ASSERT_TRUE(world.ok());
  const std::vector<std::vector<int>> groups = {
      {3, 1}, {0, 2, 4, 6}, {5}, {7, 6, 5, 4, 3, 2, 1, 0}, {1, 7, 4}};
  OnRanks(n, [&](int rank) {
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<int>& list = groups[g];
      int position = -1;
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i] == rank) position = static_cast<int>(i);
      if (position < 0) continue;
      Table t;
      ASSERT_TRUE(MakeInProcessComm(*world, list, rank, t.get()).ok());
      EXPECT_EQ(t->rank, position);
      EXPECT_EQ(t->size, static_cast<int32_t>(list.size()));
      RunAllCollectives(*t, 12, static_cast<int>(g) + 1);
    }
  });
}

// A world table and a group over the same ranks are distinct communicators:
// collectives issued on both at once, from two threads per rank, never mix.
TEST(InProcessComm, TwoTablesOverTheSameRanksAreSeparate) {
  const int n = 4;
  auto world = InProcessWorld::Create(n);
  ASSERT_TRUE(world.ok());
  std::vector<Table> first(n), second(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(MakeInProcessComm(*world, {}, r, first[r].get()).ok());
    ASSERT_TRUE(MakeInProcessComm(*world, {0, 1, 2, 3}, r, second[r].get()).ok());
  }
  OnRanks(2 * n, [&](int thread) {
    const int rank = thread % n;
    muon_comm_t& t = thread < n ? *first[rank] : *second[rank];
    RunAllCollectives(t, 20, thread < n ? 11 : 22);
  });
}

// One collective call of every member of `n` ranks, each given by fn(rank,
// table); returns the statuses and messages.
struct Outcome {
  std::vector<muon_status_t> status;
  std::vector<std::string> message;
};

Outcome CallAll(int n, const std::function<muon_status_t(int, muon_comm_t&)>& fn,
                bool then_check_usable = true) {
  auto world = InProcessWorld::Create(n);
  Outcome out;
  out.status.resize(n);
  out.message.resize(n);
  OnRanks(n, [&](int rank) {
    Table t;
    ASSERT_TRUE(MakeInProcessComm(*world, {}, rank, t.get()).ok());
    out.status[rank] = fn(rank, *t);
    out.message[rank] = TakeCallbackError();
    if (then_check_usable) {
      // A failed collective leaves the communicator usable.
      int v = rank;
      std::vector<int> all(n);
      ASSERT_EQ(t->all_gather(t->ctx, &v, all.data(), sizeof v, nullptr), MUON_OK);
      for (int r = 0; r < n; ++r) ASSERT_EQ(all[r], r);
    }
  });
  return out;
}

void ExpectAllFail(const Outcome& o, muon_status_t code, const std::string& needle) {
  for (size_t r = 0; r < o.status.size(); ++r) {
    EXPECT_EQ(o.status[r], code) << "rank " << r;
    EXPECT_NE(o.message[r].find(needle), std::string::npos)
        << "rank " << r << ": \"" << o.message[r] << "\" lacks \"" << needle << "\"";
  }
}

TEST(InProcessComm, InconsistentCallsFailOnEveryRankWithoutCopying) {
  // all_gather byte counts differ: nobody copies (recv stays as it was).
  {
    std::vector<std::vector<unsigned char>> recv(3, std::vector<unsigned char>(64, 0xee));
    Outcome o = CallAll(3, [&](int rank, muon_comm_t& t) {
      unsigned char send[16] = {1, 2, 3};
      return t.all_gather(t.ctx, send, recv[rank].data(), rank == 2 ? 16 : 8, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "all_gather byte counts differ");
    EXPECT_NE(o.message[0].find("world rank 2"), std::string::npos) << o.message[0];
    for (const auto& v : recv)
      for (unsigned char b : v) ASSERT_EQ(b, 0xee);
  }
  // Different collectives.
  {
    Outcome o = CallAll(2, [&](int rank, muon_comm_t& t) {
      unsigned char b[4] = {0, 0, 0, 0};
      return rank == 0 ? t.barrier(t.ctx, nullptr) : t.broadcast(t.ctx, b, 4, 0, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "mismatched collectives");
    EXPECT_NE(o.message[1].find("broadcast"), std::string::npos) << o.message[1];
  }
  // Broadcast roots differ, or out of range.
  {
    Outcome o = CallAll(3, [&](int rank, muon_comm_t& t) {
      unsigned char b[4] = {};
      return t.broadcast(t.ctx, b, 4, rank == 1 ? 1 : 0, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "broadcast roots differ");
    o = CallAll(2, [&](int, muon_comm_t& t) {
      unsigned char b[4] = {};
      return t.broadcast(t.ctx, b, 4, 2, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "root 2 is outside");
  }
  // all_to_all_v counts that do not pair up.
  {
    Outcome o = CallAll(2, [&](int rank, muon_comm_t& t) {
      unsigned char send[8] = {}, recv[8] = {};
      size_t sb[2] = {2, 2}, so[2] = {0, 4}, rb[2] = {2, rank == 1 ? 3u : 2u}, ro[2] = {0, 4};
      return t.all_to_all_v(t.ctx, send, sb, so, recv, rb, ro, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "do not pair up");
    o = CallAll(2, [&](int rank, muon_comm_t& t) {
      unsigned char buf[8] = {};
      size_t sizes[2] = {1, 1}, offsets[2] = {0, 1};
      return t.all_to_all_v(t.ctx, buf, sizes, rank == 0 ? nullptr : offsets, buf + 4, sizes,
                            offsets, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "NULL send_offsets");
  }
  // reduce_scatter: counts, dtypes, unknown dtype.
  {
    Outcome o = CallAll(2, [&](int rank, muon_comm_t& t) {
      float send[8] = {}, recv[4] = {};
      return t.reduce_scatter(t.ctx, send, recv, rank == 0 ? 4 : 3, MUON_DTYPE_FLOAT32, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "reduce_scatter counts differ");
    o = CallAll(2, [&](int rank, muon_comm_t& t) {
      float send[8] = {}, recv[4] = {};
      return t.reduce_scatter(t.ctx, send, recv, 2, rank, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "reduce_scatter dtypes differ");
    o = CallAll(2, [&](int, muon_comm_t& t) {
      float send[8] = {}, recv[4] = {};
      return t.reduce_scatter(t.ctx, send, recv, 2, 7, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "dtype 7 is unknown");
  }
  // NULL buffers with a nonzero size.
  {
    Outcome o = CallAll(2, [&](int rank, muon_comm_t& t) {
      unsigned char send[4] = {}, recv[8] = {};
      return t.all_gather(t.ctx, send, rank == 1 ? nullptr : recv, 4, nullptr);
    });
    ExpectAllFail(o, MUON_INVALID_ARGUMENT, "NULL recv buffer");
  }
  // A stream: host memory only.
  {
    int fake_stream = 0;
    Outcome o = CallAll(2, [&](int rank, muon_comm_t& t) {
      return t.barrier(t.ctx, rank == 1 ? &fake_stream : nullptr);
    });
    ExpectAllFail(o, MUON_UNIMPLEMENTED, "stream");
  }
}

TEST(InProcessComm, OverlappingCallsOfOneRankAreRefused) {
  auto world = InProcessWorld::Create(2);
  ASSERT_TRUE(world.ok());
  Table t0, t1;
  ASSERT_TRUE(MakeInProcessComm(*world, {}, 0, t0.get()).ok());
  ASSERT_TRUE(MakeInProcessComm(*world, {}, 1, t1.get()).ok());
  // Two threads call as rank 0 at once: the second to arrive is refused at
  // once, the first completes when rank 1 joins.
  std::promise<void> refused;
  std::atomic<int> refusals{0}, successes{0};
  auto as_rank0 = [&]() {
    const muon_status_t s = t0->barrier(t0->ctx, nullptr);
    if (s == MUON_FAILED_PRECONDITION) {
      EXPECT_NE(TakeCallbackError().find("overlaps"), std::string::npos);
      ++refusals;
      refused.set_value();
    } else {
      EXPECT_EQ(s, MUON_OK);
      ++successes;
    }
  };
  std::thread a(as_rank0), b(as_rank0);
  refused.get_future().wait();
  EXPECT_EQ(t1->barrier(t1->ctx, nullptr), MUON_OK);
  a.join();
  b.join();
  EXPECT_EQ(refusals.load(), 1);
  EXPECT_EQ(successes.load(), 1);
}

TEST(InProcessComm, AbortReleasesRanksWaitingForOneThatNeverCalls) {
  auto world = InProcessWorld::Create(3);
  ASSERT_TRUE(world.ok());
  Table t[3];
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(MakeInProcessComm(*world, {}, r, t[r].get()).ok());
  // Ranks 0 and 1 enter an all_gather; rank 2 never does.
  std::atomic<int> entered{0};
  std::vector<muon_status_t> got(2, MUON_OK);
  std::vector<std::string> why(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      int32_t mine = r, all[3] = {-1, -1, -1};
      ++entered;
      got[r] = t[r]->all_gather(t[r]->ctx, &mine, all, sizeof mine, nullptr);
      why[r] = TakeCallbackError();
      EXPECT_EQ(all[2], -1);  // nothing was copied
    });
  }
  while (entered.load() < 2) std::this_thread::yield();
  (*world)->Abort();
  for (auto& th : ranks) th.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r], MUON_UNAVAILABLE) << r;
    EXPECT_NE(why[r].find("the in-process world was aborted"), std::string::npos) << why[r];
  }
  // Every later collective fails at once, tables joined after it too.
  EXPECT_EQ(t[2]->barrier(t[2]->ctx, nullptr), MUON_UNAVAILABLE);
  Table late;
  ASSERT_TRUE(MakeInProcessComm(*world, {0, 1}, 0, late.get()).ok());
  EXPECT_EQ(late->barrier(late->ctx, nullptr), MUON_UNAVAILABLE);
}

TEST(InProcessComm, JoinChecksTheRankList) {
  EXPECT_FALSE(InProcessWorld::Create(0).ok());
  EXPECT_FALSE(InProcessWorld::Create(-3).ok());
  auto world = InProcessWorld::Create(4);
  ASSERT_TRUE(world.ok());
  muon_comm_t t;
  std::memset(&t, 0xab, sizeof t);
  const muon_comm_t before = t;
  auto expect_error = [&](const std::vector<int>& ranks, int rank, const std::string& needle) {
    const absl::Status s = MakeInProcessComm(*world, ranks, rank, &t);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s.message();
    EXPECT_EQ(std::memcmp(&t, &before, sizeof t), 0);  // untouched
  };
  expect_error({0, 1}, 2, "rank 2 is not in the rank list [0, 1]");
  expect_error({0, 4}, 0, "ranks[1] = 4");
  expect_error({1, -1}, 1, "ranks[1] = -1");
  expect_error({2, 3, 2}, 2, "appears twice");
  expect_error({0, 1, 2, 3, 0}, 0, "more than the world's 4");
  expect_error({}, 4, "rank 4 is not in the rank list");
  EXPECT_EQ(MakeInProcessComm(nullptr, {}, 0, &t).code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessComm, TablesOutliveTheWorldHandle) {
  const int n = 3;
  std::vector<Table> tables(n), sub(2);
  {
    auto world = InProcessWorld::Create(n);
    ASSERT_TRUE(world.ok());
    for (int r = 0; r < n; ++r) ASSERT_TRUE(MakeInProcessComm(*world, {}, r, tables[r].get()).ok());
    for (int r : {2, 0}) {
      ASSERT_TRUE(MakeInProcessComm(*world, {2, 0}, r, sub[r == 2 ? 0 : 1].get()).ok());
    }
    // A table requested and released without a collective.
    Table unused;
    ASSERT_TRUE(MakeInProcessComm(*world, {1}, 1, unused.get()).ok());
  }  // the last handle to the world is gone; the tables keep it alive
  OnRanks(n, [&](int rank) { RunAllCollectives(*tables[rank], 4, 5); });
  OnRanks(2, [&](int i) { RunAllCollectives(*sub[i], 4, 6); });
  // Release in an arbitrary order; the world goes with the last table (ASan checks).
  tables[1].Release();
  sub[0].Release();
  tables[0].Release();
  tables[2].Release();
  sub[1].Release();
}

TEST(OrderedSum, ChunksAliasingAndOrder) {
  // More elements than one accumulator chunk, the output aliasing block 1.
  const int n = 3;
  const size_t count = 2500;
  std::vector<std::vector<float>> blocks(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) blocks[r][i] = Value(r, 1, i);
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = (blocks[0][i] + blocks[1][i]) + blocks[2][i];
  const void* ptrs[3] = {blocks[0].data(), blocks[1].data(), blocks[2].data()};
  SumInRankOrder(DType::kF32, ptrs, n, count, blocks[1].data());
  size_t order_matters = 0;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(FloatBits(blocks[1][i]), FloatBits(want[i])) << i;
    const float reversed = (Value(2, 1, i) + Value(1, 1, i)) + Value(0, 1, i);
    order_matters += FloatBits(reversed) != FloatBits(want[i]);
  }
  // The data is chosen so that the order of addition shows.
  EXPECT_GT(order_matters, count / 20);

  // bf16: fp32 accumulation, one rounding (not a bf16 rounding per addition).
  const uint16_t one = FloatToBf16Bits(1.0f), tiny = FloatToBf16Bits(3.0f / 1024);
  const uint16_t b0[1] = {one}, b1[1] = {tiny}, b2[1] = {tiny};
  const void* bptrs[3] = {b0, b1, b2};
  uint16_t out = 0;
  SumInRankOrder(DType::kBF16, bptrs, 3, 1, &out);
  EXPECT_EQ(Bf16BitsToFloat(tiny), 3.0f / 1024);
  EXPECT_EQ(Bf16BitsToFloat(out), 1.0f + 1.0f / 128);  // rounding each step would give 1.0

  DType t;
  EXPECT_FALSE(FromCDType(3, &t));
  EXPECT_FALSE(FromCDType(-1, &t));
}

}  // namespace
}  // namespace muon
