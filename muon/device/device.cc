#include "muon/device/device.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/math/cpu/cpu_backend.h"

namespace muon {

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

void RunCopiesOnHost(const std::vector<CopyOp>& ops) {
  for (const CopyOp& op : ops) {
    const bool same = op.src_type == op.dst_type;
    const bool exact = same && (op.via == DType::kF32 || op.via == op.src_type);
    if (exact) {
      std::memcpy(op.dst, op.src, static_cast<size_t>(op.n) * SizeOf(op.src_type));
      continue;
    }
    for (int64_t i = 0; i < op.n; ++i) {
      const float v = RoundTo(op.via, LoadAsFloat(op.src_type, op.src, i));
      StoreFromFloat(op.dst_type, op.dst, i, v);
    }
  }
}

namespace {

class HostProgram final : public CopyProgram {
 public:
  explicit HostProgram(std::vector<CopyOp> ops) : ops_(std::move(ops)) {
    for (const CopyOp& op : ops_) elements_ += op.n;
  }
  int64_t elements() const override { return elements_; }
  const std::vector<CopyOp>& ops() const { return ops_; }

 private:
  std::vector<CopyOp> ops_;
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

  absl::StatusOr<void*> Allocate(size_t bytes, const std::string& what) override {
    void* p = std::calloc(bytes, 1);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory for ", what, " (", bytes, " bytes)"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }

  absl::StatusOr<std::unique_ptr<CopyProgram>> Prepare(const std::vector<CopyOp>& ops) override {
    return std::unique_ptr<CopyProgram>(new HostProgram(ops));
  }
  absl::Status Run(const CopyProgram& program) override {
    RunCopiesOnHost(static_cast<const HostProgram&>(program).ops());
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
  absl::Status Mark() override { return absl::OkStatus(); }
  absl::Status WaitMark() override { return absl::OkStatus(); }

 private:
  CpuBackend cpu_;
};

}  // namespace

std::shared_ptr<Device> MakeHostDevice() { return std::make_shared<HostDevice>(); }

}  // namespace muon
