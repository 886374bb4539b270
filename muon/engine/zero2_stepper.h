// The ZeRO-2 stepper (MUON_REPLICATED_ZERO2): parameters replicated over a
// data-parallel group whose ranks pass their own, un-averaged gradients.
// Same-shape parameters of a group form blocks of up to group-size of them,
// with block-cyclic owners. Per block: one reduce_scatter averages the
// gradients onto their owners, each owner steps its parameter whole
// (momentum, Newton-Schulz, decay and update; it alone keeps the momentum,
// 1/N of the state), and one all_gather hands the new values to every
// replica. Host tensors only.
#ifndef MUON_ENGINE_ZERO2_STEPPER_H_
#define MUON_ENGINE_ZERO2_STEPPER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/comm/comm.h"
#include "muon/common/dtype.h"
#include "muon/engine/stepper.h"

namespace muon {

class Zero2Stepper : public Stepper {
 public:
  // Forms the blocks of the ZeRO-2 parameters of ctx.params (each group's
  // blocks in an order every rank agrees on, by member lists), drops the
  // momentum of the parameters another rank owns, and allocates the step's
  // buffers. `members[g]`: the world ranks of group g's members.
  static absl::StatusOr<std::unique_ptr<Zero2Stepper>> Create(
      const std::vector<std::shared_ptr<Comm>>& groups,
      const std::vector<std::vector<int>>& members, int64_t matrices_total,
      const StepContext& ctx);

  absl::Status Run(void* stream, bool failed) override;
  const StepperStats& stats() const override { return stats_; }
  // This rank takes part in at least one block.
  bool has_blocks() const { return !blocks_.empty(); }

 private:
  // Up to group-size same-shape parameters; coord c steps params[c] (-1: none).
  struct Block {
    int group = 0;
    DType dtype = DType::kF32;
    int64_t elems = 0;
    std::vector<int> params;
    // The block's two collectives, named for errors (made once).
    std::string averaging, sharing;
  };

  Zero2Stepper(const std::vector<std::shared_ptr<Comm>>& groups, const StepContext& ctx)
      : groups_(groups), ctx_(ctx) {}
  // Create's phases: the blocks of every group's parameters (groups in
  // member-list order, each group's by name, same shape and dtype together,
  // owners block-cyclic), with the largest block's elements and the widest
  // block's over its group; then each parameter this rank owns made ready to
  // step (its math reserved, NorMuon's moments added, counted).
  void MakeBlocks(const std::vector<std::vector<int>>& members, int64_t* largest,
                  int64_t* widest);
  absl::Status TakeOwned(int param);
  absl::Status RunBlock(const Block& blk, void* stream, bool failed);
  absl::Status StepOwned(const Block& blk, int param);

  std::vector<std::shared_ptr<Comm>> groups_;
  StepContext ctx_;
  std::vector<Block> blocks_;
  std::vector<unsigned char> send_, recv_;
  std::vector<float> average_;
  // NorMuon: per param, the moments' id of its first matrix (the others'
  // follow), or -1; and the pointers NorMuon takes, sized once.
  std::vector<int> moment_first_;
  std::vector<float*> moment_ptrs_;
  // Per param (owned split ones): its blocks' lr ratios; the blocks' host copy.
  std::vector<std::vector<double>> factors_;
  SplitOrthogonalizer split_blocks_;
  StepperStats stats_;
};

}  // namespace muon

#endif  // MUON_ENGINE_ZERO2_STEPPER_H_
