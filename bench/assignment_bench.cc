// Assignment benchmark: how evenly the distributed engine spreads the
// Newton-Schulz work over ranks, and how many bytes each rank moves per step
// compared with the least any plan with the same owners could move.
//
// For real model shapes (bench/models/*.json) at 8 and 64 ranks, it builds
// the plan with muon::BuildPlan and every rank's exchange rounds with
// muon::BuildRoundTables, exactly as the engine does at the first step (from
// RankDescs made up here instead of a handshake: no communication; see
// PlanAllRanks for which ranks call BuildPlan themselves), once with
// round-robin and once with balanced assignment (MUON_ASSIGNMENT_* in
// include/libmuon/muon.h; the owners are checked against the header's description).
// The lower bound on traffic is computed independently, from the layouts
// alone: a matrix's owner must receive every element it does not hold (fp32
// momentum) and send every other copy's elements back (bf16 Newton-Schulz
// output); nothing else needs to move.
//
// Muon matrices are the models' 2-D hidden weights (roles "matrix" and
// "expert"); embeddings, the LM head and norms belong to AdamW.
//
//   bazel run -c opt //bench:assignment_bench
//
// Options: --model=NAME (one model), --layout=fsdp|tp|ddp|hsdp (one layout),
// --every-rank (call BuildPlan on every rank, not a sample: minutes),
// --setup-cost (a different table: one rank's BuildPlan and BuildRoundTables
// time for TP 8 x FSDP 8, 32, 128), --models=DIR (the JSON files).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "muon/common/dtype.h"
#include "muon/sharding/exchange.h"
#include "muon/sharding/layout.h"
#include "bench/model_file.h"
#include "bench/traffic.h"
#include "muon/sharding/plan.h"
#include "muon/sharding/testing/job.h"

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
// Layouts, on a mesh of `world` ranks: rank r sits at (r % inner, r / inner).
//
//   FSDP W          every matrix: Shard(world, dim 0, chunk)   (FSDP2, torch.chunk)
//   TP t x FSDP f   Shard(TP, dim 0 or 1, even), or Replicate(TP) for a router,
//                   then Shard(FSDP, dim 0, chunk); TP is the inner group
//   DDP W           Replicate(world)
//   HSDP d x s      Replicate(DP), then Shard(FSDP, dim 0, chunk); FSDP inner

enum class Scheme { kFsdp, kTpFsdp, kDdp, kHsdp };

struct Mesh {
  Scheme scheme = Scheme::kFsdp;
  int world = 1;
  int inner = 1;  // TP (kTpFsdp) or FSDP (kHsdp) group size; world otherwise
  int outer() const { return world / inner; }
  int In(int r) const { return r % inner; }
  int Out(int r) const { return r / inner; }
  std::string Name() const {
    const std::string w = std::to_string(world), i = std::to_string(inner),
                      o = std::to_string(outer());
    switch (scheme) {
      case Scheme::kFsdp:
        return "FSDP " + w;
      case Scheme::kTpFsdp:
        return "TP " + i + " x FSDP " + o;
      case Scheme::kDdp:
        return "DDP " + w;
      case Scheme::kHsdp:
        return "HSDP: DP " + o + " x FSDP " + i;
    }
    return "";
  }
  const char* Key() const {  // for --layout
    return scheme == Scheme::kFsdp     ? "fsdp"
           : scheme == Scheme::kTpFsdp ? "tp"
           : scheme == Scheme::kDdp    ? "ddp"
                                       : "hsdp";
  }
};

Mesh FsdpMesh(int world) { return {Scheme::kFsdp, world, world}; }
Mesh TpFsdpMesh(int world, int tp) { return {Scheme::kTpFsdp, world, tp}; }
Mesh DdpMesh(int world) { return {Scheme::kDdp, world, world}; }
Mesh HsdpMesh(int world, int fsdp) { return {Scheme::kHsdp, world, fsdp}; }

using muon::testjob::Replicate;
using muon::testjob::Shard;

