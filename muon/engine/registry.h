// What an optimizer steps, as registered before its first step: the
// communicators (the world and the placement groups), the parameters, and
// the device they live on (the host, or a CUDA device picked by the first
// parameter). Each call checks its arguments and, when it fails, leaves
// nothing behind. The first step closes registration.
#ifndef MUON_ENGINE_REGISTRY_H_
#define MUON_ENGINE_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "muon/comm/comm.h"
#include "muon/device/device.h"
#include "muon/engine/param.h"
#include "muon/engine/storage_index.h"
#include "muon/sharding/layout.h"

namespace muon {

// The distributed layout a parameter is registered with.
struct DistSpec {
  std::vector<int64_t> global_shape;
  std::vector<Placement> placements;
  bool zero2 = false;  // ZeRO-2 replicated mode (placements: one Replicate)
};

class Registry {
 public:
  // A single-process registry: `self` is the world of one rank, on the host.
  explicit Registry(std::shared_ptr<Comm> self);

  // The world (every rank of the step) and further groups; each returns the
  // group id placements use. Closed once a parameter is registered.
  absl::StatusOr<int> SetWorld(std::shared_ptr<Comm> world);
  absl::StatusOr<int> AddGroup(std::shared_ptr<Comm> group);
  absl::StatusOr<int> GroupSize(int group) const;
  int num_groups() const { return static_cast<int>(groups_.size()); }

  // Registers a parameter; returns its id. An empty name becomes "param<id>"
  // (a name is required once a world is set). `dist` (optional) gives the
  // global shape and placements; `split` cuts its matrices into blocks
  // (checked against them here).
  absl::StatusOr<int64_t> Register(const DLTensor* value, const DLTensor* grad,
                                   const std::string& name, int view, const DistSpec* dist,
                                   bool momentum_fp32, const BlockSplit& split = BlockSplit());
  // Registers a parameter on the custom path (needs a world).
  absl::StatusOr<int64_t> RegisterCustom(const DLTensor* value, const DLTensor* grad,
                                         const std::string& name, int64_t rows, int64_t cols,
                                         std::shared_ptr<CustomPath> path, bool momentum_fp32,
                                         const BlockSplit& split = BlockSplit());
  // Points param `id` at new storage (same device, shape and dtype); a null
  // grad (single-process only) skips it until a gradient is bound again.
  // Allowed between steps.
  absl::Status Rebind(int64_t id, const DLTensor* value, const DLTensor* grad);

  // The host's allocator for the device's memory (set before registering:
  // on the host device now, on a GPU when the first parameter opens it).
  absl::Status SetAllocator(const Device::Allocator& allocator);

  // update_in_grad (options.h): each gradient must hold its update exactly
  // (checked at registration, `ns_bf16`: Newton-Schulz in bf16), and after
  // the first step a parameter keeps its gradient storage (the exchange is
  // bound to it).
  void SetUpdateInGrad(bool on, bool ns_bf16) {
    update_in_grad_ = on;
    ns_bf16_ = ns_bf16;
  }
  bool update_in_grad() const { return update_in_grad_; }
  // Whether param `p` is stepped by the exchange (not the custom path, not
  // ZeRO-2).
  static bool Exchanged(const Param& p) { return !p.custom && p.zero2_group < 0; }
  // Whether param `p`'s update lives in its gradient (else an update buffer).
  bool UpdateInGrad(const Param& p) const { return update_in_grad_ && Exchanged(p); }

  // Ends registration (the first step's setup succeeded); what only
  // registration needs (the name set, the storage index) is freed.
  void Close();

  absl::StatusOr<const Param*> Get(int64_t id) const;
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  const std::shared_ptr<Device>& device() const { return device_; }
  bool distributed() const { return distributed_; }
  Comm& world() const { return *world_; }
  const std::vector<std::shared_ptr<Comm>>& groups() const { return groups_; }

 private:
  absl::Status CheckName(const std::string& name) const;
  // Checks that `p` lives on the registry's device (the first parameter picks
  // it) and allocates its momentum there.
  absl::Status Place(Param* p);
  // Under update_in_grad: refuses a gradient dtype that cannot hold p's
  // update exactly.
  absl::Status CheckGradHoldsUpdate(const Param& p) const;
  // Refuses storage shared with another registered tensor, then adds `p`.
  // O(log n): the name set and the storage index see every registered
  // parameter (until Close).
  absl::Status Add(Param p);
  // Points param `id` at `value` and `grad`, keeping the storage index.
  void Bind(int64_t id, TensorView value, TensorView grad);

  std::shared_ptr<Device> device_;
  Device::Allocator allocator_;
  bool update_in_grad_ = false;
  bool ns_bf16_ = true;
  std::shared_ptr<Comm> world_;  // the self communicator until SetWorld
  bool distributed_ = false;
  std::vector<std::shared_ptr<Comm>> groups_;  // placement groups (the world among them)
  std::vector<Param> params_;
  absl::flat_hash_set<std::string> names_;  // of params_, while registration is open
  StorageIndex storage_;                    // of params_' tensors, while open
  bool storage_stale_ = false;              // storage_ misses a rebinding
  bool closed_ = false;
};

}  // namespace muon

#endif  // MUON_ENGINE_REGISTRY_H_
