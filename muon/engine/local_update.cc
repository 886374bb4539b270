#include "muon/engine/local_update.h"

namespace muon {

StepScalars ScalarsOf(const Options& options) {
  StepScalars s;
  s.lr = options.lr;
  s.weight_decay = options.weight_decay;
  s.momentum = options.momentum;
  return s;
}

MomentumArgs MomentumOf(Param& p, DType grad_dtype, const void* grad, const LocalBuffer& update) {
  MomentumArgs m;
  m.grad_dtype = grad_dtype;
  m.grad = grad;
  m.buf_dtype = p.state_dtype;
  m.buf = p.momentum.data();
  m.n = p.numel();
  m.out = update.data;
  m.out_dtype = update.dtype;
  return m;
}

MomentumStep MomentumStepOf(const Options& options, const StepScalars* scalars,
                            int64_t* nonfinite) {
  MomentumStep s;
  s.scalars = scalars;
  s.nesterov = options.nesterov;
  s.nonfinite = nonfinite;
  return s;
}

ApplyArgs ApplyOf(const Options& options, const Param& p, const LocalBuffer& update) {
  ApplyArgs a;
  a.param_dtype = p.value.dtype;
  a.param = p.value.data;
  a.n = p.numel();
  a.update = update.data;
  a.update_dtype = update.dtype;
  a.lr_ratio = ApplyLrRatio(options.adjust_lr, p.split, p.rows, p.cols) * options.update_scale *
               p.lr_scale;
  a.weight_decay_scale = p.weight_decay_scale;
  a.cautious = options.cautious_wd;
  return a;
}

}  // namespace muon
