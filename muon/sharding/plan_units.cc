#include "muon/sharding/plan_units.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "muon/common/status.h"
#include "muon/math/ns_config.h"

namespace muon {
namespace {

// Units (one per matrix with elements: an empty one has nothing to
// orthogonalize or move) and their holders, into plan->units; returns the
// same matrices as the assignment sees them.
std::vector<MatrixInfo> MakeUnits(Plan* plan, const NsConfig& ns) {
  std::vector<MatrixInfo> infos;
  for (size_t pi = 0; pi < plan->params.size(); ++pi) {
    const PlanParam& pp = plan->params[pi];
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
      u.flops = SplitNewtonSchulzFlops(ns, pp.split, pp.rows, pp.cols);
      MatrixInfo info{&pp.name, k, pp.rows, pp.cols, u.flops, {}};
      info.whole_only = !pp.split.none();
      for (size_t h = 0; h < pp.holders.size(); ++h) {
        if (!cursors[h].Meets(k * per, (k + 1) * per)) continue;
        u.receivers.push_back(static_cast<int>(h));
        if (pp.holders[h].canonical) u.senders.push_back(static_cast<int>(h));
        info.holders.push_back(pp.holders[h].rank);
      }
      plan->units.push_back(std::move(u));
      infos.push_back(std::move(info));
    }
  }
  return infos;
}

// The owners a custom assignment chose, each checked to hold a piece of its
// matrix.
absl::Status AssignCustom(const std::vector<MatrixInfo>& infos, const CustomAssignFn& custom,
                          std::vector<int>* owners) {
  owners->assign(infos.size(), -1);
  auto st = custom(infos, owners);
  if (!st.ok()) return st;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto& h = infos[i].holders;
    if (std::find(h.begin(), h.end(), (*owners)[i]) == h.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "custom assignment: matrix ", infos[i].index, " of param '", *infos[i].param_name,
          "' was given to rank ", (*owners)[i], ", which holds no piece of it (holders: ",
          absl::StrJoin(h, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// Each matrix's owner, by options.assignment, and (Assignment::kSplit) the
// matrices split over ranks.
absl::Status AssignOwners(const std::vector<MatrixInfo>& infos, const PlanOptions& options,
                          std::vector<int>* owners, std::vector<SplitChoice>* splits) {
  switch (options.assignment) {
    case Assignment::kBalanced:
      *owners = AssignBalanced(infos);
      break;
    case Assignment::kRoundRobin:
      *owners = AssignRoundRobin(infos);
      break;
    case Assignment::kSpread:
      *owners = AssignSpread(infos);
      break;
    case Assignment::kSplit:
      *owners = AssignSpread(infos);
      *splits = ChooseSplits(infos, owners, options.ns);
      break;
    case Assignment::kCustom:
      return AssignCustom(infos, options.custom, owners);
  }
  return absl::OkStatus();
}

// Rounds. Without async parallelism one matrix per round, in order;
// otherwise each owner fills rounds up to the memory budget. Split matrices
// are left out here: they come last, in a round of their own.
void AssignRounds(Plan* plan, const std::vector<int>& owners,
                  const std::vector<SplitChoice>& splits, int world, const PlanOptions& options) {
  std::vector<int64_t> round_of(world, 0), bytes_in(world, 0);
  std::vector<bool> split(plan->units.size(), false);
  for (const SplitChoice& c : splits) split[c.matrix] = true;
  int rounds = 0;
  for (size_t i = 0; i < plan->units.size(); ++i) {
    Unit& u = plan->units[i];
    u.owner = owners[i];
    const PlanParam& pp = plan->params[u.param];
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
  plan->rounds = rounds;
}

}  // namespace

absl::Status AssignUnits(Plan* plan, int world, const PlanOptions& options) {
  const std::vector<MatrixInfo> infos = MakeUnits(plan, options.ns);
  std::vector<int> owners;
  std::vector<SplitChoice> splits;
  MUON_RETURN_IF_ERROR(AssignOwners(infos, options, &owners, &splits));
  AssignRounds(plan, owners, splits, world, options);
  // Whole matrices: the wide orientation's long side.
  for (Unit& u : plan->units) {
    u.width = std::max(plan->params[u.param].rows, plan->params[u.param].cols);
  }
  // The split matrices' parts, in the last round.
  if (!splits.empty()) {
    MUON_RETURN_IF_ERROR(SplitUnits(plan, splits, world, options.ns.steps, plan->rounds,
                                    CubicIterations(options.ns)));
    ++plan->rounds;
    // Each part's cost under the whole config (Gram Newton-Schulz's where it
    // runs), as muon_stats_t.ns_flops counts it.
    for (Unit& u : plan->units) {
      if (u.parts <= 1) continue;
      const PlanParam& pp = plan->params[static_cast<size_t>(u.param)];
      u.flops = NewtonSchulzBlockFlops(options.ns, std::min(pp.rows, pp.cols), u.width,
                                       std::max(pp.rows, pp.cols));
    }
  }
  return absl::OkStatus();
}

}  // namespace muon
