#include "muon/sharding/layout.h"

#include <cstdint>
#include <algorithm>
#include <functional>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "muon/sharding/testing/job.h"

namespace muon {
namespace {

// Expands runs to the list of global indices, in local order.
std::vector<int64_t> Indices(const Piece& p) {
  std::vector<int64_t> out;
  for (const Run& r : p.runs)
    for (int64_t k = 0; k < r.length; ++k) out.push_back(r.offset + k);
  return out;
}

using testjob::Flat;
using testjob::Replicate;
using testjob::Shard;

Piece MustCompute(const Layout& l, const std::vector<int>& sizes, const std::vector<int>& coords) {
  auto p = ComputePiece(l, sizes, coords, "w");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Piece();
}

// Reference for a 2-D rows x cols tensor: the local element (i, j) of a box
// [r0, r0 + nr) x [c0, c0 + nc) is global (r0 + i, c0 + j).
std::vector<int64_t> Box(int64_t cols, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) out.push_back((r0 + i) * cols + c0 + j);
  return out;
}

TEST(Layout, NoPlacementIsWholeTensor) {
  Layout l{{3, 5}, {}};
  Piece p = MustCompute(l, {}, {});
  EXPECT_EQ(Indices(p), Box(5, 0, 3, 0, 5));
  EXPECT_EQ(p.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(p.runs.size(), 1u);
  EXPECT_TRUE(p.canonical);
}

TEST(Layout, TensorParallelColumnAndRow) {
  // Column-parallel: Shard(0), rows split; row-parallel: Shard(1), cols split.
  for (int r = 0; r < 4; ++r) {
    Piece col = MustCompute({{8, 6}, {Shard(0, 0)}}, {4}, {r});
    EXPECT_EQ(Indices(col), Box(6, 2 * r, 2, 0, 6));
    Piece row = MustCompute({{6, 8}, {Shard(0, 1)}}, {4}, {r});
    EXPECT_EQ(Indices(row), Box(8, 0, 6, 2 * r, 2));
    EXPECT_EQ(row.shape, (std::vector<int64_t>{6, 2}));
  }
}

TEST(Layout, FsdpChunkUnevenWithEmptyTail) {
  // torch.chunk of 10 rows over 4 ranks: 3, 3, 3, 1; of 5 rows over 4: 2, 2, 1, 0.
  const int64_t want[4][2] = {{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (int r = 0; r < 4; ++r) {
    Piece p = MustCompute({{10, 3}, {Shard(0, 0, ShardSplit::kChunk)}}, {4}, {r});
    EXPECT_EQ(Indices(p), Box(3, want[r][0], want[r][1], 0, 3));
  }
  const int64_t want5[4] = {2, 2, 1, 0};
  for (int r = 0; r < 4; ++r) {
    Piece p = MustCompute({{5, 3}, {Shard(0, 0, ShardSplit::kChunk)}}, {4}, {r});
    EXPECT_EQ(p.numel, want5[r] * 3);
  }
}

TEST(Layout, ExplicitSizes) {
  std::vector<int64_t> sizes = {1, 0, 4};
  int64_t at = 0;
  for (int r = 0; r < 3; ++r) {
    Piece p = MustCompute({{4, 5}, {Shard(0, 1, ShardSplit::kSizes, sizes)}}, {3}, {r});
    EXPECT_EQ(Indices(p), Box(5, 0, 4, at, sizes[r]));
    at += sizes[r];
  }
}

TEST(Layout, FlatRangesSplitRows) {
  // ZeRO: 4 x 5 = 20 elements, ranges [0,7) [7,7) [7,13) [13,20).
  const int64_t starts[4] = {0, 7, 7, 13}, lens[4] = {7, 0, 6, 7};
  std::vector<Piece> pieces;
  for (int r = 0; r < 4; ++r) {
    Piece p = MustCompute({{4, 5}, {Flat(0, starts[r], lens[r])}}, {4}, {r});
    std::vector<int64_t> want;
    for (int64_t k = 0; k < lens[r]; ++k) want.push_back(starts[r] + k);
    EXPECT_EQ(Indices(p), want);
    EXPECT_EQ(p.shape, (std::vector<int64_t>{lens[r]}));
    pieces.push_back(p);
  }
  std::vector<const Piece*> ptrs;
  for (auto& p : pieces) ptrs.push_back(&p);
  EXPECT_TRUE(CheckTiling(ptrs, 20, "w").ok());
}

TEST(Layout, TpThenFsdpAndFsdpThenTp) {
  // 8 x 6, TP=2 over cols (row-parallel), FSDP=2 over rows: both orders give
  // the same box for the same coordinates.
  for (int tp = 0; tp < 2; ++tp) {
    for (int fs = 0; fs < 2; ++fs) {
      Piece a = MustCompute({{8, 6}, {Shard(0, 1), Shard(1, 0)}}, {2, 2}, {tp, fs});
      Piece b = MustCompute({{8, 6}, {Shard(1, 0), Shard(0, 1)}}, {2, 2}, {tp, fs});
      EXPECT_EQ(Indices(a), Box(6, 4 * fs, 4, 3 * tp, 3));
      EXPECT_EQ(Indices(b), Indices(a));
    }
  }
}

TEST(Layout, TpThenDistributedOptimizerFlatRange) {
  // Column-parallel TP=2 of 6 x 4 (3 rows each), then each TP piece (12
  // elements) split by flat ranges over DP=2: [0,5) and [5,12).
  const int64_t starts[2] = {0, 5}, lens[2] = {5, 7};
  for (int tp = 0; tp < 2; ++tp) {
    for (int dp = 0; dp < 2; ++dp) {
      Piece p = MustCompute({{6, 4}, {Shard(0, 0), Flat(1, starts[dp], lens[dp])}}, {2, 2},
                            {tp, dp});
      std::vector<int64_t> want;
      auto tp_piece = Box(4, 3 * tp, 3, 0, 4);
      for (int64_t k = 0; k < lens[dp]; ++k) want.push_back(tp_piece[starts[dp] + k]);
      EXPECT_EQ(Indices(p), want);
    }
  }
}

TEST(Layout, RowParallelThenFlatRangeIsManyRuns) {
  // Shard(1) then a flat range crossing rows: runs follow the local order.
  Piece p = MustCompute({{4, 6}, {Shard(0, 1), Flat(1, 2, 5)}}, {2, 3}, {1, 0});
  auto tp_piece = Box(6, 0, 4, 3, 3);
  std::vector<int64_t> want(tp_piece.begin() + 2, tp_piece.begin() + 7);
  EXPECT_EQ(Indices(p), want);
  EXPECT_EQ(p.runs.size(), 3u);  // [5,6) [9,12) [15,16)
}

TEST(Layout, HsdpReplicaIsNotCanonical) {
  for (int rep = 0; rep < 2; ++rep) {
    Piece p = MustCompute({{8, 2}, {Replicate(0), Shard(1, 0)}}, {2, 4}, {rep, 3});
    EXPECT_EQ(Indices(p), Box(2, 6, 2, 0, 2));
    EXPECT_EQ(p.canonical, rep == 0);
  }
}

TEST(Layout, ThreeDimensionalShard) {
  // Stacked experts (4, 3, 2), sharded over the expert dim by EP=2.
  Piece p = MustCompute({{4, 3, 2}, {Shard(0, 0)}}, {2}, {1});
  std::vector<int64_t> want;
  for (int64_t k = 12; k < 24; ++k) want.push_back(k);
  EXPECT_EQ(Indices(p), want);
  // And over the middle dim: element (e, i, j) -> e*6 + i*2 + j with i in [1,3) for sizes {1, 2}.
  Piece q = MustCompute({{4, 3, 2}, {Shard(0, 1, ShardSplit::kSizes, {1, 2})}}, {2}, {1});
  want.clear();
  for (int64_t e = 0; e < 4; ++e)
    for (int64_t i = 1; i < 3; ++i)
      for (int64_t j = 0; j < 2; ++j) want.push_back(e * 6 + i * 2 + j);
  EXPECT_EQ(Indices(q), want);
}

TEST(Layout, Errors) {
  auto msg = [](const Layout& l, std::vector<int> sizes, std::vector<int> coords) {
    auto p = ComputePiece(l, sizes, coords, "param 'w'");
    EXPECT_FALSE(p.ok());
    return std::string(p.status().message());
  };
  EXPECT_NE(msg({{8, 6}, {Shard(0, 2)}}, {2}, {0}).find("dim 2 does not exist"),
            std::string::npos);
  EXPECT_NE(msg({{7, 6}, {Shard(0, 0)}}, {2}, {0}).find("does not split evenly"),
            std::string::npos);
  EXPECT_NE(msg({{7, 6}, {Shard(0, 0, ShardSplit::kSizes, {3, 3})}}, {2}, {0}).find("add up to 6"),
            std::string::npos);
  EXPECT_NE(msg({{7, 6}, {Shard(0, 0, ShardSplit::kSizes, {7})}}, {2}, {0}).find("1 sizes given"),
            std::string::npos);
  EXPECT_NE(msg({{4, 5}, {Flat(0, 15, 6)}}, {2}, {0}).find("does not lie inside"),
            std::string::npos);
  EXPECT_NE(msg({{4, 5}, {Shard(3, 0)}}, {2}, {0}).find("group 3 is not known"),
            std::string::npos);
  EXPECT_NE(msg({{4, 4}, {Shard(0, 0), Shard(0, 1)}}, {2}, {0}).find("already used"),
            std::string::npos);
  EXPECT_NE(msg({{4, 4}, {Shard(0, 5)}}, {2}, {0}).find("param 'w'"), std::string::npos);
}

// Found by fuzz/placement_fuzzer: numbers a host passes (a global shape,
// explicit sizes, a flat range) overflowed int64_t inside ComputePiece.
TEST(Layout, HostNumbersThatWouldOverflowAreRefused) {
  const int64_t big = int64_t{1} << 62, max = INT64_MAX;
  auto msg = [](const Layout& l) {
    auto p = ComputePiece(l, {2}, {0}, "param 'w'");
    EXPECT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(p.status().message());
  };
  EXPECT_NE(msg({{2, big}, {}}).find("param 'w': global shape [2, 4611686018427387904] has more "
                                     "elements than a 64-bit count holds"),
            std::string::npos);
  // An empty dimension does not hide the overflow of the others.
  EXPECT_NE(msg({{0, big, 4}, {Shard(0, 1, ShardSplit::kChunk)}}).find("64-bit"),
            std::string::npos);
  EXPECT_NE(msg({{5, 6}, {Shard(0, 0, ShardSplit::kSizes, {1, max})}})
                .find("sizes add up to more than 5, the size of dim 0"),
            std::string::npos);
  EXPECT_NE(msg({{4, 5}, {Flat(0, 5, max)}})
                .find("range [5, 5 + 9223372036854775807) does not lie inside "
                      "the 20 elements"),
            std::string::npos);
  EXPECT_NE(msg({{4, 5}, {Flat(0, INT64_MIN, INT64_MIN)}}).find("does not lie inside"),
            std::string::npos);
}

// Found by fuzz/api_sequence_fuzzer: the registry computed the runs of a
// piece before comparing its size with the local tensor, so a wrong global
// shape cost what it said. PieceShape gives the shape at no such cost.
TEST(Layout, PieceShapeCostsNothingWhateverTheShape) {
  const int64_t big = int64_t{1} << 40;
  auto p = PieceShape({{big, 4}, {Shard(0, 1, ShardSplit::kChunk)}}, {2}, {1}, "w");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->shape, (std::vector<int64_t>{big, 2}));
  EXPECT_EQ(p->numel, 2 * big);
  EXPECT_TRUE(p->runs.empty());
  EXPECT_TRUE(p->canonical);
  // The same checks as ComputePiece.
  auto bad = PieceShape({{7, 6}, {Shard(0, 0)}}, {2}, {0}, "param 'w'");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not split evenly"), std::string::npos);
  // And ComputePiece spends nothing on an empty slice, however many rows it spans.
  auto empty = ComputePiece({{big, 0}, {Shard(0, 1, ShardSplit::kChunk)}}, {2}, {1}, "w");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel, 0);
  EXPECT_TRUE(empty->runs.empty());
}

// Found by fuzz/placement_fuzzer (once it kept huge dimensions beside an
// empty one): a chunked dimension near INT64_MAX overflowed computing its
// chunks (d + n - 1, and a + c on the last rank), undefined behaviour. Its
// chunks are torch.chunk's: ceil(d / n) each, the tail short.
TEST(Layout, ChunksOfADimensionNearTheLargestCountDoNotOverflow) {
  const int64_t max = INT64_MAX;
  const int64_t c = max / 3 + 1;  // 3074457345618258603
  for (int r = 0; r < 3; ++r) {
    auto p = ComputePiece({{max, 0}, {Shard(0, 0, ShardSplit::kChunk)}}, {3}, {r}, "w");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->shape[0], r < 2 ? c : max - 2 * c) << r;
    EXPECT_EQ(p->numel, 0);
    auto shape = PieceShape({{max, 1}, {Shard(0, 0, ShardSplit::kChunk)}}, {3}, {r}, "w");
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(shape->shape[0], r < 2 ? c : max - 2 * c) << r;
  }
  // Two ranks: the last chunk is the first's size less one.
  auto last = PieceShape({{max, 1}, {Shard(0, 0, ShardSplit::kChunk)}}, {2}, {1}, "w");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->shape[0], max / 2);
  // More ranks than rows: the tail ranks hold nothing.
  auto tail = PieceShape({{2, 3}, {Shard(0, 0, ShardSplit::kChunk)}}, {4}, {3}, "w");
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->shape, (std::vector<int64_t>{0, 3}));
}

