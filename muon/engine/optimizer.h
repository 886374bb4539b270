// The optimizer: a coordinator over the registry of parameters (registry.h),
// the options, and the steppers built at the first step (setup.h). One step
// reads like torch.optim.Muon's loop:
//
//   open: may the step start (the last GPU step judged)  (step_outcome.h)
//   the scalars; momentum into each local piece's update buffer   (local_update.h)
//   every stepper: pieces to each matrix's owner, Newton-Schulz there, the
//     results back                                     (stepper.h)
//   close: every rank agrees on the outcome, then decay and the update
//     onto each local piece               (step_outcome.h, local_update.h)
//   stats
//
// A single-process optimizer runs the same steps over a world of one rank.
// The optimizer itself never communicates: the setup, the steppers and the
// step's outcome do.
#ifndef MUON_ENGINE_OPTIMIZER_H_
#define MUON_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/comm/comm.h"
#include "muon/engine/checkpoint.h"
#include "muon/engine/options.h"
#include "muon/engine/outcome.h"
#include "muon/engine/qk_clip.h"
#include "muon/engine/param.h"
#include "muon/engine/registry.h"
#include "muon/engine/setup.h"
#include "muon/engine/step_outcome.h"

namespace muon {

// What moved and what was computed on this rank (muon_stats_t).
struct StepStats {
  int64_t steps = 0;
  CommCounters traffic;  // last step, every communicator together
  int64_t rounds = 0;
  int64_t matrices_orthogonalized = 0;
  double ns_flops = 0;
  int64_t matrices_total = 0;
  int64_t matrices_owned = 0;
  int64_t nonfinite_grads = 0;  // last step (-1: not counted, on a GPU)
  int64_t steps_skipped = 0;    // with skip_nonfinite, in all
  // Memory now: the device's live allocations, of which momentum; the local
  // parameter elements; the first per the last.
  int64_t memory_bytes = 0;
  int64_t momentum_bytes = 0;
  int64_t param_elements = 0;
  double bytes_per_param = 0;
};

class Optimizer {
 public:
  // Fails with InvalidArgument naming the first bad option.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const Options& options);
  ~Optimizer();

  const Options& options() const { return options_; }
  absl::Status SetLr(double lr);
  absl::Status SetWeightDecay(double weight_decay);
  absl::Status SetMomentum(double momentum);

  // Communicators and parameters (see registry.h). Registration is closed
  // after the first step.
  absl::StatusOr<int> SetWorld(std::shared_ptr<Comm> world) { return registry_.SetWorld(world); }
  absl::StatusOr<int> AddGroup(std::shared_ptr<Comm> group) { return registry_.AddGroup(group); }
  int num_groups() const { return registry_.num_groups(); }
  absl::StatusOr<int> GroupSize(int group) const { return registry_.GroupSize(group); }
  absl::StatusOr<int64_t> RegisterParam(const DLTensor* value, const DLTensor* grad,
                                        const std::string& name, int view,
                                        const DistSpec* dist = nullptr,
                                        const BlockSplit& split = BlockSplit());
  absl::StatusOr<int64_t> RegisterCustomParam(const DLTensor* value, const DLTensor* grad,
                                              const std::string& name, int64_t rows,
                                              int64_t cols, std::shared_ptr<CustomPath> path,
                                              const BlockSplit& split = BlockSplit());
  // A registered parameter's multipliers (muon_param_options_t; checked by
  // the caller: finite, >= 0; `id` just registered).
  void SetParamScales(int64_t id, double lr_scale, double weight_decay_scale) {
    Param& p = registry_.params()[static_cast<size_t>(id)];
    p.lr_scale = lr_scale;
    p.weight_decay_scale = weight_decay_scale;
  }
  absl::Status RebindParam(int64_t id, const DLTensor* value, const DLTensor* grad) {
    return registry_.Rebind(id, value, grad);
  }

  // Runs one step. `stream` orders the device's work and is handed to the
  // communicators.
  absl::Status Step(void* stream = nullptr);
  // Writes the current lr, weight decay and momentum where the step's kernels
  // read them, ordered on `stream` (muon_push_hyperparameters): between CUDA
  // graph replays of a captured step. Nothing before the first step.
  absl::Status PushHyperparameters(void* stream);

  size_t num_params() const { return registry_.params().size(); }
  int64_t step_count() const { return step_count_; }
  // On a GPU the last step's non-finite count arrives with the stream: the
  // first call after a step waits for it.
  const StepStats& stats() const;

