// The compact handshake (handshake.h) against the whole-message one it
// replaced: on small TP x PP x FSDP, EP x PP x FSDP, flat-range, custom-owner
// and ZeRO-2 jobs, and on spoiled ones, every rank's descriptions put back
// together from the parts equal what SerializeRankDesc / ParseRankDesc
// carried, and the plans (owners, rounds, digest, round tables) and errors
// are the same. The routing is checked without communication: what each rank
// sends each rank is what that rank expects from it, and every part a rank
// needs reaches it once.
#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "muon/common/dtype.h"
#include "muon/common/status.h"
#include "muon/sharding/exchange.h"
#include "muon/sharding/handshake.h"
#include "muon/sharding/testing/job.h"

namespace muon {
namespace {

using testjob::Flat;
using testjob::Replicate;
using testjob::Shard;

// inner (TP or EP) x stages x FSDP, inner fastest.
struct Mesh {
  int inner = 1, stages = 1, fsdp = 1;
  int world() const { return inner * stages * fsdp; }
  int Rank(int i, int s, int f) const { return (s * fsdp + f) * inner + i; }
  int In(int r) const { return r % inner; }
  int Fsdp(int r) const { return (r / inner) % fsdp; }
  int Stage(int r) const { return r / (inner * fsdp); }
};

RankParamDesc Param(const std::string& name, std::vector<int64_t> shape,
                    std::vector<Placement> placements) {
  return testjob::DescribeParam({name, std::move(shape), std::move(placements)});
}

// Groups: 0 the rank's TP (EP) group, 1 its FSDP group.
RankDesc MeshRank(const Mesh& m, int r, bool experts) {
  RankDesc d;
  d.world_rank = r;
  std::vector<int> inner, fsdp;
  for (int i = 0; i < m.inner; ++i) inner.push_back(m.Rank(i, m.Stage(r), m.Fsdp(r)));
  for (int f = 0; f < m.fsdp; ++f) fsdp.push_back(m.Rank(m.In(r), m.Stage(r), f));
  d.groups = {inner, fsdp};
  const std::string s = absl::StrCat("stage", m.Stage(r), ".");
  const Placement chunk = Shard(1, 0, ShardSplit::kChunk);
  if (!experts) {
    d.params.push_back(Param(s + "qkv", {8, 6}, {Shard(0, 0), chunk}));
    d.params.push_back(Param(s + "out", {6, 8}, {Shard(0, 1), chunk}));
    d.params.push_back(Param(s + "emb", {5, 3}, {Replicate(0), chunk}));
  } else {
    d.params.push_back(Param(s + "dense", {6, 4}, {Replicate(0), chunk}));
    for (int e = 0; e < 2 * m.inner; ++e) {
      if (e / 2 != m.In(r)) continue;
      d.params.push_back(Param(absl::StrCat(s, "expert", e), {4, 6}, {chunk}));
    }
  }
  return d;
}

std::vector<RankDesc> MeshJob(const Mesh& m, bool experts) {
  std::vector<RankDesc> job;
  for (int r = 0; r < m.world(); ++r) job.push_back(MeshRank(m, r, experts));
  return job;
}

// Group 0 the world, group 1 the ranks of the same parity (reverse order).
std::vector<RankDesc> WorldJob(int n, const std::function<void(int, RankDesc*)>& fill) {
  std::vector<RankDesc> job;
  for (int r = 0; r < n; ++r) {
    std::vector<int> parity;
    for (int q = n - 1; q >= 0; --q) {
      if (q % 2 == r % 2) parity.push_back(q);
    }
    RankDesc d = testjob::DescribeRank(r, n, {parity}, {});
    fill(r, &d);
    job.push_back(std::move(d));
  }
  return job;
}

// Flat ranges of a 6 x 5 matrix over the world (uneven, one empty) and a
// 4 x 4 one over each parity group.
void FlatParams(int r, int n, RankDesc* d) {
  const int64_t step = (30 + n - 2) / (n - 1);  // the last rank's range is empty
  const int64_t start = std::min<int64_t>(30, r * step);
  d->params.push_back(Param("flat", {6, 5}, {Flat(0, start, std::min<int64_t>(30, start + step) - start)}));
  const int64_t members = (n - r % 2 + 1) / 2;
  const int64_t at = (n - 1 - r) / 2;  // position in the reversed parity group
  const int64_t len = 16 / members, lo = at * len;
  const int64_t hi = at == members - 1 ? 16 : lo + len;
  d->params.push_back(Param(absl::StrCat("parity", r % 2), {4, 4}, {Flat(1, lo, hi - lo)}));
  d->params.push_back(Param("rows", {7, 3}, {Shard(0, 0, ShardSplit::kChunk)}));
}

// What the old handshake gave: every message whole, checked in rank order.
absl::StatusOr<Plan> WholeMessages(const std::vector<RankDesc>& job,
                                   const std::vector<std::string>& fingerprints, int me,
                                   const PlanOptions& options) {
  std::vector<RankDesc> ranks;
  for (size_t r = 0; r < job.size(); ++r) {
    if (fingerprints[r] != fingerprints[me]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "setup: rank ", r, " runs with different optimizer options (", fingerprints[r],
          ") than rank ", me, " (", fingerprints[me], "); every rank must use the same options"));
    }
    auto d = ParseRankDesc(SerializeRankDesc(job[r]), absl::StrCat("rank ", r));
    if (!d.ok()) return d.status();
    ranks.push_back(*std::move(d));
  }
  return BuildPlan(ranks, me, options);
}

