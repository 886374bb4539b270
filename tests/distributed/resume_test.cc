// Resume anywhere: a job saved at world size N with one layout (every rank's
// muon_save_state blob, and the whole parameters) is loaded at world size M
// with another layout (muon_load_states with all N blobs, before the first
// step) and continues bit for bit like one uninterrupted single-process run
// (fp32 Newton-Schulz: the distributed engine equals it bit for bit). FSDP,
// TP x FSDP, flat ranges and ZeRO-2, each into other layouts and sizes; a
// ZeRO-2 job resumed at the same size from each rank's own blob; and the
// errors of a checkpoint that cannot restore the job.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

constexpr int kBefore = 2, kAfter = 2;

struct Job {
  const char* name;
  std::vector<TParam> model;  // the same names and global shapes in every job
  Mesh mesh;
};

TParam P(const char* name, std::vector<int64_t> shape, std::vector<TPlacement> pl,
         int mode = MUON_REPLICATED_HOST_AVERAGED) {
  TParam p;
  p.name = name;
  p.shape = std::move(shape);
  p.placements = std::move(pl);
  p.replicated_mode = mode;
  return p;
}

// Three matrices; the layouts below split them in different ways.
Job Fsdp4() {
  return {"FSDP x4 (chunked rows)",
          {P("a", {10, 6}, {Shard(0, 0, MUON_SPLIT_CHUNK)}),
           P("b", {7, 9}, {Shard(0, 0, MUON_SPLIT_CHUNK)}),
           P("c", {8, 8}, {Shard(0, 0, MUON_SPLIT_CHUNK)})},
          Mesh{{4}}};
}
Job TpFsdp2x2() {
  return {"TP 2 x FSDP 2",
          {P("a", {10, 6}, {Shard(1, 1), Shard(0, 0, MUON_SPLIT_CHUNK)}),
           P("b", {7, 9}, {Replicate(1), Shard(0, 0, MUON_SPLIT_CHUNK)}),
           P("c", {8, 8}, {Shard(1, 0), Shard(0, 1)})},
          Mesh{{2, 2}}};
}
Job Flat3() {
  return {"flat ranges x3 (ZeRO-1)",
          {P("a", {10, 6}, {Flat(0)}), P("b", {7, 9}, {Flat(0)}), P("c", {8, 8}, {Flat(0)})},
          Mesh{{3}}};
}
Job Zero2x4() {
  return {"ZeRO-2 x4",
          {P("a", {10, 6}, {Replicate(0)}, MUON_REPLICATED_ZERO2),
           P("b", {7, 9}, {Replicate(0)}, MUON_REPLICATED_ZERO2),
           P("c", {8, 8}, {Replicate(0)}, MUON_REPLICATED_ZERO2)},
          Mesh{{4}}};
}
Job Zero2x2() {
  Job j = Zero2x4();
  j.name = "ZeRO-2 x2";
  j.mesh = Mesh{{2}};
  return j;
}
Job Ddp2() {
  return {"DDP x2",
          {P("a", {10, 6}, {Replicate(0)}), P("b", {7, 9}, {Replicate(0)}),
           P("c", {8, 8}, {Replicate(0)})},
          Mesh{{2}}};
}

// Every rank's pieces put together into whole tensors.
std::map<std::string, std::vector<float>> Whole(const Job& job, const std::vector<RankResult>& res) {
  std::map<std::string, std::vector<float>> out;
  for (const TParam& p : job.model) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    out[p.name].assign(static_cast<size_t>(n), 0.0f);
  }
  for (const RankResult& r : res) {
    for (size_t j = 0; j < r.names.size(); ++j) {
      for (size_t i = 0; i < r.indices[j].size(); ++i) {
        out[r.names[j]][static_cast<size_t>(r.indices[j][i])] = r.params[j][i];
      }
    }
  }
  return out;
}

