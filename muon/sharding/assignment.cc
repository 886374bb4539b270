#include "muon/sharding/assignment.h"

#include <algorithm>
#include <map>
#include <numeric>

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

}  // namespace muon
