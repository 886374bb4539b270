// Setup benchmark: what one rank spends on the distributed engine's first
// step at frontier scale (issue 14), as the code does it today.
//
// For each model x layout x rank count it makes every rank's description
// (muon::RankDesc, what a rank registered: a stage's parameters only on that
// stage's ranks, an expert only on its EP rank) and splits each into the
// handshake's parts (muon::SplitHandshake: the shared parameter table, the
// member lists, the own part). Then, for one rank (rank 0), it times what
// AgreePlan does with what it receives (the headers, every rank's own part,
// the directory, its send buffer of the parts it serves, the parts it
// receives, HandshakeDirectory::AssembleShared), muon::BuildPlan (balanced
// assignment) and muon::BuildRoundTables, and prints:
//
//   handshake MiB   bytes this rank receives in the handshake's collectives:
//                   group members (4 B per member of each group), the
//                   40-byte headers of every rank, every rank's own part,
//                   the shared parts (compressed) and member lists it does not hold, the
//                   verdicts (16 B per rank); beside it, what the handshake
//                   that gathered every message whole received (message
//                   sizes, 8 B per rank, and every message padded to the
//                   longest instead of the headers and parts), and what
//                   rank 0 sends (its own part to every rank and the parts
//                   it serves)
//   setup s         assemble + BuildPlan + BuildRoundTables, wall clock
//   setup MiB       the peak of live heap bytes during those steps, above
//                   what was live before, the received buffer included:
//                   this binary replaces operator new / delete and counts
//                   malloc_usable_size of every block (allocations through
//                   operator new only; the library's containers all are)
//   runs            global runs in all the plan's pieces (every rank's piece
//                   of every matrix is computed by every rank)
//   NS max÷mean     Newton-Schulz work of the busiest rank over the mean of
//                   all ranks, from the plan's owners; and within a stage
//                   (its busiest rank over its ranks' mean, the worst stage)
//   matrices/rank   Muon matrices per rank (all stages together; a stage
//                   has about 1/16 of both)
//   moved÷bound     bytes a rank moves per step (from its round tables) over
//                   the least any plan with the same owners moves (from the
//                   layout alone, computed here without the library), the
//                   largest of ranks 0, world/2 and world-1
//
// Each configuration runs in a child process; one whose setup runs past
// --limit seconds (60) is stopped and printed as "> 60 s (stopped)", and the
// larger rank counts of that model and layout are not run. Figures are
// printed, never checked against times: this is a benchmark, not a test.
//
//   bazel run -c opt //bench:setup_bench -- [--model=NAME] [--ranks=1024,4096]
//       [--limit=SECONDS] [--models=DIR] [--row-by-row] [--per-stage]
//       [--assignment=spread|split]
//
// --per-stage also prints, for each pipeline stage, its matrices per rank,
// its NS max÷mean and its largest matrix's NS work over the stage's mean per
// rank (no assignment can bring max÷mean below that).
//
// --row-by-row computes the plan's pieces as before boxes
// (PlanOptions::pieces_row_by_row): the same plan, the old cost.
//
// --assignment=spread plans with MUON_ASSIGNMENT_SPREAD (owners may hold
// none of their matrix) and also prints, beside the balanced plan's, the NS
// max÷mean (all; worst stage) and the bytes the whole job moves per step
// (each unit's pieces to its owner and results back, from the layout).
// --assignment=split (MUON_ASSIGNMENT_SPLIT) prints the same, the number of
// matrices split over ranks and the bytes their sums move per step
// (2 (g - 1) / g m^2 fp32 values per member and iteration), on top.
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "bench/model_file.h"
#include "bench/traffic.h"
#include "muon/common/dtype.h"
#include "muon/sharding/exchange.h"
#include "muon/sharding/handshake.h"
#include "muon/sharding/layout.h"
#include "muon/sharding/plan.h"
#include "muon/sharding/testing/job.h"

// ---------------------------------------------------------------------------
// Live heap bytes through operator new, and their peak.

namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void* Counted(void* p) {
  if (p == nullptr) return nullptr;
  const int64_t now =
      g_live.fetch_add(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed) +
      static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return p;
}

void Uncounted(void* p) {
  if (p == nullptr) return;
  g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}

