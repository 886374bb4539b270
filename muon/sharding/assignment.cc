#include "muon/sharding/assignment.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <numeric>
#include <set>
#include <utility>


namespace muon {

std::vector<int> AssignRoundRobin(const std::vector<MatrixInfo>& matrices) {
  std::vector<int> owners(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const auto& h = matrices[i].holders;
    owners[i] = h[i % h.size()];
  }
  return owners;
}

std::vector<int> AssignBalanced(const std::vector<MatrixInfo>& matrices) {
  std::vector<size_t> order(matrices.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return matrices[a].ns_flops > matrices[b].ns_flops;
  });
  std::map<int, double> load;
  std::vector<int> owners(matrices.size());
  for (size_t i : order) {
    int best = -1;
    double best_load = 0;
    for (int r : matrices[i].holders) {  // ascending: ties go to the lower rank
      const double l = load[r];
      if (best < 0 || l < best_load) {
        best = r;
        best_load = l;
      }
    }
    owners[i] = best;
    load[best] += matrices[i].ns_flops;
  }
  return owners;
}

namespace {

int Root(std::vector<int>& parent, int r) {
  while (parent[r] != r) {
    parent[r] = parent[parent[r]];
    r = parent[r];
  }
  return r;
}

// The groups of ranks that matrices join (ranks holding pieces of one matrix
// are joined), each as its ranks in ascending order, by root; `top` gets the
// highest rank that holds anything (-1 when none).
std::map<int, std::vector<int>> Groups(const std::vector<MatrixInfo>& matrices, int* top) {
  *top = -1;
  for (const MatrixInfo& m : matrices) {
    for (int r : m.holders) *top = std::max(*top, r);
  }
  std::map<int, std::vector<int>> groups;
  if (*top < 0) return groups;
  std::vector<int> parent(*top + 1);
  std::iota(parent.begin(), parent.end(), 0);
  std::vector<bool> holds(*top + 1, false);
  for (const MatrixInfo& m : matrices) {
    for (int r : m.holders) {
      holds[r] = true;
      parent[Root(parent, r)] = Root(parent, m.holders.front());
    }
  }
  for (int r = 0; r <= *top; ++r) {
    if (holds[r]) groups[Root(parent, r)].push_back(r);
  }
  return groups;
}

using Owned = std::vector<std::set<std::pair<double, size_t>>>;  // per rank: (cost, matrix)

// Levels one group of ranks: while its busiest rank is above `level` and a
// move lowers it, the busiest rank's matrix whose cost is closest to half
// the gap to the least-loaded rank (among those smaller than the gap) moves
// there. Only the matrices in `owned` move.
void Level(const std::vector<int>& ranks, double level, size_t max_moves,
           std::vector<double>* load, Owned* owned, std::vector<int>* owners) {
  std::set<std::pair<double, int>> by_load;  // (load, rank)
  for (int r : ranks) by_load.insert({(*load)[r], r});
  // Each move lowers the sum of squared loads, so this ends; the bound on
  // the moves is a second guard.
  for (size_t moves = 0; moves < max_moves; ++moves) {
    const auto [high, busiest] = *by_load.rbegin();
    const auto [low, idlest] = *by_load.begin();
    if (high <= level) break;
    const double gap = high - low, half = gap / 2;
    std::set<std::pair<double, size_t>>& mine = (*owned)[busiest];
    const auto at = mine.lower_bound({half, 0});
    std::set<std::pair<double, size_t>>::const_iterator pick = mine.end();
    auto consider = [&](std::set<std::pair<double, size_t>>::const_iterator c) {
      if (c == mine.end() || c->first <= 0 || c->first >= gap) return;
      if (pick == mine.end() || std::abs(c->first - half) < std::abs(pick->first - half)) {
        pick = c;
      }
    };
    consider(at);
    if (at != mine.begin()) consider(std::prev(at));
    if (pick == mine.end()) break;  // no move lowers the busiest rank
    const auto [cost, matrix] = *pick;
    mine.erase(pick);
    (*owned)[idlest].insert({cost, matrix});
    (*owners)[matrix] = idlest;
    by_load.erase(std::prev(by_load.end()));
    by_load.erase(by_load.begin());
    (*load)[busiest] -= cost;
    (*load)[idlest] += cost;
    by_load.insert({(*load)[busiest], busiest});
    by_load.insert({(*load)[idlest], idlest});
  }
}

// The loads and owned sets of `owners`, ranks 0..top.
void Loads(const std::vector<MatrixInfo>& matrices, const std::vector<int>& owners, int top,
           std::vector<double>* load, Owned* owned) {
  load->assign(top + 1, 0);
  owned->assign(top + 1, {});
  for (size_t i = 0; i < matrices.size(); ++i) {
    (*load)[owners[i]] += matrices[i].ns_flops;
    (*owned)[owners[i]].insert({matrices[i].ns_flops, i});
  }
}

double Total(const std::vector<int>& ranks, const std::vector<double>& load) {
  double total = 0;
  for (int r : ranks) total += load[r];
  return total;
}

}  // namespace

