// Fault injection at every collective of a step, and of the first step's
// setup, on one rank and on every rank, for the exchange stepper and the
// ZeRO-2 stepper (in-process ranks
// over the C API, each communicator wrapped to fail its k-th call after the
// data moved). For every k: no hang (the test's timeout bounds it), every
// rank returns an error for the step (the one exception: when the fault hits
// the step's own verdict exchange on one rank, the other ranks learn it at
// the next step, which every rank then fails), a further step is refused,
// and restoring the checkpoint taken before the step resumes bit for bit
// like an uninterrupted run.
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

constexpr int kSteps = 3;      // the fault hits step 1; the run then recovers it
constexpr int kFaultStep = 1;

std::vector<TParam> ExchangeModel() {
  // More matrices than ranks: with a small round_bytes, several rounds.
  return {
      {"w", {12, 8}, MUON_MATRIX_VIEW_2D, {Shard(0, 0), Flat(1)}, nullptr},
      {"v", {6, 10}, MUON_MATRIX_VIEW_2D, {Replicate(0), Flat(1)}, nullptr},
      {"u", {12, 8}, MUON_MATRIX_VIEW_2D, {Replicate(0), Shard(1, 1)}, nullptr},
      {"t", {9, 7}, MUON_MATRIX_VIEW_2D,
       {Shard(0, 0, MUON_SPLIT_CHUNK), Shard(1, 1, MUON_SPLIT_CHUNK)}, nullptr},
      {"s", {8, 8}, MUON_MATRIX_VIEW_2D, {Replicate(0), Replicate(1)}, nullptr},
      {"q", {10, 6}, MUON_MATRIX_VIEW_2D, {Shard(0, 1), Shard(1, 0)}, nullptr},
  };
}

std::vector<TParam> Zero2Model() {
  std::vector<TParam> m = {
      {"a", {8, 6}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr},
      {"b", {5, 7}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr},
      {"c", {8, 6}, MUON_MATRIX_VIEW_2D, {Replicate(0)}, nullptr},
  };
  for (TParam& p : m) p.replicated_mode = MUON_REPLICATED_ZERO2;
  return m;
}

