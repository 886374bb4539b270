// The oracle of the distributed engine: any layout at any world size gives
// parameters bit-identical to a single-process run of the same model, while
// every matrix is orthogonalized exactly once in the whole job.
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

struct Case {
  std::string name;
  Mesh mesh;
  std::vector<TParam> model;
};

// Checks every rank's final piece against the reference, bit for bit, and
// that each matrix was orthogonalized exactly once across the job.
void ExpectEquivalent(const Case& c, const RunConfig& cfg = RunConfig()) {
  SCOPED_TRACE(c.name);
  auto ref = RunReference(c.model, cfg);
  ASSERT_EQ(ref.size(), c.model.size()) << "reference run failed";
  auto results = RunDistributed(c.model, c.mesh, cfg);
  int64_t orthogonalized = 0, total = -1;
  for (size_t r = 0; r < results.size(); ++r) {
    const RankResult& res = results[r];
    ASSERT_TRUE(res.error.empty()) << "rank " << r << ": " << res.error;
    orthogonalized += res.stats.matrices_orthogonalized;
    if (total < 0) total = res.stats.matrices_total;
    EXPECT_EQ(res.stats.matrices_total, total);
    for (size_t j = 0; j < res.names.size(); ++j) {
      size_t k = 0;
      while (c.model[k].name != res.names[j]) ++k;
      for (size_t i = 0; i < res.indices[j].size(); ++i) {
        const float want = ref[k][res.indices[j][i]];
        const float got = res.params[j][i];
        ASSERT_EQ(0, std::memcmp(&want, &got, sizeof want))
            << "rank " << r << " param " << res.names[j] << " global element "
            << res.indices[j][i] << ": " << got << " vs single-process " << want;
      }
    }
  }
  int64_t matrices = 0;
  for (const TParam& p : c.model) {
    matrices += p.view == MUON_MATRIX_VIEW_BATCHED_LEADING ? p.shape[0] : 1;
  }
  EXPECT_EQ(total, matrices);
  EXPECT_EQ(orthogonalized, matrices) << "each matrix must be orthogonalized exactly once";
}

// A variant must change the single-process result (one that computed
// nothing would pass the equivalence trivially): `with` under `cfg` against
// `without` under `plain`, both reference runs complete.
void ExpectChanges(const std::vector<TParam>& with, const RunConfig& cfg,
                   const std::vector<TParam>& without, const RunConfig& plain, const char* what) {
  const auto changed = RunReference(with, cfg);
  ASSERT_EQ(changed.size(), with.size()) << what << ": the reference run failed";
  const auto unchanged = RunReference(without, plain);
  ASSERT_EQ(unchanged.size(), without.size()) << what << ": the plain reference run failed";
  EXPECT_NE(changed, unchanged) << what << " changed nothing";
}

// A small transformer-ish block: square, wide and tall matrices.
std::vector<TParam> Block(const std::vector<TPlacement>& col, const std::vector<TPlacement>& row,
                          const std::vector<TPlacement>& other) {
  return {
      {"attn.qkv", {24, 8}, MUON_MATRIX_VIEW_2D, col, nullptr},
      {"attn.out", {8, 8}, MUON_MATRIX_VIEW_2D, row, nullptr},
      {"mlp.up", {16, 8}, MUON_MATRIX_VIEW_2D, col, nullptr},
      {"mlp.down", {8, 16}, MUON_MATRIX_VIEW_2D, row, nullptr},
      {"embed", {13, 6}, MUON_MATRIX_VIEW_2D, other, nullptr},
  };
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, FsdpEvenAndUneven) {
  const int n = GetParam();
  Case c{"fsdp", Mesh{{n}}, {}};
  // dim 0 chunked (uneven, possibly empty tails) and explicit sizes.
  std::vector<int64_t> sizes(n, 0);
  for (int r = 0; r < n; ++r) sizes[r] = (r * 5 + 1) % 4;
  int64_t rows = 0;
  for (int64_t s : sizes) rows += s;
  c.model = {
      {"a", {10, 7}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"b", {5, 12}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"c", {rows, 6}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_SIZES, sizes)}, nullptr},
      {"d", {8 * n, 4}, MUON_MATRIX_VIEW_2D, {Shard(0, 0)}, nullptr},
  };
  ExpectEquivalent(c);
}