TEST(Layout, TilingFindsOverlapAndGap) {
  Piece a = MustCompute({{4, 5}, {Flat(0, 0, 10)}}, {2}, {0});
  Piece b = MustCompute({{4, 5}, {Flat(0, 8, 12)}}, {2}, {1});
  Piece c = MustCompute({{4, 5}, {Flat(0, 11, 9)}}, {2}, {1});
  auto overlap = CheckTiling({&a, &b}, 20, "w");
  EXPECT_NE(overlap.message().find("overlap at element 8"), std::string::npos) << overlap;
  auto gap = CheckTiling({&a, &c}, 20, "w");
  EXPECT_NE(gap.message().find("elements [10, 11) are held by no rank"), std::string::npos)
      << gap;
  auto missing = CheckTiling({&a}, 20, "w");
  EXPECT_NE(missing.message().find("[10, 20)"), std::string::npos) << missing;
}

TEST(Layout, IntersectGivesLocalPositions) {
  std::vector<muon::Run> runs = {{10, 5}, {0, 3}, {20, 4}};
  auto got = Intersect(runs, 2, 22);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].local, 0);
  EXPECT_EQ(got[0].run, (muon::Run{10, 5}));
  EXPECT_EQ(got[1].local, 7);
  EXPECT_EQ(got[1].run, (muon::Run{2, 1}));
  EXPECT_EQ(got[2].local, 8);
  EXPECT_EQ(got[2].run, (muon::Run{20, 2}));
}

