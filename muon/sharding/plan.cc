#include "muon/sharding/plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "muon/common/matrix_view.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"
#include "muon/math/ns_config.h"

namespace muon {
namespace {

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <typename T>
uint64_t FnvValue(uint64_t h, T v) {
  return Fnv(h, &v, sizeof v);
}

// A rank's parameter table, held or shared.
const std::vector<RankParamDesc>& ParamsOf(const RankDesc& r) { return r.params; }
const std::vector<RankParamDesc>& ParamsOf(const SharedRankDesc& r) { return *r.params; }

// Which table a rank's parameter table is: ranks that share one parsed table
// give the same key (a RankDesc's table is its own). What is checked or looked
// up by name in a table gives the same answer for every rank with that key.
const void* TableKey(const RankDesc& r) { return &r.params; }
const void* TableKey(const SharedRankDesc& r) { return r.params.get(); }

// A holder's piece. The description of the holder goes only into errors, so
// it is made only then: a failing call is made again with it (the same
// inputs, hence the same failure, now with its message).
absl::StatusOr<Piece> HolderPiece(const RankParamDesc& d, int rank, const std::vector<int>& sizes,
                                  const std::vector<int>& coords, bool row_by_row) {
  const auto compute = [&](const std::string& who) {
    return row_by_row ? ComputePieceRowByRow(d.layout, sizes, coords, who)
                      : ComputePieceBlocks(d.layout, sizes, coords, who);
  };
  absl::StatusOr<Piece> piece = compute(std::string());
  if (piece.ok()) return piece;
  return compute(absl::StrCat("param '", d.name, "' on rank ", rank));
}

// BuildPlan over either form of the descriptions (the same code, hence the
// same plan and errors).
template <typename Desc>
absl::StatusOr<Plan> BuildPlanFrom(const std::vector<Desc>& ranks, int my_rank,
                                   const PlanOptions& options) {
  const int world = static_cast<int>(ranks.size());
  // 1. Groups: every member of a rank's group must see the same member list.
  for (const Desc& r : ranks) {
    for (size_t g = 0; g < r.groups.size(); ++g) {
      const auto& members = r.groups[g];
      if (std::find(members.begin(), members.end(), r.world_rank) == members.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group ", g, " of rank ", r.world_rank, " does not contain that rank"));
      }
      for (int m : members) {
        if (m < 0 || m >= world) {
          return absl::InvalidArgumentError(absl::StrCat("group ", g, " of rank ", r.world_rank,
                                                         " names rank ", m, " outside the world"));
        }
        const auto& theirs = ranks[m].groups;
        if (std::find(theirs.begin(), theirs.end(), members) == theirs.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "group ", g, " of rank ", r.world_rank, " has members [",
              absl::StrJoin(members, ", "), "], but rank ", m,
              " has no group with these members (groups must be created the same way on every "
              "member)"));
        }
      }
    }
  }

