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
#include "muon/sharding/plan_units.h"

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

// 1. Groups: every member of a rank's group must see the same member list.
template <typename Desc>
absl::Status CheckGroups(const std::vector<Desc>& ranks) {
  const int world = static_cast<int>(ranks.size());
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
  return absl::OkStatus();
}

// Parameter `p` as rank `rank` registered it, against its first
// registration `q` (by rank `qr`): every holder must give the same.
absl::Status CheckSameRegistration(const RankParamDesc& p, int rank, const RankParamDesc& q,
                                   int qr) {
  if (p.global_shape != q.global_shape || p.view != q.view) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': rank ", qr, " registered global shape ",
        ShapeString(q.global_shape), " (view ", q.view, ") but rank ", rank, " registered ",
        ShapeString(p.global_shape), " (view ", p.view,
        "); every rank must register the same parameters with the same global shapes"));
  }
  if ((p.custom_owner >= 0) != (q.custom_owner >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': rank ", qr, " and rank ", rank,
        " registered it differently (one on the custom path, one with a layout)"));
  }
  if (p.zero2 != q.zero2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': rank ", qr, " and rank ", rank,
        " registered it with different replicated modes"));
  }
  if (p.custom_owner != q.custom_owner) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': assign_fn chose rank ", q.custom_owner, " on rank ", qr,
        " but rank ", p.custom_owner, " on rank ", rank,
        "; it must give the same owner on every rank"));
  }
  if (p.lr_scale != q.lr_scale || p.weight_decay_scale != q.weight_decay_scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': rank ", qr, " registered it with lr_scale ", q.lr_scale,
        " and weight_decay_scale ", q.weight_decay_scale, ", rank ", rank, " with ",
        p.lr_scale, " and ", p.weight_decay_scale, "; every holder must give the same"));
  }
  if (p.split != q.split) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': rank ", qr, " registered it with split_sizes (",
        SplitString(q.split), "), rank ", rank, " with (", SplitString(p.split),
        "); every holder must give the same"));
  }
  if (p.param_dtype != q.param_dtype || p.state_dtype != q.state_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': ranks ", qr, " and ", rank,
        " registered it with different dtypes (or momentum_fp32 settings)"));
  }
  return absl::OkStatus();
}

// The number of matrices the job declares so far: each one costs the plan
// (and the steps) work, so their number is bounded before any is planned (an
// empty matrix costs nothing, however many there are).
struct DeclaredMatrices {
  int64_t with_elements = 0;
  int64_t all = 0;  // empty ones too: the stats count them

  // Counts `m`, parameter `param`'s matrices (parameters in name order).
  absl::Status Add(const MatrixShape& m, const std::string& param) {
    if (m.batch > kMaxJobAllMatrices - all) {
      return absl::InvalidArgumentError(absl::StrCat(
          param, ": with its ", m.batch, " matrices the job declares more than ",
          kMaxJobAllMatrices, " matrices, empty ones included (parameters in name order); "
          "register fewer"));
    }
    all += m.batch;
    with_elements += m.with_elements();
    if (with_elements > kMaxJobMatrices) {
      return absl::InvalidArgumentError(absl::StrCat(
          param, ": with its ", m.with_elements(), " matrices the job declares ", with_elements,
          " matrices with elements (parameters in name order), more than the ", kMaxJobMatrices,
          " one job may declare (the first step plans each one on every rank); register fewer, "
          "larger matrices"));
    }
    return absl::OkStatus();
  }
};

