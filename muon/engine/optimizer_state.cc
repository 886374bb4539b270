// The optimizer's state in and out (muon_get_state / muon_set_state, the
// state blob: muon_save_state, muon_load_state, muon_load_states). The
// step's coordination is in optimizer.cc.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/common/matrix_view.h"
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
  outcome_.ParamRestored(registry_, static_cast<size_t>(p - registry_.params().data()),
                         options_.normuon);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<std::vector<SavedMoments>>> Optimizer::MomentsToSave(
    bool values) const {
  if (!options_.normuon) return nullptr;
  auto out = std::make_unique<std::vector<SavedMoments>>();
  if (setup_ != nullptr && setup_->moments != nullptr) {
    std::vector<std::vector<float>> copies;
    if (values) MUON_RETURN_IF_ERROR(setup_->moments->CopyOut(&copies));
    const auto& entries = setup_->moments->entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      out->push_back({entries[i].name, entries[i].index,
                      values ? std::move(copies[i])
                             : std::vector<float>(static_cast<size_t>(entries[i].rows))});
    }
  } else if (setup_ == nullptr) {
    for (const auto& [key, v] : moment_stash_.values) out->push_back({key.first, key.second, v});
  }
  return out;
}

absl::Status Optimizer::CheckMoments(int64_t id, const DLTensor* t, bool owned_only,
                                     const Param** param, float** values,
                                     std::vector<int>* ids) const {
  MUON_ASSIGN_OR_RETURN(const Param* p, registry_.Get(id));
  const std::string who = absl::StrCat("moments tensor for param '", p->name, "'");
  if (!options_.normuon) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": NorMuon is off (muon_options_t.normuon), so there are none"));
  }
  MUON_ASSIGN_OR_RETURN(TensorView v, ViewTensor(t, who));
  const int64_t want = p->batch * p->moment_count();
  if (!v.on_host() || v.dtype != DType::kF32 || v.numel() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": must be a float32 host tensor of ", want, " elements (", p->batch, " x ",
        p->moment_count(),
        ": a moment per row of each matrix, of each block when split by columns); got ",
        DTypeName(v.dtype), " ",
        ShapeString(v.shape), v.on_host() ? "" : " on a device"));
  }
  *param = p;
  *values = static_cast<float*>(v.data);
  ids->clear();
  if (setup_ == nullptr) return absl::OkStatus();
  const bool empty = MatrixShape{p->batch, p->rows, p->cols}.with_elements() == 0;
  for (int64_t k = 0; k < p->batch; ++k) {
    const int found = empty ? -1 : setup_->moments->Find(p->name, k);
    if (found < 0 && !empty && owned_only) {
      ids->push_back(-2);
      continue;
    }
    if (found < 0 && !empty) {
      return absl::FailedPreconditionError(absl::StrCat(
          "param '", p->name, "': the NorMuon moments of its matrix ", k,
          " live on the rank that owns it, not this one; the state blobs carry every owner's "
          "(muon_save_state, muon_load_states)"));
    }
    ids->push_back(found);
  }
  return absl::OkStatus();
}

absl::Status Optimizer::CopyMomentsOut(int64_t id, const DLTensor* dst, bool owned_only,
                                       uint8_t* owned, int64_t owned_count) const {
  const Param* p = nullptr;
  float* out = nullptr;
  std::vector<int> ids;
  MUON_RETURN_IF_ERROR(CheckMoments(id, dst, owned_only, &p, &out, &ids));
  if (owned != nullptr && owned_count != p->batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("owned_count for param '", p->name, "': must be its number of matrices, ",
                     p->batch, "; got ", owned_count));
  }
  std::fill(out, out + p->batch * p->moment_count(), 0.0f);
  for (int64_t k = 0; k < p->batch; ++k) {
    float* row = out + k * p->moment_count();
    const int found = setup_ == nullptr ? -1 : ids[static_cast<size_t>(k)];
    // Owned: one rank of the job gives each matrix's (a split matrix's
    // first member; its others keep the same).
    const bool here = setup_ == nullptr ||
                      (found != -2 && (!owned_only || found < 0 ||
                                       setup_->moments->entries()[static_cast<size_t>(found)].primary));
    if (owned != nullptr) owned[k] = here ? 1 : 0;
    if (setup_ == nullptr) {
      auto it = moment_stash_.values.find({p->name, k});
      if (it != moment_stash_.values.end() &&
          static_cast<int64_t>(it->second.size()) == p->moment_count()) {
        std::copy(it->second.begin(), it->second.end(), row);
      }
    } else if (found >= 0 && here) {
      MUON_RETURN_IF_ERROR(registry_.device()->ToHost(
          row, setup_->moments->data(found), p->moment_count() * sizeof(float)));
    }
  }
  return absl::OkStatus();
}