TEST_P(WorldSize, ZeroFlatRanges) {
  const int n = GetParam();
  Case c{"zero", Mesh{{n}}, {}};
  c.model = {
      {"w1", {9, 7}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"w2", {4, 11}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"w3", {3, 2, 5}, MUON_MATRIX_VIEW_FLATTEN_TRAILING, {Flat(0)}, nullptr},
  };
  ExpectEquivalent(c);
}

TEST_P(WorldSize, DdpAndContextParallelReplication) {
  const int n = GetParam();
  Case c{"ddp", Mesh{{n}}, Block({Replicate(0)}, {Replicate(0)}, {Replicate(0)})};
  ExpectEquivalent(c);
}

TEST_P(WorldSize, PipelineStages) {
  const int n = GetParam();
  // Stage s (rank s) holds layers s, s + n, ...: disjoint params per rank.
  Case c{"pp", Mesh{{n}}, {}};
  for (int l = 0; l < 6; ++l) {
    c.model.push_back({"layer" + std::to_string(l) + ".w", {6 + l, 5}, MUON_MATRIX_VIEW_2D, {},
                       [l, n](int rank) { return l % n == rank; }});
  }
  ExpectEquivalent(c);
}

// The variants of the update (a cubic schedule, the extra scale, cautious
// weight decay) over FSDP chunks, ZeRO flat ranges and replication at once:
// bit for bit with one process.
TEST_P(WorldSize, UpdateVariantsAreBitIdentical) {
  const int n = GetParam();
  Case c{"variants", Mesh{{n}}, {}};
  c.model = {
      {"a", {10, 7}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"w", {4, 11}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"r", {6, 6}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr},
  };
  RunConfig cfg;
  cfg.steps = 6;
  cfg.variant = [](muon_options_t* o) {
    o->ns_coefficients = MUON_NS_COEFFICIENTS_CUBIC5;
    o->update_scale = 0.9;
    o->adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW;
    o->cautious_wd = 1;
    o->weight_decay = 0.5;
  };
  ExpectEquivalent(c, cfg);
  cfg.ns_dtype = MUON_NS_DTYPE_BF16;
  ExpectEquivalent(c, cfg);
}

// NorMuon keeps per-row moments at each matrix's owner: FSDP chunks, ZeRO
// flat ranges, replication, TP x FSDP and expert stacks (batched views,
// whose owner may hold none of them), stepped 6 times with a
// momentum-driven update, bit for bit with one process. The reference
// itself must differ from plain Muon's (the option is not a no-op).
TEST_P(WorldSize, NorMuonIsBitIdentical) {
  const int n = GetParam();
  Case c{"normuon", Mesh{{n}}, {}};
  c.model = {
      {"a", {10, 7}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"w", {4, 11}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"r", {6, 6}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr},
      {"t", {8, 12}, MUON_MATRIX_VIEW_2D, {Shard(0, 1, MUON_SPLIT_CHUNK)}, nullptr},
      {"experts", {3, 5, 4}, MUON_MATRIX_VIEW_BATCHED_LEADING, {},
       [](int rank) { return rank == 0; }},
  };
  // (ZeRO-2, whose average of n gradients rounds: zero2_test.cc.)
  RunConfig cfg;
  cfg.steps = 6;
  cfg.variant = [](muon_options_t* o) {
    o->normuon = 1;
    o->normuon_beta2 = 0.9;
  };
  if (n == 1) {
    RunConfig plain = cfg;
    plain.variant = nullptr;
    ExpectChanges(c.model, cfg, c.model, plain, "normuon");
  }
  ExpectEquivalent(c, cfg);
  cfg.ns_dtype = MUON_NS_DTYPE_BF16;
  ExpectEquivalent(c, cfg);
}

// The layouts the Newton-Schulz variants run over: FSDP rows, a ZeRO flat
// range, column shards (a wide matrix) and an expert stack on one rank.
std::vector<TParam> NsVariantLayouts() {
  return {
      {"a", {10, 7}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"w", {4, 11}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"t", {8, 28}, MUON_MATRIX_VIEW_2D, {Shard(0, 1, MUON_SPLIT_CHUNK)}, nullptr},
      {"experts", {3, 5, 4}, MUON_MATRIX_VIEW_BATCHED_LEADING, {},
       [](int rank) { return rank == 0; }},
  };
}

