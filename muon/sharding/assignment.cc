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

}  // namespace

std::vector<int> AssignSpread(const std::vector<MatrixInfo>& matrices) {
  std::vector<int> owners = AssignBalanced(matrices);
  int top = -1;
  for (const MatrixInfo& m : matrices) {
    for (int r : m.holders) top = std::max(top, r);
  }
  if (top < 1) return owners;
  // The groups: ranks joined by holding pieces of one matrix.
  std::vector<int> parent(top + 1);
  std::iota(parent.begin(), parent.end(), 0);
  std::vector<bool> holds(top + 1, false);
  for (const MatrixInfo& m : matrices) {
    for (int r : m.holders) {
      holds[r] = true;
      parent[Root(parent, r)] = Root(parent, m.holders.front());
    }
  }
  std::vector<double> load(top + 1, 0);
  std::vector<std::set<std::pair<double, size_t>>> owned(top + 1);  // (cost, matrix)
  for (size_t i = 0; i < matrices.size(); ++i) {
    load[owners[i]] += matrices[i].ns_flops;
    owned[owners[i]].insert({matrices[i].ns_flops, i});
  }
  std::map<int, std::vector<int>> groups;  // root -> its ranks, ascending
  for (int r = 0; r <= top; ++r) {
    if (holds[r]) groups[Root(parent, r)].push_back(r);
  }
  for (const auto& [root, ranks] : groups) {
    if (ranks.size() < 2) continue;
    double total = 0;
    std::set<std::pair<double, int>> by_load;  // (load, rank)
    for (int r : ranks) {
      total += load[r];
      by_load.insert({load[r], r});
    }
    const double level = kSpreadLevel * total / static_cast<double>(ranks.size());
    // Each move lowers the sum of squared loads, so this ends; the bound on
    // the moves is a second guard.
    for (size_t moves = 0; moves < matrices.size(); ++moves) {
      const auto [high, busiest] = *by_load.rbegin();
      const auto [low, idlest] = *by_load.begin();
      if (high <= level) break;
      const double gap = high - low, half = gap / 2;
      std::set<std::pair<double, size_t>>& mine = owned[busiest];
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
      owned[idlest].insert({cost, matrix});
      owners[matrix] = idlest;
      by_load.erase(std::prev(by_load.end()));
      by_load.erase(by_load.begin());
      load[busiest] -= cost;
      load[idlest] += cost;
      by_load.insert({load[busiest], busiest});
      by_load.insert({load[idlest], idlest});
    }
  }
  return owners;
}

}  // namespace muon
