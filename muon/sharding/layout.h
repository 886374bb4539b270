// How a parameter is spread over ranks: a global shape and an ordered list of
// placements, each over one group, applied from the global tensor down to the
// piece one rank holds (docs/distributed.md).
//
// A piece is described by runs: contiguous ranges of the global row-major
// flattened tensor, listed in the order the local buffer stores them. Any
// composition of Shard / FlatRange / Replicate placements yields such a list.
#ifndef MUON_SHARDING_LAYOUT_H_
#define MUON_SHARDING_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace muon {

enum class PlacementKind { kShard = 0, kFlatRange = 1, kReplicate = 2 };

// How Shard splits a dimension of size d over n ranks.
enum class ShardSplit {
  kEven = 0,   // d % n == 0, d / n each (Megatron TP)
  kChunk = 1,  // torch.chunk: ceil(d / n) each, the tail possibly short or empty (FSDP2)
  kSizes = 2,  // explicit per-rank sizes summing to d
};

struct Placement {
  PlacementKind kind = PlacementKind::kReplicate;
  int group = 0;  // index of the group (communicator) it is over
  // kShard:
  int dim = 0;
  ShardSplit split = ShardSplit::kEven;
  std::vector<int64_t> sizes;  // kSizes: one per group rank
  // kFlatRange: this rank's element range [start, start + length) of the
  // current tensor's row-major flattening (possibly empty). Other ranks
  // describe their own ranges; the handshake checks that they tile.
  int64_t start = 0;
  int64_t length = 0;
};

struct Layout {
  std::vector<int64_t> global_shape;
  std::vector<Placement> placements;
};

struct Run {
  int64_t offset = 0;  // in the global flattened tensor
  int64_t length = 0;
  bool operator==(const Run& o) const { return offset == o.offset && length == o.length; }
};

// Runs of one length at a fixed pitch, consecutive in local order: run i
// (0 <= i < count) covers [offset + i * pitch, offset + i * pitch + length).
// A box of a matrix (rows r0.. of its columns c0..c1) is one block however
// many rows it has. With count > 1, pitch >= length > 0.
struct RunBlock {
  int64_t offset = 0;
  int64_t length = 0;
  int64_t pitch = 0;
  int64_t count = 1;
  bool operator==(const RunBlock& o) const {
    return offset == o.offset && length == o.length && pitch == o.pitch && count == o.count;
  }
};

// The runs of `blocks`, one by one, in order.
std::vector<Run> ExpandBlocks(absl::Span<const RunBlock> blocks);
// Runs grouped into blocks (consecutive runs of one length at one pitch).
std::vector<RunBlock> ToBlocks(const std::vector<Run>& runs);
// How many runs `blocks` stand for.
int64_t RunCount(absl::Span<const RunBlock> blocks);

struct Piece {
  std::vector<Run> runs;         // in local storage order
  // The same runs as blocks, from ComputePieceBlocks, which leaves `runs`
  // empty: what the plan holds of every holder's piece.
  std::vector<RunBlock> blocks;
  std::vector<int64_t> shape;    // the local tensor's shape (1-D after a FlatRange)
  int64_t numel = 0;
  // True when every Replicate placement puts this rank at group rank 0: the
  // one copy of these elements that is sent to owners.
  bool canonical = true;
};

// The piece held by the rank whose position in group g is coords[g], in a
// job whose group g has group_sizes[g] ranks. Checks the layout on the way:
// groups known and used once, dims that exist, even splits that divide,
// explicit sizes (one per group rank, >= 0) that add up, flat ranges inside
// the current tensor. Errors name `who` and the placement.
absl::StatusOr<Piece> ComputePiece(const Layout& layout, const std::vector<int>& group_sizes,
                                   const std::vector<int>& coords, const std::string& who);

// ComputePiece as it was computed before boxes: each Shard maps the runs so
// far slice by slice (one slice per index of the dims before its own), so
// that a Shard of dim 1 makes one run per global row before a later Shard of
// dim 0 keeps some of them. The same result as ComputePiece, at a cost that
// grows with the global shape; kept as the reference for tests
// (PlanOptions::pieces_row_by_row) and for the setup benchmark's "before".
absl::StatusOr<Piece> ComputePieceRowByRow(const Layout& layout,
                                           const std::vector<int>& group_sizes,
                                           const std::vector<int>& coords,
                                           const std::string& who);