// Gram Newton-Schulz and fp16 Newton-Schulz (their results cross the wire
// as fp16) over the same layouts as NorMuon, and together with it.
TEST_P(WorldSize, GramAndFp16AreBitIdentical) {
  const int n = GetParam();
  Case c{"gram_fp16", Mesh{{n}}, NsVariantLayouts()};
  RunConfig cfg;
  cfg.steps = 4;
  cfg.ns_dtype = MUON_NS_DTYPE_FP16;
  {
    SCOPED_TRACE("standard, fp16");
    ExpectEquivalent(c, cfg);
  }
  cfg.variant = [](muon_options_t* o) {
    o->ns_algorithm = MUON_NS_GRAM;
    o->ns_gram_restarts = 1u << 3;
  };
  {
    SCOPED_TRACE("gram, fp16");
    ExpectEquivalent(c, cfg);
  }
  cfg.ns_dtype = MUON_NS_DTYPE_FP32;
  cfg.variant = [](muon_options_t* o) {
    o->ns_algorithm = MUON_NS_GRAM;
    o->normuon = 1;
  };
  SCOPED_TRACE("gram, fp32, normuon");
  ExpectEquivalent(c, cfg);
}

// Split blocks (a GQA-fused QKV whose query rows of every group form one
// block, row blocks repeating over a flat range, column blocks over column
// shards, an expert stack): the owner orthogonalizes, normalizes and
// lr-adjusts each block apart, bit for bit with one process.
TEST_P(WorldSize, SplitBlocksAreBitIdentical) {
  const int n = GetParam();
  Case c{"split", Mesh{{n}}, {}};
  c.model = {
      {"qkv", {18, 8}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"fc1", {12, 10}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"cols", {6, 12}, MUON_MATRIX_VIEW_2D, {Shard(0, 1, MUON_SPLIT_CHUNK)}, nullptr},
      {"plain", {6, 12}, MUON_MATRIX_VIEW_2D, {Shard(0, 1, MUON_SPLIT_CHUNK)}, nullptr},
      {"experts", {3, 8, 5}, MUON_MATRIX_VIEW_BATCHED_LEADING, {},
       [](int rank) { return rank == 0; }},
  };
  c.model[0].split_sizes = {4, 1, 1};  // 3 groups: 4 query rows, 1 key, 1 value
  c.model[1].split_sizes = {3, 3};
  c.model[2].split_dim = 1;
  c.model[2].split_sizes = {4, 2};
  c.model[4].split_sizes = {2, 2};
  RunConfig cfg;
  cfg.steps = 4;
  cfg.variant = [](muon_options_t* o) { o->adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW; };
  if (n == 1) {
    std::vector<TParam> whole = c.model;
    for (TParam& p : whole) {
      p.split_sizes.clear();
      p.split_dim = 0;  // (a dim without sizes is refused)
    }
    ExpectChanges(c.model, cfg, whole, cfg, "the split");
  }
  ExpectEquivalent(c, cfg);
  cfg.ns_dtype = MUON_NS_DTYPE_BF16;
  cfg.variant = [](muon_options_t* o) {
    o->normuon = 1;
    o->normuon_beta2 = 0.9;
  };
  ExpectEquivalent(c, cfg);
  cfg.assignment = MUON_ASSIGNMENT_SPLIT;  // split matrices stay whole on one owner
  cfg.ns_dtype = MUON_NS_DTYPE_FP32;
  cfg.variant = nullptr;
  ExpectEquivalent(c, cfg);
}

// AOL's pre-scaling and schedule, fp32 and bf16 (its owners' slots in
// bf16), with split blocks and NorMuon too.
TEST_P(WorldSize, AolIsBitIdentical) {
  const int n = GetParam();
  Case c{"aol", Mesh{{n}}, NsVariantLayouts()};
  RunConfig cfg;
  cfg.steps = 4;
  cfg.variant = [](muon_options_t* o) {
    o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
    o->ns_steps = 4;
  };
  if (n == 1) {
    RunConfig plain = cfg;
    plain.variant = [](muon_options_t* o) {
      static const double rows[] = {4.0098, -7.0585, 2.4635, 3.4585, -5.5479, 2.5959,
                                    2.7573, -3.2939, 1.4254, 2.7215, -3.0494, 1.3169};
      o->ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
      o->ns_table = rows;
      o->ns_table_rows = 4;
      o->ns_steps = 4;
    };
    ExpectChanges(c.model, cfg, c.model, plain, "the pre-scaling");
  }
  ExpectEquivalent(c, cfg);
  cfg.ns_dtype = MUON_NS_DTYPE_BF16;
  ExpectEquivalent(c, cfg);
  c.model[0].split_sizes = {5};
  cfg.variant = [](muon_options_t* o) {
    o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
    o->ns_steps = 4;
    o->normuon = 1;
  };
  ExpectEquivalent(c, cfg);
}

