#include "muon/device/device.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {

Device::~Device() = default;

absl::Status Device::SetAllocator(const Allocator& allocator) {
  if ((allocator.allocate == nullptr) != (allocator.release == nullptr)) {
    return absl::InvalidArgumentError(
        "allocate and release: set both (a host allocator) or neither (the library's own)");
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  if (!live_.empty()) {
    return absl::FailedPreconditionError(
        "the allocator can only be set before the device allocates anything");
  }
  allocator_ = allocator;
  return absl::OkStatus();
}

absl::StatusOr<void*> Device::Allocate(size_t bytes, const std::string& what) {
  Allocator a;
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    a = allocator_;
  }
  void* p = nullptr;
  if (a.allocate != nullptr) {
    p = a.allocate(a.ctx, bytes, dl_device_type(), dl_device_id(), current_stream());
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "allocating ", what, " (", bytes, " bytes on ", name(), "): the host's allocator "
          "(muon_options_t.allocate) returned NULL"));
    }
    // The header asks for kAllocatorAlignment (the kernels rely on it; a
    // block short of it would be read misaligned, undefined). Handed back at
    // once, and refused.
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    if (at % kAllocatorAlignment != 0) {
      a.release(a.ctx, p, bytes, dl_device_type(), dl_device_id(), current_stream());
      return absl::InvalidArgumentError(absl::StrCat(
          "allocating ", what, " (", bytes, " bytes on ", name(), "): the host's allocator "
          "(muon_options_t.allocate) returned 0x", absl::Hex(at, absl::kZeroPad16), ", aligned to ",
          at & (~at + 1), " bytes; its blocks must be aligned to at least ",
          kAllocatorAlignment, " bytes"));
    }
    absl::Status zeroed = ZeroNew(p, bytes, what);
    if (!zeroed.ok()) {
      a.release(a.ctx, p, bytes, dl_device_type(), dl_device_id(), current_stream());
      return zeroed;
    }
  } else {
    absl::StatusOr<void*> own = AllocateOwn(bytes, what);
    if (!own.ok()) return own.status();
    p = *own;
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  live_[p] = bytes;
  live_bytes_ += static_cast<int64_t>(bytes);
  return p;
}

void Device::Free(void* ptr) {
  if (ptr == nullptr) return;
  size_t bytes = 0;
  Allocator a;
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    auto it = live_.find(ptr);
    if (it != live_.end()) {
      bytes = it->second;
      live_bytes_ -= static_cast<int64_t>(bytes);
      live_.erase(it);
    }
    a = allocator_;
  }
  if (a.release != nullptr) {
    a.release(a.ctx, ptr, bytes, dl_device_type(), dl_device_id(), current_stream());
  } else {
    FreeOwn(ptr);
  }
}

int64_t Device::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return live_bytes_;
}

absl::StatusOr<void*> StagingMemoryKind::Allocate(Device& device, size_t bytes,
                                                 const std::string& what) {
  absl::StatusOr<void*> p = device.AllocateStaging(bytes, what);
  if (p.ok()) std::memset(*p, 0, bytes);
  return p;
}

MemorySource MemorySourceOf(Device* device) {
  MemorySource m;
  m.allocate = [device](size_t bytes, const std::string& what) {
    return device->Allocate(bytes, what);
  };
  m.free = [device](void* ptr) { device->Free(ptr); };
  return m;
}


}  // namespace muon