// A custom-path parameter's unit: one matrix `m`, on the owner assign_fn
// chose, which must hold it. `holders`: (world rank, index among that rank's
// parameters), in rank order.
absl::StatusOr<CustomUnit> CustomUnitOf(const std::string& name, const RankParamDesc& cd,
                                        const MatrixShape& m,
                                        const std::vector<std::pair<int, int>>& holders,
                                        int my_rank, const NsConfig& ns) {
  CustomUnit cu;
  cu.name = name;
  cu.owner = cd.custom_owner;
  cu.rows = m.rows;
  cu.cols = m.cols;
  cu.split = cd.split;
  cu.flops = SplitNewtonSchulzFlops(ns, cu.split, cu.rows, cu.cols);
  std::vector<int> ranks;
  for (const auto& [rank, i] : holders) {
    ranks.push_back(rank);
    if (rank == my_rank) cu.local = i;
  }
  if (std::find(ranks.begin(), ranks.end(), cu.owner) == ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': assign_fn chose rank ", cu.owner,
        ", which did not register it (holders: ", absl::StrJoin(ranks, ", "), ")"));
  }
  return cu;
}

// A holder of `pp` with piece `piece`, its blocks and (unless the same as
// the previous holder's) its shape appended to the parameter's flat arrays.
void AddHolder(PlanParam& pp, int rank, const Piece& piece) {
  Holder h;
  h.rank = rank;
  h.canonical = piece.canonical;
  if (!pp.holders.empty() && pp.Shape(pp.holders.back()) == piece.shape) {
    h.shape_at = pp.holders.back().shape_at;
  } else {
    h.shape_at = static_cast<int64_t>(pp.shapes.size());
    pp.shapes.push_back(static_cast<int64_t>(piece.shape.size()));
    pp.shapes.insert(pp.shapes.end(), piece.shape.begin(), piece.shape.end());
  }
  h.first_block = static_cast<int64_t>(pp.blocks.size());
  h.num_blocks = static_cast<int64_t>(piece.blocks.size());
  pp.holders.push_back(h);
  pp.blocks.insert(pp.blocks.end(), piece.blocks.begin(), piece.blocks.end());
}

// Every parameter's holders' pieces tile its elements exactly.
absl::Status CheckHoldersTile(Plan& plan) {
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
  return absl::OkStatus();
}

// BuildPlan over either form of the descriptions (the same code, hence the
// same plan and errors), phase by phase (Build): each phase leaves what the
// later ones read in the builder's members.
template <typename Desc>
class PlanBuilder {
 public:
  PlanBuilder(const std::vector<Desc>& ranks, int my_rank, const PlanOptions& options)
      : ranks_(ranks), my_rank_(my_rank), options_(options) {}

  absl::StatusOr<Plan> Build() {
    MUON_RETURN_IF_ERROR(CheckGroups(ranks_));
    // 2. Parameters by name, with each holder's piece.
    FindTables();
    MUON_RETURN_IF_ERROR(CompareRegistrations());
    FindZero2AndCustom();
    MUON_RETURN_IF_ERROR(CheckZero2Groups());
    MUON_RETURN_IF_ERROR(DeclareParams());
    IndexTables();
    MUON_RETURN_IF_ERROR(AddHolders());
    MUON_RETURN_IF_ERROR(CheckHoldersTile(plan_));
    // 3. and 4.: units, their owners, their rounds.
    MUON_RETURN_IF_ERROR(AssignUnits(&plan_, static_cast<int>(ranks_.size()), options_));
    plan_.digest = PlanDigest(plan_);
    return std::move(plan_);
  }

 private:
  // The distinct tables, in the order of their first rank, and each rank's.
  void FindTables() {
    table_of_.resize(ranks_.size());
    absl::flat_hash_map<const void*, int> ids;
    for (size_t k = 0; k < ranks_.size(); ++k) {
      const auto [it, added] =
          ids.try_emplace(TableKey(ranks_[k]), static_cast<int>(tables_.size()));
      if (added) tables_.push_back(&ParamsOf(ranks_[k]));
      table_of_[k] = it->second;
    }
  }

