// The element-wise parts of a step on parameters' local pieces, as
// torch.optim.Muon computes them: momentum into each piece's fp32 update
// buffer before the orthogonalization, decay and the update from it after.
// These build the backend's arguments; one backend call steps every piece.
#ifndef MUON_ENGINE_LOCAL_UPDATE_H_
#define MUON_ENGINE_LOCAL_UPDATE_H_

#include "muon/common/dtype.h"
#include "muon/device/device.h"
#include "muon/engine/options.h"
#include "muon/engine/param.h"
#include "muon/math/backend.h"

namespace muon {

// The hyper-parameters of a step with `options` (StoreScalars puts them where
// the kernels read them).
StepScalars ScalarsOf(const Options& options);

// buf <- lerp(buf, grad, 1 - momentum); update <- nesterov ? lerp(grad, buf,
// momentum) : buf. `grad` holds p.numel() elements of `grad_dtype`; `update`
// (p's update storage: an fp32 buffer, or the gradient itself) receives
// p.numel() values.
MomentumArgs MomentumOf(Param& p, DType grad_dtype, const void* grad, const LocalBuffer& update);
MomentumStep MomentumStepOf(const Options& options, const StepScalars* scalars,
                            int64_t* nonfinite);

// p <- p * (1 - lr * weight_decay) - adjusted_lr * update.
ApplyArgs ApplyOf(const Options& options, const Param& p, const LocalBuffer& update);

}  // namespace muon

#endif  // MUON_ENGINE_LOCAL_UPDATE_H_