void ExpectEqualsReference(const Job& job, const std::vector<RankResult>& res,
                           const std::vector<std::vector<float>>& ref) {
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_TRUE(res[r].error.empty()) << "rank " << r << ": " << res[r].error;
    for (size_t j = 0; j < res[r].names.size(); ++j) {
      size_t k = 0;
      while (job.model[k].name != res[r].names[j]) ++k;
      for (size_t i = 0; i < res[r].indices[j].size(); ++i) {
        ASSERT_EQ(res[r].params[j][i], ref[k][static_cast<size_t>(res[r].indices[j][i])])
            << "rank " << r << " param " << res[r].names[j] << " element "
            << res[r].indices[j][i];
      }
    }
  }
}

// NorMuon, the variant whose state lives on each matrix's owner.
void NorMuon(muon_options_t* o) {
  o->normuon = 1;
  o->normuon_beta2 = 0.9;
}

void Resume(const Job& from, const Job& to, bool own_blob = false,
            void (*variant)(muon_options_t*) = nullptr) {
  SCOPED_TRACE(std::string(from.name) + " -> " + to.name + (variant ? " (variant)" : ""));
  RunConfig first;
  if (variant != nullptr) first.variant = variant;
  first.steps = kBefore;
  first.save_at_end = true;
  const std::vector<RankResult> saved = RunDistributed(from.model, from.mesh, first);
  std::vector<std::vector<unsigned char>> blobs;
  for (const RankResult& r : saved) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    blobs.push_back(r.blob);
  }
  const auto values = Whole(from, saved);
  RunConfig second;
  second.variant = first.variant;
  second.first_step = kBefore;
  second.steps = kAfter;
  second.resume_values = &values;
  second.resume_from = &blobs;
  second.resume_own_blob = own_blob;
  const std::vector<RankResult> resumed = RunDistributed(to.model, to.mesh, second);
  RunConfig whole;
  whole.variant = first.variant;
  whole.steps = kBefore + kAfter;
  const auto ref = RunReference(to.model, whole);
  ASSERT_FALSE(ref.empty());
  ExpectEqualsReference(to, resumed, ref);
  for (const RankResult& r : resumed) EXPECT_EQ(r.stats.steps, kBefore + kAfter);
}

TEST(Resume, FsdpAtFourRanksIntoOtherSizesAndLayouts) {
  Resume(Fsdp4(), Flat3());
  Resume(Fsdp4(), TpFsdp2x2());
  Resume(Fsdp4(), Zero2x2());
}

TEST(Resume, TpTimesFsdpIntoOtherSizesAndLayouts) {
  Resume(TpFsdp2x2(), Fsdp4());
  Resume(TpFsdp2x2(), Flat3());
  Resume(TpFsdp2x2(), Ddp2());
}

TEST(Resume, FlatRangesIntoOtherSizesAndLayouts) {
  Resume(Flat3(), Fsdp4());
  Resume(Flat3(), TpFsdp2x2());
}

TEST(Resume, Zero2IntoOtherSizesAndLayouts) {
  Resume(Zero2x4(), Zero2x2());
  Resume(Zero2x4(), Fsdp4());
  Resume(Zero2x2(), Flat3());
}

TEST(Resume, Zero2FromEachRanksOwnBlobIntoAFreshOptimizer) {
  // The same job: each rank loads its own blob before the first step; the
  // ranks that did not own a param's momentum hold none of it in their blob.
  Resume(Zero2x4(), Zero2x4(), /*own_blob=*/true);
}

// NorMuon's moments move to whichever rank owns each matrix after the
// resume: other world sizes and layouts, ZeRO-2 owners, a rank's own blob.
TEST(Resume, NorMuonMomentsFollowTheirMatricesToTheNewOwners) {
  Resume(Fsdp4(), Flat3(), false, NorMuon);
  Resume(TpFsdp2x2(), Fsdp4(), false, NorMuon);
  Resume(Flat3(), Ddp2(), false, NorMuon);
  Resume(Zero2x4(), Zero2x2(), false, NorMuon);
  Resume(Fsdp4(), Zero2x2(), false, NorMuon);
  Resume(Fsdp4(), Fsdp4(), /*own_blob=*/true, NorMuon);
}