absl::Status Optimizer::CopyMomentsIn(int64_t id, const DLTensor* src, bool owned_only) {
  const Param* p = nullptr;
  float* in = nullptr;
  std::vector<int> ids;
  MUON_RETURN_IF_ERROR(CheckMoments(id, src, owned_only, &p, &in, &ids));
  for (int64_t i = 0; i < p->batch * p->moment_count(); ++i) {
    if (!(in[i] >= 0) || !std::isfinite(in[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moments tensor for param '", p->name, "': element ", i, " is ", in[i],
          " (second moments are finite and >= 0)"));
    }
  }
  for (int64_t k = 0; k < p->batch; ++k) {
    const float* row = in + k * p->moment_count();
    if (setup_ == nullptr) {
      // Zeros are what a matrix without moments starts with: only values
      // that are not need to reach every owner.
      for (int64_t i = 0; i < p->moment_count() && !moment_stash_.set_by_host; ++i) {
        moment_stash_.set_by_host = row[i] != 0.0f;
      }
      moment_stash_.values[{p->name, k}].assign(row, row + p->moment_count());
    } else if (ids[static_cast<size_t>(k)] >= 0) {
      MUON_RETURN_IF_ERROR(registry_.device()->FromHost(
          setup_->moments->data(ids[static_cast<size_t>(k)]), row,
          p->moment_count() * sizeof(float)));
    }
  }
  return absl::OkStatus();
}

size_t Optimizer::StateBlobSize() const {
  absl::StatusOr<std::unique_ptr<std::vector<SavedMoments>>> moments = MomentsToSave(false);
  return muon::StateBlobSize(registry_.params(), moments.ok() ? moments->get() : nullptr);
}

absl::Status Optimizer::SaveState(unsigned char* out) const {
  MUON_RETURN_IF_ERROR(outcome_.PendingFailure(registry_));
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
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<std::vector<SavedMoments>> moments, MomentsToSave(true));
  WriteStateBlob(params, step_count_, momentum, moments.get(), out);
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
  // NorMuon's moments: every blob's (replicas' copies are equal; the first
  // is taken); a blob without them (saved without NorMuon) starts them at 0.
  MomentStash stash;
  for (const SavedState& b : blobs) {
    stash.present = stash.present || b.format >= 3;
    for (const SavedMoments& m : b.moments) stash.values.emplace(MomentKey{m.name, m.index}, m.values);
  }
  OwnerMoments* owned = setup_ != nullptr ? setup_->moments.get() : nullptr;
  if (owned != nullptr) MUON_RETURN_IF_ERROR(owned->Check(stash));
  Device& device = *registry_.device();
  for (const StateCopy& c : plan.copies) {
    unsigned char* dst = params[c.param].momentum.as<unsigned char>() + c.dst_byte;
    MUON_RETURN_IF_ERROR(device.FromHost(dst, c.src, c.bytes));
  }
  if (owned != nullptr) MUON_RETURN_IF_ERROR(owned->Restore(stash));
  if (setup_ == nullptr) moment_stash_ = std::move(stash);
  for (Param& p : params) p.momentum_elsewhere = false;
  for (size_t i : plan.held_elsewhere) params[i].momentum_elsewhere = true;
  step_count_ = plan.step_count;
  stats_.steps = step_count_;  // the stats count steps as muon_step_count does
  outcome_.Restored();  // (the step in flight is still judged by every rank)
  return absl::OkStatus();
}

}  // namespace muon
