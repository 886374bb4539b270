#include "muon/device/device.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/cpu/cpu_threads.h"
#include "muon/math/cpu/parallel.h"

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

namespace {

// Elements [begin, end) of one copy.
void RunCopy(const CopyOp& op, int64_t begin, int64_t end) {
  const void* src = ElementAt(op.src, op.src_type, begin);
  void* dst = ElementAt(op.dst, op.dst_type, begin);
  const bool same = op.src_type == op.dst_type;
  const bool exact = same && (op.via == DType::kF32 || op.via == op.src_type);
  if (exact) {
    std::memcpy(dst, src, static_cast<size_t>(end - begin) * SizeOf(op.src_type));
  } else {
    cpu::Convert(op.src_type, src, op.via, op.dst_type, dst, end - begin);
  }
}

}  // namespace

void RunCopiesOnHost(const std::vector<CopyOp>& ops) {
  for (const CopyOp& op : ops) RunCopy(op, 0, op.n);
}

namespace {

// The copies and their chunks (made once): a program runs on the rank's
// threads.
class HostProgram final : public CopyProgram {
 public:
  explicit HostProgram(std::vector<CopyOp> ops) : ops_(std::move(ops)) {
    for (const CopyOp& op : ops_) elements_ += op.n;
    cpu::SplitIntoChunks(ops_.size(), [&](size_t i) { return ops_[i].n; }, &chunks_);
  }
  int64_t elements() const override { return elements_; }
  void Run() const {
    cpu::RunChunks(chunks_, cpu::ThreadsPerRankHere(), [&](const cpu::Chunk& c) {
      RunCopy(ops_[c.item], c.begin, c.end);
    });
  }

 private:
  std::vector<CopyOp> ops_;
  std::vector<cpu::Chunk> chunks_;
  int64_t elements_ = 0;
};

class HostDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  MathBackend& math() override { return cpu_; }
  absl::Status SetStream(void*) override { return absl::OkStatus(); }
  absl::StatusOr<int> Bind() override { return -1; }
  void Unbind(int) override {}

  HostDevice() { cpu_.SetMemorySource(MemorySourceOf(this)); }

 protected:
  absl::StatusOr<void*> AllocateOwn(size_t bytes, const std::string& what) override {
    void* p = std::calloc(bytes, 1);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory for ", what, " (", bytes, " bytes)"));
    }
    return p;
  }
  void FreeOwn(void* ptr) override { std::free(ptr); }
  absl::Status ZeroNew(void* ptr, size_t bytes, const std::string&) override {
    std::memset(ptr, 0, bytes);
    return absl::OkStatus();
  }
  int32_t dl_device_type() const override { return 1; }  // kDLCPU
  int32_t dl_device_id() const override { return 0; }
  void* current_stream() const override { return nullptr; }

 public:

  absl::StatusOr<std::unique_ptr<CopyProgram>> Prepare(const std::vector<CopyOp>& ops) override {
    return std::unique_ptr<CopyProgram>(new HostProgram(ops));
  }
  absl::Status Run(const CopyProgram& program) override {
    static_cast<const HostProgram&>(program).Run();
    return absl::OkStatus();
  }

  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status FromHost(void* device, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyBytes(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status FromHostAsync(void* device, const void* host, size_t bytes) override {
    return FromHost(device, host, bytes);
  }
  absl::Status ToHostAsync(void* host, const void* device, size_t bytes) override {
    return ToHost(host, device, bytes);
  }
  absl::Status ZeroAsync(void* device, size_t bytes) override {
    if (bytes > 0) std::memset(device, 0, bytes);
    return absl::OkStatus();
  }
  bool Capturing() override { return false; }
  absl::StatusOr<void*> AllocateStaging(size_t bytes, const std::string& what) override {
    return AllocateOwn(bytes, what);
  }
  void FreeStaging(void* ptr) override { std::free(ptr); }
  absl::Status Mark() override { return absl::OkStatus(); }
  absl::Status WaitMark() override { return absl::OkStatus(); }

 private:
  CpuBackend cpu_;
};

}  // namespace

std::shared_ptr<Device> MakeHostDevice() { return std::make_shared<HostDevice>(); }

}  // namespace muon
