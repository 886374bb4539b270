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

// Cautious weight decay (arXiv 2510.12402; Dion, Emerging-Optimizers): the
// decay factor where update * p >= 0 (the decay moves p the way the update
// does, or one of them is zero), 1 (no decay) where their signs differ.
// Signs compared, not the product, which could underflow to 0; without
// branches (bitwise ands and ors of the comparisons), so that the CPU loops
// vectorize. (A NaN update or value makes the element NaN either way.)
MUON_HD float CautiousDecay(float p, float update, float decay) {
  const bool opposed = ((update > 0.0f) & (p < 0.0f)) | ((update < 0.0f) & (p > 0.0f));
  return opposed ? 1.0f : decay;
}

// The fp32 factors the element functions take, from the step's double
// hyper-parameters (StepScalars), computed alike on the host and in a kernel
// (the device's multiply-subtract kept from fusing into one fma, which
// rounds once where the host rounds twice).
MUON_HD float MomentumWeightOfBuf(double momentum) { return static_cast<float>(1.0 - momentum); }
MUON_HD float MomentumWeightOfOut(double momentum) { return static_cast<float>(momentum); }
MUON_HD float DecayFactor(double lr, double weight_decay) {
#ifdef __CUDA_ARCH__
  return static_cast<float>(__dadd_rn(1.0, -__dmul_rn(lr, weight_decay)));
#else
  return static_cast<float>(1.0 - lr * weight_decay);
#endif
}
// -(adjusted lr), adjusted lr = lr * lr_ratio as torch's _adjust_lr.
MUON_HD float UpdateAlpha(double lr, double lr_ratio) { return static_cast<float>(-(lr * lr_ratio)); }

}  // namespace ew
}  // namespace muon

#endif  // MUON_MATH_ELEMENTWISE_H_