  // 2. Parameters by name, with each holder's piece.
  Plan plan;
  std::map<std::string, int> index;
  std::map<std::string, std::pair<int, const RankParamDesc*>> first;  // who registered it first
  // The distinct tables, in the order of their first rank, and each rank's.
  std::vector<const std::vector<RankParamDesc>*> tables;
  std::vector<int> table_of(ranks.size());
  {
    absl::flat_hash_map<const void*, int> ids;
    for (size_t k = 0; k < ranks.size(); ++k) {
      const auto [it, added] = ids.try_emplace(TableKey(ranks[k]), static_cast<int>(tables.size()));
      if (added) tables.push_back(&ParamsOf(ranks[k]));
      table_of[k] = it->second;
    }
  }
  // A table is compared with the first registrations once: on a later rank
  // with the same table every entry meets the same first registration (or is
  // it) and passes as it did.
  std::vector<bool> compared(tables.size(), false);
  for (size_t k = 0; k < ranks.size(); ++k) {
    const Desc& r = ranks[k];
    if (compared[table_of[k]]) continue;
    compared[table_of[k]] = true;
    for (size_t i = 0; i < ParamsOf(r).size(); ++i) {
      const RankParamDesc& p = ParamsOf(r)[i];
      auto it = first.find(p.name);
      if (it == first.end()) {
        first[p.name] = {r.world_rank, &p};
        continue;
      }
      const RankParamDesc& q = *it->second.second;
      const int qr = it->second.first;
      if (p.global_shape != q.global_shape || p.view != q.view) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " registered global shape ",
            ShapeString(q.global_shape), " (view ", q.view, ") but rank ", r.world_rank,
            " registered ", ShapeString(p.global_shape), " (view ", p.view,
            "); every rank must register the same parameters with the same global shapes"));
      }
      if ((p.custom_owner >= 0) != (q.custom_owner >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " and rank ", r.world_rank,
            " registered it differently (one on the custom path, one with a layout)"));
      }
      if (p.zero2 != q.zero2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " and rank ", r.world_rank,
            " registered it with different replicated modes"));
      }
      if (p.custom_owner != q.custom_owner) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': assign_fn chose rank ", q.custom_owner, " on rank ", qr,
            " but rank ", p.custom_owner, " on rank ", r.world_rank,
            "; it must give the same owner on every rank"));
      }
      if (p.lr_scale != q.lr_scale || p.weight_decay_scale != q.weight_decay_scale) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " registered it with lr_scale ", q.lr_scale,
            " and weight_decay_scale ", q.weight_decay_scale, ", rank ", r.world_rank, " with ",
            p.lr_scale, " and ", p.weight_decay_scale, "; every holder must give the same"));
      }
      if (p.split != q.split) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " registered it with split_sizes (",
            SplitString(q.split), "), rank ", r.world_rank, " with (", SplitString(p.split),
            "); every holder must give the same"));
      }
      if (p.param_dtype != q.param_dtype || p.state_dtype != q.state_dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': ranks ", qr, " and ", r.world_rank,
            " registered it with different dtypes (or momentum_fp32 settings)"));
      }
    }
  }
  // ZeRO-2 parameters move over their own group: every member of a holder's
  // group must hold them too (so every member runs the same blocks). Each
  // table's ZeRO-2 names in a set, so that each check is one lookup.
  std::vector<absl::flat_hash_set<absl::string_view>> zero2_names(tables.size());
  std::vector<bool> has_custom(tables.size(), false);
  for (size_t t = 0; t < tables.size(); ++t) {
    for (const RankParamDesc& d : *tables[t]) {
      if (d.zero2) zero2_names[t].insert(d.name);
      if (d.custom_owner >= 0) has_custom[t] = true;
    }
  }
  // The custom-path parameters' holders (world rank, index among that rank's
  // parameters), in rank order.
  absl::flat_hash_map<absl::string_view, std::vector<std::pair<int, int>>> custom_holders;
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (!has_custom[table_of[k]]) continue;
    const Desc& r = ranks[k];
    for (size_t i = 0; i < ParamsOf(r).size(); ++i) {
      const RankParamDesc& d = ParamsOf(r)[i];
      if (d.custom_owner >= 0) {
        custom_holders[d.name].push_back({r.world_rank, static_cast<int>(i)});
      }
    }
  }
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (zero2_names[table_of[k]].empty()) continue;
    const Desc& r = ranks[k];
    for (const RankParamDesc& d : ParamsOf(r)) {
      if (!d.zero2) continue;
      const auto& members = r.groups[d.layout.placements[0].group];
      for (int m : members) {
        if (!zero2_names[table_of[m]].contains(d.name)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "param '", d.name, "': registered in ZeRO-2 mode over a group with rank ", m,
              " (by rank ", r.world_rank, "), but rank ", m, " did not register it that way"));
        }
      }
    }
  }
  // The matrices with elements the job declares, in name order: each one
  // costs the plan (and the steps) work, so their number is bounded before
  // any is planned (an empty matrix costs nothing, however many there are).
  int64_t declared = 0;
  int64_t all_matrices = 0;  // empty ones too: the stats count them
  for (const auto& [name, who] : first) {
    const RankParamDesc& cd = *who.second;
    const std::string param = absl::StrCat("param '", name, "'");
    // A custom-path parameter is one matrix, its global shape rows x cols.
    MUON_ASSIGN_OR_RETURN(
        const MatrixShape m,
        ViewAsMatrices(cd.global_shape,
                       cd.custom_owner >= 0 ? static_cast<int>(MatrixView::k2D) : cd.view, param));
    MUON_RETURN_IF_ERROR(CheckDeclaredMatrices(m, cd.global_shape, param));
    MUON_RETURN_IF_ERROR(CheckBlockSplit(cd.split, m.rows, m.cols, param));
    if (m.batch > kMaxJobAllMatrices - all_matrices) {
      return absl::InvalidArgumentError(absl::StrCat(
          param, ": with its ", m.batch, " matrices the job declares more than ",
          kMaxJobAllMatrices, " matrices, empty ones included (parameters in name order); "
          "register fewer"));
    }
    all_matrices += m.batch;
    declared += m.with_elements();
    if (declared > kMaxJobMatrices) {
      return absl::InvalidArgumentError(absl::StrCat(
          param, ": with its ", m.with_elements(), " matrices the job declares ", declared,
          " matrices with elements (parameters in name order), more than the ", kMaxJobMatrices,
          " one job may declare (the first step plans each one on every rank); register fewer, "
          "larger matrices"));
    }
    if (cd.zero2) {
      plan.zero2_matrices += m.batch;
      continue;
    }
    if (cd.custom_owner >= 0) {
      CustomUnit cu;
      cu.name = name;
      cu.owner = cd.custom_owner;
      cu.rows = m.rows;
      cu.cols = m.cols;
      cu.split = cd.split;
      cu.flops = SplitNewtonSchulzFlops(options.ns, cu.split, cu.rows, cu.cols);
      std::vector<int> holders;
      for (const auto& [rank, i] : custom_holders[name]) {
        holders.push_back(rank);
        if (rank == my_rank) cu.local = i;
      }
      if (std::find(holders.begin(), holders.end(), cu.owner) == holders.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", name, "': assign_fn chose rank ", cu.owner,
            ", which did not register it (holders: ", absl::StrJoin(holders, ", "), ")"));
      }
      plan.custom.push_back(std::move(cu));
      continue;
    }
    PlanParam pp;
    pp.name = name;
    pp.state_dtype = cd.state_dtype;
    pp.batch = m.batch;
    pp.rows = m.rows;
    pp.cols = m.cols;
    pp.split = cd.split;
    plan.empty_matrices += m.batch - m.with_elements();
    index[name] = static_cast<int>(plan.params.size());
    plan.params.push_back(std::move(pp));
  }
  // Each table's entries' parameters (-1: custom path or ZeRO-2), looked up
  // by name once per table.
  std::vector<std::vector<int>> param_of(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    param_of[t].reserve(tables[t]->size());
    for (const RankParamDesc& d : *tables[t]) {
      param_of[t].push_back(d.custom_owner >= 0 || d.zero2 ? -1 : index.at(d.name));
    }
  }
  // Each parameter's holders, counted first so that its arrays are made at
  // their size: one Holder, and (from boxes, the usual case) one block per
  // holder.
  {
    std::vector<int64_t> uses(tables.size(), 0);  // ranks with each table
    for (int t : table_of) ++uses[t];
    std::vector<int64_t> holders(plan.params.size(), 0);
    for (size_t t = 0; t < tables.size(); ++t) {
      for (int slot : param_of[t]) {
        if (slot >= 0) holders[slot] += uses[t];
      }
    }
    for (size_t p = 0; p < plan.params.size(); ++p) {
      plan.params[p].holders.reserve(static_cast<size_t>(holders[p]));
      plan.params[p].blocks.reserve(static_cast<size_t>(holders[p]));
    }
  }
  for (size_t k = 0; k < ranks.size(); ++k) {
    const Desc& r = ranks[k];
    std::vector<int> sizes, coords;
    for (const auto& members : r.groups) {
      sizes.push_back(static_cast<int>(members.size()));
      coords.push_back(static_cast<int>(
          std::find(members.begin(), members.end(), r.world_rank) - members.begin()));
    }
    const std::vector<int>& slots = param_of[table_of[k]];
    for (size_t i = 0; i < ParamsOf(r).size(); ++i) {
      if (slots[i] < 0) continue;
      const RankParamDesc& d = ParamsOf(r)[i];
      PlanParam& pp = plan.params[slots[i]];
      auto piece = HolderPiece(d, r.world_rank, sizes, coords, options.pieces_row_by_row);
      if (!piece.ok()) return piece.status();
      if (options.pieces_row_by_row) piece->blocks = ToBlocks(piece->runs);
      if (r.world_rank == my_rank) {
        pp.local = static_cast<int>(i);
        pp.local_holder = static_cast<int>(pp.holders.size());
      }
      Holder h;
      h.rank = r.world_rank;
      h.canonical = piece->canonical;
      if (!pp.holders.empty() && pp.Shape(pp.holders.back()) == piece->shape) {
        h.shape_at = pp.holders.back().shape_at;
      } else {
        h.shape_at = static_cast<int64_t>(pp.shapes.size());
        pp.shapes.push_back(static_cast<int64_t>(piece->shape.size()));
        pp.shapes.insert(pp.shapes.end(), piece->shape.begin(), piece->shape.end());
      }
      h.first_block = static_cast<int64_t>(pp.blocks.size());
      h.num_blocks = static_cast<int64_t>(piece->blocks.size());
      pp.holders.push_back(h);
      pp.blocks.insert(pp.blocks.end(), piece->blocks.begin(), piece->blocks.end());
    }
  }
  for (PlanParam& pp : plan.params) {
    pp.blocks.shrink_to_fit();  // more than one block per holder (batches, flat ranges)
    pp.shapes.shrink_to_fit();
    std::vector<PieceBlocks> pieces;
    pieces.reserve(pp.holders.size());
    for (const Holder& h : pp.holders) pieces.push_back({pp.Blocks(h), h.canonical});
    std::vector<int> who;
    for (const Holder& h : pp.holders) who.push_back(h.rank);
    auto tiled = CheckTilingBlocks(pieces, pp.batch * pp.rows * pp.cols,
                                   absl::StrCat("param '", pp.name, "' (registered on ranks ",
                                                absl::StrJoin(who, ", "), ")"));
    if (!tiled.ok()) return tiled;
  }

  // 3. Units (one per matrix with elements: an empty one has nothing to
  // orthogonalize or move), their holders, and the assignment.
  std::vector<MatrixInfo> infos;
  for (size_t pi = 0; pi < plan.params.size(); ++pi) {
    const PlanParam& pp = plan.params[pi];
    const int64_t per = pp.rows * pp.cols;
    if (per == 0) continue;
    // The matrices in order: each holder's blocks are walked once.
    std::vector<BlockCursor> cursors;
    cursors.reserve(pp.holders.size());
    for (const Holder& h : pp.holders) cursors.emplace_back(pp.Blocks(h));
    for (int64_t k = 0; k < pp.batch; ++k) {
      Unit u;
      u.param = static_cast<int>(pi);
      u.index = k;
      u.flops = SplitNewtonSchulzFlops(options.ns, pp.split, pp.rows, pp.cols);
      MatrixInfo info{&pp.name, k, pp.rows, pp.cols, u.flops, {}};
      info.whole_only = !pp.split.none();
      for (size_t h = 0; h < pp.holders.size(); ++h) {
        if (!cursors[h].Meets(k * per, (k + 1) * per)) continue;
        u.receivers.push_back(static_cast<int>(h));
        if (pp.holders[h].canonical) u.senders.push_back(static_cast<int>(h));
        info.holders.push_back(pp.holders[h].rank);
      }
      plan.units.push_back(std::move(u));
      infos.push_back(std::move(info));
    }
  }
  std::vector<int> owners;
  std::vector<SplitChoice> splits;
  switch (options.assignment) {
    case Assignment::kBalanced:
      owners = AssignBalanced(infos);
      break;
    case Assignment::kRoundRobin:
      owners = AssignRoundRobin(infos);
      break;
    case Assignment::kSpread:
      owners = AssignSpread(infos);
      break;
    case Assignment::kSplit:
      owners = AssignSpread(infos);
      splits = ChooseSplits(infos, &owners, options.ns.steps);
      break;
    case Assignment::kCustom: {
      owners.assign(infos.size(), -1);
      auto st = options.custom(infos, &owners);
      if (!st.ok()) return st;
      for (size_t i = 0; i < infos.size(); ++i) {
        const auto& h = infos[i].holders;
        if (std::find(h.begin(), h.end(), owners[i]) == h.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "custom assignment: matrix ", infos[i].index, " of param '", *infos[i].param_name,
              "' was given to rank ", owners[i], ", which holds no piece of it (holders: ",
              absl::StrJoin(h, ", "), ")"));
        }
      }
      break;
    }
  }

  // 4. Rounds. Without async parallelism one matrix per round, in order;
  // otherwise each owner fills rounds up to the memory budget. Split
  // matrices come last, in a round of their own.
  std::vector<int64_t> round_of(world, 0), bytes_in(world, 0);
  std::vector<bool> split(plan.units.size(), false);
  for (const SplitChoice& c : splits) split[c.matrix] = true;
  int rounds = 0;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    Unit& u = plan.units[i];
    u.owner = owners[i];
    const PlanParam& pp = plan.params[u.param];
    if (split[i]) continue;
    if (!options.async_parallelism) {
      u.round = rounds;  // the next round
    } else {
      const int64_t b = pp.rows * pp.cols * 4;
      if (bytes_in[u.owner] > 0 && bytes_in[u.owner] + b > options.round_bytes) {
        ++round_of[u.owner];
        bytes_in[u.owner] = 0;
      }
      bytes_in[u.owner] += b;
      u.round = static_cast<int>(round_of[u.owner]);
    }
    rounds = std::max(rounds, u.round + 1);
  }
  plan.rounds = rounds;

  // Whole matrices: the wide orientation's long side.
  for (Unit& u : plan.units) {
    u.width = std::max(plan.params[u.param].rows, plan.params[u.param].cols);
  }
  // The split matrices' parts, in the last round.
  if (!splits.empty()) {
    MUON_RETURN_IF_ERROR(SplitUnits(&plan, splits, world, options.ns.steps, plan.rounds,
                                    CubicIterations(options.ns)));
    ++plan.rounds;
  }
  plan.digest = PlanDigest(plan);
  return plan;
}

}  // namespace

