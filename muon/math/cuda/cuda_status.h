// CUDA runtime errors as statuses: the call named, the error's name and text;
// out-of-memory as ResourceExhausted.
#ifndef MUON_MATH_CUDA_CUDA_STATUS_H_
#define MUON_MATH_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace muon {

inline absl::Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat(msg, ": out of GPU memory"));
  }
  return absl::InternalError(msg);
}

}  // namespace muon

#endif  // MUON_MATH_CUDA_CUDA_STATUS_H_
