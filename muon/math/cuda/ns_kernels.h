// The CUDA kernels of the GPU backend, behind plain launch functions (this
// header is included by host C++ compiled without nvcc). Every launch is
// stream-ordered and returns the launch error; none synchronizes.
#ifndef MUON_MATH_CUDA_NS_KERNELS_H_
#define MUON_MATH_CUDA_NS_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace muon {
namespace cuda {

// Element types, numbered like muon::DType: 0 float32, 1 bfloat16, 2 float16.
enum ElemType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// dst[0, bytes) <- src[0, bytes) (host memory, bytes <= 64), stream-ordered,
// the bytes taken at the call as a kernel argument (a graph captures them as
// they are now). The step's hyper-parameters reach the device this way, laid
// out as muon::StepScalars (muon/math/backend.h): lr, weight_decay,
// momentum, each a double.
cudaError_t LaunchStoreBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);

// One tensor of a multi-tensor momentum launch.
struct MomentumTensor {
  int grad_type = kF32;
  const void* grad = nullptr;
  int buf_type = kF32;
  void* buf = nullptr;
  int64_t n = 0;
  void* out = nullptr;
  int out_type = kF32;
};

// For every tensor (all of them in as few launches as the kernel argument
// space allows, each block a chunk of one tensor), with the momentum read
// from `scalars` when the kernel runs:
//   buf <- lerp(buf, grad, 1 - momentum) (rounded to buf_type);
//   out <- nesterov ? lerp(grad, buf, momentum) : buf (rounded to buf_type,
//          stored as out_type; out may be grad: each element is read first);
//   *nonfinite (device memory, may be NULL) += the non-finite grad elements.
cudaError_t LaunchMomentum(const MomentumTensor* tensors, int64_t count, const void* scalars,
                           bool nesterov, int64_t* nonfinite, cudaStream_t stream);

// One tensor of a multi-tensor update launch.
struct ApplyTensor {
  int param_type = kF32;
  void* param = nullptr;
  int64_t n = 0;
  const void* update = nullptr;
  double lr_ratio = 1.0;
  int update_type = kF32;
  int cautious = 0;  // nonzero: the decay only where update * param >= 0
  double weight_decay_scale = 1.0;  // this tensor's decay: wd * weight_decay_scale
};

// For every tensor, lr and weight_decay read from `scalars` when it runs:
//   param <- round(param * (1 - lr * wd)); param <- round(param - lr * lr_ratio * update);
// nothing when `gate` (device memory, may be NULL) holds nonzero.
cudaError_t LaunchApply(const ApplyTensor* tensors, int64_t count, const void* scalars,
                        const int32_t* gate, cudaStream_t stream);

// *counter (device memory) += the non-finite elements of x[0, n) (in `type`).
cudaError_t LaunchCountNonFinite(int type, const void* x, int64_t n, int64_t* counter,
                                 cudaStream_t stream);

// x[0, n) (in `type`) <- round_type(round_precision(x * factor)): a split
// block's lr factor (SplitOrthogonalizer).
cudaError_t LaunchScaleRounded(int type, void* x, int64_t n, float factor, int precision,
                               cudaStream_t stream);

// One tensor of a multi-tensor count launch.
struct CountTensor {
  int type = kF32;
  const void* x = nullptr;
  int64_t n = 0;
};

// The same over every tensor, in as few launches as the kernel argument
// space allows (one for up to 40 tensors), each block a chunk of one tensor.
cudaError_t LaunchCountNonFiniteAll(const CountTensor* tensors, int64_t count, int64_t* counter,
                                    cudaStream_t stream);

// *flag = 0 when each of the n 16-byte verdicts (u32 magic, i32 code, u64
// digest) has `magic`, code 0 and verdict 0's digest, else 1 (one block).
cudaError_t LaunchVerdictGate(const void* verdicts, int64_t n, uint32_t magic, int32_t* flag,
                              cudaStream_t stream);

// The blocks LaunchPrepare splits one matrix of `elems` elements over: its
// `partials` buffer holds count * NormBlocks(elems) floats.
int NormBlocks(int64_t elems);

// For each of `count` matrices of `elems` elements of u_type at u (no transpose:
// muon/math/ns_program.h reads either orientation as stored):
//   x[k] <- round(u[k]) / max(||round(u[k])||_F, eps)   in x_type
// the norm in fp32 (rounded to bf16 when x_type is bf16, as torch's bf16 norm
// is; fp16 rounds the quotient alone, u[k] / max(||u[k]||_F, eps), as the
// CPU backend does), split over NormBlocks(elems) blocks per matrix with float4 loads and a
// fixed reduction order (deterministic; the same bits for an fp32 u and its
// bf16 copy when x_type is bf16). Two launches.
cudaError_t LaunchPrepare(const void* u, int u_type, int64_t count, int64_t elems, int x_type,
                          float eps, float* partials, void* x, cudaStream_t stream);

// u[0, n) (u_type: fp32, or x_type itself) <- x[0, n) (in x_type).
cudaError_t LaunchFinish(int x_type, const void* x, int64_t n, void* u, int u_type,
                         cudaStream_t stream);

// For `count` symmetric m x m matrices at d (column-major, stride m * m, in
// x_type) of which only the tiles on and below the diagonal of b x b tiles
// were computed: each upper tile <- its mirror's bits (element (r, c) with
// r / b < c / b takes (c, r)'s).
cudaError_t LaunchMirrorTiles(int x_type, void* d, int64_t count, int64_t m, int64_t b,
                              cudaStream_t stream);

// Gram Newton-Schulz's Q = Z + a I: q[k] <- z[k], then each diagonal
// element + a (in fp32, rounded to x_type), for `count` m x m matrices at
// stride m * m.
cudaError_t LaunchAddIdentity(int x_type, const void* z, void* q, int64_t count, int64_t m,
                              float a, cudaStream_t stream);

}  // namespace cuda
}  // namespace muon

#endif  // MUON_MATH_CUDA_NS_KERNELS_H_