// Per-parameter lr and weight-decay multipliers over sharded, flat and
// replicated layouts: each holder applies them to its pieces.
TEST_P(WorldSize, PerParameterScalesAreBitIdentical) {
  const int n = GetParam();
  Case c{"scales", Mesh{{n}}, {}};
  c.model = {
      {"a", {10, 7}, MUON_MATRIX_VIEW_2D, {Shard(0, 0, MUON_SPLIT_CHUNK)}, nullptr},
      {"w", {4, 11}, MUON_MATRIX_VIEW_2D, {Flat(0)}, nullptr},
      {"r", {6, 6}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr},
  };
  c.model[0].lr_scale = 0.5;
  c.model[1].weight_decay_scale = 0.0;
  c.model[2].lr_scale = 3.0;
  c.model[2].weight_decay_scale = 2.0;
  RunConfig cfg;
  cfg.steps = 4;
  RunConfig plain;
  plain.steps = 4;
  std::vector<TParam> unscaled = c.model;
  for (TParam& p : unscaled) p.lr_scale = p.weight_decay_scale = 1.0;
  ExpectChanges(c.model, cfg, unscaled, plain, "lr_scale and weight_decay_scale");
  ExpectEquivalent(c, cfg);
}

// QK-Clip after the steps, on a fused QKV projection (GQA: 4 query heads of
// 3 rows, 2 key heads) and on separate W_q / W_k with MLA's rotary rows:
// each rank scales its own pieces, bit for bit with one process.
muon_status_t ClipBoth(int, muon_optimizer_t* opt) {
  muon_qk_clip_layer_t fused;
  muon_qk_clip_layer_init(&fused, sizeof fused);
  fused.q_param = fused.k_param = 0;  // "qkv"
  fused.num_heads = 4;
  fused.num_kv_heads = 2;
  fused.q_head_rows = 3;
  fused.k_first_row = 12;
  fused.k_head_rows = 3;
  fused.alpha = 0.3;
  muon_qk_clip_layer_t mla;
  muon_qk_clip_layer_init(&mla, sizeof mla);
  mla.q_param = 1;  // "wq"
  mla.k_param = 2;  // "wkv": per head 3 key rows, then 2 value rows
  mla.num_heads = 3;
  mla.q_rotary_rows = 1;
  mla.k_head_rows = 3;
  mla.k_head_stride = 5;
  int64_t a = -1, b = -1;
  muon_status_t st = muon_register_qk_clip(opt, &fused, &a);
  if (st == MUON_OK) st = muon_register_qk_clip(opt, &mla, &b);
  const float fused_logits[4] = {150.0f, 50.0f, 200.0f, -3.0f};
  const float mla_logits[3] = {90.0f, 400.0f, std::nanf("")};
  int32_t clipped = -1;
  if (st == MUON_OK) st = muon_qk_clip(opt, a, fused_logits, 4, 100.0, &clipped);
  if (st == MUON_OK && clipped != 2) return MUON_INTERNAL;
  if (st == MUON_OK) st = muon_qk_clip(opt, b, mla_logits, 3, 100.0, &clipped);
  if (st == MUON_OK && clipped != 1) return MUON_INTERNAL;
  return st;
}

