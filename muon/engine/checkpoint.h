// The optimizer state as a self-describing byte blob (see muon_save_state).
//
// Layout (little-endian): "MUONSTAT" | u32 format=1 | u32 0 | i64 step_count |
// u64 param_count | per param: u32 name_len, name, u8 state dtype, u8 view,
// u16 0, u32 ndim, i64 dims[ndim], u64 nbytes, momentum bytes.
#ifndef MUON_ENGINE_CHECKPOINT_H_
#define MUON_ENGINE_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/engine/param.h"

namespace muon {

size_t StateBlobSize(const std::vector<Param>& params);

// Writes the blob into out[0, StateBlobSize(params)); momentum[i] is a host
// copy of params[i].momentum (the buffer itself on the host device).
void WriteStateBlob(const std::vector<Param>& params, int64_t step_count,
                    const std::vector<const void*>& momentum, unsigned char* out);

// Where each parameter's momentum bytes sit in a checked blob.
struct ParsedState {
  int64_t step_count = 0;
  std::vector<const unsigned char*> momentum;  // one per param, in order
};

// Checks the whole blob against `params` (count, names, shapes, views, dtypes,
// sizes) without changing anything; errors name the first mismatch.
absl::StatusOr<ParsedState> ParseStateBlob(const std::vector<Param>& params,
                                           const unsigned char* data, size_t size);

}  // namespace muon

#endif  // MUON_ENGINE_CHECKPOINT_H_