// "big" is worth splitting over the ranks (MUON_ASSIGNMENT_SPLIT).
std::vector<TParam> SplitModel() {
  std::vector<TParam> model = {
      {"big", {16, 96}, MUON_MATRIX_VIEW_2D, {Shard(0, 0)}, nullptr}};
  for (int i = 0; i < 15; ++i) {  // 4 matrices per rank: a split may happen
    model.push_back({"small" + std::to_string(i), {8, 8}, MUON_MATRIX_VIEW_2D, {Replicate(0)},
                     nullptr});
  }
  return model;
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct Case {
  const char* name;
  std::vector<TParam> model;
  Mesh mesh;
  size_t round_bytes = 0;  // small: several exchange rounds per step
  int assignment = MUON_ASSIGNMENT_BALANCED;
  std::function<void(muon_options_t* o)> variant;  // the options' variant, if any
};

// A run of the case's model with its options: `steps` steps at `prefetch`.
RunConfig ConfigOf(const Case& c, int prefetch, int steps) {
  RunConfig cfg;
  cfg.steps = steps;
  cfg.prefetch_count = prefetch;
  cfg.round_bytes = c.round_bytes;
  cfg.assignment = c.assignment;
  cfg.variant = c.variant;
  return cfg;
}

// The collectives of the first step's setup, from a counted run of at least
// two steps (step 0 and step 1 issue the same besides the setup).
int SetupCalls(const RankResult& counted) {
  const std::vector<int>& at = counted.calls_before_step;
  return at[1] - (at[2] - at[1]);
}

void InjectEverywhere(const Case& c, int prefetch) {
  SCOPED_TRACE(std::string(c.name) + " prefetch " + std::to_string(prefetch));
  // What a recovered run must end equal to.
  RunConfig clean = ConfigOf(c, prefetch, kFaultStep + 1);
  clean.count_calls = true;
  const std::vector<RankResult> want = RunDistributed(c.model, c.mesh, clean);
  const int n = c.mesh.size();
  for (int r = 0; r < n; ++r) ASSERT_TRUE(want[r].error.empty()) << want[r].error;
  int injected = 0;
  for (int fail_rank : {-1, 1}) {
    // Rank 1's collectives of the faulty step (every rank issues the same
    // number: the steppers issue all of theirs whatever happens).
    const int first = want[1].calls_before_step[kFaultStep];
    const int last = want[1].calls_before_step[kFaultStep + 1];
    ASSERT_GT(last, first);
    for (int k = first; k < last; ++k) {
      SCOPED_TRACE("collective " + std::to_string(k - first) + " of the step, on " +
                   (fail_rank < 0 ? std::string("every rank") : "rank 1"));
      RunConfig cfg = ConfigOf(c, prefetch, kSteps);
      cfg.fail_call = k;
      cfg.fail_rank = fail_rank;
      // The step's last collective carries the verdicts (the exchange's last
      // scatter, or the all_gather of them after the ZeRO-2 stepper): failing
      // there on one rank after its verdict left, that rank alone knows this
      // step failed; it refuses the next, which every rank then fails.
      const bool verdict = k == last - 1;
      if (verdict && fail_rank >= 0) {
        cfg.keep_stepping = true;
        const std::vector<RankResult> res = RunDistributed(c.model, c.mesh, cfg);
        ++injected;
        for (int r = 0; r < n; ++r) {
          SCOPED_TRACE("rank " + std::to_string(r));
          ASSERT_EQ(res[r].step_errors.size(), static_cast<size_t>(kSteps));
          EXPECT_EQ(res[r].step_errors[kFaultStep].empty(), r != fail_rank)
              << res[r].step_errors[kFaultStep];
          const std::string& next = res[r].step_errors[kFaultStep + 1];
          EXPECT_TRUE(Has(next, "FAILED_PRECONDITION")) << next;
          EXPECT_TRUE(Has(next, "rank 1: FAILED_PRECONDITION: refused")) << next;
        }
        continue;
      }
      const std::vector<RankResult> res = RunDistributed(c.model, c.mesh, cfg);
      ++injected;
      for (int r = 0; r < n; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(res[r].failed_step, kFaultStep) << res[r].error;
        // Every rank names the injected failure, and (agreed) the rank it hit.
        EXPECT_TRUE(Has(res[r].error, "injected link failure")) << res[r].error;
        // The ranks went on issuing the same collectives, of the same sizes
        // (NCCL would hang on sizes that do not pair up).
        EXPECT_FALSE(Has(res[r].error, "do not pair up")) << res[r].error;
        EXPECT_FALSE(Has(res[r].error, "differ:")) << res[r].error;
        if (!verdict) {
          EXPECT_TRUE(Has(res[r].error, fail_rank < 0 ? "rank 0:" : "rank 1:")) << res[r].error;
        }
        EXPECT_TRUE(Has(res[r].refused, "FAILED_PRECONDITION")) << res[r].refused;
        EXPECT_TRUE(res[r].recovered);
        // Restored and re-stepped: bit for bit the uninterrupted run.
        ASSERT_EQ(res[r].params.size(), want[r].params.size());
        for (size_t j = 0; j < want[r].params.size(); ++j) {
          EXPECT_EQ(res[r].params[j], want[r].params[j]) << res[r].names[j];
        }
      }
    }
  }
  std::printf("%s, prefetch %d: %d faults injected and survived\n", c.name, prefetch, injected);
}

// Every collective of the first step's setup (group memberships, the
// handshake's four, the agreement on its outcome), failed on one rank or on
// every rank after the data moved: every rank fails that first step alike,
// naming the injected failure. Where the setup itself fails (every
// collective but the agreement's), nothing changed: stepping again sets up
// again and succeeds on every rank. Where the agreement's all_gather fails
// after the verdicts left, the failing ranks cannot tell whether the others
// stepped on: they keep the setup and refuse in the step, which every rank
// then fails, and every rank refuses the next step until the state is
// restored. Either way, restoring the state from before the first step and
// stepping gives the uninterrupted run bit for bit.
void InjectInSetup(const Case& c, int prefetch) {
  SCOPED_TRACE(std::string(c.name) + " setup, prefetch " + std::to_string(prefetch));
  RunConfig clean = ConfigOf(c, prefetch, 2);
  clean.count_calls = true;
  const std::vector<RankResult> counted = RunDistributed(c.model, c.mesh, clean);
  clean.steps = 1;
  const std::vector<RankResult> want = RunDistributed(c.model, c.mesh, clean);
  const int n = c.mesh.size();
  int setup_calls = -1;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(counted[r].error.empty()) << counted[r].error;
    ASSERT_TRUE(want[r].error.empty()) << want[r].error;
    const int setup = SetupCalls(counted[r]);
    if (r == 0) setup_calls = setup;
    ASSERT_EQ(setup, setup_calls) << "rank " << r;
  }
  ASSERT_GE(setup_calls, 5);  // the handshake's four and the agreement, at least
  int injected = 0;
  for (int fail_rank : {-1, 1}) {
    for (int k = 0; k < setup_calls; ++k) {
      SCOPED_TRACE("collective " + std::to_string(k) + " of the setup, on " +
                   (fail_rank < 0 ? std::string("every rank") : "rank 1"));
      RunConfig cfg = ConfigOf(c, prefetch, 2);
      cfg.fail_call = k;
      cfg.fail_rank = fail_rank;
      const bool agreement = k == setup_calls - 1;
      const std::vector<RankResult> res = RunDistributed(c.model, c.mesh, cfg);
      ++injected;
      for (int r = 0; r < n; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_EQ(res[r].failed_step, 0) << res[r].error;
        EXPECT_TRUE(Has(res[r].error, "injected link failure")) << res[r].error;
        EXPECT_TRUE(Has(res[r].error, fail_rank < 0 ? "rank 0:" : "rank 1:")) << res[r].error;
        if (agreement) {
          EXPECT_FALSE(res[r].again_ok);
          EXPECT_TRUE(Has(res[r].refused, "FAILED_PRECONDITION")) << res[r].refused;
        } else {
          EXPECT_TRUE(res[r].again_ok) << res[r].refused;
        }
        EXPECT_TRUE(res[r].recovered) << res[r].recovery_error;
        ASSERT_EQ(res[r].params.size(), want[r].params.size());
        for (size_t j = 0; j < want[r].params.size(); ++j) {
          EXPECT_EQ(res[r].params[j], want[r].params[j]) << res[r].names[j];
        }
      }
    }
  }
  std::printf("%s setup, prefetch %d: %d faults injected and survived\n", c.name, prefetch,
              injected);
}