// The compact handshake's data path for rank `me`: the parts, the directory,
// the routing (checked), Assemble, BuildPlan. *received: the bytes `me`
// receives (headers, own parts, the parts sent to it).
absl::StatusOr<Plan> Compact(const std::vector<RankDesc>& job,
                             const std::vector<std::string>& fingerprints, int me,
                             const PlanOptions& options, int64_t* received = nullptr) {
  const int n = static_cast<int>(job.size());
  std::vector<HandshakeParts> parts;
  std::vector<HandshakeHeader> headers;
  std::vector<std::string> owns;
  for (int r = 0; r < n; ++r) {
    parts.push_back(SplitHandshake(fingerprints[r], job[r]));
    headers.push_back(parts.back().header);
    owns.push_back(parts.back().own);
  }
  const HandshakeDirectory dir(headers, owns);
  // Every rank's bytes of every part it holds.
  std::vector<std::vector<std::string>> held(n, std::vector<std::string>(dir.parts()));
  for (int r = 0; r < n; ++r) {
    for (const auto& [part, local] : dir.Held(r)) {
      held[r][part] = local == 0 ? parts[r].shared : parts[r].groups[local - 1];
      EXPECT_EQ(KeyOf(held[r][part]), dir.key(part));
    }
  }
  // What each sender sends each receiver is what the receiver expects from it.
  for (int s = 0; s < n; ++s) {
    const std::vector<std::vector<size_t>> sent = dir.Sent(s);
    for (int j = 0; j < n; ++j) {
      std::vector<size_t> expected;
      for (size_t part = 0; part < dir.parts(); ++part) {
        if (dir.Sender(part, j) == s) expected.push_back(part);
      }
      EXPECT_EQ(sent[j], expected) << "sender " << s << ", receiver " << j;
    }
  }
  std::vector<std::string> bytes = held[me];
  int64_t got = static_cast<int64_t>(sizeof(HandshakeHeader)) * n;
  for (const std::string& o : owns) got += static_cast<int64_t>(o.size());
  for (size_t part = 0; part < dir.parts(); ++part) {
    const int s = dir.Sender(part, me);
    if (s < 0) continue;
    EXPECT_FALSE(held[s][part].empty() && dir.key(part).size > 0) << "part " << part;
    // What s sends: its shared part compressed, a member list as it is.
    const std::string& wire = dir.Compressed(part, s) ? parts[s].shared_wire : held[s][part];
    EXPECT_EQ(wire.size(), dir.WireSize(part, s)) << "part " << part;
    if (dir.Compressed(part, s)) {
      EXPECT_TRUE(ExpandPart(wire, dir.key(part), &bytes[part])) << "part " << part;
      EXPECT_EQ(bytes[part], held[s][part]) << "part " << part;
    } else {
      bytes[part] = wire;
    }
    got += static_cast<int64_t>(wire.size());
  }
  if (received != nullptr) *received = got;
  // Assemble and AssembleShared give the same descriptions or the same
  // error; the plan is built, as AgreePlan does, from the shared form (and
  // compared by the callers with BuildPlan over the whole messages).
  const absl::StatusOr<std::vector<RankDesc>> whole = dir.Assemble(bytes, fingerprints[me], me);
  absl::StatusOr<std::vector<SharedRankDesc>> shared =
      dir.AssembleShared(bytes, fingerprints[me], me);
  EXPECT_EQ(shared.status(), whole.status());
  if (!shared.ok()) return shared.status();
  if (!whole.ok()) return whole.status();
  std::set<const std::vector<RankParamDesc>*> tables;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(SerializeRankDesc((*whole)[r]), SerializeRankDesc(job[r])) << "rank " << r;
    const SharedRankDesc& d = (*shared)[r];
    RankDesc expanded;
    expanded.world_rank = d.world_rank;
    expanded.groups = d.groups;
    expanded.params = *d.params;
    EXPECT_EQ(SerializeRankDesc(expanded), SerializeRankDesc(job[r])) << "rank " << r;
    tables.insert(d.params.get());
  }
  // One parsed table per distinct shared part, unless FlatRange ranges make
  // a rank's own copy.
  bool ranges = false;
  for (const RankDesc& d : job) {
    for (const RankParamDesc& p : d.params) {
      for (const Placement& pl : p.layout.placements) {
        ranges = ranges || pl.kind == PlacementKind::kFlatRange;
      }
    }
  }
  if (!ranges) {
    std::set<HandshakeKey> distinct;
    for (const HandshakeHeader& h : headers) distinct.insert(h.shared);
    EXPECT_EQ(tables.size(), distinct.size());
  }
  return BuildPlan(*shared, me, options);
}

