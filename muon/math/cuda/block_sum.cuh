// One block-wide sum for the kernels (ns_kernels.cu, normuon_kernels.cu).
#ifndef MUON_MATH_CUDA_BLOCK_SUM_CUH_
#define MUON_MATH_CUDA_BLOCK_SUM_CUH_

namespace muon {
namespace cuda {

// Sums `acc` over a block of kThreads threads in a fixed order (a tree over
// the thread index: deterministic); every thread gets the result. It may be
// called several times in a row in one kernel.
template <int kThreads, typename T>
__device__ T BlockSum(T acc) {
  __shared__ T partial[kThreads];
  __syncthreads();  // a previous call's readers are done
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  return partial[0];
}

}  // namespace cuda
}  // namespace muon

#endif  // MUON_MATH_CUDA_BLOCK_SUM_CUH_