// The same jobs with split blocks: "a" by columns (its moments: a row of
// each of two blocks), "c" by rows.
Job Split(Job j) {
  for (TParam& p : j.model) {
    if (p.name == "a") {
      p.split_dim = 1;
      p.split_sizes = {4, 2};
    } else if (p.name == "c") {
      p.split_sizes = {2, 2};
    }
  }
  return j;
}

TEST(Resume, SplitBlocksMomentsFollowTheirMatricesToTheNewOwners) {
  Resume(Split(Fsdp4()), Split(Flat3()), false, NorMuon);
  Resume(Split(TpFsdp2x2()), Split(Zero2x2()), false, NorMuon);
  Resume(Split(Zero2x4()), Split(Ddp2()), false, NorMuon);
}

// muon_get_owned_moments / muon_set_owned_moments, what muon.Muon's
// state_dict and load_state_dict use under a distributed config. The model:
// FSDP rows, a flat range, replicas, column shards, and an expert stack
// registered on rank 0 only (its owner is rank 0; a rank never owns what it
// does not hold).
struct OwnedMoments {
  std::vector<float> values;
  std::vector<uint8_t> owned;
};
using OwnedByRank = std::map<std::pair<int, std::string>, OwnedMoments>;

std::vector<TParam> OwnedMomentsModel() {
  return {
      P("a", {10, 7}, {Shard(0, 0, MUON_SPLIT_CHUNK)}),
      P("w", {4, 11}, {Flat(0)}),
      P("r", {6, 6}, {Replicate(0)}),
      P("t", {8, 12}, {Shard(0, 1, MUON_SPLIT_CHUNK)}),
      {"experts", {3, 5, 4}, MUON_MATRIX_VIEW_BATCHED_LEADING, {},
       [](int rank) { return rank == 0; }},
  };
}

int64_t Batch(const TParam& p) {
  return p.view == MUON_MATRIX_VIEW_BATCHED_LEADING ? p.shape[0] : 1;
}
int64_t MomentCount(const TParam& p) {
  return Batch(p) * (p.view == MUON_MATRIX_VIEW_BATCHED_LEADING ? p.shape[1] : p.shape[0]);
}

// An after_steps hook: `set` (when not NULL) gives every held parameter its
// whole moments through muon_set_owned_moments first; then each rank's
// muon_get_owned_moments goes into *out.
std::function<muon_status_t(int, muon_optimizer_t*)> ReadOwned(
    const std::vector<TParam>& model, std::mutex* mu, OwnedByRank* out,
    const std::map<std::string, std::vector<float>>* set = nullptr) {
  return [&model, mu, out, set](int rank, muon_optimizer_t* opt) -> muon_status_t {
    int64_t id = 0;
    for (const TParam& p : model) {
      if (p.registered_on && !p.registered_on(rank)) continue;
      std::vector<float> whole = set ? set->at(p.name) : std::vector<float>();
      int64_t n = MomentCount(p);
      DLTensor in = Tensor1D(whole.data(), &n);
      if (set != nullptr) {
        const muon_status_t st = muon_set_owned_moments(opt, id, &in);
        if (st != MUON_OK) return st;
      }
      OwnedMoments o{std::vector<float>(static_cast<size_t>(n), -1.0f),
                     std::vector<uint8_t>(static_cast<size_t>(Batch(p)), 7)};
      DLTensor t = Tensor1D(o.values.data(), &n);
      const muon_status_t st = muon_get_owned_moments(opt, id, &t, o.owned.data(), Batch(p));
      if (st != MUON_OK) return st;
      std::lock_guard<std::mutex> lock(*mu);
      (*out)[{rank, p.name}] = std::move(o);
      ++id;
    }
    return MUON_OK;
  };
}