// The RankDesc every rank would send in the handshake.
std::vector<muon::RankDesc> MakeRankDescs(const Model& model, const Mesh& mesh) {
  std::vector<muon::RankDesc> ranks(mesh.world);
  for (int r = 0; r < mesh.world; ++r) {
    muon::RankDesc& d = ranks[r];
    d.world_rank = r;
    // Group 0: the inner group (the world for FSDP and DDP); group 1: the
    // outer one. Members in group-rank order.
    std::vector<int> inner, outer;
    for (int i = 0; i < mesh.inner; ++i) inner.push_back(mesh.Out(r) * mesh.inner + i);
    for (int o = 0; o < mesh.outer(); ++o) outer.push_back(o * mesh.inner + mesh.In(r));
    d.groups.push_back(inner);
    if (mesh.outer() > 1) d.groups.push_back(outer);
    for (const Matrix& m : model.matrices) {
      muon::RankParamDesc p;
      p.name = m.name;
      p.param_dtype = static_cast<uint8_t>(muon::DType::kF32);
      p.state_dtype = static_cast<uint8_t>(muon::DType::kF32);
      p.view = 0;  // MUON_MATRIX_VIEW_2D
      p.global_shape = {m.rows, m.cols};
      p.layout.global_shape = p.global_shape;
      auto& pl = p.layout.placements;
      switch (mesh.scheme) {
        case Scheme::kFsdp:
          pl.push_back(Shard(0, 0, muon::ShardSplit::kChunk));
          break;
        case Scheme::kTpFsdp:
          pl.push_back(m.tp == TpKind::kReplicate ? Replicate(0)
                                                  : Shard(0, m.tp == TpKind::kRow ? 1 : 0,
                                                                   muon::ShardSplit::kEven));
          pl.push_back(Shard(1, 0, muon::ShardSplit::kChunk));
          break;
        case Scheme::kDdp:
          pl.push_back(Replicate(0));
          break;
        case Scheme::kHsdp:
          pl.push_back(Replicate(1));
          pl.push_back(Shard(0, 0, muon::ShardSplit::kChunk));
          break;
      }
      d.params.push_back(std::move(p));
    }
  }
  return ranks;
}

// The same layouts, computed here without the library: the rectangle of the
// global matrix rank r holds, and whether it is the copy that is sent.
Rect HeldRect(const Matrix& m, const Mesh& mesh, int r) {
  Rect x{0, m.rows, 0, m.cols, true};
  switch (mesh.scheme) {
    case Scheme::kFsdp:
      ChunkRows(&x, r, mesh.world);
      break;
    case Scheme::kTpFsdp: {
      const int t = mesh.In(r);
      if (m.tp == TpKind::kReplicate) {
        x.canonical = t == 0;
      } else if (m.tp == TpKind::kRow) {
        x.c0 = t * (m.cols / mesh.inner);
        x.c1 = x.c0 + m.cols / mesh.inner;
      } else {
        x.r0 = t * (m.rows / mesh.inner);
        x.r1 = x.r0 + m.rows / mesh.inner;
      }
      ChunkRows(&x, mesh.Out(r), mesh.outer());
      break;
    }
    case Scheme::kDdp:
      x.canonical = r == 0;
      break;
    case Scheme::kHsdp:
      x.canonical = mesh.Out(r) == 0;
      ChunkRows(&x, mesh.In(r), mesh.inner);
      break;
  }
  return x;
}

// ---------------------------------------------------------------------------
// Measurements.

struct RankFigures {
  double flops = 0;
  int64_t sent = 0, received = 0;  // to and from other ranks, one step
  int rounds = 0;
  uint64_t digest = 0;
  std::string error;
};

struct Result {
  std::vector<RankFigures> ranks;
  std::vector<int> owners;  // per unit of rank 0's plan
  std::vector<std::string> unit_names;
  double seconds = 0;
  std::string error;
};

// What rank r computes and moves per step, from its round tables.
RankFigures Figures(const muon::Plan& plan, int r, int world) {
  RankFigures f;
  const std::vector<muon::RoundTable> tables =
      muon::BuildRoundTables(plan, r, world, muon::DType::kBF16);
  f.digest = plan.digest;
  f.rounds = plan.rounds;
  for (const muon::RoundTable& t : tables) {
    f.flops += t.flops;
    f.sent += PeerBytes(t.gather_send, r) + PeerBytes(t.scatter_send, r);
    f.received += PeerBytes(t.gather_recv, r) + PeerBytes(t.scatter_recv, r);
  }
  return f;
}

