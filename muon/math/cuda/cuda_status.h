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

// Before a kernel launch: a launch's error is read with cudaGetLastError,
// which returns (and clears) the last error of any runtime call on this
// thread. An error already pending there is an earlier call's (the host's,
// left unread) or the context's (a sticky fault): libmuon does not launch,
// names it as pending rather than as its own, and leaves it unread for its
// caller (cudaPeekAtLastError does not clear it).
inline absl::Status CudaPendingBefore(const std::string& what) {
  const cudaError_t pending = cudaPeekAtLastError();
  if (pending == cudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": not launched: a CUDA error was pending before it, from an earlier call on this "
      "thread (not libmuon's): ", cudaGetErrorName(pending), " (", cudaGetErrorString(pending),
      "); it is left for its caller to read (cudaGetLastError)"));
}

}  // namespace muon

#endif  // MUON_MATH_CUDA_CUDA_STATUS_H_
