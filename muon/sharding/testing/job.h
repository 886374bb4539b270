// Test helpers for the sharding code: placements in one line, and a job
// described rank by rank as the handshake delivers it (each rank's groups as
// member lists, its parameters with their layouts).
#ifndef MUON_SHARDING_TESTING_JOB_H_
#define MUON_SHARDING_TESTING_JOB_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "muon/sharding/layout.h"
#include "muon/sharding/plan.h"

namespace muon {
namespace testjob {

inline Placement Shard(int group, int dim, ShardSplit split = ShardSplit::kEven,
                       std::vector<int64_t> sizes = {}) {
  Placement p;
  p.kind = PlacementKind::kShard;
  p.group = group;
  p.dim = dim;
  p.split = split;
  p.sizes = std::move(sizes);
  return p;
}

inline Placement Flat(int group, int64_t start, int64_t length) {
  Placement p;
  p.kind = PlacementKind::kFlatRange;
  p.group = group;
  p.start = start;
  p.length = length;
  return p;
}

inline Placement Replicate(int group) {
  Placement p;
  p.kind = PlacementKind::kReplicate;
  p.group = group;
  return p;
}

// One parameter as a rank registers it.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<Placement> placements;
  uint8_t view = 0;  // muon_matrix_view_t
  uint8_t dtype = 0;  // DType of param, grad and state
};

inline RankParamDesc DescribeParam(const ParamSpec& s) {
  RankParamDesc d;
  d.name = s.name;
  d.param_dtype = s.dtype;
  d.state_dtype = s.dtype;
  d.view = s.view;
  d.global_shape = s.global_shape;
  d.layout.global_shape = s.global_shape;
  d.layout.placements = s.placements;
  return d;
}

// A rank of a job whose group 0 is the world of `world` ranks and whose
// further groups are `groups` (member lists containing `rank`).
inline RankDesc DescribeRank(int rank, int world, const std::vector<std::vector<int>>& groups,
                             const std::vector<ParamSpec>& params) {
  RankDesc d;
  d.world_rank = rank;
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  d.groups.push_back(all);
  for (const auto& g : groups) d.groups.push_back(g);
  for (const ParamSpec& p : params) d.params.push_back(DescribeParam(p));
  return d;
}

}  // namespace testjob
}  // namespace muon

#endif  // MUON_SHARDING_TESTING_JOB_H_