// Runs fn(i) for i in [0, n) on `threads` threads.
template <typename Fn>
void ParallelFor(int n, int threads, Fn fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

// Builds the plan and round tables of every rank.
//
// Every rank builds the same plan from the same handshake data; here every
// rank also registers the same matrices in the same order, so the plans differ
// only in which holder is "this rank" (BuildRoundTables finds it from the rank).
// One BuildPlan call computes every rank's pieces, so calling it for each of
// W ranks costs O(W^2) pieces: minutes on 2 cores for the 64-rank TP layouts
// of the big models. By default BuildPlan runs on the first, a middle and the
// last rank; their plans must agree (digest) and their round tables must give
// the same figures as tables built from rank 0's plan, which then serves every
// other rank. With every_rank, BuildPlan runs on every rank.
Result PlanAllRanks(const std::vector<muon::RankDesc>& descs, muon::Assignment assignment,
                    int threads, bool every_rank) {
  const int world = static_cast<int>(descs.size());
  Result res;
  res.ranks.resize(world);
  muon::PlanOptions options;
  options.assignment = assignment;
  const auto start = std::chrono::steady_clock::now();

  std::vector<int> sample;
  for (int r = 0; r < world; ++r) {
    if (every_rank || r == 0 || r == world / 2 || r == world - 1) sample.push_back(r);
  }
  std::vector<char> planned(world, 0);  // not vector<bool>: written from several threads
  std::unique_ptr<muon::Plan> plan0;
  std::vector<RankFigures> via_plan0(world);
  ParallelFor(static_cast<int>(sample.size()), threads, [&](int i) {
    const int r = sample[i];
    RankFigures& f = res.ranks[r];
    auto plan = muon::BuildPlan(descs, r, options);
    if (!plan.ok()) {
      f.error = std::string(plan.status().message());
      return;
    }
    f = Figures(*plan, r, world);
    planned[r] = 1;
    if (r == 0) plan0 = std::make_unique<muon::Plan>(std::move(plan).value());
  });
  if (!plan0) {
    res.error = "rank 0: " + res.ranks[0].error;
    return res;
  }
  ParallelFor(world, threads, [&](int r) {
    if (!planned[r]) {
      res.ranks[r] = Figures(*plan0, r, world);
    } else if (!every_rank && r != 0) {
      via_plan0[r] = Figures(*plan0, r, world);
    }
  });
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < world; ++r) {
    const RankFigures& f = res.ranks[r];
    if (!f.error.empty()) {
      res.error = "rank " + std::to_string(r) + ": " + f.error;
      return res;
    }
    if (f.digest != res.ranks[0].digest) {
      res.error = "rank " + std::to_string(r) + " built a different plan than rank 0";
      return res;
    }
    if (planned[r] && !every_rank && r != 0 &&
        (via_plan0[r].sent != f.sent || via_plan0[r].received != f.received ||
         via_plan0[r].flops != f.flops)) {
      res.error = "rank " + std::to_string(r) +
                  ": round tables from rank 0's plan differ from those of its own plan";
      return res;
    }
  }
  for (const muon::Unit& u : plan0->units) {
    res.owners.push_back(u.owner);
    res.unit_names.push_back(plan0->params[u.param].name);
  }
  return res;
}

