// The host device: host memory, the CPU backend, copies run on the host's
// threads (see host_device.h).
#include "muon/device/host_device.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/cpu/cpu_threads.h"
#include "muon/math/cpu/parallel.h"

namespace muon {

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
