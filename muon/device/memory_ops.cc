#include "muon/device/memory_ops.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {
std::atomic<const MemoryOps*> g_ops{nullptr};
}  // namespace

const MemoryOps* InstalledMemoryOps() { return g_ops.load(std::memory_order_acquire); }

void InstallMemoryOps(const MemoryOps* ops) { g_ops.store(ops, std::memory_order_release); }

absl::Status MemoryOpsError(const MemoryOps& ops, int error, const char* what) {
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ops.error_string(error)));
}

}  // namespace muon