// ComputePiece with the runs as blocks (Piece::blocks; Piece::runs left
// empty). Without a FlatRange, the cost and size do not grow with the rows
// of the piece: a box of a batch of matrices is one block per matrix.
absl::StatusOr<Piece> ComputePieceBlocks(const Layout& layout,
                                         const std::vector<int>& group_sizes,
                                         const std::vector<int>& coords, const std::string& who);

// ComputePiece without the runs (left empty): the same checks, the shape,
// numel and canonical flag, at a cost that does not grow with the tensor.
// The registry compares it with the local tensor before computing the runs,
// whose number can be as large as the global shape says.
absl::StatusOr<Piece> PieceShape(const Layout& layout, const std::vector<int>& group_sizes,
                                 const std::vector<int>& coords, const std::string& who);

// The runs of `runs` (a local storage order) restricted to the global range
// [begin, end), with the local position where each kept run starts.
struct LocatedRun {
  int64_t local = 0;  // position in the local buffer
  Run run;
};
std::vector<LocatedRun> Intersect(const std::vector<Run>& runs, int64_t begin, int64_t end);

// Intersect, and whether any run meets a range, over one piece's runs for a
// sequence of ranges (the matrices of a parameter, in order): each call
// resumes where the last one stopped, so that a sequence whose `begin` never
// decreases, over runs in increasing global order (the order every placement
// gives), costs O(runs + ranges) in all instead of O(runs) per range. A range
// starting before the last one starts over; runs in another order are
// searched in full. Keeps a pointer to `runs`. (The plan walks blocks with
// BlockCursor; this stays as its reference in tests.)
class RunCursor {
 public:
  explicit RunCursor(const std::vector<Run>& runs);
  std::vector<LocatedRun> Intersect(int64_t begin, int64_t end);
  // Whether a run has an element in [begin, end).
  bool Meets(int64_t begin, int64_t end);

 private:
  // Moves past the runs that end at or before `begin`.
  void Seek(int64_t begin);

  const std::vector<Run>* runs_;
  bool sorted_ = true;  // increasing global offsets, disjoint
  int64_t last_begin_ = 0;
  size_t next_ = 0;    // the first run that may meet a range from last_begin_ on
  int64_t local_ = 0;  // its position in the local buffer
};

// RunCursor over blocks (a piece's Piece::blocks): the same answers as a
// RunCursor over ExpandBlocks(blocks), at a cost per call that grows with the
// runs it returns, not the runs it passes: a seek jumps over a block's runs
// by arithmetic. Keeps a view of `blocks` (not a copy).
class BlockCursor {
 public:
  explicit BlockCursor(absl::Span<const RunBlock> blocks);
  std::vector<LocatedRun> Intersect(int64_t begin, int64_t end);
  bool Meets(int64_t begin, int64_t end);

 private:
  void Seek(int64_t begin);

  absl::Span<const RunBlock> blocks_;
  bool sorted_ = true;       // increasing global offsets, disjoint
  std::vector<Run> expanded_;  // when not sorted: the runs, searched in full
  int64_t last_begin_ = 0;
  size_t block_ = 0;   // the block of the first run that may meet a range
  int64_t run_ = 0;    // that run within its block
  int64_t local_ = 0;  // its position in the local buffer
};

// Checks that the pieces (all copies, canonical or not) of a tensor of
// `numel` elements are consistent: the canonical ones tile [0, numel) exactly
// once, and every non-canonical run lies inside it. Errors name `who` and the
// first overlap or gap.
absl::Status CheckTiling(const std::vector<const Piece*>& pieces, int64_t numel,
                         const std::string& who);

// CheckTiling over the pieces' blocks (Piece::blocks), with the same errors,
// without expanding them: a merge of the canonical blocks by offset that,
// where a few blocks of one pitch tile a whole period (the column pieces of
// a band of rows), checks one period and jumps over the rest of the band.
absl::Status CheckTilingBlocks(const std::vector<const Piece*>& pieces, int64_t numel,
                               const std::string& who);

// One piece's blocks and canonical flag, wherever they are stored (a Piece,
// or the plan's flat arrays of every holder's blocks).
struct PieceBlocks {
  absl::Span<const RunBlock> blocks;
  bool canonical = true;
};
// CheckTilingBlocks over pieces given as PieceBlocks: the same check and errors.
absl::Status CheckTilingBlocks(const std::vector<PieceBlocks>& pieces, int64_t numel,
                               const std::string& who);

}  // namespace muon

#endif  // MUON_SHARDING_LAYOUT_H_
