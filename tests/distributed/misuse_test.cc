// The distributed engine refuses what cannot be right, on every rank, with a
// message naming the parameter (or group, or rank) and the cause; it never
// hangs or writes out of bounds. And it moves exactly the bytes the
// zero-redundancy plan promises.
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every rank failed, and every message contains each of `parts`.
void ExpectAllFail(const std::vector<RankResult>& results, const std::vector<std::string>& parts) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_FALSE(results[r].error.empty()) << "rank " << r << " did not fail";
    for (const auto& part : parts) {
      EXPECT_TRUE(Has(results[r].error, part)) << "rank " << r << ": " << results[r].error;
    }
  }
}

std::vector<TParam> Model() {
  return {
      {"w", {12, 8}, MUON_MATRIX_VIEW_2D, {Shard(0, 0), Flat(1)}, nullptr},
      {"v", {6, 10}, MUON_MATRIX_VIEW_2D, {Replicate(0), Flat(1)}, nullptr},
  };
}

TEST(Misuse, DifferentGlobalShapesAcrossRanks) {
  RunConfig cfg;
  cfg.steps = 1;
  cfg.mutate = [](int rank, TParam* p, int64_t*, int64_t*) {
    if (rank == 3 && p->name == "v") p->shape = {6, 12};
  };
  auto res = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  ExpectAllFail(res, {"param 'v'", "rank 3", "[6, 12]", "[6, 10]"});
}

TEST(Misuse, MissingAndOverlappingFlatRanges) {
  RunConfig cfg;
  cfg.steps = 1;
  // Rank 1 (DP coord 0 of TP coord 1) takes a shorter range: a gap.
  cfg.mutate = [](int rank, TParam* p, int64_t* start, int64_t* length) {
    if (rank == 1 && p->name == "w") {
      *start = 0;
      *length = 2;
    }
  };
  auto gap = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  ExpectAllFail(gap, {"param 'w'", "held by no rank"});

  cfg.mutate = [](int rank, TParam* p, int64_t* start, int64_t* length) {
    if (rank == 3 && p->name == "w") {  // DP coord 1 also starts at 0: overlap
      *start = 0;
      *length = 48;
    }
  };
  auto overlap = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  ExpectAllFail(overlap, {"param 'w'", "overlap"});
}

TEST(Misuse, MissingReplicatePlacementIsAnOverlap) {
  // A TP-replicated tensor declared without Replicate(TP) is held twice.
  std::vector<TParam> model = {{"e", {8, 4}, MUON_MATRIX_VIEW_2D, {Shard(1, 0)}, nullptr}};
  RunConfig cfg;
  cfg.steps = 1;
  auto res = RunDistributed(model, Mesh{{2, 2}}, cfg);
  ExpectAllFail(res, {"param 'e'", "overlap"});
}

TEST(Misuse, PlacementOnMissingDimAndUnevenSplit) {
  RunConfig cfg;
  cfg.steps = 1;
  std::vector<TParam> bad_dim = {{"x", {8, 4}, MUON_MATRIX_VIEW_2D, {Shard(0, 2)}, nullptr}};
  ExpectAllFail(RunDistributed(bad_dim, Mesh{{2}}, cfg), {"param 'x'", "dim 2 does not exist"});
  std::vector<TParam> uneven = {{"y", {7, 4}, MUON_MATRIX_VIEW_2D, {Shard(0, 0)}, nullptr}};
  ExpectAllFail(RunDistributed(uneven, Mesh{{2}}, cfg), {"param 'y'", "does not split evenly"});
}

TEST(Misuse, DifferentOptionsAcrossRanks) {
  RunConfig cfg;
  cfg.steps = 1;
  cfg.mutate_options = [](int rank, muon_options_t* o) {
    if (rank == 2) o->prefetch_count = 0;
  };
  ExpectAllFail(RunDistributed(Model(), Mesh{{2, 2}}, cfg), {"different optimizer options"});
}

muon_status_t ToNonHolder(void*, size_t n, const muon_matrix_info_t* m, int32_t* owners) {
  for (size_t i = 0; i < n; ++i) owners[i] = m[i].num_holders == 4 ? 0 : 3;
  return MUON_OK;
}

muon_status_t DependsOnRank(void* state, size_t n, const muon_matrix_info_t* m, int32_t* owners) {
  const int rank = *static_cast<int*>(state);
  for (size_t i = 0; i < n; ++i) owners[i] = m[i].holders[rank % m[i].num_holders];
  return MUON_OK;
}

