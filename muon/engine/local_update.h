// The element-wise parts of a step on one parameter's local piece, as
// torch.optim.Muon computes them: momentum into the parameter's fp32 update
// buffer before the orthogonalization, decay and the update from it after.
#ifndef MUON_ENGINE_LOCAL_UPDATE_H_
#define MUON_ENGINE_LOCAL_UPDATE_H_

#include "absl/status/status.h"
#include "muon/common/dtype.h"
#include "muon/engine/options.h"
#include "muon/engine/param.h"
#include "muon/math/backend.h"

namespace muon {

// buf <- lerp(buf, grad, 1 - momentum); update <- nesterov ? lerp(grad, buf,
// momentum) : buf. `grad` holds p.numel() elements of `grad_dtype`; `update`
// receives p.numel() fp32 values.
absl::Status UpdateMomentum(MathBackend& math, const Options& options, Param& p,
                            DType grad_dtype, const void* grad, float* update,
                            int64_t* nonfinite = nullptr);

// p <- p * (1 - lr * weight_decay) - adjusted_lr * update; on the device,
// nothing when `gate` (device memory, may be NULL) holds nonzero.
absl::Status ApplyUpdate(MathBackend& math, const Options& options, const Param& p,
                         const float* update, const int32_t* gate = nullptr);

}  // namespace muon

#endif  // MUON_ENGINE_LOCAL_UPDATE_H_