// The owners include/libmuon/muon.h promises, computed here from the layouts: matrices
// in global order (by name), each one's holders (ranks holding any of it,
// ascending); MUON_ASSIGNMENT_ROUND_ROBIN gives matrix i to holder
// i mod (number of holders), MUON_ASSIGNMENT_BALANCED goes largest
// Newton-Schulz cost first to the least loaded holder (ties: the earlier
// matrix, the lower rank).
std::vector<int> ExpectedOwners(const Model& model, const Mesh& mesh, muon::Assignment assignment) {
  std::map<std::string, const Matrix*> by_name;  // the global order
  for (const Matrix& m : model.matrices) by_name[m.name] = &m;
  std::vector<std::vector<int>> holders;
  std::vector<double> cost;
  for (const auto& [name, m] : by_name) {
    holders.emplace_back();
    for (int r = 0; r < mesh.world; ++r) {
      if (HeldRect(*m, mesh, r).Area() > 0) holders.back().push_back(r);
    }
    const double a = static_cast<double>(std::min(m->rows, m->cols));
    const double b = static_cast<double>(std::max(m->rows, m->cols));
    cost.push_back(5 * (4 * a * a * b + 2 * a * a * a));  // 5 iterations of the quintic
  }
  std::vector<int> owners(holders.size());
  if (assignment == muon::Assignment::kRoundRobin) {
    for (size_t i = 0; i < holders.size(); ++i) owners[i] = holders[i][i % holders[i].size()];
    return owners;
  }
  std::vector<size_t> order(holders.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return cost[x] > cost[y]; });
  std::vector<double> load(mesh.world, 0);
  for (size_t i : order) {
    int best = holders[i][0];
    for (int r : holders[i]) {
      if (load[r] < load[best]) best = r;
    }
    owners[i] = best;
    load[best] += cost[i];
  }
  return owners;
}

