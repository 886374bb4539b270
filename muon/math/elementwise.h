// The element-wise math of a step, defined once for the CPU backend and the
// CUDA kernels (__host__ __device__ under nvcc, see muon/common/half.h):
// torch's lerp, one element of the momentum update, and one of decay plus
// update. elementwise_test.cc checks them on the CPU against torch's
// formulas evaluated independently.
#ifndef MUON_MATH_ELEMENTWISE_H_
#define MUON_MATH_ELEMENTWISE_H_

#include "muon/common/half.h"

namespace muon {
namespace ew {

// torch's lerp: self + w (end - self) for |w| < 0.5, else end - (end - self)(1 - w).
MUON_HD float TorchLerp(float self, float end, float w) {
  return (w < 0.5f && w > -0.5f) ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}

// One element of the momentum update, as torch.optim.Muon computes it with a
// momentum buffer of `buf_type`: *buf <- lerp(*buf, g, w_buf) rounded to
// buf_type; returns the update, nesterov ? lerp(g, *buf, w_out) : *buf,
// rounded to buf_type (the precision torch's update tensor has).
MUON_HD float MomentumElement(int buf_type, float g, float* buf, float w_buf, float w_out,
                              bool nesterov) {
  const float b = RoundTo(buf_type, TorchLerp(*buf, g, w_buf));
  *buf = b;
  return nesterov ? RoundTo(buf_type, TorchLerp(g, b, w_out)) : b;
}

// One element of decay and the update, as torch's mul_ then add_ (each
// rounded to the parameter's type; the caller's Store does the second).
MUON_HD float ApplyElement(int param_type, float p, float update, float decay, float alpha) {
  return RoundTo(param_type, p * decay) + alpha * update;
}

}  // namespace ew
}  // namespace muon

#endif  // MUON_MATH_ELEMENTWISE_H_