std::vector<int> AssignSpread(const std::vector<MatrixInfo>& matrices) {
  std::vector<int> owners = AssignBalanced(matrices);
  int top = -1;
  const std::map<int, std::vector<int>> groups = Groups(matrices, &top);
  if (top < 1) return owners;
  std::vector<double> load;
  Owned owned;
  Loads(matrices, owners, top, &load, &owned);
  for (const auto& [root, ranks] : groups) {
    if (ranks.size() < 2) continue;
    const double level = kSpreadLevel * Total(ranks, load) / static_cast<double>(ranks.size());
    Level(ranks, level, matrices.size(), &load, &owned, &owners);
  }
  return owners;
}

std::vector<SplitChoice> ChooseSplits(const std::vector<MatrixInfo>& matrices,
                                      std::vector<int>* owners, const NsConfig& ns) {
  std::vector<SplitChoice> splits;
  int top = -1;
  const std::map<int, std::vector<int>> groups = Groups(matrices, &top);
  if (top < 1) return splits;
  std::vector<double> load;
  Owned owned;
  Loads(matrices, *owners, top, &load, &owned);
  // Each group's matrices, costliest first.
  std::vector<int> group_of(top + 1, -1);
  std::vector<const std::vector<int>*> group_ranks;
  for (const auto& [root, ranks] : groups) {
    for (int r : ranks) group_of[r] = static_cast<int>(group_ranks.size());
    group_ranks.push_back(&ranks);
  }
  std::vector<std::vector<size_t>> by_cost(group_ranks.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    if (!matrices[i].holders.empty()) by_cost[group_of[matrices[i].holders.front()]].push_back(i);
  }
  std::vector<bool> member(top + 1, false);  // in a split already
  for (size_t gi = 0; gi < group_ranks.size(); ++gi) {
    const std::vector<int>& ranks = *group_ranks[gi];
    std::vector<size_t>& order = by_cost[gi];
    if (ranks.size() < 2 ||
        order.size() < kSplitMinMatricesPerRank * ranks.size()) {
      continue;
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return matrices[a].ns_flops > matrices[b].ns_flops;
    });
    bool split_any = false;
    for (size_t matrix : order) {
      // Only a matrix that alone costs more than the level: the others the
      // moves between whole owners level.
      const double cost = matrices[matrix].ns_flops;
      const double mean = Total(ranks, load) / static_cast<double>(ranks.size());
      if (cost <= kSpreadLevel * mean) break;
      const MatrixInfo& info = matrices[matrix];
      if (info.whole_only) continue;
      const int64_t m = std::min(info.rows, info.cols), n = std::max(info.rows, info.cols);
      const int owner = (*owners)[matrix];
      // The members: the owner when free, then the group's least-loaded free
      // ranks.
      std::vector<int> free;
      for (int r : ranks) {
        if (r != owner && !member[r]) free.push_back(r);
      }
      std::stable_sort(free.begin(), free.end(), [&](int a, int b) { return load[a] < load[b]; });
      if (!member[owner]) free.insert(free.begin(), owner);
      // The fewest parts whose widest costs no more than the mean, or than
      // 1.25x what every member computes whatever its width (the m x m
      // polynomial) when that is more: more parts would add members for
      // little.
      auto part = [&](int64_t g) {
        return NewtonSchulzBlockFlops(ns, m, PartWidth(n, g, 0), n);  // the widest
      };
      const double target = std::max(mean, 1.25 * NewtonSchulzBlockFlops(ns, m, 0, n));
      const int64_t most = std::min<int64_t>(static_cast<int64_t>(free.size()), n);
      int64_t g = 2;
      while (g < most && part(g) > target) ++g;
      if (g > most || part(g) >= cost) break;  // no free ranks left, or no gain
      std::vector<int> members(free.begin(), free.begin() + g);
      owned[owner].erase({cost, matrix});
      load[owner] -= cost;
      for (int64_t p = 0; p < g; ++p) {
        load[members[static_cast<size_t>(p)]] +=
            NewtonSchulzBlockFlops(ns, m, PartWidth(n, g, p), n);
        member[members[static_cast<size_t>(p)]] = true;
      }
      splits.push_back({matrix, std::move(members)});
      split_any = true;
    }
    // The whole matrices level around the parts, which stay.
    if (split_any) {
      const double level = kSpreadLevel * Total(ranks, load) / static_cast<double>(ranks.size());
      Level(ranks, level, matrices.size(), &load, &owned, owners);
    }
  }
  std::sort(splits.begin(), splits.end(),
            [](const SplitChoice& a, const SplitChoice& b) { return a.matrix < b.matrix; });
  return splits;
}

}  // namespace muon
