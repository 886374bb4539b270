#include "muon/engine/local_update.h"

namespace muon {

absl::Status UpdateMomentum(MathBackend& math, const Options& options, Param& p,
                            DType grad_dtype, const void* grad, float* update,
                            int64_t* nonfinite) {
  MomentumArgs m;
  m.grad_dtype = grad_dtype;
  m.grad = grad;
  m.buf_dtype = p.state_dtype;
  m.buf = p.momentum.data();
  m.n = p.numel();
  m.momentum = options.momentum;
  m.nesterov = options.nesterov;
  m.out = update;
  m.nonfinite = nonfinite;
  return math.Momentum(m);
}

absl::Status ApplyUpdate(MathBackend& math, const Options& options, const Param& p,
                         const float* update, const int32_t* gate) {
  ApplyArgs a;
  a.param_dtype = p.value.dtype;
  a.param = p.value.data;
  a.n = p.numel();
  a.update = update;
  a.decay = 1.0 - options.lr * options.weight_decay;
  a.lr_adjusted = AdjustedLr(options.lr, options.adjust_lr, p.rows, p.cols);
  a.gate = gate;
  return math.Apply(a);
}

}  // namespace muon