std::string Describe(const Plan& p, int me, int world) {
  std::string s = absl::StrCat("digest ", p.digest, " rounds ", p.rounds, " zero2 ",
                               p.zero2_matrices, "\n");
  for (const PlanParam& pp : p.params) {
    absl::StrAppend(&s, pp.name, " local ", pp.local, " holder ", pp.local_holder, " holders");
    for (const Holder& h : pp.holders) absl::StrAppend(&s, " ", h.rank, ":", h.canonical);
    absl::StrAppend(&s, "\n");
  }
  for (const Unit& u : p.units) {
    absl::StrAppend(&s, "unit ", u.param, "/", u.index, " owner ", u.owner, " round ", u.round,
                    "\n");
  }
  for (const CustomUnit& c : p.custom) absl::StrAppend(&s, c.name, " -> ", c.owner, "\n");
  for (const RoundTable& t : BuildRoundTables(p, me, world, DType::kBF16)) {
    absl::StrAppend(&s, "round ", t.label, " slots ", t.slot_floats, " owned ", t.owned, "\n");
    for (int peer = 0; peer < world; ++peer) {
      for (const LocalSpan& l : t.gather_send[peer]) {
        absl::StrAppend(&s, " gs", peer, ":", l.param, ",", l.pos, ",", l.length);
      }
      for (const SlotSpan& l : t.gather_recv[peer]) {
        absl::StrAppend(&s, " gr", peer, ":", l.pos, ",", l.length);
      }
      for (const SlotSpan& l : t.scatter_send[peer]) {
        absl::StrAppend(&s, " ss", peer, ":", l.pos, ",", l.length);
      }
      for (const LocalSpan& l : t.scatter_recv[peer]) {
        absl::StrAppend(&s, " sr", peer, ":", l.param, ",", l.pos, ",", l.length);
      }
    }
    absl::StrAppend(&s, "\n");
  }
  return s;
}

// Every rank: the same plan or the same error both ways. Returns rank 0's
// outcome (for the callers' own checks).
absl::Status ExpectSame(const std::vector<RankDesc>& job,
                        std::vector<std::string> fingerprints = {},
                        const PlanOptions& options = PlanOptions()) {
  const int n = static_cast<int>(job.size());
  if (fingerprints.empty()) fingerprints.assign(n, "same options");
  absl::Status first;
  for (int me = 0; me < n; ++me) {
    const absl::StatusOr<Plan> whole = WholeMessages(job, fingerprints, me, options);
    const absl::StatusOr<Plan> compact = Compact(job, fingerprints, me, options);
    EXPECT_EQ(compact.status(), whole.status()) << "rank " << me;
    if (whole.ok() && compact.ok()) {
      EXPECT_EQ(Describe(*compact, me, n), Describe(*whole, me, n)) << "rank " << me;
    }
    if (me == 0) first = whole.status();
  }
  return first;
}

TEST(CompactHandshake, TensorPipelineFsdpMeshes) {
  for (const Mesh m : {Mesh{2, 2, 2}, Mesh{2, 3, 1}, Mesh{1, 2, 3}, Mesh{4, 1, 2}}) {
    SCOPED_TRACE(absl::StrCat(m.inner, " x ", m.stages, " x ", m.fsdp));
    EXPECT_TRUE(ExpectSame(MeshJob(m, false)).ok());
    PlanOptions rr;
    rr.assignment = Assignment::kRoundRobin;
    rr.round_bytes = 64;
    EXPECT_TRUE(ExpectSame(MeshJob(m, false), {}, rr).ok());
  }
}