TEST(Faults, SetupAtEveryCollective) {
  for (int prefetch : {0, 1, 2}) {
    InjectInSetup({"exchange", ExchangeModel(), Mesh{{2, 2}}, 4 * 12 * 8}, prefetch);
  }
  InjectInSetup({"zero2", Zero2Model(), Mesh{{4}}}, 0);
  InjectInSetup({"split", SplitModel(), Mesh{{4}}, 4 * 8 * 8, MUON_ASSIGNMENT_SPLIT}, 1);
}

// A lying link: rank 1 receives rank 0's handshake header with one bit of
// its own part's size flipped (32 GiB more). Sizes from the wire are capped
// before anything is allocated for them: rank 1 names the damage, the
// handshake's exchange no longer pairs up, and every rank fails the setup
// (nothing allocated, no rank left waiting).
TEST(Faults, ADamagedHandshakeHeaderIsRefusedBeforeAnyAllocation) {
  RunConfig clean;
  clean.steps = 2;
  clean.count_calls = true;
  const std::vector<RankResult> counted = RunDistributed(ExchangeModel(), Mesh{{2, 2}}, clean);
  const int setup_calls = SetupCalls(counted[1]);
  RunConfig cfg;
  cfg.steps = 1;
  cfg.corrupt_call = setup_calls - 5;  // after the memberships: the headers' all_gather
  cfg.corrupt_rank = 1;
  cfg.corrupt_byte = 24 + 4;  // rank 0's header: its key (24 bytes), then own_size
  cfg.corrupt_mask = 0x08;    // bit 35
  const std::vector<RankResult> res = RunDistributed(ExchangeModel(), Mesh{{2, 2}}, cfg);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(res[r].failed_step, 0) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "the first step's setup failed")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "rank 1: INTERNAL: setup: rank 0 announced a part of its own "
                                  "of 34359738"))
        << res[r].error;
  }
}

TEST(Faults, ExchangeStepperAtEveryCollective) {
  // At most one matrix per rank and round: two rounds, so that with prefetch a
  // fault meets the other round's exchange in flight.
  for (int prefetch : {0, 1}) {
    InjectEverywhere({"exchange", ExchangeModel(), Mesh{{2, 2}}, 4 * 12 * 8}, prefetch);
  }
}