// Every matrix flagged by exactly one rank (0 or 1 flags only, zeros where
// not owned); the flagged matrices put together, by name.
std::map<std::string, std::vector<float>> PutTogether(const std::vector<TParam>& model,
                                                     const OwnedByRank& got, int ranks) {
  std::map<std::string, std::vector<float>> whole;
  for (const TParam& p : model) {
    const int64_t rows = MomentCount(p) / Batch(p);
    std::vector<float>& w = whole[p.name];
    w.assign(static_cast<size_t>(MomentCount(p)), 0.0f);
    for (int64_t m = 0; m < Batch(p); ++m) {
      int owners = 0;
      for (int r = 0; r < ranks; ++r) {
        auto it = got.find({r, p.name});
        if (it == got.end()) continue;
        const OwnedMoments& o = it->second;
        EXPECT_LE(o.owned[static_cast<size_t>(m)], 1) << p.name << " rank " << r;
        for (int64_t i = m * rows; i < (m + 1) * rows; ++i) {
          if (o.owned[static_cast<size_t>(m)] == 1) {
            w[static_cast<size_t>(i)] = o.values[static_cast<size_t>(i)];
          } else {
            EXPECT_EQ(o.values[static_cast<size_t>(i)], 0.0f) << p.name << " rank " << r;
          }
        }
        owners += o.owned[static_cast<size_t>(m)] == 1;
      }
      EXPECT_EQ(owners, 1) << p.name << " matrix " << m;
    }
  }
  return whole;
}

// *out: one process's moments of every matrix after `cfg` (it owns them
// all). False when the reference run failed.
bool ReferenceMoments(const std::vector<TParam>& model, RunConfig cfg,
                      std::map<std::string, std::vector<float>>* out) {
  std::mutex mu;
  OwnedByRank got;
  cfg.after_steps = ReadOwned(model, &mu, &got);
  if (RunReference(model, cfg).empty()) return false;
  *out = PutTogether(model, got, 1);
  return true;
}

TEST(Resume, OwnedMomentsPutTogetherAreTheSingleProcessMoments) {
  const std::vector<TParam> model = OwnedMomentsModel();
  RunConfig cfg;
  cfg.variant = NorMuon;
  cfg.steps = 3;
  std::map<std::string, std::vector<float>> ref;
  ASSERT_TRUE(ReferenceMoments(model, cfg, &ref)) << "reference run failed";
  std::mutex mu;
  for (const auto& [name, v] : ref) {
    bool nonzero = false;
    for (float x : v) nonzero = nonzero || x != 0.0f;
    EXPECT_TRUE(nonzero) << name << ": the reference's moments are zero, the test cannot tell";
  }
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    OwnedByRank got;
    cfg.after_steps = ReadOwned(model, &mu, &got);
    for (const RankResult& r : RunDistributed(model, Mesh{{n}}, cfg)) {
      ASSERT_TRUE(r.error.empty()) << r.error;
    }
    const auto whole = PutTogether(model, got, n);
    for (const auto& [name, v] : ref) {
      ASSERT_EQ(whole.at(name).size(), v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(whole.at(name)[i], v[i]) << name << " moment " << i << " at " << n << " ranks";
      }
    }
  }
}

// Given the whole moments on every holder, each rank keeps the matrices it
// owns: read back and put together, they are what was set.
TEST(Resume, SetOwnedMomentsKeepsWhatEachRankOwns) {
  const std::vector<TParam> model = OwnedMomentsModel();
  std::map<std::string, std::vector<float>> set;
  for (const TParam& p : model) {
    std::vector<float>& v = set[p.name];
    for (int64_t i = 0; i < MomentCount(p); ++i) v.push_back(0.25f + 0.125f * static_cast<float>(i));
  }
  RunConfig cfg;
  cfg.variant = NorMuon;
  cfg.steps = 2;
  std::mutex mu;
  OwnedByRank got;
  cfg.after_steps = ReadOwned(model, &mu, &got, &set);
  for (const RankResult& r : RunDistributed(model, Mesh{{3}}, cfg)) {
    ASSERT_TRUE(r.error.empty()) << r.error;
  }
  EXPECT_EQ(PutTogether(model, got, 3), set);
}