bool SameRuns(const std::vector<LocatedRun>& a, const std::vector<LocatedRun>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].local != b[i].local || !(a[i].run == b[i].run)) return false;
  }
  return true;
}

bool MeetsAny(const std::vector<muon::Run>& runs, int64_t begin, int64_t end) {
  for (const muon::Run& r : runs) {
    if (r.offset < end && r.offset + r.length > begin) return true;
  }
  return false;
}

// The cursor gives what Intersect gives, for the matrices of a batched
// parameter in order (the plan's and the exchange tables' walk), for ranges
// that go back, and for runs in no global order.
TEST(Layout, RunCursorMatchesIntersect) {
  // 6 matrices of 4 x 6, sharded over columns (2 of 3 ranks' worth): a run
  // per row, some spanning no matrix boundary; then a FlatRange piece whose
  // one run spans several matrices.
  Layout l;
  l.global_shape = {6, 4, 6};
  l.placements = {Shard(0, 2, ShardSplit::kSizes, {2, 3, 1})};
  const Piece rows = MustCompute(l, {3}, {1});
  ASSERT_EQ(rows.runs.size(), 24u);
  const std::vector<muon::Run> flat = {{10, 70}};
  const std::vector<muon::Run> unsorted = {{30, 5}, {2, 4}, {100, 40}, {50, 1}};
  for (const std::vector<muon::Run>* runs : {&rows.runs, &flat, &unsorted}) {
    for (int64_t per : {24, 7, 1, 144}) {
      RunCursor cursor(*runs);
      for (int64_t k = 0; k * per < 150; ++k) {
        EXPECT_EQ(cursor.Meets(k * per, (k + 1) * per), MeetsAny(*runs, k * per, (k + 1) * per))
            << per << " " << k;
        EXPECT_TRUE(SameRuns(cursor.Intersect(k * per, (k + 1) * per),
                             Intersect(*runs, k * per, (k + 1) * per)))
            << per << " " << k;
      }
      // Back to the start, then a range inside the last run's.
      EXPECT_TRUE(SameRuns(cursor.Intersect(0, 150), Intersect(*runs, 0, 150)));
      EXPECT_TRUE(SameRuns(cursor.Intersect(11, 13), Intersect(*runs, 11, 13)));
      EXPECT_EQ(cursor.Meets(3, 4), MeetsAny(*runs, 3, 4));
      EXPECT_EQ(cursor.Meets(150, 150), false);
    }
  }
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

// The same piece, or the same error, as `want`.
void ExpectSamePiece(const absl::StatusOr<Piece>& got, const absl::StatusOr<Piece>& want,
                     const std::string& what) {
  ASSERT_EQ(got.ok(), want.ok()) << what << ": " << got.status() << " vs " << want.status();
  if (!got.ok()) {
    EXPECT_EQ(got.status(), want.status()) << what;
    return;
  }
  EXPECT_EQ(got->runs, want->runs) << what;
  EXPECT_EQ(got->shape, want->shape) << what;
  EXPECT_EQ(got->numel, want->numel) << what;
  EXPECT_EQ(got->canonical, want->canonical) << what;
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A BlockCursor over a piece's blocks answers as a RunCursor over its runs,
// for the matrices of several sizes in order, and for ranges that go back.
void ExpectSameCursor(const Piece& p, const std::string& what) {
  const std::vector<muon::Run> runs = ExpandBlocks(p.blocks);
  const int64_t numel = p.runs.empty() ? 0 : p.runs.back().offset + p.runs.back().length;
  for (int64_t per : {1, 2, 3, 5, 6, 18, 100}) {
    RunCursor want(runs);
    BlockCursor got(p.blocks);
    for (int64_t k = 0; k * per <= numel + per; ++k) {
      EXPECT_EQ(got.Meets(k * per, (k + 1) * per), want.Meets(k * per, (k + 1) * per))
          << what << " per " << per << " k " << k;
      EXPECT_TRUE(SameRuns(got.Intersect(k * per, (k + 1) * per),
                           want.Intersect(k * per, (k + 1) * per)))
          << what << " per " << per << " k " << k;
    }
    EXPECT_TRUE(SameRuns(got.Intersect(1, 4), want.Intersect(1, 4))) << what;
    EXPECT_EQ(got.Meets(2, 3), want.Meets(2, 3)) << what;
  }
}

// CheckTilingBlocks gives CheckTiling's verdict, and its error, on a job's
// pieces (which tile), without one of them (a gap, unless it held nothing),
// with one twice (an overlap) and with one made canonical.
void ExpectSameTiling(const std::vector<Piece>& rows, const std::vector<Piece>& blocks,
                      int64_t numel, const std::string& what) {
  auto compare = [&](const std::vector<size_t>& pick, bool all_canonical) {
    std::vector<Piece> r, b;
    for (size_t i : pick) {
      r.push_back(rows[i]);
      b.push_back(blocks[i]);
      if (all_canonical) r.back().canonical = b.back().canonical = true;
    }
    std::vector<const Piece*> rp, bp;
    for (const Piece& p : r) rp.push_back(&p);
    for (const Piece& p : b) bp.push_back(&p);
    EXPECT_EQ(CheckTilingBlocks(bp, numel, "w"), CheckTiling(rp, numel, "w"))
        << what << " pieces " << ::testing::PrintToString(pick) << " canonical "
        << all_canonical;
  };
  std::vector<size_t> all;
  for (size_t i = 0; i < rows.size(); ++i) all.push_back(i);
  compare(all, false);
  compare(all, true);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<size_t> without, twice = all;
    for (size_t j : all) {
      if (j != i) without.push_back(j);
    }
    twice.push_back(i);
    compare(without, false);
    compare(twice, false);
  }
}

// Pieces from boxes against pieces row by row (the computation before boxes):
// every Shard / Replicate composition of up to three placements over groups
// of 1 to 3 ranks, on 1-D to 3-D shapes with empty, odd and even dims, at
// every coordinate, and with a FlatRange last (row by row on both paths).
TEST(Layout, BoxesMatchRowByRow) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {7}, {6, 4}, {5, 3}, {0, 4}, {4, 0}, {4, 6, 3}, {3, 5, 2}, {2, 1, 6}};
  std::vector<Placement> kinds;
  for (int dim = 0; dim < 3; ++dim) {
    kinds.push_back(Shard(0, dim, ShardSplit::kEven));
    kinds.push_back(Shard(0, dim, ShardSplit::kChunk));
    kinds.push_back(Shard(0, dim, ShardSplit::kSizes));
  }
  kinds.push_back(Replicate(0));
  const std::vector<int> group_sizes = {2, 3, 1};
  int compared = 0;
  for (const auto& shape : shapes) {
    // Sequences of 0 to 3 placements, over groups 0, 1, 2 in turn.
    std::vector<std::vector<int>> seqs = {{}};
    for (size_t len = 1; len <= 3; ++len) {
      std::vector<int> idx(len, 0);
      while (true) {
        seqs.push_back(idx);
        size_t k = 0;
        while (k < len && ++idx[k] == static_cast<int>(kinds.size())) idx[k++] = 0;
        if (k == len) break;
      }
    }
    for (const auto& seq : seqs) {
      for (int flat = 0; flat < 2; ++flat) {
        Layout l;
        l.global_shape = shape;
        for (size_t i = 0; i < seq.size(); ++i) {
          Placement p = kinds[seq[i]];
          p.group = static_cast<int>(i);
          if (p.kind == PlacementKind::kShard && p.split == ShardSplit::kSizes) {
            // Uneven sizes that add up where the dim is 0..7 long (else an error).
            const int n = group_sizes[i];
            for (int k = 0; k < n; ++k) p.sizes.push_back(k == n - 1 ? 0 : 1);
          }
          l.placements.push_back(p);
        }
        if (flat) l.placements.push_back(Flat(static_cast<int>(seq.size()), 1, 2));
        std::vector<int> sizes(group_sizes.begin(), group_sizes.begin() + seq.size());
        if (flat) sizes.push_back(1);
        std::vector<int> coords(sizes.size(), 0);
        std::vector<Piece> rows, blocks;  // every coordinate's piece, both ways
        while (true) {
          const std::string what = ::testing::PrintToString(shape) + " seq " +
                                   ::testing::PrintToString(seq) + " flat " +
                                   std::to_string(flat) + " at " +
                                   ::testing::PrintToString(coords);
          const absl::StatusOr<Piece> want = ComputePieceRowByRow(l, sizes, coords, "w");
          ExpectSamePiece(ComputePiece(l, sizes, coords, "w"), want, what);
          // As blocks: the same runs once expanded, and no runs.
          absl::StatusOr<Piece> got = ComputePieceBlocks(l, sizes, coords, "w");
          if (got.ok()) {
            EXPECT_TRUE(got->runs.empty()) << what;
            got->runs = ExpandBlocks(got->blocks);
          }
          ExpectSamePiece(got, want, what);
          if (want.ok() && got.ok()) {
            EXPECT_EQ(ExpandBlocks(ToBlocks(want->runs)), want->runs) << what;
            ExpectSameCursor(*got, what);
            rows.push_back(*want);
            blocks.push_back(*got);
            blocks.back().runs.clear();
          }
          ++compared;
          size_t k = 0;
          while (k < coords.size() && ++coords[k] == sizes[k]) coords[k++] = 0;
          if (k == coords.size()) break;
        }
        ExpectSameTiling(rows, blocks, Product(shape), ::testing::PrintToString(shape) +
                                                           " seq " + ::testing::PrintToString(seq) +
                                                           " flat " + std::to_string(flat));
      }
    }
  }
  EXPECT_GT(compared, 10000);
}