TEST(Faults, SplitMatrixSumsAtEveryCollective) {
  // MUON_ASSIGNMENT_SPLIT: "big" is split over the 4 ranks; its norm's and
  // Gram products' sums (two all_to_all_v each, every rank taking part) run
  // in a last round between the other rounds' exchanges and its scatter.
  std::vector<TParam> model = SplitModel();
  for (int prefetch : {0, 1}) {
    InjectEverywhere({"split", model, Mesh{{4}}, 4 * 8 * 8, MUON_ASSIGNMENT_SPLIT}, prefetch);
  }
  // Heavier small matrices: "big" splits over 2 of the 4 ranks, and the two
  // without a part issue the sums' collectives with no bytes.
  for (size_t i = 1; i < model.size(); ++i) model[i].shape = {12, 12};
  InjectEverywhere({"split_two", model, Mesh{{4}}, 4 * 12 * 12, MUON_ASSIGNMENT_SPLIT}, 1);
}

// The variants' sums (BlockSums): AOL takes no norm (its first sum is the
// first gram's), Gram Newton-Schulz sums R where it forms it, NorMuon adds
// one of the rows' squares. A rank that stops before its part, or in it,
// makes the rest of the same sizes, so that every collective pairs up.
TEST(Faults, SplitVariantsSumAtEveryCollective) {
  const std::vector<std::pair<const char*, std::function<void(muon_options_t*)>>> variants = {
      {"split_aol",
       [](muon_options_t* o) {
         o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
         o->ns_steps = 4;
       }},
      {"split_gram", [](muon_options_t* o) { o->ns_algorithm = MUON_NS_GRAM; }},
      {"split_normuon_fp16",
       [](muon_options_t* o) {
         o->normuon = 1;
         o->ns_dtype = MUON_NS_DTYPE_FP16;
       }},
  };
  for (const auto& [name, variant] : variants) {
    InjectEverywhere({name, SplitModel(), Mesh{{4}}, 4 * 8 * 8, MUON_ASSIGNMENT_SPLIT, variant},
                     1);
  }
}

TEST(Faults, Zero2StepperAtEveryCollective) {
  InjectEverywhere({"zero2", Zero2Model(), Mesh{{4}}}, 0);
}

// A callback may return any int (C allows it): a status the header does not
// list reads as UNKNOWN, agreed on every rank like any failure.
TEST(Faults, AStatusOutsideTheHeadersListReadsAsUnknown) {
  RunConfig clean;
  clean.steps = 2;
  clean.count_calls = true;
  const auto want = RunDistributed(ExchangeModel(), Mesh{{2, 2}}, clean);
  for (int status : {999, -7, 2147483647}) {
    RunConfig cfg;
    cfg.steps = 2;
    cfg.fail_call = want[2].calls_before_step[1];  // rank 2's first collective of step 1
    cfg.fail_rank = 2;
    cfg.fail_status = status;
    const auto res = RunDistributed(ExchangeModel(), Mesh{{2, 2}}, cfg);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(res[r].failed_step, 1) << res[r].error;
      EXPECT_TRUE(Has(res[r].error, "step: UNKNOWN: ")) << res[r].error;
      EXPECT_TRUE(Has(res[r].error, "failed on 1 of 4 ranks (rank 2: UNKNOWN:")) << res[r].error;
      EXPECT_TRUE(Has(res[r].error, "injected link failure")) << res[r].error;
    }
  }
}

TEST(Faults, TheFailingRankAndItsCauseReachEveryRank) {
  RunConfig clean;
  clean.steps = 2;
  clean.count_calls = true;
  const auto want = RunDistributed(ExchangeModel(), Mesh{{2, 2}}, clean);
  RunConfig cfg;
  cfg.steps = 3;
  cfg.fail_call = want[3].calls_before_step[1];  // rank 3's first collective of step 1
  cfg.fail_rank = 3;
  const auto res = RunDistributed(ExchangeModel(), Mesh{{2, 2}}, cfg);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(Has(res[r].error, "UNAVAILABLE")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "failed on 1 of 4 ranks (rank 3:")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "all_to_all_v on world (rank 3 of 4)")) << res[r].error;
    EXPECT_TRUE(Has(res[r].error, "every rank returns this error")) << res[r].error;
  }
}

}  // namespace
}  // namespace muon_test