// MUON_ASSIGNMENT_SPLIT: "big" costs more than the other ranks' matrices
// together and is orthogonalized by all 4 ranks, each keeping its whole
// NorMuon moments (NorMuonBlock updates them alike). Its first member gives
// them (one owner per matrix, as put together), within 1e-5 of one
// process's: the split's updates agree within fp32 rounding of its sums'
// order, and the moments average their squares; what is set reaches every
// member.
std::vector<TParam> SplitMomentsModel() {
  std::vector<TParam> model = {P("big", {16, 96}, {Shard(0, 0)})};
  for (int i = 0; i < 15; ++i) {
    model.push_back(P(("small" + std::to_string(i)).c_str(), {8, 8}, {Replicate(0)}));
  }
  return model;
}

TEST(Resume, ASplitMatrixsMomentsAreGivenOnceAndKeptByEveryMember) {
  const std::vector<TParam> model = SplitMomentsModel();
  RunConfig cfg;
  cfg.variant = NorMuon;
  cfg.steps = 3;
  std::map<std::string, std::vector<float>> ref;
  ASSERT_TRUE(ReferenceMoments(model, cfg, &ref)) << "reference run failed";
  std::mutex mu;
  cfg.assignment = MUON_ASSIGNMENT_SPLIT;
  OwnedByRank got;
  cfg.after_steps = ReadOwned(model, &mu, &got);
  int64_t orthogonalized = 0;
  for (const RankResult& r : RunDistributed(model, Mesh{{4}}, cfg)) {
    ASSERT_TRUE(r.error.empty()) << r.error;
    orthogonalized += r.stats.matrices_orthogonalized;
  }
  ASSERT_EQ(orthogonalized, 15 + 4) << "big is not split over the 4 ranks";
  const auto whole = PutTogether(model, got, 4);  // one rank flags each matrix
  for (const auto& [name, v] : ref) {
    const std::vector<float>& w = whole.at(name);
    ASSERT_EQ(w.size(), v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_GT(v[i], 0.0f) << name << " moment " << i;
      EXPECT_NEAR(w[i], v[i], 1e-5 * v[i]) << name << " moment " << i;
    }
  }
  // The whole moments set on every rank: each member of big keeps them all.
  std::vector<float> set(16);
  for (size_t i = 0; i < set.size(); ++i) set[i] = 0.5f + 0.25f * static_cast<float>(i);
  int kept = 0;
  cfg.after_steps = [&](int, muon_optimizer_t* opt) -> muon_status_t {
    int64_t n = 16;
    DLTensor in = Tensor1D(set.data(), &n);
    const muon_status_t st = muon_set_owned_moments(opt, 0, &in);
    if (st != MUON_OK) return st;
    std::vector<float> back(16, -1.0f);
    DLTensor out = Tensor1D(back.data(), &n);
    if (muon_get_moments(opt, 0, &out) != MUON_OK) return MUON_INTERNAL;  // a member's
    std::lock_guard<std::mutex> lock(mu);
    kept += back == set;
    return MUON_OK;
  };
  for (const RankResult& r : RunDistributed(model, Mesh{{4}}, cfg)) {
    ASSERT_TRUE(r.error.empty()) << r.error;
  }
  EXPECT_EQ(kept, 4);
}

