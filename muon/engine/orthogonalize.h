// Newton-Schulz on its own, outside a step: what torch's
// _zeropower_via_newtonschulz computes, for every matrix of a tensor, on a
// device's backend (muon_orthogonalize in include/libmuon/muon.h).
#ifndef MUON_ENGINE_ORTHOGONALIZE_H_
#define MUON_ENGINE_ORTHOGONALIZE_H_

#include <dlpack/dlpack.h>

#include <memory>

#include "absl/status/status.h"
#include "muon/device/device.h"
#include "muon/math/ns_config.h"

namespace muon {

// out <- NS(in) for every matrix of `in` under `view` (a muon_matrix_view_t):
// `in` is read as fp32, orthogonalized in config.dtype's precision, and
// rounded to out's dtype. Both tensors are contiguous, of one shape, in
// `device`'s memory (or host memory on the host device), float32, bfloat16
// or float16; `out` may be `in` itself but may not overlap it otherwise. On
// a GPU the work is ordered on `stream`, and the call returns once it is done
// (it frees its fp32 working copy). Errors name "in" or "out" and the cause.
absl::Status OrthogonalizeTensor(const std::shared_ptr<Device>& device, const NsConfig& config,
                                 const DLTensor* in, const DLTensor* out, int view,
                                 void* stream);

}  // namespace muon

#endif  // MUON_ENGINE_ORTHOGONALIZE_H_