  // Each table against the first registrations (first_). A table is
  // compared once: on a later rank with the same table every entry meets the
  // same first registration (or is it) and passes as it did.
  absl::Status CompareRegistrations() {
    std::vector<bool> compared(tables_.size(), false);
    for (size_t k = 0; k < ranks_.size(); ++k) {
      const Desc& r = ranks_[k];
      if (compared[table_of_[k]]) continue;
      compared[table_of_[k]] = true;
      for (const RankParamDesc& p : ParamsOf(r)) {
        auto it = first_.find(p.name);
        if (it == first_.end()) {
          first_[p.name] = {r.world_rank, &p};
          continue;
        }
        MUON_RETURN_IF_ERROR(
            CheckSameRegistration(p, r.world_rank, *it->second.second, it->second.first));
      }
    }
    return absl::OkStatus();
  }

  // Each table's ZeRO-2 names in a set (so that each check is one lookup)
  // and whether it has custom-path entries; the custom-path parameters'
  // holders (world rank, index among that rank's parameters), in rank order.
  void FindZero2AndCustom() {
    zero2_names_.resize(tables_.size());
    std::vector<bool> has_custom(tables_.size(), false);
    for (size_t t = 0; t < tables_.size(); ++t) {
      for (const RankParamDesc& d : *tables_[t]) {
        if (d.zero2) zero2_names_[t].insert(d.name);
        if (d.custom_owner >= 0) has_custom[t] = true;
      }
    }
    for (size_t k = 0; k < ranks_.size(); ++k) {
      if (!has_custom[table_of_[k]]) continue;
      const Desc& r = ranks_[k];
      for (size_t i = 0; i < ParamsOf(r).size(); ++i) {
        const RankParamDesc& d = ParamsOf(r)[i];
        if (d.custom_owner >= 0) {
          custom_holders_[d.name].push_back({r.world_rank, static_cast<int>(i)});
        }
      }
    }
  }