// Moments the host sets reach only the ranks that hold each parameter. Under
// SPREAD a rank orthogonalizes experts it does not hold: rather than start
// their moments at zero (a silent change of the resumed run), every rank's
// first step fails naming the parameter and the fix. BALANCED owners hold
// what they own: the same calls step. Zeros (a state saved without
// moments) are what every matrix starts with: SPREAD steps with them.
TEST(Resume, HostSetMomentsThatCannotReachANonHoldingOwnerAreRefused) {
  std::vector<TParam> model;
  for (int r = 0; r < 4; ++r) {
    model.push_back({"expert" + std::to_string(r), {3, 5, 4}, MUON_MATRIX_VIEW_BATCHED_LEADING,
                     {}, [r](int rank) { return rank == r; }});
  }
  model.push_back(P("dense", {24, 24}, {Replicate(-1)}));
  for (const std::pair<int, float>& run : {std::pair<int, float>{MUON_ASSIGNMENT_SPREAD, 0.5f},
                                           {MUON_ASSIGNMENT_BALANCED, 0.5f},
                                           {MUON_ASSIGNMENT_SPREAD, 0.0f}}) {
    const int assignment = run.first;
    const float value = run.second;
    SCOPED_TRACE(std::to_string(assignment) + " " + std::to_string(value));
    const bool refused = assignment == MUON_ASSIGNMENT_SPREAD && value != 0.0f;
    RunConfig cfg;
    cfg.variant = NorMuon;
    cfg.assignment = assignment;
    cfg.steps = 0;
    std::mutex mu;
    std::vector<std::string> errors;
    cfg.after_steps = [&](int rank, muon_optimizer_t* opt) -> muon_status_t {
      int64_t id = 0;
      for (const TParam& p : model) {
        if (p.registered_on && !p.registered_on(rank)) continue;
        std::vector<float> whole(static_cast<size_t>(MomentCount(p)), value);
        int64_t n = MomentCount(p);
        DLTensor in = Tensor1D(whole.data(), &n);
        const muon_status_t st = muon_set_owned_moments(opt, id++, &in);
        if (st != MUON_OK) return st;
      }
      const muon_status_t st = muon_step(opt, nullptr);
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(st == MUON_OK ? "" : muon_last_error_message());
      return MUON_OK;
    };
    for (const RankResult& r : RunDistributed(model, Mesh{{4}}, cfg)) {
      ASSERT_TRUE(r.error.empty()) << r.error;
    }
    ASSERT_EQ(errors.size(), 4u);
    for (const std::string& e : errors) {
      if (!refused) {
        EXPECT_EQ(e, "");
        continue;
      }
      EXPECT_NE(e.find("FAILED_PRECONDITION"), std::string::npos) << e;
      EXPECT_NE(e.find("without holding the parameter"), std::string::npos) << e;
      EXPECT_NE(e.find("muon_load_states"), std::string::npos) << e;
    }
  }
}

// Misuse: owned flags of another count than the parameter's matrices, and
// the calls without NorMuon, are refused naming the cause; dst is untouched.
TEST(Resume, OwnedMomentsMisuseIsRefusedNamingTheCause) {
  const std::vector<TParam> model = OwnedMomentsModel();
  std::string wrong_count, without_normuon;
  RunConfig cfg;
  cfg.variant = NorMuon;
  cfg.steps = 1;
  cfg.after_steps = [&](int, muon_optimizer_t* opt) -> muon_status_t {
    std::vector<float> values(10, -1.0f);
    int64_t n = 10;
    DLTensor t = Tensor1D(values.data(), &n);
    uint8_t owned[2] = {7, 7};
    if (muon_get_owned_moments(opt, 0, &t, owned, 2) != MUON_INVALID_ARGUMENT) return MUON_INTERNAL;
    wrong_count = muon_last_error_message();
    if (values[0] != -1.0f || owned[0] != 7) return MUON_INTERNAL;  // nothing written
    return muon_get_owned_moments(opt, 0, &t, nullptr, 0);  // the flags are optional
  };
  ASSERT_FALSE(RunReference(model, cfg).empty());
  EXPECT_NE(wrong_count.find("owned_count for param 'a'"), std::string::npos) << wrong_count;
  EXPECT_NE(wrong_count.find("must be its number of matrices, 1; got 2"), std::string::npos)
      << wrong_count;
  cfg.variant = nullptr;
  cfg.after_steps = [&](int, muon_optimizer_t* opt) -> muon_status_t {
    std::vector<float> values(10);
    int64_t n = 10;
    DLTensor t = Tensor1D(values.data(), &n);
    if (muon_set_owned_moments(opt, 0, &t) != MUON_FAILED_PRECONDITION) return MUON_INTERNAL;
    without_normuon = muon_last_error_message();
    return MUON_OK;
  };
  ASSERT_FALSE(RunReference(model, cfg).empty());
  EXPECT_NE(without_normuon.find("NorMuon is off"), std::string::npos) << without_normuon;
}

