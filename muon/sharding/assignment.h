// Who orthogonalizes each matrix of the job: every choice gives each matrix to
// exactly one rank; all but kSpread name a rank that holds a piece of it.
#ifndef MUON_SHARDING_ASSIGNMENT_H_
#define MUON_SHARDING_ASSIGNMENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/math/ns_config.h"

namespace muon {

enum class Assignment { kBalanced = 0, kRoundRobin = 1, kCustom = 2, kSpread = 3, kSplit = 4 };

// One global matrix as an assignment sees it.
struct MatrixInfo {
  const std::string* param_name;
  int64_t index;  // within the parameter's matrix view
  int64_t rows, cols;
  double ns_flops;
  std::vector<int> holders;  // world ranks, ascending
  // Orthogonalized in blocks (split_sizes): never split over ranks.
  bool whole_only = false;
};

// A host's assignment (Assignment::kCustom): fills owners (one per matrix) or
// returns an error.
using CustomAssignFn =
    std::function<absl::Status(const std::vector<MatrixInfo>&, std::vector<int>*)>;

// Owners by greedy largest-first onto the least-loaded candidate (ties: the
// earlier matrix, the lower rank), or round-robin over each matrix's holders.
std::vector<int> AssignBalanced(const std::vector<MatrixInfo>& matrices);
std::vector<int> AssignRoundRobin(const std::vector<MatrixInfo>& matrices);

// AssignBalanced, then levelling within each group of ranks that matrices
// connect (ranks are connected when they hold pieces of one matrix: a
// pipeline stage). While the group's busiest rank is above kSpreadLevel times
// the group's mean and a move lowers it, one of its matrices moves to the
// group's least-loaded rank, which may hold none of it (its owner then
// receives the whole gradient and sends the whole update back): the matrix
// whose cost is closest to half the gap, among those smaller than the gap.
// Deterministic: every rank computes the same owners.
inline constexpr double kSpreadLevel = 1.01;
std::vector<int> AssignSpread(const std::vector<MatrixInfo>& matrices);

// The width of part `part` of `parts` of a long side n: as even as
// possible, the first parts one wider (what SplitUnits cuts, and what
// ChooseSplits weighs).
inline int64_t PartWidth(int64_t n, int64_t parts, int64_t part) {
  return n / parts + (part < n % parts ? 1 : 0);
}

// A matrix orthogonalized by several ranks together (split Newton-Schulz):
// `members` own its parts, in part order.
struct SplitChoice {
  size_t matrix = 0;  // index into the matrices
  std::vector<int> members;
};

// Fewer matrices per rank than this, and ChooseSplits leaves a group as
// AssignSpread left it: most of its ranks then own nothing, nearly every
// matrix costs more than the mean, and the sums of the splits that would
// level it move more than the exchange itself (setup_bench: 2x to 50x the
// exchange's bytes for Llama-3 and Mixtral at TP 8 x PP 16, against 2% to
// 16% for DeepSeek-V3's stages of 9 to 49 matrices per rank).
inline constexpr size_t kSplitMinMatricesPerRank = 4;

// After AssignSpread's `owners`, within each group of ranks with at least
// kSplitMinMatricesPerRank matrices per rank, costliest first: a matrix that
// alone costs more than kSpreadLevel times the group's mean is split over its
// owner and the group's least-loaded ranks, each in at most one split (the
// parts run in one round, and a rank takes one part of a round): the fewest
// parts whose widest costs no more than the mean (NewtonSchulzBlockFlops
// under `ns`, as the matrices' costs are: every member also computes the
// m x m polynomial, or Gram's m x m iterations), or than 1.25x that m x m
// work when it is more. Then the whole matrices are levelled
// again around the parts (AssignSpread's moves; `owners` changes). Stops at
// the first matrix under the level, or when no free rank is left.
// Deterministic.
std::vector<SplitChoice> ChooseSplits(const std::vector<MatrixInfo>& matrices,
                                      std::vector<int>* owners, const NsConfig& ns);

}  // namespace muon

#endif  // MUON_SHARDING_ASSIGNMENT_H_
