// Split blocks: one registered matrix orthogonalized as independent blocks
// (muon_param_options_t.split_sizes), as Megatron-core's Muon treats a fused
// QKV (split_qkv). What the blocks are, what they cost, and the host loop
// that runs each one through a backend at the matrix's owner.
//
// Along `dim` (0: rows, 1: columns) of a rows x cols matrix the sizes repeat
// with period P = sum(sizes), which must divide that extent E; block j
// gathers the j-th piece of every period, in order: a (E / P * sizes[j]) x
// cols matrix for dim 0. So sizes {q, k, v} with P = rows cut a fused QKV in
// three; Megatron's GQA layout (groups of q_per_group * head_dim query rows,
// then head_dim key rows, then head_dim value rows) is sizes
// {q_per_group * head_dim, head_dim, head_dim} with E / P = groups: the
// queries of every group form one matrix, as Megatron-core splits it.
#ifndef MUON_MATH_SPLIT_BLOCKS_H_
#define MUON_MATH_SPLIT_BLOCKS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "muon/math/backend.h"
#include "muon/math/ns_config.h"

namespace muon {

// The most sizes one split may list (a head per block of the largest
// attention layers fits).
inline constexpr int64_t kMaxSplitSizes = 4096;

struct BlockSplit {
  int dim = 0;                 // 0: rows, 1: columns
  std::vector<int64_t> sizes;  // empty: the whole matrix, unsplit
  bool none() const { return sizes.empty(); }
  friend bool operator==(const BlockSplit& a, const BlockSplit& b) {
    return a.none() == b.none() && (a.none() || (a.dim == b.dim && a.sizes == b.sizes));
  }
  friend bool operator!=(const BlockSplit& a, const BlockSplit& b) { return !(a == b); }
};

// "dim 0, sizes {q, k, v}" (or "none"), for messages.
std::string SplitString(const BlockSplit& split);

// OK when `split` cuts rows x cols matrices: dim 0 or 1, 1 to kMaxSplitSizes
// sizes, each > 0, their sum dividing the extent along dim. The message
// starts with `who` and names the field (split_dim, split_sizes).
absl::Status CheckBlockSplit(const BlockSplit& split, int64_t rows, int64_t cols,
                             absl::string_view who);

struct BlockShape {
  int64_t rows = 0, cols = 0;
};
// Block j's shape (the whole matrix when the split is none).
BlockShape SplitBlockShape(const BlockSplit& split, size_t j, int64_t rows, int64_t cols);
// The blocks' shapes, in order (the whole matrix when the split is none).
std::vector<BlockShape> SplitBlockShapes(const BlockSplit& split, int64_t rows, int64_t cols);
// One orthogonalization of a rows x cols matrix so split: its blocks' sum
// (allocates nothing).
double SplitNewtonSchulzFlops(const NsConfig& config, const BlockSplit& split, int64_t rows,
                              int64_t cols);
// NorMuon's moments of one matrix: one per row of each block, block after
// block for dim 1 (rows each); for dim 0 (and none) one per row of the
// matrix, in the matrix's row order (the blocks' rows partition them).
int64_t SplitMomentCount(const BlockSplit& split, int64_t rows, int64_t cols);

// Runs split matrices block by block through a backend, in the backend's
// memory (host or device): block j of every matrix of a batch is gathered
// into one batch (CopyRuns), orthogonalized, normalized (NorMuon, with its
// rows' moments), multiplied by its factor (ScaleRounded) and scattered
// back; every call stream-ordered on a GPU. The room is kept from call to
// call (Reserve), so a step allocates nothing.
class SplitOrthogonalizer {
 public:
  // The most bytes the gathered blocks take: a batch's block j runs in
  // chunks of as many matrices as fit (at least one), so that the room
  // stays near one large block (a fused QKV's queries) and not the batch's
  // size (one per layer).
  static constexpr size_t kDefaultRoomBytes = size_t{64} << 20;
  explicit SplitOrthogonalizer(size_t room_bytes = kDefaultRoomBytes) : room_bytes_(room_bytes) {}
  SplitOrthogonalizer(SplitOrthogonalizer&&) = default;
  SplitOrthogonalizer& operator=(SplitOrthogonalizer&&) = default;

  // Room for the blocks of `count` rows x cols matrices of `dtype` (in
  // chunks, see above), from `memory` (the device's: the blocks live where
  // the matrices do), and in the backend's workspace for every chunk shape
  // Run will use. ResourceExhausted when memory is short.
  absl::Status Reserve(MathBackend& math, const MemorySource& memory, const NsConfig& config,
                       const BlockSplit& split, int64_t count, int64_t rows, int64_t cols,
                       DType dtype);
  // Every matrix of `matrices` (rows x cols, the backend's memory, after
  // Reserve): block j orthogonalized with `config`; then, with `normuon`,
  // normalized with matrix k's moments at moments[k] (SplitMomentCount
  // values, the backend's memory; null: matrix k is passed over by
  // NorMuon); then multiplied by factors[j] (rounded to config.dtype's
  // precision, as the result of Newton-Schulz is; a factor of exactly 1
  // leaves the bits).
  absl::Status Run(MathBackend& math, const NsConfig& config, const BlockSplit& split,
                   absl::Span<const double> factors, const NorMuonStep* normuon,
                   float* const* moments, const MatrixBatch& matrices);

 private:
  // A grow-only block of the memory Reserve was given.
  class Room {
   public:
    Room() = default;
    Room(Room&& other) noexcept { *this = std::move(other); }
    Room& operator=(Room&& other) noexcept;
    ~Room() { Free(); }
    // At least `want` bytes from `from` (kept until more are asked for).
    absl::Status Grow(const MemorySource& from, size_t want, const char* what);
    unsigned char* data() const { return static_cast<unsigned char*>(ptr_); }
    size_t size() const { return bytes_; }

   private:
    void Free();
    MemorySource memory_;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
  };
  // NorMuon on a chunk's block j (`moments`: the chunk's matrices').
  absl::Status RunNorMuon(MathBackend& math, const NorMuonStep& normuon, const BlockSplit& split,
                          size_t j, int64_t offset, float* const* moments,
                          const MatrixBatch& block);
  // Matrices per chunk for blocks of `block_bytes` (at least 1).
  int64_t Chunk(size_t block_bytes, int64_t count) const;

  size_t room_bytes_;
  Room blocks_;                     // block j of a chunk of matrices, in the matrices' dtype
  Room moments_;                    // their rows' moments (dim 0), fp32
  std::vector<float*> moment_ptrs_;  // NorMuon's per-matrix pointers into them
};

}  // namespace muon

#endif  // MUON_MATH_SPLIT_BLOCKS_H_
