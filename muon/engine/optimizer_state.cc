// The optimizer's state in and out (muon_get_state / muon_set_state, the
// state blob: muon_save_state, muon_load_state, muon_load_states). The
// step's coordination is in optimizer.cc.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"
#include "muon/engine/checkpoint.h"
#include "muon/engine/optimizer.h"
#include "muon/engine/state_restore.h"

namespace muon {

absl::Status Optimizer::CheckStateTensor(int64_t id, const DLTensor* t, Param** param) const {
  MUON_ASSIGN_OR_RETURN(const Param* p, registry_.Get(id));
  if (!p->holds_state) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", p->name, "': its momentum lives on its ZeRO-2 owner, another rank of its "
        "data-parallel group; read or write it there"));
  }
  const std::string who = absl::StrCat("state tensor for param '", p->name, "'");
  MUON_ASSIGN_OR_RETURN(TensorView v, ViewTensor(t, who));
  const Device& device = *registry_.device();
  if (!v.on_host() && DeviceString(v.device) != device.name()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": is on ", DeviceString(v.device),
                                                   "; pass host memory or a tensor on ",
                                                   device.name()));
  }
  if (v.shape != p->value.shape) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", ShapeString(v.shape),
                                                   " differs from the parameter's ",
                                                   ShapeString(p->value.shape)));
  }
  if (v.dtype != p->state_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": dtype ", DTypeName(v.dtype),
                                                   " differs from the state dtype ",
                                                   DTypeName(p->state_dtype)));
  }
  *param = const_cast<Param*>(p);
  return absl::OkStatus();
}

absl::Status Optimizer::CopyStateOut(int64_t id, const DLTensor* dst) const {
  Param* p = nullptr;
  MUON_RETURN_IF_ERROR(CheckStateTensor(id, dst, &p));
  auto v = ViewTensor(dst, "state tensor");
  Device& device = *registry_.device();
  if (p->momentum.empty()) return absl::OkStatus();
  return v->on_host() ? device.ToHost(v->data, p->momentum.data(), p->momentum.size())
                      : device.CopyBytes(v->data, p->momentum.data(), p->momentum.size());
}

absl::Status Optimizer::CopyStateIn(int64_t id, const DLTensor* src) {
  Param* p = nullptr;
  MUON_RETURN_IF_ERROR(CheckStateTensor(id, src, &p));
  auto v = ViewTensor(src, "state tensor");
  Device& device = *registry_.device();
  if (!p->momentum.empty()) {
    MUON_RETURN_IF_ERROR(
        v->on_host() ? device.FromHost(p->momentum.data(), v->data, p->momentum.size())
                     : device.CopyBytes(p->momentum.data(), v->data, p->momentum.size()));
  }
  if (!poisoned_.empty()) {
    // Poisoned until every param holding state here has been restored.
    const std::vector<Param>& params = registry_.params();
    restored_[static_cast<size_t>(p - params.data())] = true;
    bool all = true;
    for (size_t i = 0; i < params.size(); ++i) all = all && (restored_[i] || !params[i].holds_state);
    if (all) poisoned_.clear();
  }
  return absl::OkStatus();
}

size_t Optimizer::StateBlobSize() const { return muon::StateBlobSize(registry_.params()); }

absl::Status Optimizer::SaveState(unsigned char* out) const {
  MUON_RETURN_IF_ERROR(device_outcome_.PendingFailure(registry_));
  const std::vector<Param>& params = registry_.params();
  Device& device = *registry_.device();
  std::vector<const void*> momentum(params.size());
  std::vector<std::vector<unsigned char>> staged;  // host copies of device momentum
  try {
    if (!device.is_host()) staged.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const DeviceBuffer& m = params[i].momentum;
      momentum[i] = m.data();
      if (device.is_host() || m.empty()) continue;
      staged[i].resize(m.size());
      MUON_RETURN_IF_ERROR(device.ToHost(staged[i].data(), m.data(), m.size()));
      momentum[i] = staged[i].data();
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory for staging the state");
  }
  WriteStateBlob(params, step_count_, momentum, out);
  return absl::OkStatus();
}

absl::Status Optimizer::LoadState(const unsigned char* data, size_t size) {
  MUON_ASSIGN_OR_RETURN(SavedState blob, ParseStateBlob(data, size, "state blob"));
  return Restore({std::move(blob)}, /*own_blob=*/true);
}

absl::Status Optimizer::LoadStates(const unsigned char* const* data, const size_t* sizes,
                                   size_t count) {
  std::vector<SavedState> blobs;
  for (size_t k = 0; k < count; ++k) {
    MUON_ASSIGN_OR_RETURN(SavedState blob,
                          ParseStateBlob(data[k], sizes[k], absl::StrCat("state blob ", k)));
    blobs.push_back(std::move(blob));
  }
  return Restore(blobs, /*own_blob=*/false);
}

absl::Status Optimizer::Restore(const std::vector<SavedState>& blobs, bool own_blob) {
  std::vector<Param>& params = registry_.params();
  // Everything is checked before the first byte is written.
  MUON_ASSIGN_OR_RETURN(RestorePlan plan, PlanRestore(params, blobs, own_blob, setup_ != nullptr));
  Device& device = *registry_.device();
  for (const StateCopy& c : plan.copies) {
    unsigned char* dst = params[c.param].momentum.as<unsigned char>() + c.dst_byte;
    MUON_RETURN_IF_ERROR(device.FromHost(dst, c.src, c.bytes));
  }
  for (Param& p : params) p.momentum_elsewhere = false;
  for (size_t i : plan.held_elsewhere) params[i].momentum_elsewhere = true;
  step_count_ = plan.step_count;
  stats_.steps = step_count_;  // the stats count steps as muon_step_count does
  device_outcome_.Restored();  // (the step in flight is still judged by every rank)
  poisoned_.clear();
  return absl::OkStatus();
}

}  // namespace muon