void* Allocate(size_t n) {
  void* p = Counted(std::malloc(n == 0 ? 1 : n));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* AllocateAligned(size_t n, std::align_val_t a) {
  const size_t align = static_cast<size_t>(a);
  const size_t size = (n + align - 1) / align * align;
  void* p = Counted(std::aligned_alloc(align, size == 0 ? align : size));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(size_t n) { return Allocate(n); }
void* operator new[](size_t n) { return Allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return Counted(std::malloc(n == 0 ? 1 : n));
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return Counted(std::malloc(n == 0 ? 1 : n));
}
void* operator new(size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return AllocateAligned(n, a); }
void operator delete(void* p) noexcept { Uncounted(p); }
void operator delete[](void* p) noexcept { Uncounted(p); }
void operator delete(void* p, size_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t) noexcept { Uncounted(p); }
void operator delete(void* p, std::align_val_t) noexcept { Uncounted(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Uncounted(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { Uncounted(p); }

namespace {

using bench::ChunkRows;
using bench::kNsBytes;
using bench::kStateBytes;
using bench::LoadModel;
using bench::Overlap;
using bench::PeerBytes;
using bench::Rect;
using bench::Matrix;
using bench::Model;
using bench::TpKind;

// ---------------------------------------------------------------------------
// Layouts with pipeline stages, on `world` ranks, coordinates innermost
// first: rank r is at (r % inner, (r / inner) % stages, r / (inner * stages)).
//
//   TP t x PP p x FSDP f   groups: 0 = TP (the inner ranks of one stage and
//                          FSDP index), 1 = FSDP (the ranks of one stage and
//                          TP index). A matrix lives on its layer's stage:
//                          Shard(TP, dim 0 or 1, even), or Replicate(TP) for
//                          a router, then Shard(FSDP, dim 0, chunk).
//   EP e x PP p x FSDP f   groups: 0 = EP, 1 = FSDP. A dense matrix:
//                          Replicate(EP), then Shard(FSDP, dim 0, chunk); a
//                          routed expert only on its EP rank (experts split
//                          into e contiguous blocks), Shard(FSDP, dim 0, chunk).
//
// Layer l is on stage l * p / layers (contiguous, within one layer of even);
// a whole-model matrix on stage 0. Only the ranks of a stage register its
// matrices: that is how a pipeline stage is expressed to the library (every
// rank describes what it registered; the plan's holders of a matrix are the
// ranks that registered it, and only their pieces must tile it).

enum class Scheme { kTpPpFsdp, kEpPpFsdp };

struct Mesh {
  Scheme scheme = Scheme::kTpPpFsdp;
  int world = 1;
  int inner = 1;   // TP or EP
  int stages = 1;  // PP
  int fsdp() const { return world / (inner * stages); }
  int In(int r) const { return r % inner; }
  int Stage(int r) const { return (r / inner) % stages; }
  int Fsdp(int r) const { return r / (inner * stages); }
  int Rank(int in, int stage, int f) const { return (f * stages + stage) * inner + in; }
  std::string Name() const {
    return std::string(scheme == Scheme::kTpPpFsdp ? "TP " : "EP ") + std::to_string(inner) +
           " x PP " + std::to_string(stages) + " x FSDP " + std::to_string(fsdp());
  }
};

int StageOf(const Matrix& m, const Model& model, const Mesh& mesh) {
  if (m.layer < 0) return 0;
  return static_cast<int>(static_cast<int64_t>(m.layer) * mesh.stages / model.layers);
}

// The experts of a layer (the largest index + 1 of its experts).
int ExpertsPerLayer(const Model& model) {
  int n = 0;
  for (const Matrix& m : model.matrices) n = std::max(n, m.expert + 1);
  return n;
}

// The EP rank of an expert, or -1 for a dense matrix (held by every EP rank).
int EpRankOf(const Matrix& m, const Mesh& mesh, int experts) {
  if (mesh.scheme != Scheme::kEpPpFsdp || m.expert < 0) return -1;
  return m.expert / std::max(1, experts / mesh.inner);
}

using muon::testjob::Replicate;
using muon::testjob::Shard;

// What rank r sends in the handshake.
muon::RankDesc Describe(const Model& model, const Mesh& mesh, int experts, int r) {
  muon::RankDesc d;
  d.world_rank = r;
  std::vector<int> inner, fsdp;
  for (int i = 0; i < mesh.inner; ++i) inner.push_back(mesh.Rank(i, mesh.Stage(r), mesh.Fsdp(r)));
  for (int f = 0; f < mesh.fsdp(); ++f) fsdp.push_back(mesh.Rank(mesh.In(r), mesh.Stage(r), f));
  d.groups = {inner, fsdp};
  for (const Matrix& m : model.matrices) {
    if (StageOf(m, model, mesh) != mesh.Stage(r)) continue;
    const int ep = EpRankOf(m, mesh, experts);
    if (ep >= 0 && ep != mesh.In(r)) continue;
    muon::RankParamDesc p;
    p.name = m.name;
    p.param_dtype = static_cast<uint8_t>(muon::DType::kBF16);
    p.state_dtype = static_cast<uint8_t>(muon::DType::kF32);
    p.view = 0;  // MUON_MATRIX_VIEW_2D
    p.global_shape = {m.rows, m.cols};
    p.layout.global_shape = p.global_shape;
    auto& pl = p.layout.placements;
    if (mesh.scheme == Scheme::kTpPpFsdp) {
      pl.push_back(m.tp == TpKind::kReplicate
                       ? Replicate(0)
                       : Shard(0, m.tp == TpKind::kRow ? 1 : 0, muon::ShardSplit::kEven));
    } else if (ep < 0) {
      pl.push_back(Replicate(0));
    }
    pl.push_back(Shard(1, 0, muon::ShardSplit::kChunk));
    d.params.push_back(std::move(p));
  }
  return d;
}

// The same layouts without the library: the rectangle of the global matrix
// rank r holds (empty where r does not register it), and whether it is the
// copy that is sent.
Rect HeldRect(const Matrix& m, const Model& model, const Mesh& mesh, int experts, int r) {
  Rect x{0, m.rows, 0, m.cols, true};
  const int ep = EpRankOf(m, mesh, experts);
  if (StageOf(m, model, mesh) != mesh.Stage(r) || (ep >= 0 && ep != mesh.In(r))) return Rect{};
  const int t = mesh.In(r);
  if (mesh.scheme == Scheme::kTpPpFsdp) {
    if (m.tp == TpKind::kReplicate) {
      x.canonical = t == 0;
    } else if (m.tp == TpKind::kRow) {
      x.c0 = t * (m.cols / mesh.inner);
      x.c1 = x.c0 + m.cols / mesh.inner;
    } else {
      x.r0 = t * (m.rows / mesh.inner);
      x.r1 = x.r0 + m.rows / mesh.inner;
    }
  } else if (ep < 0) {
    x.canonical = t == 0;
  }
  ChunkRows(&x, mesh.Fsdp(r), mesh.fsdp());
  return x;
}

// The ranks that may hold a piece of m (its stage's, its EP rank's).
std::vector<int> Candidates(const Matrix& m, const Model& model, const Mesh& mesh, int experts) {
  std::vector<int> out;
  const int s = StageOf(m, model, mesh), ep = EpRankOf(m, mesh, experts);
  for (int f = 0; f < mesh.fsdp(); ++f) {
    for (int i = 0; i < mesh.inner; ++i) {
      if (ep < 0 || i == ep) out.push_back(mesh.Rank(i, s, f));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t MovedBytes(const std::vector<muon::RoundTable>& tables, int r) {
  int64_t n = 0;
  for (const muon::RoundTable& t : tables) {
    n += PeerBytes(t.gather_send, r) + PeerBytes(t.scatter_send, r) +
         PeerBytes(t.gather_recv, r) + PeerBytes(t.scatter_recv, r);
  }
  return n;
}

// The least bytes rank `me` moves per step with the plan's owners: as owner
// it receives every element it does not hold once (from the copy that is
// sent) and sends the result to every other copy; as a holder it sends its
// canonical elements the owner lacks and receives its elements' result.
// Also checks that every owner holds a piece of its matrix, unless
// owners_may_hold_none (MUON_ASSIGNMENT_SPREAD). With me < 0: the bytes the
// whole job moves (each unit's owner's side).
int64_t LowerBound(const Model& model, const Mesh& mesh, int experts, const muon::Plan& plan,
                   int me, bool owners_may_hold_none, std::string* error) {
  std::map<std::string, const Matrix*> by_name;
  for (const Matrix& m : model.matrices) by_name[m.name] = &m;
  int64_t bytes = 0;
  for (const muon::Unit& u : plan.units) {
    const std::string& name = plan.params[u.param].name;
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      *error = "the plan has a matrix '" + name + "' the model does not";
      return -1;
    }
    const Matrix& m = *it->second;
    const int o = u.owner;
    // The unit's elements: the matrix, or a part's block of it (a tall
    // matrix's rows, a wide one's columns).
    Rect block{0, m.rows, 0, m.cols};
    if (u.parts > 1 && m.rows > m.cols) {
      block.r0 = u.first;
      block.r1 = u.first + u.width;
    } else if (u.parts > 1) {
      block.c0 = u.first;
      block.c1 = u.first + u.width;
    }
    auto held = [&](int r) {
      Rect x = HeldRect(m, model, mesh, experts, r);
      x.r0 = std::max(x.r0, block.r0);
      x.r1 = std::min(x.r1, block.r1);
      x.c0 = std::max(x.c0, block.c0);
      x.c1 = std::min(x.c1, block.c1);
      return x;
    };
    const Rect owner = held(o);
    if (owner.Area() == 0 && !owners_may_hold_none) {
      *error = "matrix '" + name + "' was given to rank " + std::to_string(o) +
               ", which holds none of it";
      return -1;
    }
    auto pair_bytes = [&](int r) {
      const Rect x = held(r);
      int64_t n = x.Area() * kNsBytes;
      if (x.canonical) n += (x.Area() - Overlap(x, owner)) * kStateBytes;
      return n;
    };
    if (o == me || me < 0) {
      for (int r : Candidates(m, model, mesh, experts)) {
        if (r != o) bytes += pair_bytes(r);
      }
    } else {
      bytes += pair_bytes(me);
    }
  }
  return bytes;
}

// The bytes the split matrices' sums move per step in the whole job (their
// Gram products' reduce-scatter and all-gather: 2 (g - 1) / g m^2 fp32
// values per member and iteration; the norm's doubles are left out).
int64_t SumBytes(const muon::Plan& plan, int ns_steps) {
  int64_t bytes = 0;
  for (const muon::Unit& u : plan.units) {
    if (u.parts <= 1 || u.part != 0) continue;
    const muon::PlanParam& pp = plan.params[u.param];
    const int64_t m = std::min(pp.rows, pp.cols);
    bytes += 2 * (u.parts - 1) * m * m * 4 * ns_steps;
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// One configuration, measured in a child process.

struct Figures {
  int64_t handshake_bytes = 0;      // the compact handshake (handshake.h)
  int64_t whole_message_bytes = 0;  // every message whole (the handshake before it)
  int64_t sent_bytes = 0;           // the shared parts and member lists this rank sends
  double parse_s = 0, plan_s = 0, tables_s = 0;
  int64_t memory = 0;
  int64_t pieces = 0, runs = 0;
  double ns_max_over_mean = 0;
  double ns_stage_max_over_mean = 0;  // within a stage, the worst stage
  double matrices_per_rank = 0;
  double moved_over_bound = 0;
  // --assignment=spread: the balanced plan's figures beside the spread one's.
  double balanced_max_over_mean = 0, balanced_stage_max_over_mean = 0;
  int64_t job_bytes = 0, balanced_job_bytes = 0;
  int64_t sum_bytes = 0, split_matrices = 0;  // --assignment=split
  char error[256] = {0};
};

void Fail(Figures* f, const std::string& what) {
  std::snprintf(f->error, sizeof f->error, "%s", what.c_str());
}

// Writes a byte to `ready` once the inputs are made (the time limit starts
// then), and fills *f.
bool g_row_by_row = false;  // --row-by-row: pieces as before boxes
bool g_per_stage = false;   // --per-stage: each stage's balance
bool g_spread = false;      // --assignment=spread (or split)
bool g_split = false;       // --assignment=split

// NS work of a plan's owners: each stage's busiest rank and total, and
// max÷mean over all ranks and in the worst stage.
struct Balance {
  std::vector<double> stage_max, stage_total;
  double all = 0, worst_stage = 0;
};

Balance Imbalance(const muon::Plan& plan, const Mesh& mesh) {
  const int world = mesh.world;
  std::vector<double> load(world, 0);
  double total = 0;
  for (const muon::Unit& u : plan.units) {
    load[u.owner] += u.flops;
    total += u.flops;
  }
  Balance b;
  b.stage_max.assign(mesh.stages, 0);
  b.stage_total.assign(mesh.stages, 0);
  for (int r = 0; r < world; ++r) {
    b.stage_max[mesh.Stage(r)] = std::max(b.stage_max[mesh.Stage(r)], load[r]);
    b.stage_total[mesh.Stage(r)] += load[r];
  }
  for (int s = 0; s < mesh.stages; ++s) {
    if (b.stage_total[s] > 0) {
      b.worst_stage =
          std::max(b.worst_stage, b.stage_max[s] / (b.stage_total[s] * mesh.stages / world));
    }
  }
  b.all = *std::max_element(load.begin(), load.end()) / (total / world);
  return b;
}

void Measure(const Model& model, const Mesh& mesh, int ready, Figures* f) {
  const int world = mesh.world, me = 0;
  const int experts = ExpertsPerLayer(model);
  // Settings every rank shares (the engine's fingerprint is of this length).
  const std::string fingerprint(160, 'f');
  // Every rank's parts, as each would make them (SplitHandshake); the
  // whole-message handshake's longest message, for the bytes it received.
  std::vector<muon::HandshakeParts> parts(world);
  std::vector<muon::HandshakeHeader> headers(world);
  int64_t group_members = 0;
  size_t longest = 0;
  for (int r = 0; r < world; ++r) {
    const muon::RankDesc d = Describe(model, mesh, experts, r);
    if (r == me) {
      for (const auto& g : d.groups) group_members += static_cast<int64_t>(g.size());
    }
    longest = std::max(longest, 4 + fingerprint.size() + muon::SerializeRankDesc(d).size());
    parts[r] = muon::SplitHandshake(fingerprint, d);
    headers[r] = parts[r].header;
  }
  f->whole_message_bytes = 4 * group_members + 8 * int64_t{world} +
                           static_cast<int64_t>(longest) * world + 16 * int64_t{world};
  const char go = 1;
  if (write(ready, &go, 1) != 1) return;

  const int64_t base = g_live.load();
  g_peak.store(base);
  const auto t0 = std::chrono::steady_clock::now();
  // What AgreePlan receives and does, step by step: the headers (all_gather),
  // every rank's own part (all_to_all_v), the directory, the parts this rank
  // sends (its send buffer) and receives, then every rank's description.
  std::vector<muon::HandshakeHeader> got_headers = headers;
  std::string owns_buffer;
  for (int r = 0; r < world; ++r) owns_buffer += parts[r].own;
  std::vector<std::string> owns(world);
  size_t at = 0;
  for (int r = 0; r < world; ++r) {
    owns[r] = owns_buffer.substr(at, headers[r].own_size);
    at += headers[r].own_size;
  }
  std::string().swap(owns_buffer);
  const muon::HandshakeDirectory dir(got_headers, owns);
  std::vector<std::string>().swap(owns);
  std::vector<std::string> bytes(dir.parts());
  for (const auto& [part, local] : dir.Held(me)) {
    bytes[part] = local == 0 ? parts[me].shared : parts[me].groups[local - 1];
  }
  std::string send;
  for (const std::vector<size_t>& to : dir.Sent(me)) {
    for (size_t part : to) send += dir.Compressed(part, me) ? parts[me].shared_wire : bytes[part];
  }
  f->sent_bytes = static_cast<int64_t>(send.size() + parts[me].own.size() * world);
  std::string().swap(send);
  int64_t parts_received = 0;
  for (size_t part = 0; part < dir.parts(); ++part) {
    const int from = dir.Sender(part, me);
    if (from < 0) continue;
    // The sender's shared part arrives compressed, a member list as it is.
    if (dir.Compressed(part, from)) {
      if (!muon::ExpandPart(parts[from].shared_wire, dir.key(part), &bytes[part])) {
        return Fail(f, "rank " + std::to_string(from) + "'s table did not expand");
      }
    } else {
      for (const auto& [p, local] : dir.Held(from)) {
        if (p == part) bytes[part] = parts[from].groups[local - 1];
      }
    }
    parts_received += static_cast<int64_t>(dir.WireSize(part, from));
  }
  f->handshake_bytes = 4 * group_members +
                       static_cast<int64_t>(sizeof(muon::HandshakeHeader)) * world +
                       static_cast<int64_t>(at) + parts_received + 16 * int64_t{world};
  auto assembled = dir.AssembleShared(bytes, fingerprint, me);
  if (!assembled.ok()) return Fail(f, std::string(assembled.status().message()));
  std::vector<std::string>().swap(bytes);
  std::vector<muon::SharedRankDesc> ranks = std::move(assembled).value();
  const auto t1 = std::chrono::steady_clock::now();
  muon::PlanOptions options;
  options.pieces_row_by_row = g_row_by_row;
  if (g_spread) options.assignment = muon::Assignment::kSpread;
  if (g_split) options.assignment = muon::Assignment::kSplit;
  auto plan = muon::BuildPlan(ranks, me, options);
  const auto t2 = std::chrono::steady_clock::now();
  if (!plan.ok()) return Fail(f, std::string(plan.status().message()));
  const std::vector<muon::RoundTable> tables =
      muon::BuildRoundTables(*plan, me, world, muon::DType::kBF16);
  const auto t3 = std::chrono::steady_clock::now();
  f->memory = g_peak.load() - base;
  // The parts put back together give every rank's description exactly.
  for (int r = 0; r < world; ++r) {
    muon::RankDesc whole;
    whole.world_rank = ranks[r].world_rank;
    whole.groups = ranks[r].groups;
    whole.params = *ranks[r].params;
    if (muon::SerializeRankDesc(whole) !=
        muon::SerializeRankDesc(Describe(model, mesh, experts, r))) {
      return Fail(f, "rank " + std::to_string(r) + "'s description did not survive the parts");
    }
  }
  f->parse_s = std::chrono::duration<double>(t1 - t0).count();
  f->plan_s = std::chrono::duration<double>(t2 - t1).count();
  f->tables_s = std::chrono::duration<double>(t3 - t2).count();

  for (const muon::PlanParam& pp : plan->params) {
    f->pieces += static_cast<int64_t>(pp.holders.size());
    for (const muon::Holder& h : pp.holders) f->runs += muon::RunCount(pp.Blocks(h));
  }
  const Balance balance = Imbalance(*plan, mesh);
  f->ns_max_over_mean = balance.all;
  f->ns_stage_max_over_mean = balance.worst_stage;
  if (g_spread) {
    std::string error;
    f->job_bytes = LowerBound(model, mesh, experts, *plan, -1, true, &error);
    f->sum_bytes = SumBytes(*plan, options.ns.steps);
    for (const muon::Unit& u : plan->units) f->split_matrices += u.parts > 1 && u.part == 0;
    auto balanced = muon::BuildPlan(ranks, me, muon::PlanOptions());
    if (!balanced.ok()) return Fail(f, std::string(balanced.status().message()));
    const Balance b = Imbalance(*balanced, mesh);
    f->balanced_max_over_mean = b.all;
    f->balanced_stage_max_over_mean = b.worst_stage;
    f->balanced_job_bytes = LowerBound(model, mesh, experts, *balanced, -1, false, &error);
    if (f->balanced_job_bytes < 0) return Fail(f, error);
  }
  if (g_per_stage) {
    const std::vector<double>& stage_max = balance.stage_max;
    const std::vector<double>& stage_total = balance.stage_total;
    std::vector<int64_t> stage_units(mesh.stages, 0);
    std::vector<double> stage_largest(mesh.stages, 0);
    for (const muon::Unit& u : plan->units) {
      const int s = mesh.Stage(u.owner);
      ++stage_units[s];
      stage_largest[s] = std::max(stage_largest[s], static_cast<double>(u.flops));
    }
    for (int s = 0; s < mesh.stages; ++s) {
      if (stage_total[s] <= 0) continue;
      const double mean = stage_total[s] * mesh.stages / world;
      std::fprintf(stderr, "  stage %d: %.1f matrices per rank, NS max÷mean %.3f, largest ÷ mean %.3f\n",
                   s, static_cast<double>(stage_units[s]) * mesh.stages / world, stage_max[s] / mean,
                   stage_largest[s] / mean);
    }
  }
  f->matrices_per_rank = static_cast<double>(plan->units.size()) / world;

  // Moved over the bound on a few ranks (round tables from rank 0's plan
  // serve any rank: BuildRoundTables finds the rank's entries itself).
  for (int r : {0, world / 2, world - 1}) {
    const int64_t moved =
        MovedBytes(r == me ? tables : muon::BuildRoundTables(*plan, r, world, muon::DType::kBF16),
                   r);
    std::string error;
    const int64_t bound = LowerBound(model, mesh, experts, *plan, r, g_spread, &error);
    if (bound < 0) return Fail(f, error);
    if (moved < bound) return Fail(f, "rank " + std::to_string(r) + " moves less than the bound");
    f->moved_over_bound =
        std::max(f->moved_over_bound, bound == 0 ? 1.0 : static_cast<double>(moved) / bound);
  }
}

// Runs Measure in a child; false when it ran past `limit` seconds (stopped)
// or died, with *why.
bool RunLimited(const Model& model, const Mesh& mesh, double limit, Figures* f, std::string* why) {
  int ready[2], result[2];
  if (pipe(ready) != 0 || pipe(result) != 0) {
    *why = "pipe failed";
    return false;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    close(result[0]);
    Figures mine;
    Measure(model, mesh, ready[1], &mine);
    const ssize_t n = write(result[1], &mine, sizeof mine);
    _exit(n == static_cast<ssize_t>(sizeof mine) ? 0 : 1);
  }
  close(ready[1]);
  close(result[1]);
  char go = 0;
  const bool started = read(ready[0], &go, 1) == 1;
  const auto start = std::chrono::steady_clock::now();
  bool done = false;
  int status = 0;
  while (started) {
    if (waitpid(child, &status, WNOHANG) == child) {
      done = true;
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit) {
      kill(child, SIGKILL);
      break;
    }
    usleep(20000);
  }
  if (!done) waitpid(child, &status, 0);
  bool ok = false;
  if (done && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    ok = read(result[0], f, sizeof *f) == static_cast<ssize_t>(sizeof *f);
  }
  close(ready[0]);
  close(result[0]);
  if (!ok) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "> %.0f s (stopped)", limit);
    *why = !started ? "the child died making its inputs" : done ? "the child failed" : buf;
  }
  return ok;
}

std::string MiB(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(n) / (1 << 20));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "bench/models";  // under `bazel run`: the runfiles
  std::string only;
  std::vector<int> rank_counts = {1024, 4096, 16384};
  double limit = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--models=", 0) == 0) {
      dir = a.substr(9);
    } else if (a.rfind("--model=", 0) == 0) {
      only = a.substr(8);
    } else if (a == "--per-stage") {
      g_per_stage = true;
    } else if (a == "--assignment=spread") {
      g_spread = true;
    } else if (a == "--assignment=split") {
      g_spread = g_split = true;
    } else if (a == "--row-by-row") {
      g_row_by_row = true;
    } else if (a.rfind("--limit=", 0) == 0) {
      limit = std::atof(a.c_str() + 8);
    } else if (a.rfind("--ranks=", 0) == 0) {
      rank_counts.clear();
      for (size_t at = 8; at < a.size();) {
        const size_t comma = std::min(a.find(',', at), a.size());
        rank_counts.push_back(std::atoi(a.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--models=DIR] [--model=NAME] [--ranks=N,N,...] [--limit=SECONDS] "
                   "[--row-by-row] [--per-stage] [--assignment=spread]\n",
                   argv[0]);
      return 2;
    }
  }
  // (model, scheme, inner): the layouts, then the existing models
  // with at least one layer per stage.
  struct Config {
    const char* model;
    Scheme scheme;
    int inner;
  };
  const std::vector<Config> configs = {
      {"llama3-405b", Scheme::kTpPpFsdp, 8}, {"deepseek-v3", Scheme::kEpPpFsdp, 64},
      {"llama3-70b", Scheme::kTpPpFsdp, 8},  {"llama3-8b", Scheme::kTpPpFsdp, 8},
      {"mixtral-8x7b", Scheme::kTpPpFsdp, 8},
  };
  std::printf(
      "| model | layout | ranks | matrices | pieces | runs | handshake MiB/rank: whole "
      "messages -> parts (rank 0 sends) | setup s "
      "(parse + plan + tables) | setup MiB/rank (peak) | NS max÷mean: all; worst stage | "
      "matrices/rank | "
      "moved÷bound |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Config& c : configs) {
    if (!only.empty() && only != c.model) continue;
    Model model;
    std::string error;
    if (!LoadModel(dir + "/" + c.model + ".json", &model, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    bool stopped = false;
    for (int world : rank_counts) {
      const int stages = 16;
      Mesh mesh{c.scheme, world, c.inner, stages};
      if (world % (c.inner * stages) != 0) {
        std::fprintf(stderr, "%s: %d ranks is not a multiple of %d\n", c.model, world,
                     c.inner * stages);
        return 2;
      }
      if (stopped) {
        std::printf("| %s | %s | %d | %zu | | | | not run (a smaller size took > %.0f s) | | | | |\n",
                    model.name.c_str(), mesh.Name().c_str(), world, model.matrices.size(), limit);
        continue;
      }
      Figures f;
      std::string why;
      const auto t0 = std::chrono::steady_clock::now();
      if (!RunLimited(model, mesh, limit, &f, &why)) {
        stopped = true;
        std::printf("| %s | %s | %d | %zu | | | | %s | | | | |\n", model.name.c_str(),
                    mesh.Name().c_str(), world, model.matrices.size(), why.c_str());
      } else if (f.error[0] != 0) {
        std::fprintf(stderr, "%s, %s, %d ranks: %s\n", model.name.c_str(), mesh.Name().c_str(),
                     world, f.error);
        return 1;
      } else {
        std::printf("| %s | %s | %d | %zu | %lld | %lld | %s -> %s (%s) | %.2f (%.2f + %.2f + %.2f) | %s | "
                    "%.2f; %.2f | %.2f | %.3f |\n",
                    model.name.c_str(), mesh.Name().c_str(), world, model.matrices.size(),
                    static_cast<long long>(f.pieces), static_cast<long long>(f.runs),
                    MiB(f.whole_message_bytes).c_str(), MiB(f.handshake_bytes).c_str(),
                    MiB(f.sent_bytes).c_str(), f.parse_s + f.plan_s + f.tables_s, f.parse_s,
                    f.plan_s, f.tables_s, MiB(f.memory).c_str(), f.ns_max_over_mean,
                    f.ns_stage_max_over_mean,
                    f.matrices_per_rank, f.moved_over_bound);
        if (g_spread) {
          std::printf("|  | %s against balanced | | | | | | | | NS max÷mean %.2f; %.2f (balanced "
                      "%.2f; %.2f) | job moves %.2f GiB/step (balanced %.2f, x%.3f) | |\n",
                      g_split ? "split" : "spread", f.ns_max_over_mean, f.ns_stage_max_over_mean,
                      f.balanced_max_over_mean, f.balanced_stage_max_over_mean,
                      f.job_bytes / double(1 << 30), f.balanced_job_bytes / double(1 << 30),
                      f.balanced_job_bytes > 0 ? double(f.job_bytes) / f.balanced_job_bytes : 0.0);
        }
        if (g_split) {
          std::printf("|  | split matrices | | | | | | | | %lld | their sums move %.2f GiB/step "
                      "(x%.3f with the exchange) | |\n",
                      static_cast<long long>(f.split_matrices), f.sum_bytes / double(1 << 30),
                      f.balanced_job_bytes > 0
                          ? double(f.job_bytes + f.sum_bytes) / f.balanced_job_bytes
                          : 0.0);
        }
      }
      std::fflush(stdout);
      std::fprintf(stderr, "%s, %s: %.1f s in all\n", model.name.c_str(), mesh.Name().c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return 0;
}
