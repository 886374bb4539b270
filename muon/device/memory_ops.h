// Byte copies that work on any memory the process can address (host or GPU),
// for the in-process communicator when its ranks pass GPU buffers. Without a
// GPU device loaded there are none and host memcpy is all there is; the CUDA
// loader installs the plugin's ops once a CUDA device opens (cuda_loader.h).
#ifndef MUON_DEVICE_MEMORY_OPS_H_
#define MUON_DEVICE_MEMORY_OPS_H_

#include <cstddef>

#include "absl/status/status.h"

namespace muon {

// C function pointers (they come from the plugin). Each returns 0 on
// success, else an error whose text error_string gives.
struct MemoryOps {
  // Waits until the work enqueued on `stream` is done.
  int (*sync)(void* stream);
  // Enqueues a copy of `bytes` between any two addresses on `stream`.
  int (*copy)(void* dst, const void* src, size_t bytes, void* stream);
  // 1 when the host may read `ptr` directly (host or pinned memory).
  int (*host_readable)(const void* ptr);
  const char* (*error_string)(int error);
};

// The installed ops, or NULL (no GPU device loaded in this process).
const MemoryOps* InstalledMemoryOps();
void InstallMemoryOps(const MemoryOps* ops);  // process-wide, once, never removed

// A status for a nonzero result of one of `ops`, naming `what`.
absl::Status MemoryOpsError(const MemoryOps& ops, int error, const char* what);

}  // namespace muon

#endif  // MUON_DEVICE_MEMORY_OPS_H_