TEST(Misuse, CustomAssignmentMustNameHoldersAndAgree) {
  // Experts on one rank each: a custom owner outside the holders is refused.
  std::vector<TParam> model;
  for (int r = 0; r < 4; ++r) {
    model.push_back({"expert" + std::to_string(r), {4, 3}, MUON_MATRIX_VIEW_2D, {},
                     [r](int rank) { return rank == r; }});
  }
  model.push_back({"dense", {4, 4}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr});
  RunConfig cfg;
  cfg.steps = 1;
  cfg.assignment = MUON_ASSIGNMENT_CUSTOM;
  cfg.assign_fn = ToNonHolder;
  ExpectAllFail(RunDistributed(model, Mesh{{4}}, cfg),
                {"custom assignment", "holds no piece of it"});
  cfg.assign_fn = DependsOnRank;
  ExpectAllFail(RunDistributed(model, Mesh{{4}}, cfg), {"different plan"});
}

TEST(Misuse, HoldersGivingDifferentScalesAreNamed) {
  RunConfig cfg;
  cfg.steps = 1;
  cfg.mutate = [](int rank, TParam* p, int64_t*, int64_t*) {
    if (rank == 3 && p->name == "w") p->weight_decay_scale = 0.0;
  };
  ExpectAllFail(RunDistributed(Model(), Mesh{{2, 2}}, cfg),
                {"param 'w'", "weight_decay_scale", "every holder must give the same"});
}

TEST(Misuse, HoldersGivingDifferentSplitsAreNamed) {
  RunConfig cfg;
  cfg.steps = 1;
  cfg.mutate = [](int rank, TParam* p, int64_t*, int64_t*) {
    if (p->name == "w") {
      p->split_sizes = rank == 2 ? std::vector<int64_t>{4} : std::vector<int64_t>{2, 2};
    }
  };
  ExpectAllFail(RunDistributed(Model(), Mesh{{2, 2}}, cfg),
                {"param 'w'", "split_sizes (dim 0, sizes {", "every holder must give the same"});
}

TEST(Misuse, CommunicatorFailureMidStepPoisonsUntilRestored) {
  RunConfig cfg;
  cfg.steps = 3;
  cfg.prefetch_count = 0;
  // Step 1's scatter: calls 0, 1 are the setup handshake's (own parts,
  // shared parts), 2, 3 step 0's gather and scatter, 4 step 1's gather.
  cfg.fail_exchange_call = 5;
  auto res = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_TRUE(Has(res[r].error, "UNAVAILABLE")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "injected link failure")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "scattering round 0 (param 'v'")) << res[r].error;
    EXPECT_TRUE(Has(res[r].refused, "FAILED_PRECONDITION")) << res[r].refused;
    EXPECT_TRUE(Has(res[r].refused, "restore")) << res[r].refused;
    EXPECT_TRUE(res[r].recovered) << "rank " << r;
  }
}

// NorMuon: the failed step may have moved the owners' moments, which only a
// whole blob restores; muon_set_state of every parameter does not lift the
// poisoning, and the refusal says so. Restoring the blob resumes.
TEST(Misuse, APoisonedNorMuonOptimizerNeedsTheWholeBlob) {
  RunConfig cfg;
  cfg.steps = 3;
  cfg.prefetch_count = 0;
  cfg.fail_exchange_call = 5;  // step 1's scatter, after the owners' NorMuon
  cfg.variant = [](muon_options_t* o) { o->normuon = 1; };
  auto res = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_TRUE(Has(res[r].refused, "NorMuon's second moments")) << res[r].refused;
    EXPECT_TRUE(res[r].recovered) << "rank " << r;
  }
  cfg.restore_with_set_state = true;
  res = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_FALSE(res[r].recovered) << "rank " << r << ": set_state lifted a NorMuon poisoning";
  }
}

TEST(Misuse, APoisonedOptimizerWaitsForEveryParamsStateNotJustOne) {
  RunConfig cfg;
  cfg.steps = 3;
  cfg.prefetch_count = 0;
  cfg.fail_exchange_call = 5;  // step 1's scatter, as above
  cfg.restore_with_set_state = true;
  auto res = RunDistributed(Model(), Mesh{{2, 2}}, cfg);
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_GE(res[r].names.size(), 2u) << "rank " << r;
    const std::string& partly = res[r].refused_when_partly_restored;
    EXPECT_TRUE(Has(partly, "FAILED_PRECONDITION")) << partly;
    const size_t n = res[r].names.size();
    EXPECT_TRUE(Has(partly, std::to_string(n - 1) + " of " + std::to_string(n) + " restored"))
        << partly;
    EXPECT_TRUE(res[r].recovered) << "rank " << r;
  }
}