// Row-parallel pieces under FSDP, as blocks: one block each, and the tiling
// check over them (which jumps over whole bands of rows) agrees with the one
// over runs, also where a rank's column sizes disagree with the others' in
// the middle of a band.
TEST(Layout, RowParallelBlocksTileAsRuns) {
  struct Case {
    std::vector<int64_t> cols, odd;  // column sizes; those of the one odd rank
  };
  for (const Case& c : {Case{{8, 8, 8, 8}, {7, 10, 8, 7}}, Case{{7, 9, 8, 6}, {7, 10, 8, 5}}}) {
    const int64_t width = c.cols[0] + c.cols[1] + c.cols[2] + c.cols[3];
    const Layout l{{61, width},
                   {Shard(0, 1, ShardSplit::kSizes, c.cols), Shard(1, 0, ShardSplit::kChunk)}};
    const int64_t numel = 61 * width;
    std::vector<Piece> rows, blocks;
    for (int f = 0; f < 8; ++f) {
      for (int t = 0; t < 4; ++t) {
        auto r = ComputePieceRowByRow(l, {4, 8}, {t, f}, "w");
        auto b = ComputePieceBlocks(l, {4, 8}, {t, f}, "w");
        ASSERT_TRUE(r.ok() && b.ok()) << r.status() << b.status();
        EXPECT_EQ(b->blocks.size(), 1u);
        EXPECT_EQ(ExpandBlocks(b->blocks), r->runs);
        rows.push_back(*r);
        blocks.push_back(*b);
      }
    }
    const std::string what = ::testing::PrintToString(c.cols);
    std::vector<const Piece*> ptrs;
    for (const Piece& p : blocks) ptrs.push_back(&p);
    EXPECT_TRUE(CheckTilingBlocks(ptrs, numel, "w").ok()) << what;
    ExpectSameTiling(rows, blocks, numel, what);
    // Rank (1, 5) with other column sizes: its piece overlaps (or leaves a
    // gap beside) its neighbours' in the middle of a band.
    Layout odd = l;
    odd.placements[0].sizes = c.odd;
    rows[21] = *ComputePieceRowByRow(odd, {4, 8}, {1, 5}, "w");
    blocks[21] = *ComputePieceBlocks(odd, {4, 8}, {1, 5}, "w");
    EXPECT_FALSE(CheckTilingBlocks(ptrs, numel, "w").ok()) << what;
    ExpectSameTiling(rows, blocks, numel, what + " odd");
  }
}

