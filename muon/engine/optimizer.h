// The optimizer: registration, the step pipeline and state.
//
// One step, as data (DESIGN.md section 2): gradients -> momentum on each
// local piece -> pieces travel to each matrix's owner (one all-to-all per
// round) -> the owner orthogonalizes whole matrices, batched by shape ->
// update pieces travel back -> decay and update applied to each local piece.
// A single-process optimizer runs the same pipeline over a world of one rank.
#ifndef MUON_ENGINE_OPTIMIZER_H_
#define MUON_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/device/device.h"
#include "muon/dist/comm.h"
#include "muon/dist/exchange.h"
#include "muon/dist/layout.h"
#include "muon/dist/plan.h"
#include "muon/engine/options.h"
#include "muon/engine/param.h"
#include "muon/math/backend.h"

namespace muon {

// The distributed layout a parameter is registered with.
struct DistSpec {
  std::vector<int64_t> global_shape;
  std::vector<Placement> placements;
  bool zero2 = false;  // ZeRO-2 replicated mode (placements: one Replicate)
};

struct StepStats {
  int64_t steps = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t collectives = 0;
  int64_t rounds = 0;
  int64_t matrices_orthogonalized = 0;
  double ns_flops = 0;
  int64_t matrices_total = 0;
  int64_t matrices_owned = 0;
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

  // The world (every rank of the step) and further groups; each returns the
  // group id placements use. Closed once a parameter is registered.
  absl::StatusOr<int> SetWorld(std::shared_ptr<Comm> world);
  absl::StatusOr<int> AddGroup(std::shared_ptr<Comm> group);
  int num_groups() const { return static_cast<int>(groups_.size()); }
  absl::StatusOr<int> GroupSize(int group) const;

  // Registers a parameter; returns its id. An empty name becomes "param<id>"
  // (a name is required once a world is set). `dist` (optional) gives the
  // global shape and placements. Closed after the first step.
  absl::StatusOr<int64_t> RegisterParam(const DLTensor* value, const DLTensor* grad,
                                        const std::string& name, int view,
                                        const DistSpec* dist = nullptr);

  // Registers a parameter on the custom path (needs a world).
  absl::StatusOr<int64_t> RegisterCustomParam(const DLTensor* value, const DLTensor* grad,
                                              const std::string& name, int64_t rows,
                                              int64_t cols, std::shared_ptr<CustomPath> path);

  // Points param `id` at new storage (same shape and dtype); a null grad
  // (single-process only) skips it until a gradient is bound again.
  absl::Status RebindParam(int64_t id, const DLTensor* value, const DLTensor* grad);

  // Runs one step. `stream` is handed to the communicators.
  absl::Status Step(void* stream = nullptr);

  size_t num_params() const { return params_.size(); }
  int64_t step_count() const { return step_count_; }
  const StepStats& stats() const { return stats_; }

  // State access. Errors name the parameter.
  absl::StatusOr<const Param*> GetParam(int64_t id) const;
  absl::Status CopyStateOut(int64_t id, const DLTensor* dst) const;
  absl::Status CopyStateIn(int64_t id, const DLTensor* src);
  size_t StateBlobSize() const;
  absl::Status SaveState(unsigned char* out) const;
  absl::Status LoadState(const unsigned char* data, size_t size);

 private:
  explicit Optimizer(const Options& options);
  absl::Status Setup(void* stream);
  absl::Status RunRounds(void* stream);
  absl::Status Orthogonalize(const RoundTable& t, float* slots);
  absl::Status RunCustom(void* stream);
  absl::Status BuildZero2();
  // Momentum of param i from `grad` into its update buffer; decay and the
  // update from that buffer onto the param.
  absl::Status MomentumOf(size_t i, DType grad_dtype, const void* grad);
  absl::Status ApplyTo(size_t i, double decay);
  absl::Status RunZero2(void* stream);
  absl::Status AddParam(Param p);
  // Checks that `p` lives on this optimizer's device (the first parameter
  // picks it: the host, or a CUDA device through the plugin) and allocates its
  // momentum there.
  absl::Status PlaceParam(Param* p);
  absl::Status CheckStateTensor(int64_t id, const DLTensor* t, Param** param) const;

  Options options_;
  std::shared_ptr<Device> device_;  // the host until a CUDA tensor is registered
  std::shared_ptr<Comm> world_;               // a self communicator until SetWorld
  bool distributed_ = false;
  std::vector<std::shared_ptr<Comm>> groups_;  // placement groups (the world among them)
  std::vector<std::vector<int>> group_members_;  // world ranks of each group (after setup)
  std::vector<Param> params_;

  // Built at the first step.
  bool planned_ = false;
  Plan plan_;
  std::vector<RoundTable> tables_;
  // Device memory: per param its fp32 update (U, then the orthogonalized
  // update); prefetch_count + 1 working buffers of owned matrices; the
  // exchange's send and receive buffers; and each round's exchange bound to
  // them.
  std::vector<DeviceBuffer> updates_;
  std::vector<DeviceBuffer> slots_;
  DeviceBuffer send_, recv_;
  std::vector<BoundExchange> bound_;
  std::vector<float> custom_slot_;  // the largest custom-path matrix this rank owns (host)

  // ZeRO-2 blocks: up to group-size same-shape parameters, owner coord c
  // steps params[c] (-1: none).
  struct Zero2Block {
    int group = 0;
    DType dtype = DType::kF32;
    int64_t elems = 0;
    std::vector<int> params;
  };
  std::vector<Zero2Block> zero2_blocks_;
  std::vector<unsigned char> zero2_send_, zero2_recv_;
  std::vector<float> zero2_avg_;

  std::string poisoned_;  // set when a step failed after changing state
  int64_t step_count_ = 0;
  StepStats stats_;
};

}  // namespace muon

#endif  // MUON_ENGINE_OPTIMIZER_H_
