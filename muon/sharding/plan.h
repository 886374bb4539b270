// The job-wide plan of the distributed step, built once at the first step
// from what every rank registered (exchanged by the handshake, handshake.h):
// which global matrices exist, which ranks hold which pieces of them, who
// orthogonalizes each one (assignment.h), and in which exchange round.
//
// Every rank builds the same plan from the same handshake data; the handshake
// checks that with a digest.
#ifndef MUON_SHARDING_PLAN_H_
#define MUON_SHARDING_PLAN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "muon/math/ns_config.h"
#include "muon/math/split_blocks.h"
#include "muon/sharding/assignment.h"
#include "muon/sharding/layout.h"

namespace muon {

// What one rank registered, as sent in the handshake.
struct RankParamDesc {
  std::string name;
  uint8_t param_dtype = 0;
  uint8_t state_dtype = 0;
  uint8_t view = 0;  // muon_matrix_view_t
  std::vector<int64_t> global_shape;
  Layout layout;  // group indices refer to the registering rank's groups
  int32_t custom_owner = -1;  // >= 0: on the custom path, orthogonalized there
  uint8_t zero2 = 0;          // 1: ZeRO-2 replicated mode (outside the plan's units)
  double lr_scale = 1.0, weight_decay_scale = 1.0;  // every holder's must agree
  BlockSplit split;  // its matrices' blocks (split_blocks.h); every holder's must agree
};

struct RankDesc {
  int world_rank = 0;
  // Members (world ranks, in group-rank order) of each of this rank's groups.
  std::vector<std::vector<int>> groups;
  std::vector<RankParamDesc> params;
};

// A RankDesc whose parameter table may be one object shared by the ranks
// that registered the same table (HandshakeDirectory::AssembleShared: the
// ranks of a pipeline stage, without FlatRange placements), so that a job of
// many ranks holds each distinct table once instead of once per rank.
struct SharedRankDesc {
  int world_rank = 0;
  std::vector<std::vector<int>> groups;
  std::shared_ptr<const std::vector<RankParamDesc>> params;  // never null
};

struct PlanOptions {
  Assignment assignment = Assignment::kBalanced;
  CustomAssignFn custom;  // Assignment::kCustom
  bool async_parallelism = true;
  int64_t round_bytes = int64_t{256} << 20;
  // What each matrix's Newton-Schulz computes, for its price (its steps,
  // its cubic ones, the Gram form: NewtonSchulzFlops).
  NsConfig ns;
  // Pieces computed row by row (ComputePieceRowByRow, then grouped into
  // blocks) instead of from boxes: the same plan, the old cost of computing
  // pieces; for tests and the setup benchmark.
  bool pieces_row_by_row = false;
};

// A rank holding a piece of a parameter. Its piece (what ComputePieceBlocks
// gives: the runs as blocks, and the local shape) lies in its parameter's
// flat arrays (PlanParam::Blocks, PlanParam::Shape): a job holds millions
// of pieces, most of them one block, and two small heap vectors each would
// cost more than the blocks themselves.
struct Holder {
  int rank = 0;
  // True when every Replicate placement puts it at group rank 0 (Piece::canonical).
  bool canonical = true;
  int64_t shape_at = 0;     // its shape: PlanParam::shapes[shape_at] dims, then the dims
  int64_t first_block = 0;  // its blocks: PlanParam::blocks[first_block, first_block + num_blocks)
  int64_t num_blocks = 0;
};

struct PlanParam {
  std::string name;
  uint8_t state_dtype = 0;
  int64_t batch = 1, rows = 0, cols = 0;
  // Each matrix orthogonalized as these blocks (none: whole); such a matrix
  // is never split over ranks (SplitUnit).
  BlockSplit split;
  std::vector<Holder> holders;  // ascending rank
  std::vector<RunBlock> blocks;  // every holder's blocks, holder after holder
  // The holders' shapes, each as its number of dims then the dims; holders
  // in a row with the same shape share one.
  std::vector<int64_t> shapes;
  int local = -1;               // index among this rank's registered params, or -1
  int local_holder = -1;        // this rank's entry in holders, or -1

