#include "muon/engine/owner_moments.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {

int OwnerMoments::Add(const std::string& name, int64_t index, int64_t rows, bool primary) {
  entries_.push_back({name, index, rows, floats_, primary});
  floats_ += rows;
  const int id = static_cast<int>(entries_.size()) - 1;
  ids_.emplace(MomentKey{name, index}, id);
  return id;
}

int OwnerMoments::Find(const std::string& name, int64_t index) const {
  auto it = ids_.find({name, index});
  return it == ids_.end() ? -1 : it->second;
}

absl::Status OwnerMoments::Check(const MomentStash& stash) const {
  for (const Entry& e : entries_) {
    auto it = stash.values.find({e.name, e.index});
    if (it == stash.values.end() && stash.present) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", e.name, "': the NorMuon second moments of its matrix ", e.index,
          " are in no loaded state blob, which list NorMuon moments (a blob of every rank "
          "of the saving job is needed: each holds the moments of the matrices its rank "
          "owned)"));
    }
    if (it != stash.values.end() && static_cast<int64_t>(it->second.size()) != e.rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", e.name, "': the loaded NorMuon second moments of its matrix ", e.index,
          " hold ", it->second.size(), " rows; the matrix has ", e.rows));
    }
  }
  return absl::OkStatus();
}

absl::Status OwnerMoments::Allocate(const std::shared_ptr<Device>& device,
                                    const MomentStash& stash) {
  MUON_RETURN_IF_ERROR(Check(stash));
  device_ = device;
  MUON_ASSIGN_OR_RETURN(buffer_,
                        DeviceBuffer::Make(device, static_cast<size_t>(floats_) * sizeof(float),
                                           "the NorMuon second moments"));
  return Restore(stash);
}

absl::Status OwnerMoments::Restore(const MomentStash& stash) {
  MUON_RETURN_IF_ERROR(Check(stash));
  if (floats_ == 0) return absl::OkStatus();
  std::vector<float> all(static_cast<size_t>(floats_), 0.0f);
  for (const Entry& e : entries_) {  // (Check: present ones are all there)
    auto it = stash.values.find({e.name, e.index});
    if (it != stash.values.end()) std::copy(it->second.begin(), it->second.end(), all.begin() + e.offset);
  }
  return device_->FromHost(buffer_.data(), all.data(), all.size() * sizeof(float));
}

absl::Status OwnerMoments::CopyOut(std::vector<std::vector<float>>* out) const {
  out->clear();
  if (floats_ == 0) {
    out->resize(entries_.size());
    return absl::OkStatus();
  }
  std::vector<float> all(static_cast<size_t>(floats_));
  MUON_RETURN_IF_ERROR(device_->ToHost(all.data(), buffer_.data(), all.size() * sizeof(float)));
  for (const Entry& e : entries_) {
    out->emplace_back(all.begin() + e.offset, all.begin() + e.offset + e.rows);
  }
  return absl::OkStatus();
}

}  // namespace muon
