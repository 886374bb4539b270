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

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = std::move(o.device_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Make(std::shared_ptr<Device> device, size_t bytes,
                                                const std::string& what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  absl::StatusOr<void*> p = device->Allocate(bytes, what);
  if (!p.ok()) return p.status();
  b.device_ = std::move(device);
  b.ptr_ = *p;
  b.bytes_ = bytes;
  return b;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr && device_) device_->Free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  device_.reset();
}

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = std::move(o.device_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

absl::StatusOr<StagingBuffer> StagingBuffer::Make(std::shared_ptr<Device> device, size_t bytes,
                                                  const std::string& what) {
  StagingBuffer b;
  if (bytes == 0) return b;
  absl::StatusOr<void*> p = device->AllocateStaging(bytes, what);
  if (!p.ok()) return p.status();
  std::memset(*p, 0, bytes);
  b.device_ = std::move(device);
  b.ptr_ = static_cast<unsigned char*>(*p);
  b.bytes_ = bytes;
  return b;
}

void StagingBuffer::Reset() {
  if (ptr_ != nullptr && device_) device_->FreeStaging(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  device_.reset();
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