  // A holder's piece: its runs as blocks, in local storage order, and its
  // local tensor's shape (1-D after a FlatRange).
  absl::Span<const RunBlock> Blocks(const Holder& h) const {
    return absl::MakeConstSpan(blocks).subspan(static_cast<size_t>(h.first_block),
                                               static_cast<size_t>(h.num_blocks));
  }
  absl::Span<const int64_t> Shape(const Holder& h) const {
    return absl::MakeConstSpan(shapes).subspan(static_cast<size_t>(h.shape_at) + 1,
                                               static_cast<size_t>(shapes[h.shape_at]));
  }
};

struct Unit {
  int param = 0;        // index into Plan::params
  int64_t index = 0;    // matrix within the parameter's view
  int owner = 0;        // world rank
  int round = 0;
  double flops = 0;
  // Split Newton-Schulz (MathBackend::OrthogonalizeBlock): part `part` of
  // `parts` of its matrix, the wide orientation's columns [first, first +
  // width): rows of a tall matrix (rows > cols), columns of a wide one. Its
  // owner gathers, orthogonalizes with the other parts' owners, and scatters
  // only that block. The parts of a matrix are consecutive units of one
  // round. parts == 1: the whole matrix (first 0, width its long side).
  int part = 0, parts = 1;
  int64_t first = 0, width = 0;
  std::vector<int> senders;    // indices into holders: canonical pieces meeting the matrix
  std::vector<int> receivers;  // indices into holders: every piece meeting the matrix
};

// A parameter on the custom path: the host moves its data.
struct CustomUnit {
  std::string name;
  int owner = 0;
  int64_t rows = 0, cols = 0;
  int local = -1;  // this rank's param index, or -1
  double flops = 0;
  BlockSplit split;  // its blocks (none: whole)
};

struct Plan {
  std::vector<PlanParam> params;  // sorted by name (layout path)
  // Global order: by param, then index; one per matrix with elements (an
  // empty matrix's update is empty: it has no unit).
  std::vector<Unit> units;
  std::vector<CustomUnit> custom;  // sorted by name
  int64_t zero2_matrices = 0;      // matrices of ZeRO-2 parameters (stepped outside units)
  int64_t empty_matrices = 0;      // matrices of `params` without elements (no unit)
  int rounds = 0;
  uint64_t digest = 0;
};

// Splits plan->units[unit] (a whole matrix) into one part per rank of
// `owners` (distinct world ranks), the wide orientation's long side cut as
// evenly as possible (the first parts one wider), each part in the unit's
// round with its share of the work (NewtonSchulzBlockFlops); the digest
// covers the parts. InvalidArgument when the unit is already split, when
// there are fewer than 2 owners or more than the long side, or when an
// owner repeats or is outside the world.
absl::Status SplitUnit(Plan* plan, size_t unit, const std::vector<int>& owners, int world,
                       int ns_steps, int ns_cubic_steps = 0);
// The same for several units at once (SplitChoice::matrix a unit's index,
// its members the parts' owners), in one pass; with `round` >= 0 every part
// goes to that round instead of its unit's.
absl::Status SplitUnits(Plan* plan, const std::vector<SplitChoice>& splits, int world,
                        int ns_steps, int round, int ns_cubic_steps = 0);

// The digest every rank's plan must share: units (param names, matrix,
// part, owner, round) and custom units (names, owners).
uint64_t PlanDigest(const Plan& plan);

// Builds the plan for `my_rank` from every rank's description (indexed by
// world rank; a rank's params are in its registration order). Errors name the
// first inconsistent parameter or group and the ranks involved, or the
// parameter (in name order) at which the job declares more matrices with
// elements than kMaxJobMatrices (matrix_view.h), checked before any is
// planned, as each parameter's kMaxParamMatrices is, or more matrices in all
// (empty ones included) than kMaxJobAllMatrices, so that every count of them
// fits in an int64_t.
constexpr int64_t kMaxJobAllMatrices = int64_t{1} << 62;
absl::StatusOr<Plan> BuildPlan(const std::vector<RankDesc>& ranks, int my_rank,
                               const PlanOptions& options);
// The same plan, or the same error, from the same descriptions with their
// parameter tables shared.
absl::StatusOr<Plan> BuildPlan(const std::vector<SharedRankDesc>& ranks, int my_rank,
                               const PlanOptions& options);

}  // namespace muon

#endif  // MUON_SHARDING_PLAN_H_