// The least traffic per rank for the owners `res.owners`, from the layout
// alone: the owner receives each element it does not hold once (from the copy
// that is sent) and sends the result to every other copy.
std::vector<int64_t> LowerBound(const Model& model, const Mesh& mesh, const Result& res,
                                std::string* error) {
  std::map<std::string, const Matrix*> by_name;
  for (const Matrix& m : model.matrices) by_name[m.name] = &m;
  std::vector<int64_t> bytes(mesh.world, 0);
  std::vector<Rect> held(mesh.world);
  for (size_t u = 0; u < res.owners.size(); ++u) {
    auto it = by_name.find(res.unit_names[u]);
    if (it == by_name.end()) {
      *error = "the plan has a matrix '" + res.unit_names[u] + "' the model does not";
      return {};
    }
    const Matrix& m = *it->second;
    const int o = res.owners[u];
    for (int r = 0; r < mesh.world; ++r) held[r] = HeldRect(m, mesh, r);
    if (held[o].Area() == 0) {
      *error = "matrix '" + m.name + "' was given to rank " + std::to_string(o) +
               ", which holds none of it";
      return {};
    }
    for (int r = 0; r < mesh.world; ++r) {
      if (r == o) continue;
      // Gather: r's copy, less what the owner already has.
      if (held[r].canonical) {
        const int64_t n = (held[r].Area() - Overlap(held[r], held[o])) * kStateBytes;
        bytes[r] += n;
        bytes[o] += n;
      }
      // Scatter: every copy gets the update for its elements.
      const int64_t n = held[r].Area() * kNsBytes;
      bytes[r] += n;
      bytes[o] += n;
    }
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// Output.

std::string Fmt(double v) {
  char buf[64];
  if (v >= 100 || v == 0) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (v >= 10) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
  } else if (v >= 1) {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f", v);
  }
  return buf;
}

// Bytes, readably: "0", "917504 B", "12.3 MB", "479.2 GB".
std::string HumanBytes(int64_t n) {
  char buf[64];
  if (n < 1000000) {
    std::snprintf(buf, sizeof buf, n == 0 ? "0" : "%lld B", static_cast<long long>(n));
  } else if (n < 1000000000) {
    std::snprintf(buf, sizeof buf, "%.1f MB", n / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GB", n / 1e9);
  }
  return buf;
}

template <typename T>
void MaxMean(const std::vector<T>& v, double* max, double* mean) {
  *max = 0;
  *mean = 0;
  for (T x : v) {
    *max = std::max(*max, static_cast<double>(x));
    *mean += static_cast<double>(x);
  }
  *mean /= static_cast<double>(v.size());
}

std::vector<double> FlopsT(const Result& r) {
  std::vector<double> v;
  for (const RankFigures& f : r.ranks) v.push_back(f.flops / 1e12);
  return v;
}

std::vector<int64_t> Moved(const Result& r) {
  std::vector<int64_t> v;
  for (const RankFigures& f : r.ranks) v.push_back(f.sent + f.received);
  return v;
}

// Bytes moved beyond the bound, summed over ranks (0 when the plan meets it);
// negative would mean the bound is wrong.
int64_t Excess(const std::vector<int64_t>& moved, const std::vector<int64_t>& bound) {
  int64_t n = 0;
  for (size_t r = 0; r < moved.size(); ++r) n += moved[r] - bound[r];
  return n;
}

// One table row per model and layout. Returns false on an error (printed).
bool Row(const Model& model, const Mesh& mesh, int threads, bool every_rank) {
  const std::vector<muon::RankDesc> descs = MakeRankDescs(model, mesh);
  const Result rr = PlanAllRanks(descs, muon::Assignment::kRoundRobin, threads, every_rank);
  const Result bal = PlanAllRanks(descs, muon::Assignment::kBalanced, threads, every_rank);
  std::string error;
  for (const Result* r : {&rr, &bal}) {
    if (!r->error.empty()) {
      std::fprintf(stderr, "%s, %s: %s\n", model.name.c_str(), mesh.Name().c_str(),
                   r->error.c_str());
      return false;
    }
    int64_t sent = 0, received = 0;
    for (const RankFigures& x : r->ranks) {
      sent += x.sent;
      received += x.received;
    }
    if (sent != received) {
      std::fprintf(stderr, "%s, %s: ranks send %lld bytes in all but receive %lld\n",
                   model.name.c_str(), mesh.Name().c_str(), static_cast<long long>(sent),
                   static_cast<long long>(received));
      return false;
    }
  }
  if (rr.owners != ExpectedOwners(model, mesh, muon::Assignment::kRoundRobin) ||
      bal.owners != ExpectedOwners(model, mesh, muon::Assignment::kBalanced)) {
    std::fprintf(stderr,
                 "%s, %s: the plan's owners are not the ones include/libmuon/muon.h describes\n",
                 model.name.c_str(), mesh.Name().c_str());
    return false;
  }
  const std::vector<int64_t> bound_bal = LowerBound(model, mesh, bal, &error);
  const std::vector<int64_t> bound_rr = LowerBound(model, mesh, rr, &error);
  if (bound_bal.empty() || bound_rr.empty()) {
    std::fprintf(stderr, "%s, %s: %s\n", model.name.c_str(), mesh.Name().c_str(), error.c_str());
    return false;
  }
  const std::vector<int64_t> moved = Moved(bal);
  if (Excess(moved, bound_bal) < 0 || Excess(Moved(rr), bound_rr) < 0) {
    std::fprintf(stderr, "%s, %s: the plan moves less than the lower bound: the bound is wrong\n",
                 model.name.c_str(), mesh.Name().c_str());
    return false;
  }
  double rr_max, rr_mean, bal_max, bal_mean, mv_max, mv_mean, lb_max, lb_mean;
  MaxMean(FlopsT(rr), &rr_max, &rr_mean);
  MaxMean(FlopsT(bal), &bal_max, &bal_mean);
  MaxMean(moved, &mv_max, &mv_mean);
  MaxMean(bound_bal, &lb_max, &lb_mean);
  std::printf(
      "| %s | %d | %s | %zu | %d | %s / %s (%.2f) | %s / %s (%.2f) | %.2f | %s / %s | %s / %s | "
      "%s; %s |\n",
      model.name.c_str(), mesh.world, mesh.Name().c_str(), model.matrices.size(),
      bal.ranks[0].rounds, Fmt(rr_max).c_str(), Fmt(rr_mean).c_str(), rr_max / rr_mean,
      Fmt(bal_max).c_str(), Fmt(bal_mean).c_str(), bal_max / bal_mean, rr_max / bal_max,
      Fmt(mv_max / 1e9).c_str(), Fmt(mv_mean / 1e9).c_str(), Fmt(lb_max / 1e9).c_str(),
      Fmt(lb_mean / 1e9).c_str(), HumanBytes(Excess(moved, bound_bal)).c_str(),
      HumanBytes(Excess(Moved(rr), bound_rr)).c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "%s, %s: %.1f s (%s)\n", model.name.c_str(), mesh.Name().c_str(),
               rr.seconds + bal.seconds, every_rank ? "BuildPlan on every rank" : "sampled");
  return true;
}

// What one rank spends at the first step to build its plan and round tables,
// TP 8 x FSDP n for growing n (balanced assignment).
bool SetupCost(const Model& model, const std::vector<int>& fsdp_sizes) {
  for (int n : fsdp_sizes) {
    const Mesh mesh = TpFsdpMesh(8 * n, 8);
    const std::vector<muon::RankDesc> descs = MakeRankDescs(model, mesh);
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = muon::BuildPlan(descs, 0, muon::PlanOptions());
    const auto t1 = std::chrono::steady_clock::now();
    if (!plan.ok()) {
      std::fprintf(stderr, "%s: %s\n", model.name.c_str(),
                   std::string(plan.status().message()).c_str());
      return false;
    }
    const std::vector<muon::RoundTable> tables =
        muon::BuildRoundTables(*plan, 0, mesh.world, muon::DType::kBF16);
    const auto t2 = std::chrono::steady_clock::now();
    int64_t runs = 0;
    for (const muon::PlanParam& pp : plan->params) {
      for (const muon::Holder& h : pp.holders) runs += muon::RunCount(pp.Blocks(h));
    }
    std::printf("| %s | %d | %s | %lld | %.2f | %.2f |\n", model.name.c_str(), mesh.world,
                mesh.Name().c_str(), static_cast<long long>(runs),
                std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
    std::fflush(stdout);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "bench/models";  // under `bazel run`: the runfiles
  std::string only, only_layout;     // run one model or one kind of layout only
  bool every_rank = false, setup_cost = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--models=", 0) == 0) {
      dir = a.substr(9);
    } else if (a.rfind("--model=", 0) == 0) {
      only = a.substr(8);
    } else if (a.rfind("--layout=", 0) == 0) {
      only_layout = a.substr(9);
    } else if (a == "--every-rank") {
      every_rank = true;
    } else if (a == "--setup-cost") {
      setup_cost = true;
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--models=DIR] [--model=NAME] [--layout=fsdp|tp|ddp|hsdp] [--every-rank] "
          "[--setup-cost]\n",
          argv[0]);
      return 2;
    }
  }
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const std::vector<std::string> names = {"gpt2-124m", "llama3-8b", "llama3-70b", "mixtral-8x7b"};
  std::vector<Model> models;
  for (const std::string& name : names) {
    if (!only.empty() && name != only) continue;
    Model model;
    std::string error;
    if (!LoadModel(dir + "/" + name + ".json", &model, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    models.push_back(std::move(model));
  }
  if (models.empty()) {
    std::fprintf(stderr, "no model named '%s'\n", only.c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();

  if (setup_cost) {
    std::printf(
        "| model | ranks | layout | runs in all pieces | BuildPlan s | BuildRoundTables s |\n");
    std::printf("|---|---:|---|---:|---:|---:|\n");
    for (const Model& model : models) {
      if (!SetupCost(model, {8, 32, 128})) return 1;
    }
  } else {
    std::printf(
        "| model | ranks | layout | matrices | rounds | NS TFLOP/rank, round-robin: max / mean "
        "(max÷mean) | balanced: max / mean (max÷mean) | round-robin max ÷ balanced max | GB "
        "moved/rank: max / mean | lower bound: max / mean | moved over the bound, all ranks "
        "(balanced; round-robin) |\n");
    std::printf("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Model& model : models) {
      for (const Mesh& mesh :
           {FsdpMesh(8), FsdpMesh(64), TpFsdpMesh(64, 8), DdpMesh(8), HsdpMesh(64, 8)}) {
        if (!only_layout.empty() && only_layout != mesh.Key()) continue;
        if (!Row(model, mesh, threads, every_rank)) return 1;
      }
    }
  }
  std::fprintf(stderr, "total %.1f s on %d threads\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               threads);
  return 0;
}