// Without every blob of a NorMuon job, some matrix's moments are missing.
// DDP replicas: either rank's blob holds all the momentum, but each holds
// the moments of the matrices its rank owned only. The first step after
// loading one blob fails on every rank (the setup is agreed), names a
// matrix, and changes no parameter.
TEST(Resume, NorMuonMomentsMissingFromTheBlobsAreNamed) {
  RunConfig first;
  first.variant = NorMuon;
  first.steps = kBefore;
  first.save_at_end = true;
  const auto saved = RunDistributed(Ddp2().model, Ddp2().mesh, first);
  std::vector<std::vector<unsigned char>> one;
  for (const auto& r : saved) ASSERT_TRUE(r.error.empty()) << r.error;
  one.push_back(saved[0].blob);
  const auto values = Whole(Ddp2(), saved);
  RunConfig second;
  second.variant = NorMuon;
  second.first_step = kBefore;
  second.steps = 1;
  second.keep_stepping = true;
  second.resume_values = &values;
  second.resume_from = &one;
  const auto res = RunDistributed(Ddp2().model, Ddp2().mesh, second);
  for (size_t r = 0; r < res.size(); ++r) {
    ASSERT_EQ(res[r].step_errors.size(), 1u) << "rank " << r;
    EXPECT_NE(res[r].step_errors[0].find("NorMuon second moments"), std::string::npos)
        << "rank " << r << ": " << res[r].step_errors[0];
    for (size_t j = 0; j < res[r].names.size(); ++j) {
      const auto& before = values.at(res[r].names[j]);
      for (size_t i = 0; i < res[r].indices[j].size(); ++i) {
        ASSERT_EQ(res[r].params[j][i], before[static_cast<size_t>(res[r].indices[j][i])])
            << "rank " << r << " changed " << res[r].names[j];
      }
    }
  }
  // Both blobs: it resumes.
  std::vector<std::vector<unsigned char>> both{saved[0].blob, saved[1].blob};
  second.resume_from = &both;
  for (const auto& r : RunDistributed(Ddp2().model, Ddp2().mesh, second)) {
    ASSERT_EQ(r.step_errors.size(), 1u);
    EXPECT_EQ(r.step_errors[0], "");
  }
}

TEST(Resume, ACheckpointThatCannotRestoreTheJobChangesNothingAndSaysWhy) {
  RunConfig first;
  first.steps = kBefore;
  first.save_at_end = true;
  const auto saved = RunDistributed(Fsdp4().model, Fsdp4().mesh, first);
  const auto values = Whole(Fsdp4(), saved);
  // One rank's blob missing: rows of every matrix are in none of the others.
  std::vector<std::vector<unsigned char>> three;
  for (int r = 0; r < 3; ++r) three.push_back(saved[r].blob);
  RunConfig second;  // loading only: a rank refused must not leave others stepping
  second.first_step = kBefore;
  second.steps = 0;
  second.resume_values = &values;
  second.resume_from = &three;
  auto res = RunDistributed(Flat3().model, Flat3().mesh, second);
  bool named = false;
  for (const RankResult& r : res) {
    if (r.error.empty()) continue;
    EXPECT_NE(r.error.find("load: INVALID_ARGUMENT"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("are in none of the 3 blobs"), std::string::npos) << r.error;
    named = true;
  }
  EXPECT_TRUE(named) << "no rank noticed the missing blob";
  // Another layout from a rank's own blob: refused, pointing to muon_load_states.
  std::vector<std::vector<unsigned char>> all;
  for (const auto& r : saved) all.push_back(r.blob);
  all.resize(3);
  second.resume_from = &all;
  second.resume_own_blob = true;
  res = RunDistributed(Flat3().model, Flat3().mesh, second);
  named = false;
  for (const RankResult& r : res) {
    if (r.error.empty()) continue;
    EXPECT_NE(r.error.find("muon_load_states"), std::string::npos) << r.error;
    named = true;
  }
  EXPECT_TRUE(named) << "a blob of another layout loaded as this rank's own";
}

}  // namespace
}  // namespace muon_test