TEST(QkClip, EveryLayoutScalesItsPiecesAsOneProcess) {
  auto model = [](const std::vector<TPlacement>& pl) {
    return std::vector<TParam>{
        {"qkv", {24, 8}, MUON_MATRIX_VIEW_2D, pl, nullptr},
        {"wq", {9, 8}, MUON_MATRIX_VIEW_2D, pl, nullptr},
        {"wkv", {15, 8}, MUON_MATRIX_VIEW_2D, pl, nullptr},
    };
  };
  RunConfig cfg;
  cfg.steps = 2;
  cfg.after_steps = ClipBoth;
  RunConfig none = cfg;
  none.after_steps = nullptr;
  const auto plain = model({});
  ExpectChanges(plain, cfg, plain, none, "qk_clip");
  if (HasFatalFailure()) return;
  ExpectEquivalent({"fsdp", Mesh{{4}}, model({Shard(0, 0, MUON_SPLIT_CHUNK)})}, cfg);
  ExpectEquivalent({"tp_columns", Mesh{{2}}, model({Shard(0, 1)})}, cfg);
  ExpectEquivalent({"flat", Mesh{{3}}, model({Flat(0)})}, cfg);
  ExpectEquivalent({"replicated", Mesh{{2}}, model({Replicate(0)})}, cfg);
  ExpectEquivalent({"tp_x_fsdp", Mesh{{2, 2}}, model({Shard(0, 0, MUON_SPLIT_CHUNK), Shard(1, 1, MUON_SPLIT_CHUNK)})},
                   cfg);
}

INSTANTIATE_TEST_SUITE_P(OneToEight, WorldSize, ::testing::Range(1, 9));

TEST(Layouts, TensorParallelColumnAndRow) {
  for (int tp : {1, 2, 4, 8}) {
    Case c{"tp" + std::to_string(tp), Mesh{{tp}},
           Block({Shard(0, 0)}, {Shard(0, 1)}, {Shard(0, 0, MUON_SPLIT_CHUNK)})};
    ExpectEquivalent(c);
  }
}

TEST(Layouts, TpThenFsdpAndFsdpThenTp) {
  for (auto dims : std::vector<std::vector<int>>{{2, 2}, {2, 3}, {4, 2}, {2, 4}}) {
    // mesh dim 0 = TP, dim 1 = FSDP.
    Case a{"tp_then_fsdp", Mesh{dims},
           Block({Shard(0, 0), Shard(1, 0, MUON_SPLIT_CHUNK)},
                 {Shard(0, 1), Shard(1, 0, MUON_SPLIT_CHUNK)},
                 {Replicate(0), Shard(1, 1, MUON_SPLIT_CHUNK)})};
    ExpectEquivalent(a);
    Case b{"fsdp_then_tp", Mesh{dims},
           Block({Shard(1, 0, MUON_SPLIT_CHUNK), Shard(0, 0, MUON_SPLIT_CHUNK)},
                 {Shard(1, 0, MUON_SPLIT_CHUNK), Shard(0, 1)},
                 {Shard(1, 0, MUON_SPLIT_CHUNK), Replicate(0)})};
    ExpectEquivalent(b);
  }
}

TEST(Layouts, TensorParallelWithDistributedOptimizer) {
  // Megatron: TP shards, then each TP piece split into flat ranges over DP.
  for (auto dims : std::vector<std::vector<int>>{{2, 2}, {2, 3}, {4, 2}}) {
    Case c{"tp_distopt", Mesh{dims}, Block({Shard(0, 0), Flat(1)}, {Shard(0, 1), Flat(1)}, {Replicate(0), Flat(1)})};
    ExpectEquivalent(c);
  }
}

TEST(Layouts, Hsdp) {
  // mesh dim 0 = shard (FSDP), dim 1 = replicate.
  for (auto dims : std::vector<std::vector<int>>{{2, 2}, {4, 2}, {2, 3}, {3, 2}}) {
    Case c{"hsdp", Mesh{dims},
           Block({Replicate(1), Shard(0, 0, MUON_SPLIT_CHUNK)},
                 {Replicate(1), Shard(0, 0, MUON_SPLIT_CHUNK)}, {Replicate(1), Flat(0)})};
    ExpectEquivalent(c);
  }
}