// Zero redundancy, counted: with known owners (the last holder of each
// matrix), each rank sends and receives exactly the formula's bytes: the
// owner receives each element it does not hold once (from its canonical
// copy) and sends every other holder its elements of the result.
muon_status_t LastHolder(void*, size_t n, const muon_matrix_info_t* m, int32_t* owners) {
  for (size_t i = 0; i < n; ++i) owners[i] = m[i].holders[m[i].num_holders - 1];
  return MUON_OK;
}

TEST(ZeroRedundancy, BytesMatchTheFormula) {
  const Mesh mesh{{2, 3}};  // TP 2 x DP 3
  std::vector<TParam> model = {
      {"col", {12, 5}, MUON_MATRIX_VIEW_2D, {Shard(0, 0), Flat(1)}, nullptr},
      {"row", {6, 8}, MUON_MATRIX_VIEW_2D, {Shard(0, 1), Shard(1, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"rep", {5, 7}, MUON_MATRIX_VIEW_2D, {Replicate(0), Replicate(1)}, nullptr},
  };
  for (int ns_dtype : {MUON_NS_DTYPE_FP32, MUON_NS_DTYPE_BF16}) {
    RunConfig cfg;
    cfg.steps = 2;
    cfg.ns_dtype = ns_dtype;
    cfg.assignment = MUON_ASSIGNMENT_CUSTOM;
    cfg.assign_fn = LastHolder;
    auto res = RunDistributed(model, mesh, cfg);
    const int n = mesh.size();
    std::vector<int64_t> sent(n, 0), received(n, 0), owned(n, 0);
    const int64_t up = 4;                                         // fp32 momentum on the wire
    const int64_t down = ns_dtype == MUON_NS_DTYPE_BF16 ? 2 : 4;  // NS output on the wire
    for (const TParam& p : model) {
      // Holders: every rank; canonical copies: Replicate coordinate 0.
      const int owner = n - 1;
      ++owned[owner];
      const std::vector<int64_t> owner_piece = LocalIndices(p, mesh, owner);
      const std::set<int64_t> owner_holds(owner_piece.begin(), owner_piece.end());
      for (int r = 0; r < n; ++r) {
        bool canonical = true;
        for (const TPlacement& pl : p.placements) {
          if (pl.kind == MUON_PLACEMENT_REPLICATE && mesh.Coords(r)[pl.mesh_dim] != 0) {
            canonical = false;
          }
        }
        const std::vector<int64_t> piece = LocalIndices(p, mesh, r);
        const int64_t mine = static_cast<int64_t>(piece.size());
        if (r == owner) continue;
        if (canonical) {  // only what the owner does not hold itself travels
          int64_t missing = 0;
          for (int64_t e : piece) missing += owner_holds.count(e) == 0;
          sent[r] += missing * up;
          received[owner] += missing * up;
        }
        // Down, r's piece in runs of consecutive elements, each padded to 4
        // bytes on the wire (every span starts 4-byte aligned).
        int64_t down_bytes = 0;
        for (size_t i = 0; i < piece.size();) {
          size_t j = i + 1;
          while (j < piece.size() && piece[j] == piece[j - 1] + 1) ++j;
          down_bytes += (static_cast<int64_t>(j - i) * down + 3) / 4 * 4;
          i = j;
        }
        EXPECT_GE(down_bytes, mine * down);
        received[r] += down_bytes;
        sent[owner] += down_bytes;
      }
    }
    // Besides the pieces: each rank's 16-byte step verdict to every other
    // rank (the outcome agreement), riding on the last scatter: no collective
    // of its own.
    const int64_t verdicts = 16 * (n - 1);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(res[r].error.empty()) << res[r].error;
      EXPECT_EQ(res[r].stats.bytes_sent, sent[r] + verdicts) << "rank " << r;
      EXPECT_EQ(res[r].stats.bytes_received, received[r] + verdicts) << "rank " << r;
      EXPECT_EQ(res[r].stats.matrices_orthogonalized, owned[r]) << "rank " << r;
      EXPECT_EQ(res[r].stats.collectives, 2 * res[r].stats.rounds)
          << "one exchange per direction per round, the verdicts on the last";
    }
  }
}

}  // namespace
}  // namespace muon_test
