// The single-process optimizer: registration, the step pipeline and state.
//
// One step, as data: gradients -> momentum on each parameter -> matrices of
// the same shape gathered as one fp32 batch -> Newton-Schulz on the batch ->
// decay and update applied to each parameter.
#ifndef MUON_ENGINE_OPTIMIZER_H_
#define MUON_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/engine/options.h"
#include "muon/engine/param.h"
#include "muon/math/backend.h"

namespace muon {

class Optimizer {
 public:
  // Fails with InvalidArgument naming the first bad option.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const Options& options);

  const Options& options() const { return options_; }
  absl::Status SetLr(double lr);
  absl::Status SetWeightDecay(double weight_decay);
  absl::Status SetMomentum(double momentum);

  // Registers a parameter; returns its id. An empty name becomes "param<id>".
  // Closed after the first step (FailedPrecondition).
  absl::StatusOr<int64_t> RegisterParam(const DLTensor* value, const DLTensor* grad,
                                        const std::string& name, int view);

  absl::Status Step();

  size_t num_params() const { return params_.size(); }
  int64_t step_count() const { return step_count_; }

  // State access. Errors name the parameter.
  absl::StatusOr<const Param*> GetParam(int64_t id) const;
  absl::Status CopyStateOut(int64_t id, const DLTensor* dst) const;
  absl::Status CopyStateIn(int64_t id, const DLTensor* src);
  size_t StateBlobSize() const;
  void SaveState(unsigned char* out) const;
  absl::Status LoadState(const unsigned char* data, size_t size);

 private:
  // Same-shape matrices processed together as one batch.
  struct Chunk {
    int64_t rows = 0, cols = 0;
    std::vector<size_t> params;  // indices into params_
    int64_t matrices = 0;        // sum of their batch sizes
  };

  explicit Optimizer(const Options& options);
  absl::Status BuildPlan();
  absl::Status CheckStateTensor(int64_t id, const DLTensor* t, const char* what,
                                Param** param) const;

  Options options_;
  std::unique_ptr<MathBackend> backend_;
  std::vector<Param> params_;
  std::vector<Chunk> chunks_;  // built at the first step
  std::vector<float> batch_;   // fp32 working batch, sized for the largest chunk
  bool planned_ = false;
  int64_t step_count_ = 0;
};

}  // namespace muon

#endif  // MUON_ENGINE_OPTIMIZER_H_