// Boxes of a batch of matrices cut at random (guillotine cuts, so that the
// bands of rows of neighbouring column strips need not line up), some whole
// rows, some pieces holding several boxes, then spoiled at random (a box
// dropped, repeated, moved, grown, or a copy that is not canonical):
// CheckTilingBlocks gives CheckTiling's verdict and error on the runs.
TEST(Layout, TilingOfRandomBoxesAsRuns) {
  std::mt19937 rng(7);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  int failed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const int64_t batch = 1 + pick(2), rows = 1 + pick(12), cols = 1 + pick(8);
    struct Box {
      int64_t b, r0, r1, c0, c1;
    };
    std::vector<Box> boxes;
    std::function<void(Box)> cut = [&](Box x) {
      const bool can_rows = x.r1 - x.r0 > 1, can_cols = x.c1 - x.c0 > 1;
      if ((!can_rows && !can_cols) || pick(3) == 0) {
        boxes.push_back(x);
        return;
      }
      if (can_rows && (!can_cols || pick(2) == 0)) {
        const int64_t at = x.r0 + 1 + pick(x.r1 - x.r0 - 1);
        cut({x.b, x.r0, at, x.c0, x.c1});
        cut({x.b, at, x.r1, x.c0, x.c1});
      } else {
        const int64_t at = x.c0 + 1 + pick(x.c1 - x.c0 - 1);
        cut({x.b, x.r0, x.r1, x.c0, at});
        cut({x.b, x.r0, x.r1, at, x.c1});
      }
    };
    for (int64_t b = 0; b < batch; ++b) cut({b, 0, rows, 0, cols});
    // Spoil one box, maybe.
    const int spoil = static_cast<int>(pick(6));
    const size_t which = static_cast<size_t>(pick(static_cast<int64_t>(boxes.size())));
    if (spoil == 1) boxes.erase(boxes.begin() + which);
    if (spoil == 2) boxes.push_back(boxes[which]);
    if (spoil == 3 && boxes[which].r1 < rows) ++boxes[which].r1;
    if (spoil == 4 && boxes[which].c0 > 0) --boxes[which].c0;
    if (spoil == 5 && boxes[which].r0 > 0) --boxes[which].r0, --boxes[which].r1;
    std::shuffle(boxes.begin(), boxes.end(), rng);
    std::vector<Piece> as_runs, as_blocks;
    for (size_t i = 0; i < boxes.size();) {
      Piece p;
      p.canonical = pick(10) != 0;
      const size_t n = 1 + static_cast<size_t>(pick(3));
      for (size_t k = 0; k < n && i < boxes.size(); ++k, ++i) {
        const Box& x = boxes[i];
        const int64_t first = (x.b * rows + x.r0) * cols + x.c0;
        if (x.c0 == 0 && x.c1 == cols) {
          p.blocks.push_back({first, (x.r1 - x.r0) * cols, (x.r1 - x.r0) * cols, 1});
        } else {
          p.blocks.push_back({first, x.c1 - x.c0, cols, x.r1 - x.r0});
        }
      }
      Piece r = p;
      r.runs = ExpandBlocks(p.blocks);
      r.blocks.clear();
      as_runs.push_back(r);
      as_blocks.push_back(p);
    }
    std::vector<const Piece*> rp, bp;
    for (const Piece& p : as_runs) rp.push_back(&p);
    for (const Piece& p : as_blocks) bp.push_back(&p);
    const absl::Status want = CheckTiling(rp, batch * rows * cols, "w");
    EXPECT_EQ(CheckTilingBlocks(bp, batch * rows * cols, "w"), want) << "iteration " << iter;
    failed += !want.ok();
  }
  EXPECT_GT(failed, 3000);  // the spoiled ones mostly
  EXPECT_LT(failed, 17000);
}

// A row-parallel piece under FSDP is one run per kept row, from a box.
TEST(Layout, RowParallelUnderFsdpIsOneRunPerKeptRow) {
  const Layout l{{64, 32}, {Shard(0, 1), Shard(1, 0, ShardSplit::kChunk)}};
  for (int t = 0; t < 4; ++t) {
    for (int f = 0; f < 8; ++f) {
      const Piece p = MustCompute(l, {4, 8}, {t, f});
      ASSERT_EQ(p.runs.size(), 8u);
      EXPECT_EQ(Indices(p), Box(32, 8 * f, 8, 8 * t, 8));
    }
  }
}

}  // namespace
}  // namespace muon