  // Newton-Schulz alone (muon_orthogonalize): every matrix of `in` into
  // `out` under these options, on the parameters' device; before any
  // parameter is registered, on the device the tensors are on.
  absl::Status Orthogonalize(const DLTensor* in, const DLTensor* out, int view, void* stream);

  // State access. Errors name the parameter.
  absl::StatusOr<const Param*> GetParam(int64_t id) const { return registry_.Get(id); }
  absl::Status CopyStateOut(int64_t id, const DLTensor* dst) const;
  absl::Status CopyStateIn(int64_t id, const DLTensor* src);
  // QK-Clip (muon_register_qk_clip, muon_qk_clip; qk_clip.h): a layer's id,
  // and one clip of its heads on this rank's pieces.
  absl::StatusOr<int64_t> RegisterQkClip(QkClipLayer layer);
  // On a GPU the scaling is enqueued on `stream` (stream_given: the host
  // named one; muon_qk_clip names none and is refused there).
  absl::Status QkClip(int64_t layer_id, const float* max_logits, int num_heads, double tau,
                      void* stream, bool stream_given, int32_t* clipped);

  // NorMuon's moments of one parameter (muon_get_moments, muon_set_moments).
  // With `owned_only` (muon_get_owned_moments, muon_set_owned_moments), the
  // matrices another rank owns are skipped (read as zeros, flagged 0 in
  // `owned` when not NULL: owned_count flags) instead of refused.
  absl::Status CopyMomentsOut(int64_t id, const DLTensor* dst, bool owned_only = false,
                              uint8_t* owned = nullptr, int64_t owned_count = 0) const;
  absl::Status CopyMomentsIn(int64_t id, const DLTensor* src, bool owned_only = false);
  size_t StateBlobSize() const;
  absl::Status SaveState(unsigned char* out) const;
  absl::Status LoadState(const unsigned char* data, size_t size);
  // Several ranks' blobs (muon_load_states): any world size and layout.
  absl::Status LoadStates(const unsigned char* const* data, const size_t* sizes, size_t count);

 private:
  Optimizer(const Options& options, std::shared_ptr<Comm> self);
  // Whether a parameter's momentum and update are computed here (ZeRO-2
  // parameters are stepped whole by their stepper; unbound ones skipped).
  bool StepsLocally(const Param& p) const { return p.zero2_group < 0 && p.active; }
  // The checks and the first step's setup: a failure here changes nothing.
  absl::Status Prepare(void* stream);
  // The three stages of a step (see the top of this file): the scalars and
  // momenta, then the steppers, noted in *local (this rank goes on taking
  // part in every collective whatever failed); the updates land at Close.
  void RunStages(const StepCall& step, LocalOutcome* local);
  absl::Status UpdateMomenta();
  absl::Status RunSteppers(void* stream, bool failed);
  absl::Status ApplyUpdates(const int32_t* gate = nullptr);

  void CountStats();
  absl::Status Restore(const std::vector<SavedState>& blobs, bool own_blob);
  absl::Status CheckStateTensor(int64_t id, const DLTensor* t, Param** param) const;
  // With NorMuon: the moments the blob holds (after the first step the
  // matrices this rank owns, before it what was loaded), with their values
  // when `values` (else zeros of their sizes); NULL without NorMuon.
  absl::StatusOr<std::unique_ptr<std::vector<SavedMoments>>> MomentsToSave(bool values) const;
  // The parameter and the host fp32 tensor of its moments, checked; after the
  // first step also each matrix's moments id here (-1: a matrix without
  // elements, or, when `owned_only`, one another rank owns: -2), refused
  // unless this rank owns every one or `owned_only`.
  absl::Status CheckMoments(int64_t id, const DLTensor* t, bool owned_only, const Param** param,
                            float** values, std::vector<int>* ids) const;

  Options options_;
  Registry registry_;
  std::unique_ptr<StepSetup> setup_;  // built at the first step
  // NorMuon moments loaded before the first step, which its setup hands to
  // the matrices' owners (then emptied).
  MomentStash moment_stash_;
  std::vector<QkClipLayer> qk_layers_;  // registered for muon_qk_clip
  int64_t nonfinite_ = 0;       // this step's momentum pass
  int64_t step_count_ = 0;
  // The steps' outcomes: poisoning, the skip agreements, the verdicts
  // (step_outcome.h).
  StepOutcome outcome_;

  mutable StepStats stats_;
};

}  // namespace muon

#endif  // MUON_ENGINE_OPTIMIZER_H_
