// The fully custom path: the host assigns, gathers and redistributes a
// matrix through callbacks; results equal single-process Muon bit for bit,
// and what comes back from a user gather is checked, never trusted.
#include <dlpack/dlpack.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "tests/distributed/harness.h"

namespace muon_test {
namespace {

constexpr int64_t kRows = 10, kCols = 6;

struct RankState;

// The host's side: rank r holds rows [2r, 2r + 2) of a 10 x 6 matrix for r
// < 4 and rows 8, 9 with rank 3 too (a layout described by nobody but the
// host). Data moves through shared buffers and a host barrier.
struct Host {
  int ranks = 4;
  std::vector<float> gathered = std::vector<float>(kRows * kCols);
  std::vector<float> result = std::vector<float>(kRows * kCols);
  std::vector<muon_comm_t> barrier_comms;  // a group of its own, for barriers
  int64_t wrong_rows = 0;                  // > 0: the owner reports this many rows
  int owner_choice = 1;
  bool disagree = false;
  bool refuse = false;  // assign_fn fails (returns -1 with a message)
  // >= 0: that rank's gather_fn / redistribute_fn fails after taking part in
  // the host's collective (its barrier), so no other rank waits on it.
  int fail_gather_on = -1;
  int fail_redistribute_on = -1;
  // >= 0: the world communicator's collective number `fail_call` (counted
  // from the start) fails after moving the data, on rank `fail_rank` (-1:
  // on every rank); a failed step is then tried once more.
  int fail_call = -1;
  int fail_rank = -1;
  // Called on every rank after its steps, before muon_destroy, with the
  // parameter's id (the ranks run side by side: Barrier works there).
  std::function<void(RankState&, muon_optimizer_t*, int64_t)> after_steps;
};

struct RankState {
  Host* host;
  int rank;
};

int64_t FirstRow(int r) { return 2 * r; }
int64_t NumRows(int r) { return r == 3 ? 4 : 2; }

int32_t Assign(void* s, const char*, int32_t) {
  auto* st = static_cast<RankState*>(s);
  if (st->host->refuse) {
    muon_set_callback_error("no owner known for this matrix");
    return -1;
  }
  return st->host->disagree ? st->rank % 2 : st->host->owner_choice;
}

void Barrier(RankState* st) {
  muon_comm_t& c = st->host->barrier_comms[st->rank];
  c.barrier(c.ctx, nullptr);
}

muon_status_t Gather(void* s, const float* local, int64_t n, int32_t owner, muon_gathered_t* out,
                     void*) {
  auto* st = static_cast<RankState*>(s);
  if (n != NumRows(st->rank) * kCols) {
    muon_set_callback_error("unexpected local size");
    return MUON_INVALID_ARGUMENT;
  }
  std::memcpy(st->host->gathered.data() + FirstRow(st->rank) * kCols, local, n * sizeof(float));
  Barrier(st);
  if (st->rank == st->host->fail_gather_on) {
    muon_set_callback_error("the host lost its gather buffer");
    return MUON_INTERNAL;
  }
  if (st->rank == owner) {
    out->data = st->host->gathered.data();
    out->rows = st->host->wrong_rows > 0 ? st->host->wrong_rows : kRows;
    out->cols = kCols;
  }
  return MUON_OK;
}

muon_status_t Redistribute(void* s, const float* full, int64_t rows, int64_t cols, int32_t owner,
                           float* local, int64_t n, void*) {
  auto* st = static_cast<RankState*>(s);
  if (st->rank == owner) std::memcpy(st->host->result.data(), full, rows * cols * sizeof(float));
  Barrier(st);
  std::memcpy(local, st->host->result.data() + FirstRow(st->rank) * kCols, n * sizeof(float));
  Barrier(st);
  if (st->rank == st->host->fail_redistribute_on) {
    muon_set_callback_error("the host's link went down");
    return MUON_UNAVAILABLE;
  }
  return MUON_OK;
}

struct Outcome {
  std::vector<std::vector<float>> pieces;
  std::vector<std::string> errors;
  std::vector<muon_stats_t> stats;
  std::vector<int> failed_step;     // -1: none
  std::vector<std::string> again;   // with fail_call: the step tried again ("" if it succeeded)
  std::vector<int> calls;           // the world's collectives, counted with fail_call
};

Outcome RunRanks(Host& host, int steps) {
  const int n = host.ranks;
  muon_inprocess_world_t* world = nullptr;
  EXPECT_EQ(muon_inprocess_world_create(n, &world), MUON_OK);
  std::vector<int32_t> reversed;
  for (int r = n - 1; r >= 0; --r) reversed.push_back(r);
  host.barrier_comms.resize(n);
  Outcome out;
  out.pieces.resize(n);
  out.errors.resize(n);
  out.stats.resize(n);
  out.failed_step.assign(n, -1);
  out.again.resize(n);
  out.calls.resize(n);
  auto body = [&](int rank) {
    RankState state{&host, rank};
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    o.lr = 0.02;
    o.ns_dtype = MUON_NS_DTYPE_FP32;
    muon_optimizer_t* opt = nullptr;
    muon_create(&o, &opt);
    muon_comm_t comm;
    int32_t world_id;
    muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    CallCounter counter;
    if (host.fail_call >= 0) {
      if (host.fail_rank < 0 || host.fail_rank == rank) counter.fail_on = host.fail_call;
      comm = WrapFailing(comm, &counter);
    }
    muon_set_world(opt, &comm, &world_id);
    muon_inprocess_comm(world, reversed.data(), n, rank, &host.barrier_comms[rank]);
    std::vector<float>& piece = out.pieces[rank];
    piece.resize(NumRows(rank) * kCols);
    std::vector<float> grad(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) {
      piece[i] = InitValue("custom", FirstRow(rank) * kCols + static_cast<int64_t>(i));
    }
    int64_t shape[2] = {NumRows(rank), kCols};
    DLTensor p{}, g{};
    p.data = piece.data();
    g.data = grad.data();
    p.device = g.device = {kDLCPU, 0};
    p.ndim = g.ndim = 2;
    p.dtype = g.dtype = {kDLFloat, 32, 1};
    p.shape = g.shape = shape;
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = "custom";
    muon_custom_layout_t layout{sizeof(muon_custom_layout_t), &state, kRows, kCols, Assign,
                                Gather, Redistribute};
    int64_t id;
    muon_status_t st = muon_register_param_custom(opt, &p, &g, &po, &layout, &id);
    for (int s = 0; s < steps && st == MUON_OK; ++s) {
      for (size_t i = 0; i < grad.size(); ++i) {
        grad[i] = GradValue("custom", FirstRow(rank) * kCols + static_cast<int64_t>(i), s);
      }
      st = muon_step(opt, nullptr);
      if (st != MUON_OK) {
        out.failed_step[rank] = s;
        out.errors[rank] = muon_last_error_message();
        if (host.fail_call >= 0) {  // the same step again, with the same gradient
          st = muon_step(opt, nullptr);
          out.again[rank] = st == MUON_OK ? "" : muon_last_error_message();
        }
      }
    }
    out.calls[rank] = counter.calls;
    if (st != MUON_OK && out.errors[rank].empty()) out.errors[rank] = muon_last_error_message();
    if (host.after_steps) host.after_steps(state, opt, id);
    muon_stats_init(&out.stats[rank], sizeof out.stats[rank]);
    muon_get_stats(opt, &out.stats[rank]);
    muon_destroy(opt);
    host.barrier_comms[rank].release(host.barrier_comms[rank].ctx);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  return out;
}

TEST(CustomPath, MatchesSingleProcess) {
  Host host;
  auto out = RunRanks(host, 20);
  RunConfig cfg;
  cfg.steps = 20;
  auto ref = RunReference({{"custom", {kRows, kCols}, MUON_MATRIX_VIEW_2D, {}, nullptr}}, cfg);
  ASSERT_EQ(ref.size(), 1u);
  int64_t orthogonalized = 0;
  for (int r = 0; r < host.ranks; ++r) {
    ASSERT_TRUE(out.errors[r].empty()) << "rank " << r << ": " << out.errors[r];
    orthogonalized += out.stats[r].matrices_orthogonalized;
    EXPECT_EQ(out.stats[r].matrices_owned, r == host.owner_choice ? 1 : 0);
    for (size_t i = 0; i < out.pieces[r].size(); ++i) {
      const float want = ref[0][FirstRow(r) * kCols + i];
      ASSERT_EQ(0, std::memcmp(&want, &out.pieces[r][i], sizeof want)) << "rank " << r << " i " << i;
    }
  }
  EXPECT_EQ(orthogonalized, 1);
}

TEST(CustomPath, OwnersMustAgree) {
  Host host;
  host.disagree = true;
  auto out = RunRanks(host, 1);
  for (int r = 0; r < host.ranks; ++r) {
    EXPECT_NE(out.errors[r].find("param 'custom': assign_fn chose rank"), std::string::npos)
        << out.errors[r];
  }
}

TEST(CustomPath, FailingAssignmentIsReportedOnEveryRank) {
  Host host;
  host.refuse = true;
  auto out = RunRanks(host, 1);
  for (int r = 0; r < host.ranks; ++r) {
    EXPECT_NE(out.errors[r].find("param 'custom': assign_fn returned -1"), std::string::npos)
        << out.errors[r];
    EXPECT_NE(out.errors[r].find("no owner known for this matrix"), std::string::npos)
        << out.errors[r];
  }
}

TEST(CustomPath, WrongShapeFromGatherIsRefusedOnEveryRank) {
  Host host;  // 4 ranks: the owner's check fails, the others go on and agree
  host.owner_choice = 0;
  host.wrong_rows = 9;
  auto out = RunRanks(host, 1);
  for (int r = 0; r < host.ranks; ++r) {
    EXPECT_NE(out.errors[r].find("rank 0: INVALID_ARGUMENT: param 'custom': gather_fn returned "
                                 "a 9 x 6 matrix"),
              std::string::npos)
        << "rank " << r << ": " << out.errors[r];
    EXPECT_NE(out.errors[r].find("registered as 10 x 6"), std::string::npos) << out.errors[r];
  }
}

// Every collective of the first step's setup (the world's membership, the
// handshake's four, the agreement on its outcome) failed on one rank or on every rank: every rank
// fails that step alike, naming the failure. A setup that failed changed
// nothing: the same step tried again sets up and succeeds, and the run ends
// bit for bit as an uninterrupted one. The agreement's all_gather failing
// after the verdicts left: the failing ranks keep the setup and refuse in the
// step, every rank fails it, and every rank refuses the step tried again.
TEST(CustomPath, AFaultAtEverySetupCollectiveFailsEveryRankAlike) {
  Host counting;
  counting.fail_call = 1 << 30;  // counted, never failed
  const Outcome clean = RunRanks(counting, 2);
  const Outcome one = [] {
    Host h;
    h.fail_call = 1 << 30;
    return RunRanks(h, 1);
  }();
  const int setup_calls = one.calls[1] - (clean.calls[1] - one.calls[1]);
  // The world's membership, the handshake's four, the agreement.
  ASSERT_EQ(setup_calls, 6);
  int injected = 0;
  for (int fail_rank : {-1, 1}) {
    for (int k = 0; k < setup_calls; ++k) {
      SCOPED_TRACE("collective " + std::to_string(k) + " on " +
                   (fail_rank < 0 ? std::string("every rank") : "rank 1"));
      Host host;
      host.fail_call = k;
      host.fail_rank = fail_rank;
      const Outcome out = RunRanks(host, 2);
      ++injected;
      const bool agreement = k == setup_calls - 1;
      for (int r = 0; r < host.ranks; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        const std::string& e = out.errors[r];
        EXPECT_EQ(out.failed_step[r], 0) << e;
        EXPECT_NE(e.find("injected link failure"), std::string::npos) << e;
        EXPECT_NE(e.find(fail_rank < 0 ? "rank 0:" : "rank 1:"), std::string::npos) << e;
        if (agreement) {
          EXPECT_NE(out.again[r].find("refused"), std::string::npos) << out.again[r];
          continue;
        }
        EXPECT_EQ(out.again[r], "");
        EXPECT_EQ(out.pieces[r], clean.pieces[r]);
      }
    }
  }
  std::printf("custom path setup: %d faults injected and survived\n", injected);
}

TEST(CustomPath, ACallbackFailingOnOneRankFailsTheStepOnEveryRank) {
  for (bool in_gather : {true, false}) {
    Host host;
    (in_gather ? host.fail_gather_on : host.fail_redistribute_on) = 2;
    auto out = RunRanks(host, 2);  // the failing step is the first: no second one
    for (int r = 0; r < host.ranks; ++r) {
      const std::string& e = out.errors[r];
      EXPECT_NE(e.find("failed on 1 of 4 ranks (rank 2: "), std::string::npos) << e;
      EXPECT_NE(e.find(in_gather ? "gather_fn failed: the host lost its gather buffer"
                                 : "redistribute_fn failed: the host's link went down"),
                std::string::npos)
          << e;
      EXPECT_EQ(out.stats[r].steps, 0) << "rank " << r;
    }
  }
}

// A rank's momentum of the custom matrix (its NumRows x kCols piece), or
// with `set` that momentum overwritten by `values`.
std::vector<float> Momentum(muon_optimizer_t* opt, int64_t id, int rank,
                            const std::vector<float>* set = nullptr) {
  std::vector<float> m = set ? *set : std::vector<float>(NumRows(rank) * kCols);
  int64_t shape[2] = {NumRows(rank), kCols};
  DLTensor t{};
  t.data = m.data();
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  const muon_status_t st = set ? muon_set_state(opt, id, &t) : muon_get_state(opt, id, &t);
  EXPECT_EQ(st, MUON_OK) << muon_last_error_message();
  return m;
}

// What one rank's state calls returned after its steps.
struct StateCalls {
  muon_status_t from_rank1 = MUON_OK, from_all = MUON_OK, own = MUON_INTERNAL;
  std::string from_rank1_error, from_all_error, own_error;
  bool unchanged = false, restored = false;
};

TEST(CustomPath, StateLoadsFromThisRanksOwnBlobOnly) {
  // A blob holds a custom matrix's piece without global coordinates. Ranks
  // 0, 1 and 2 hold pieces of one shape (2 x 6): given rank 1's blob alone,
  // muon_load_states took its piece as theirs. It refuses while a custom-path
  // parameter is registered, changing nothing; muon_load_state with the
  // rank's own blob restores it.
  Host host;
  std::vector<std::vector<unsigned char>> blobs(host.ranks);
  std::vector<StateCalls> calls(host.ranks);
  host.after_steps = [&](RankState& state, muon_optimizer_t* opt, int64_t id) {
    const int rank = state.rank;
    StateCalls& c = calls[rank];
    size_t size = 0;
    EXPECT_EQ(muon_save_state(opt, nullptr, 0, &size), MUON_OK);
    blobs[rank].resize(size);
    EXPECT_EQ(muon_save_state(opt, blobs[rank].data(), size, &size), MUON_OK);
    Barrier(&state);  // every rank's blob is saved
    const std::vector<float> before = Momentum(opt, id, rank);

    const void* one[1] = {blobs[1].data()};
    const size_t one_size[1] = {blobs[1].size()};
    c.from_rank1 = muon_load_states(opt, one, one_size, 1);
    c.from_rank1_error = muon_last_error_message();
    std::vector<const void*> all;
    std::vector<size_t> sizes;
    for (const auto& b : blobs) {
      all.push_back(b.data());
      sizes.push_back(b.size());
    }
    c.from_all = muon_load_states(opt, all.data(), sizes.data(), all.size());
    c.from_all_error = muon_last_error_message();
    c.unchanged = Momentum(opt, id, rank) == before;

    // Zeroed first, so that the load is seen.
    const std::vector<float> zero(before.size(), 0.0f);
    Momentum(opt, id, rank, &zero);
    c.own = muon_load_state(opt, blobs[rank].data(), blobs[rank].size());
    c.own_error = muon_last_error_message();
    c.restored = Momentum(opt, id, rank) == before;
  };
  auto out = RunRanks(host, 3);
  for (int r = 0; r < host.ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(out.errors[r].empty()) << out.errors[r];
    const StateCalls& c = calls[r];
    EXPECT_EQ(c.from_rank1, MUON_FAILED_PRECONDITION) << muon_status_string(c.from_rank1);
    EXPECT_EQ(c.from_all, MUON_FAILED_PRECONDITION) << muon_status_string(c.from_all);
    for (const std::string& e : {c.from_rank1_error, c.from_all_error}) {
      EXPECT_NE(e.find("param 'custom' is on the custom path"), std::string::npos) << e;
      EXPECT_NE(e.find("restore this rank's own blob with muon_load_state, or each parameter "
                       "with muon_set_state"),
                std::string::npos)
          << e;
    }
    EXPECT_TRUE(c.unchanged) << "a refused muon_load_states changed the momentum";
    EXPECT_EQ(c.own, MUON_OK) << c.own_error;
    EXPECT_TRUE(c.restored) << "muon_load_state did not restore the rank's own momentum";
  }
}

}  // namespace
}  // namespace muon_test