TEST(Layouts, ExpertParallel) {
  // 4 ranks = EP 2 x expert-data-parallel 2 (mesh dim 0 = EDP, dim 1 = EP).
  // Each EP rank owns two experts (stacked, one matrix per slice); dense
  // layers are data parallel over the world.
  Mesh mesh{{2, 2}};
  Case c{"ep", mesh, {}};
  for (int e = 0; e < 2; ++e) {
    c.model.push_back({"experts" + std::to_string(e) + ".w1", {2, 8, 6},
                       MUON_MATRIX_VIEW_BATCHED_LEADING, {Replicate(0)},
                       [mesh, e](int rank) { return mesh.Coords(rank)[1] == e; }});
  }
  c.model.push_back({"dense", {7, 9}, MUON_MATRIX_VIEW_2D, {Replicate(-1)}, nullptr});
  ExpectEquivalent(c);
  // Without an expert-data-parallel group: experts local to one rank each.
  Case d{"ep_local", Mesh{{4}}, {}};
  for (int r = 0; r < 4; ++r) {
    d.model.push_back({"expert" + std::to_string(r), {3, 5, 4}, MUON_MATRIX_VIEW_BATCHED_LEADING,
                       {}, [r](int rank) { return rank == r; }});
  }
  ExpectEquivalent(d);
  // The same with a dense matrix over the world and MUON_ASSIGNMENT_SPREAD:
  // its owner hands its experts to the other ranks, which hold none of them,
  // so the owners receive whole matrices and send whole updates back.
  d.name = "ep_local_spread";
  d.model.push_back({"dense", {24, 24}, MUON_MATRIX_VIEW_2D, {Replicate(-1)}, nullptr});
  RunConfig spread;
  spread.assignment = MUON_ASSIGNMENT_SPREAD;
  spread.steps = 5;
  ExpectEquivalent(d, spread);
  // Under BALANCED every rank orthogonalizes its own 3 experts, the dense
  // owner one more; under SPREAD the dense owner gives all of its away.
  std::vector<int64_t> counts;
  for (const RankResult& r : RunDistributed(d.model, d.mesh, spread)) {
    counts.push_back(r.stats.matrices_orthogonalized);
  }
  std::sort(counts.begin(), counts.end());
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 4, 4, 4}));
}

