// NorMuon's second moments (muon/math/normuon.h) of the matrices this rank
// orthogonalizes, kept across steps: `rows` fp32 values per matrix, keyed by
// parameter name and matrix index (the plan's names, so that a matrix whose
// parameter this rank does not hold has them too), in the device's memory.
// The steppers add their matrices at setup, then the setup allocates them
// all at once, zero or as the last loaded state blob had them; the blob
// saves and restores them (format 3).
#ifndef MUON_ENGINE_OWNER_MOMENTS_H_
#define MUON_ENGINE_OWNER_MOMENTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "muon/device/device.h"

namespace muon {

using MomentKey = std::pair<std::string, int64_t>;  // param name, matrix index

// Moments read from state blobs, waiting for the rank that owns each matrix.
struct MomentStash {
  // A blob listed moments (format 3, saved with normuon): every owned matrix
  // must then be among them. Unset: those not among them start at zero.
  bool present = false;
  // The host set moments other than zero before the first step
  // (muon_set_moments, muon_set_owned_moments: a resume through its own
  // checkpoint), which reach only the ranks that hold each parameter.
  bool set_by_host = false;
  std::map<MomentKey, std::vector<float>> values;
};

class OwnerMoments {
 public:
  struct Entry {
    std::string name;
    int64_t index = 0;
    int64_t rows = 0;
    int64_t offset = 0;  // in the buffer, floats
    // The rank that gives them to a host putting the ranks' moments together
    // (muon_get_owned_moments): the owner, or the first member of a matrix
    // split over ranks, each of whose members keeps them all alike.
    bool primary = true;
  };

  // Adds matrix `index` of `name`, `rows` moments; returns its id.
  int Add(const std::string& name, int64_t index, int64_t rows, bool primary = true);
  // The id of matrix `index` of `name`, or -1 when this rank does not own it.
  int Find(const std::string& name, int64_t index) const;
  // Allocates every added matrix's moments on `device` and fills them from
  // `stash` (zero without one). InvalidArgument naming the matrix when the
  // stash is present but lacks it or holds another row count.
  absl::Status Allocate(const std::shared_ptr<Device>& device, const MomentStash& stash);
  // Overwrites the moments from `stash` as Allocate fills them; checks every
  // matrix before writing any.
  absl::Status Restore(const MomentStash& stash);
  // Every entry's moments, host copies in entry order (for the blob).
  absl::Status CopyOut(std::vector<std::vector<float>>* out) const;

  // What Restore and Allocate refuse, without writing anything.
  absl::Status Check(const MomentStash& stash) const;

  float* data(int id) const { return buffer_.as<float>() + entries_[id].offset; }
  const std::vector<Entry>& entries() const { return entries_; }

 private:

  std::vector<Entry> entries_;
  std::map<MomentKey, int> ids_;
  int64_t floats_ = 0;
  std::shared_ptr<Device> device_;
  DeviceBuffer buffer_;
};

}  // namespace muon

#endif  // MUON_ENGINE_OWNER_MOMENTS_H_
