// StrictCpuRuntime's page-locked host memory (see the header): plain host
// memory it keeps a list of, so that a copy can tell it from pageable memory.
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "muon/device/testing/strict_cpu_runtime.h"

namespace muon {

absl::StatusOr<void*> StrictCpuRuntime::HostAlloc(size_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  absl::Status capturing = CheckNotCapturingLocked(what);
  if (!capturing.ok()) return capturing;
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of host memory"));
  }
  std::memset(p, 0xA5, bytes);  // as cudaHostAlloc: not zeroed (the arena's fresh pattern)
  pinned_[static_cast<const unsigned char*>(p)] = bytes;
  ++devices_[static_cast<size_t>(CurrentLocked())].counters.host_allocs;
  return p;
}

void StrictCpuRuntime::HostFree(void* ptr) {
  if (ptr == nullptr) return;
  (void)RunAll(-1);  // as cudaFreeHost: after the work that may use it
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_.find(static_cast<const unsigned char*>(ptr));
  if (it == pinned_.end()) {
    if (failed_.ok()) {
      failed_ = absl::InvalidArgumentError(absl::StrFormat(
          "strict-cpu runtime: HostFree(%p) of memory HostAlloc did not hand out", ptr));
    }
    return;
  }
  pinned_.erase(it);
  std::free(ptr);
}

bool StrictCpuRuntime::PinnedLocked(const void* ptr, size_t bytes) const {
  const auto* p = static_cast<const unsigned char*>(ptr);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  return p + bytes <= it->first + it->second;
}

}  // namespace muon