// MUON_ASSIGNMENT_SPLIT: a matrix that costs more than the other ranks'
// matrices together is orthogonalized by several ranks, each holding one
// block of it; the sums of its norm and Gram products run in another order
// than one process's products, so the parameters agree within fp32 (or bf16)
// rounding instead of bit for bit.
// The largest difference between two runs' values of the model's
// parameters, over the largest magnitude of `base`'s.
double LargestDifference(const std::vector<std::vector<float>>& base,
                         const std::vector<std::vector<float>>& other) {
  double worst = 0;
  for (size_t k = 0; k < base.size(); ++k) {
    double scale = 0, diff = 0;
    for (size_t i = 0; i < base[k].size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(base[k][i])));
      diff = std::max(diff, std::fabs(static_cast<double>(other[k][i]) - base[k][i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// `tolerance` < 0: the split may differ from one process by at most
// -tolerance times as much as one process's own low-precision result
// differs from its fp32 one (the precision's own error on this CPU).
void ExpectSplitClose(const Case& c, const RunConfig& cfg, double tolerance, int64_t parts) {
  SCOPED_TRACE(c.name);
  auto ref = RunReference(c.model, cfg);
  ASSERT_EQ(ref.size(), c.model.size()) << "reference run failed";
  if (tolerance < 0) {
    RunConfig fp32 = cfg;
    fp32.ns_dtype = MUON_NS_DTYPE_FP32;
    const auto exact = RunReference(c.model, fp32);
    ASSERT_EQ(exact.size(), c.model.size()) << "fp32 reference run failed";
    const double own = LargestDifference(exact, ref);
    std::printf("%s: one process's own difference from fp32 %.3g of the largest value\n",
                c.name.c_str(), own);
    tolerance = -tolerance * own;
  }
  auto results = RunDistributed(c.model, c.mesh, cfg);
  int64_t orthogonalized = 0;
  double worst = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    const RankResult& res = results[r];
    ASSERT_TRUE(res.error.empty()) << "rank " << r << ": " << res.error;
    orthogonalized += res.stats.matrices_orthogonalized;
    EXPECT_EQ(res.stats.matrices_total, static_cast<int64_t>(c.model.size()));
    for (size_t j = 0; j < res.names.size(); ++j) {
      size_t k = 0;
      while (c.model[k].name != res.names[j]) ++k;
      // The largest difference over the parameter's largest magnitude.
      double scale = 0, diff = 0;
      for (float v : ref[k]) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      for (size_t i = 0; i < res.indices[j].size(); ++i) {
        const double want = ref[k][res.indices[j][i]], got = res.params[j][i];
        diff = std::max(diff, std::fabs(got - want));
      }
      worst = std::max(worst, diff / scale);
    }
  }
  EXPECT_LE(worst, tolerance) << "largest difference from one process, over the largest value";
  std::printf("%s: largest difference from one process %.3g of the largest value\n",
              c.name.c_str(), worst);
  // Each matrix once, the split one once per part (each member counts its).
  EXPECT_EQ(orthogonalized, static_cast<int64_t>(c.model.size()) - 1 + parts);
}

Case SplitCase() {
  // 4 ranks, 16 matrices (a split needs 4 per rank): a 16 x 96 matrix (rows
  // over the ranks) costs 2.3x the fifteen 8 x 8 replicated ones together,
  // so it is split over the 4 ranks (24 columns each); the small ones keep
  // whole owners.
  Case c{"split", Mesh{{4}}, {{"big", {16, 96}, MUON_MATRIX_VIEW_2D, {Shard(0, 0)}, nullptr}}};
  for (int i = 0; i < 15; ++i) {
    c.model.push_back({"small" + std::to_string(i), {8, 8}, MUON_MATRIX_VIEW_2D, {Replicate(0)},
                       nullptr});
  }
  return c;
}

TEST(Split, AMatrixOrthogonalizedByFourRanksMatchesOneProcess) {
  const Case c = SplitCase();
  for (int prefetch : {0, 1}) {
    RunConfig cfg;
    cfg.steps = 5;
    cfg.assignment = MUON_ASSIGNMENT_SPLIT;
    cfg.prefetch_count = prefetch;
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    ExpectSplitClose(c, cfg, 1e-5, 4);
  }
  // Heavier small matrices: "big" splits over 2 of the 4 ranks; the other
  // two take part in the sums' collectives with no bytes.
  Case two = c;
  two.name = "split_two";
  for (size_t i = 1; i < two.model.size(); ++i) two.model[i].shape = {12, 12};
  RunConfig pair;
  pair.steps = 5;
  pair.assignment = MUON_ASSIGNMENT_SPLIT;
  ExpectSplitClose(two, pair, 1e-5, 2);
  // A tall matrix splits by rows, one range per part.
  Case tall = c;
  tall.name = "split_tall";
  tall.model[0].shape = {96, 16};
  RunConfig cfg;
  cfg.steps = 5;
  cfg.assignment = MUON_ASSIGNMENT_SPLIT;
  ExpectSplitClose(tall, cfg, 1e-5, 4);
}

// AOL over the members: the whole's W W^T summed from the blocks' shares
// gives the scales and the first gram, as one process's whole matrix.
TEST(Split, AolOverFourRanksMatchesOneProcess) {
  const Case c = SplitCase();
  RunConfig cfg;
  cfg.steps = 4;
  cfg.assignment = MUON_ASSIGNMENT_SPLIT;
  cfg.variant = [](muon_options_t* o) {
    o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
    o->ns_steps = 4;
  };
  ExpectSplitClose(c, cfg, 1e-5, 4);
  Case tall = c;
  tall.name = "split_tall_aol";
  tall.model[0].shape = {96, 16};
  ExpectSplitClose(tall, cfg, 1e-5, 4);
}

// NorMuon over the members: the rows' squares summed, every member's
// moments the whole's; Gram Newton-Schulz: R summed where it is formed, the
// m x m iterations on every member; fp16: the emulated whole's rounding.
TEST(Split, NorMuonGramAndFp16OverFourRanksMatchOneProcess) {
  const Case c = SplitCase();
  Case tall = c;
  tall.name = "split_tall";
  tall.model[0].shape = {96, 16};
  struct Variant {
    const char* name;
    std::function<void(muon_options_t*)> set;
    int ns_dtype;
    double tolerance;
  };
  const std::vector<Variant> variants = {
      {"normuon", [](muon_options_t* o) { o->normuon = 1; }, MUON_NS_DTYPE_FP32, 1e-5},
      // In fp32 one process's own Gram and standard iterations differ by
      // 7.2e-6 (wide) and 1.5e-5 (tall) of the largest value on this model:
      // Gram's fp32 roundings, which the split's sums reorder, move it as far.
      {"gram", [](muon_options_t* o) { o->ns_algorithm = MUON_NS_GRAM; }, MUON_NS_DTYPE_FP32,
       3e-5},
      // fp16: a rounding that the sums' order flips moves an element by an
      // fp16 ulp, and NorMuon's row normalization carries that to the rows'
      // scale; how often one flips follows the CPU's fp32 products
      // (libmuon's AVX-512 kernel or OpenBLAS): under 0.1% of the largest
      // value on AVX-512 machines, 0.21% on an AVX2-only EPYC, where fp16
      // itself is 2.1% from fp32. The split stays at most a quarter as far
      // from one process as fp16 itself is from fp32.
      {"gram_fp16_normuon",
       [](muon_options_t* o) {
         o->ns_algorithm = MUON_NS_GRAM;
         o->normuon = 1;
       },
       MUON_NS_DTYPE_FP16, -0.25},
      {"fp16", nullptr, MUON_NS_DTYPE_FP16, -0.25},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    RunConfig cfg;
    cfg.steps = 5;
    cfg.assignment = MUON_ASSIGNMENT_SPLIT;
    cfg.ns_dtype = v.ns_dtype;
    cfg.variant = v.set;
    ExpectSplitClose(c, cfg, v.tolerance, 4);
    ExpectSplitClose(tall, cfg, v.tolerance, 4);
  }
}

TEST(Split, Bf16RoundsAsOneProcessOnTheEmulatedProducts) {
  // One process on the emulated bf16 products, the split's rounding.
  setenv("MUON_CPU_NATIVE_BF16", "0", 1);
  const Case c = SplitCase();
  RunConfig cfg;
  cfg.steps = 5;
  cfg.ns_dtype = MUON_NS_DTYPE_BF16;
  cfg.assignment = MUON_ASSIGNMENT_SPLIT;
  ExpectSplitClose(c, cfg, 1e-3, 4);
  unsetenv("MUON_CPU_NATIVE_BF16");
}

TEST(Layouts, ThreeDimensionalMix) {
  // TP 2 x FSDP 2 x DP 2 = 8 ranks.
  Case c{"tp_fsdp_dp", Mesh{{2, 2, 2}},
         Block({Replicate(2), Shard(0, 0), Shard(1, 0, MUON_SPLIT_CHUNK)},
               {Replicate(2), Shard(0, 1), Shard(1, 0, MUON_SPLIT_CHUNK)},
               {Replicate(2), Replicate(0), Flat(1)})};
  ExpectEquivalent(c);
}

TEST(Settings, ResultsDoNotDependOnPipelineSettings) {
  Case c{"settings", Mesh{{2, 2}},
         Block({Shard(0, 0), Shard(1, 0, MUON_SPLIT_CHUNK)}, {Shard(0, 1), Flat(1)},
               {Replicate(0), Replicate(1)})};
  for (int prefetch : {0, 1, 2}) {
    for (int async : {0, 1}) {
      for (int assignment :
           {MUON_ASSIGNMENT_BALANCED, MUON_ASSIGNMENT_ROUND_ROBIN, MUON_ASSIGNMENT_SPREAD}) {
        RunConfig cfg;
        cfg.steps = 5;
        cfg.prefetch_count = prefetch;
        cfg.async_parallelism = async;
        cfg.assignment = assignment;
        cfg.round_bytes = 512;  // several rounds
        SCOPED_TRACE("prefetch " + std::to_string(prefetch) + " async " + std::to_string(async));
        ExpectEquivalent(c, cfg);
      }
    }
  }
}

TEST(Settings, BroadcastAndBarrierMayBeNull) {
  // The engine calls all_gather, all_to_all_v and reduce_scatter only.
  Case c{"optional", Mesh{{2, 2}},
         Block({Shard(0, 0), Shard(1, 0, MUON_SPLIT_CHUNK)}, {Shard(0, 1), Flat(1)},
               {Replicate(0), Replicate(1)})};
  RunConfig cfg;
  cfg.steps = 3;
  cfg.round_bytes = 512;
  cfg.without_optional_collectives = true;
  ExpectEquivalent(c, cfg);
}

TEST(Settings, Bf16NewtonSchulzIsAlsoBitIdentical) {
  Case c{"bf16", Mesh{{2, 2}}, Block({Shard(0, 0), Flat(1)}, {Replicate(0), Shard(1, 1)},
                             {Replicate(0), Replicate(1)})};
  RunConfig cfg;
  cfg.ns_dtype = MUON_NS_DTYPE_BF16;
  ExpectEquivalent(c, cfg);
}

}  // namespace
}  // namespace muon_test
