// Restoring momentum from saved state blobs (checkpoint.h): which bytes of
// which blob go where in this rank's momentum buffers, decided and checked
// in full before anything is written.
//
// From this rank's own blob (muon_load_state): the same parameters in the
// same order, shapes, views and dtypes, and the same elements (layout) as
// when saved. From several ranks' blobs (muon_load_states), e.g. every blob
// of a job saved at another world size or layout: each parameter's global
// elements are looked up in whichever blob holds them (a replica's copy
// will do), by name, global shape, view and dtype; refused while a
// custom-path parameter is registered (its entries carry no global
// coordinates).
#ifndef MUON_ENGINE_STATE_RESTORE_H_
#define MUON_ENGINE_STATE_RESTORE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/engine/checkpoint.h"
#include "muon/engine/param.h"

namespace muon {

struct StateCopy {
  size_t param = 0;     // index into the params
  size_t dst_byte = 0;  // into its momentum buffer
  const unsigned char* src = nullptr;
  size_t bytes = 0;
};

struct RestorePlan {
  std::vector<StateCopy> copies;
  // ZeRO-2 params restored before the first step from a blob of a rank that
  // held none of their momentum: that rank must not own them at setup.
  std::vector<size_t> held_elsewhere;
  int64_t step_count = 0;
};

// `set_up`: whether the first step's setup ran (before it, a ZeRO-2 param's
// owner is not known yet). Errors name the blob, the param and the cause.
absl::StatusOr<RestorePlan> PlanRestore(const std::vector<Param>& params,
                                        const std::vector<SavedState>& blobs, bool own_blob,
                                        bool set_up);

}  // namespace muon

#endif  // MUON_ENGINE_STATE_RESTORE_H_