TEST(CompactHandshake, ExpertPipelineFsdpMeshes) {
  for (const Mesh m : {Mesh{2, 2, 2}, Mesh{4, 2, 1}, Mesh{2, 1, 3}}) {
    SCOPED_TRACE(absl::StrCat(m.inner, " x ", m.stages, " x ", m.fsdp));
    EXPECT_TRUE(ExpectSame(MeshJob(m, true)).ok());
  }
}

TEST(CompactHandshake, FlatRangesCustomOwnersAndZeroTwo) {
  for (int n : {2, 3, 4, 5}) {
    SCOPED_TRACE(n);
    const auto job = WorldJob(n, [n](int r, RankDesc* d) {
      FlatParams(r, n, d);
      RankParamDesc custom = Param("custom", {3, 4}, {Replicate(0)});
      custom.custom_owner = n - 1;
      d->params.push_back(custom);
      RankParamDesc zero2 = Param(absl::StrCat("zero2.", r % 2), {4, 2}, {Replicate(1)});
      zero2.zero2 = 1;
      d->params.push_back(zero2);
    });
    EXPECT_TRUE(ExpectSame(job).ok()) << ExpectSame(job);
  }
}

TEST(CompactHandshake, InconsistentJobsGiveTheSameErrors) {
  const Mesh m{2, 2, 2};
  struct Case {
    std::string what, expect;
    std::function<void(std::vector<RankDesc>*, std::vector<std::string>*)> spoil;
  };
  const std::vector<Case> cases = {
      {"a shape", "global shape",
       [](auto* job, auto*) { (*job)[5].params[0].global_shape = {8, 7}; }},
      {"a dtype", "different dtypes", [](auto* job, auto*) { (*job)[2].params[1].state_dtype = 1; }},
      {"a group's members", "has no group with these members",
       [](auto* job, auto*) { (*job)[3].groups[1] = {3, 7, 1}; }},
      {"a member outside", "outside the world",
       [](auto* job, auto*) { (*job)[6].groups[0] = {6, 9}; }},
      {"options", "different optimizer options",
       [](auto*, auto* fps) { (*fps)[4] = "other options"; }},
      {"a tiling", "param 'stage0.qkv'",
       [](auto* job, auto*) { (*job)[1].params[0].layout.placements[0] = Shard(0, 1); }},
      {"a missing parameter", "param 'stage1.out'",
       [](auto* job, auto*) { (*job)[7].params.erase((*job)[7].params.begin() + 1); }},
      {"a custom owner", "assign_fn chose rank", [](auto* job, auto*) {
         for (auto& d : *job) d.params[2].custom_owner = d.world_rank == 5 ? 4 : 5;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<RankDesc> job = MeshJob(m, false);
    std::vector<std::string> fps(job.size(), "same options");
    c.spoil(&job, &fps);
    const absl::Status st = ExpectSame(job, fps);
    EXPECT_NE(std::string(st.message()).find(c.expect), std::string::npos) << st;
  }
}

TEST(CompactHandshake, InconsistentFlatRangesAndZeroTwoGiveTheSameErrors) {
  const int n = 4;
  // Rank 2's world range overlaps rank 1's.
  auto job = WorldJob(n, [](int r, RankDesc* d) { FlatParams(r, n, d); });
  job[2].params[0].layout.placements[0].start -= 2;
  absl::Status st = ExpectSame(job);
  EXPECT_NE(std::string(st.message()).find("param 'flat'"), std::string::npos) << st;
  // Rank 3 registers a ZeRO-2 parameter its parity group's rank 1 does not.
  job = WorldJob(n, [](int r, RankDesc* d) {
    FlatParams(r, n, d);
    RankParamDesc zero2 = Param("zero2", {4, 2}, {Replicate(1)});
    zero2.zero2 = r == 3 ? 1 : 0;
    if (r % 2 == 1) d->params.push_back(zero2);
  });
  st = ExpectSame(job);
  EXPECT_NE(std::string(st.message()).find("replicated modes"), std::string::npos) << st;
}

// ZeRO-2 and custom-owner parameters in tables shared by many ranks (BuildPlan
// checks and looks up a shared table's names once): the same plans, and the
// same first error where a rank's FSDP peer lacks a ZeRO-2 parameter or a
// custom owner is not a holder.
TEST(CompactHandshake, SharedTablesWithZeroTwoAndCustomOwners) {
  const Mesh m{2, 2, 3};
  const auto job = [&](bool drop_zero2, bool bad_owner) {
    std::vector<RankDesc> j = MeshJob(m, false);
    for (RankDesc& d : j) {
      const int r = d.world_rank;
      const std::string s = absl::StrCat("stage", m.Stage(r), ".");
      RankParamDesc zero2 = Param(s + "norm", {4, 2}, {Replicate(1)});
      zero2.zero2 = 1;
      if (!(drop_zero2 && m.Stage(r) == 1 && m.Fsdp(r) == 2)) d.params.push_back(zero2);
      RankParamDesc custom = Param(s + "gate", {3, 4}, {Replicate(0)});
      custom.custom_owner = m.Rank(1, m.Stage(r), bad_owner ? 0 : 1);
      if (m.Fsdp(r) != 0 || !bad_owner) d.params.push_back(custom);
    }
    return j;
  };
  EXPECT_TRUE(ExpectSame(job(false, false)).ok()) << ExpectSame(job(false, false));
  absl::Status st = ExpectSame(job(true, false));
  EXPECT_NE(std::string(st.message()).find("did not register it that way"), std::string::npos)
      << st;
  st = ExpectSame(job(false, true));
  EXPECT_NE(std::string(st.message()).find("which did not register it"), std::string::npos) << st;
}

// A compressed part expands only to the part its key names.
TEST(CompactHandshake, CompressedPartsExpandOnlyToTheirKey) {
  const Mesh m{2, 4, 8};
  const auto job = MeshJob(m, false);
  const HandshakeParts p = SplitHandshake("same options", job[0]);
  std::string out;
  ASSERT_TRUE(ExpandPart(p.shared_wire, p.header.shared, &out));
  EXPECT_EQ(out, p.shared);
  EXPECT_TRUE(ExpandPart(CompressPart(""), KeyOf(""), &out));
  EXPECT_EQ(out, "");
  // Truncated, one byte changed, or checked against another part's key.
  EXPECT_FALSE(ExpandPart(p.shared_wire.substr(0, p.shared_wire.size() / 2), p.header.shared, &out));
  std::string spoiled = p.shared_wire;
  spoiled[spoiled.size() / 2] ^= 0x10;
  EXPECT_FALSE(ExpandPart(spoiled, p.header.shared, &out));
  const HandshakeParts other = SplitHandshake("same options", job[m.Rank(0, 1, 0)]);
  ASSERT_NE(other.shared, p.shared);
  EXPECT_FALSE(ExpandPart(other.shared_wire, p.header.shared, &out));
  HandshakeKey longer = p.header.shared;
  longer.size += 1;
  EXPECT_FALSE(ExpandPart(p.shared_wire, longer, &out));
  EXPECT_FALSE(ExpandPart("not zlib", p.header.shared, &out));
}

TEST(CompactHandshake, SharedPartsCrossOncePerReceiver) {
  // 4 stages of 2 x 8: rank 0 receives the other 3 stages' tables once each
  // and the member lists it does not hold, not 63 whole messages.
  const Mesh m{2, 4, 8};
  const auto job = MeshJob(m, false);
  const std::vector<std::string> fps(job.size(), "same options");
  int64_t received = 0;
  ASSERT_TRUE(Compact(job, fps, 0, PlanOptions(), &received).ok());
  // The other 3 stages' tables, compressed (each stage's ranks send the same).
  int64_t tables = 0;
  for (int stage = 1; stage < 4; ++stage) {
    const HandshakeParts p = SplitHandshake(fps[0], job[m.Rank(0, stage, 0)]);
    EXPECT_LT(p.shared_wire.size(), p.shared.size());
    tables += static_cast<int64_t>(p.shared_wire.size());
  }
  const int64_t own = static_cast<int64_t>(SplitHandshake(fps[0], job[0]).own.size());
  // Distinct member lists: 32 TP pairs and 8 FSDP groups of 8, less rank 0's 2.
  const int64_t lists = 31 * (4 + 2 * 4) + 7 * (4 + 8 * 4);
  EXPECT_EQ(received, 64 * (static_cast<int64_t>(sizeof(HandshakeHeader)) + own) + tables + lists);
  int64_t whole = 0;
  for (const RankDesc& d : job) {
    whole = std::max<int64_t>(whole, SerializeRankDesc(d).size() + 4 + fps[0].size());
  }
  EXPECT_LT(received, 64 * whole / 2);
}

}  // namespace
}  // namespace muon