uint64_t PlanDigest(const Plan& plan) {
  uint64_t h = 1469598103934665603ull;
  for (const Unit& u : plan.units) {
    h = Fnv(h, plan.params[u.param].name.data(), plan.params[u.param].name.size());
    h = FnvValue(h, u.index);
    h = FnvValue(h, u.owner);
    h = FnvValue(h, u.round);
    // Whole matrices add nothing: their digest is what it was before parts.
    if (u.parts > 1) {
      h = FnvValue(h, u.part);
      h = FnvValue(h, u.parts);
      h = FnvValue(h, u.first);
      h = FnvValue(h, u.width);
    }
  }
  for (const CustomUnit& c : plan.custom) {
    h = Fnv(h, c.name.data(), c.name.size());
    h = FnvValue(h, c.owner);
  }
  return h;
}

absl::Status SplitUnits(Plan* plan, const std::vector<SplitChoice>& splits, int world,
                        int ns_steps, int round, int ns_cubic_steps) {
  std::vector<const SplitChoice*> at(plan->units.size(), nullptr);
  for (const SplitChoice& c : splits) {
    if (c.matrix >= plan->units.size()) {
      return absl::InvalidArgumentError(absl::StrCat("split: no unit ", c.matrix));
    }
    const Unit& whole = plan->units[c.matrix];
    const PlanParam& pp = plan->params[whole.param];
    const std::string what =
        absl::StrCat("splitting matrix ", whole.index, " of param '", pp.name, "'");
    const int64_t n = std::max(pp.rows, pp.cols);
    const int64_t parts = static_cast<int64_t>(c.members.size());
    if (whole.parts != 1 || at[c.matrix] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": already split"));
    }
    if (parts < 2 || parts > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " into ", parts, " parts: between 2 and ", n, " (its long side)"));
    }
    std::vector<int> sorted = c.members;
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 0; k < sorted.size(); ++k) {
      if (sorted[k] < 0 || sorted[k] >= world || (k > 0 && sorted[k] == sorted[k - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": owners must be distinct ranks of the world of ", world, " (got ",
            absl::StrJoin(c.members, ", "), ")"));
      }
    }
    at[c.matrix] = &c;
  }
  // One pass: each split unit's parts in its place.
  std::vector<Unit> units;
  units.reserve(plan->units.size() + splits.size() * 2);
  for (size_t i = 0; i < plan->units.size(); ++i) {
    Unit& whole = plan->units[i];
    if (at[i] == nullptr) {
      units.push_back(std::move(whole));
      continue;
    }
    const PlanParam& pp = plan->params[whole.param];
    const int64_t m = std::min(pp.rows, pp.cols), n = std::max(pp.rows, pp.cols);
    const int64_t parts = static_cast<int64_t>(at[i]->members.size());
    int64_t first = 0;
    for (int64_t p = 0; p < parts; ++p) {
      Unit u = whole;
      u.owner = at[i]->members[static_cast<size_t>(p)];
      if (round >= 0) u.round = round;
      u.part = static_cast<int>(p);
      u.parts = static_cast<int>(parts);
      u.first = first;
      u.width = PartWidth(n, parts, p);
      u.flops = NewtonSchulzBlockFlops(m, u.width, ns_steps, ns_cubic_steps);
      first += u.width;
      units.push_back(std::move(u));
    }
  }
  plan->units = std::move(units);
  plan->digest = PlanDigest(*plan);
  return absl::OkStatus();
}

absl::Status SplitUnit(Plan* plan, size_t unit, const std::vector<int>& owners, int world,
                       int ns_steps, int ns_cubic_steps) {
  return SplitUnits(plan, {SplitChoice{unit, owners}}, world, ns_steps, -1, ns_cubic_steps);
}

absl::StatusOr<Plan> BuildPlan(const std::vector<RankDesc>& ranks, int my_rank,
                               const PlanOptions& options) {
  return BuildPlanFrom(ranks, my_rank, options);
}

absl::StatusOr<Plan> BuildPlan(const std::vector<SharedRankDesc>& ranks, int my_rank,
                               const PlanOptions& options) {
  return BuildPlanFrom(ranks, my_rank, options);
}

}  // namespace muon