  // ZeRO-2 parameters move over their own group: every member of a holder's
  // group must hold them too (so every member runs the same blocks).
  absl::Status CheckZero2Groups() const {
    for (size_t k = 0; k < ranks_.size(); ++k) {
      if (zero2_names_[table_of_[k]].empty()) continue;
      const Desc& r = ranks_[k];
      for (const RankParamDesc& d : ParamsOf(r)) {
        if (!d.zero2) continue;
        const auto& members = r.groups[d.layout.placements[0].group];
        for (int m : members) {
          if (!zero2_names_[table_of_[m]].contains(d.name)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "param '", d.name, "': registered in ZeRO-2 mode over a group with rank ", m,
                " (by rank ", r.world_rank, "), but rank ", m, " did not register it that way"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  // The matrices with elements the job declares, in name order, counted
  // (DeclaredMatrices); each parameter into the plan: a ZeRO-2 one's count,
  // a custom-path one's unit, the others' PlanParam (index_: its slot).
  absl::Status DeclareParams() {
    DeclaredMatrices declared;
    for (const auto& [name, who] : first_) {
      const RankParamDesc& cd = *who.second;
      const std::string param = absl::StrCat("param '", name, "'");
      // A custom-path parameter is one matrix, its global shape rows x cols.
      MUON_ASSIGN_OR_RETURN(
          const MatrixShape m,
          ViewAsMatrices(cd.global_shape,
                         cd.custom_owner >= 0 ? static_cast<int>(MatrixView::k2D) : cd.view,
                         param));
      MUON_RETURN_IF_ERROR(CheckDeclaredMatrices(m, cd.global_shape, param));
      MUON_RETURN_IF_ERROR(CheckBlockSplit(cd.split, m.rows, m.cols, param));
      MUON_RETURN_IF_ERROR(declared.Add(m, param));
      if (cd.zero2) {
        plan_.zero2_matrices += m.batch;
        continue;
      }
      if (cd.custom_owner >= 0) {
        MUON_ASSIGN_OR_RETURN(
            CustomUnit cu, CustomUnitOf(name, cd, m, custom_holders_[name], my_rank_, options_.ns));
        plan_.custom.push_back(std::move(cu));
        continue;
      }
      PlanParam pp;
      pp.name = name;
      pp.state_dtype = cd.state_dtype;
      pp.batch = m.batch;
      pp.rows = m.rows;
      pp.cols = m.cols;
      pp.split = cd.split;
      plan_.empty_matrices += m.batch - m.with_elements();
      index_[name] = static_cast<int>(plan_.params.size());
      plan_.params.push_back(std::move(pp));
    }
    return absl::OkStatus();
  }

  // Each table's entries' parameters (-1: custom path or ZeRO-2), looked up
  // by name once per table; each parameter's holders counted, so that its
  // arrays are made at their size: one Holder, and (from boxes, the usual
  // case) one block per holder.
  void IndexTables() {
    param_of_.resize(tables_.size());
    for (size_t t = 0; t < tables_.size(); ++t) {
      param_of_[t].reserve(tables_[t]->size());
      for (const RankParamDesc& d : *tables_[t]) {
        param_of_[t].push_back(d.custom_owner >= 0 || d.zero2 ? -1 : index_.at(d.name));
      }
    }
    std::vector<int64_t> uses(tables_.size(), 0);  // ranks with each table
    for (int t : table_of_) ++uses[t];
    std::vector<int64_t> holders(plan_.params.size(), 0);
    for (size_t t = 0; t < tables_.size(); ++t) {
      for (int slot : param_of_[t]) {
        if (slot >= 0) holders[slot] += uses[t];
      }
    }
    for (size_t p = 0; p < plan_.params.size(); ++p) {
      plan_.params[p].holders.reserve(static_cast<size_t>(holders[p]));
      plan_.params[p].blocks.reserve(static_cast<size_t>(holders[p]));
    }
  }

  // Each rank's piece of each parameter it holds, in rank order.
  absl::Status AddHolders() {
    for (size_t k = 0; k < ranks_.size(); ++k) {
      const Desc& r = ranks_[k];
      std::vector<int> sizes, coords;
      for (const auto& members : r.groups) {
        sizes.push_back(static_cast<int>(members.size()));
        coords.push_back(static_cast<int>(
            std::find(members.begin(), members.end(), r.world_rank) - members.begin()));
      }
      const std::vector<int>& slots = param_of_[table_of_[k]];
      for (size_t i = 0; i < ParamsOf(r).size(); ++i) {
        if (slots[i] < 0) continue;
        PlanParam& pp = plan_.params[slots[i]];
        auto piece =
            HolderPiece(ParamsOf(r)[i], r.world_rank, sizes, coords, options_.pieces_row_by_row);
        if (!piece.ok()) return piece.status();
        if (options_.pieces_row_by_row) piece->blocks = ToBlocks(piece->runs);
        if (r.world_rank == my_rank_) {
          pp.local = static_cast<int>(i);
          pp.local_holder = static_cast<int>(pp.holders.size());
        }
        AddHolder(pp, r.world_rank, *piece);
      }
    }
    return absl::OkStatus();
  }

  const std::vector<Desc>& ranks_;
  const int my_rank_;
  const PlanOptions& options_;
  Plan plan_;
  std::vector<const std::vector<RankParamDesc>*> tables_;
  std::vector<int> table_of_;  // per rank: its table
  // Per parameter name: who registered it first (world rank, entry).
  std::map<std::string, std::pair<int, const RankParamDesc*>> first_;
  std::vector<absl::flat_hash_set<absl::string_view>> zero2_names_;  // per table
  absl::flat_hash_map<absl::string_view, std::vector<std::pair<int, int>>> custom_holders_;
  std::map<std::string, int> index_;        // per layout-path parameter: its slot in the plan
  std::vector<std::vector<int>> param_of_;  // per table, per entry: its slot, or -1
};

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
  return PlanBuilder<RankDesc>(ranks, my_rank, options).Build();
}

absl::StatusOr<Plan> BuildPlan(const std::vector<SharedRankDesc>& ranks, int my_rank,
                               const PlanOptions& options) {
  return PlanBuilder<SharedRankDesc>(ranks, my_rank, options).Build();
}

}  // namespace muon
