#include "muon/device/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/device/cuda/copy_kernels.h"
#include "muon/math/cuda/cuda_status.h"
#include "muon/math/cuda/cuda_backend.h"

namespace muon {
namespace {

// Makes `ordinal` the calling thread's current device for a scope and puts
// the previous one back (the host's threads keep their own choice).
class OnDevice {
 public:
  explicit OnDevice(int ordinal) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != ordinal) {
      status_ = cudaSetDevice(ordinal);
      switched_ = status_ == cudaSuccess;
    }
  }
  ~OnDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  cudaError_t status_ = cudaSuccess;
};

class CudaProgram final : public CopyProgram {
 public:
  ~CudaProgram() override {
    if (chunks_ != nullptr) cudaFree(chunks_);
  }
  int64_t elements() const override { return elements_; }

  cuda::CopyChunk* chunks_ = nullptr;  // device array
  int64_t count_ = 0;
  int64_t elements_ = 0;
};

// The CUDA backend called with its GPU current, whichever thread calls (the
// exchange thread starts on device 0).
class GuardedMath final : public MathBackend {
 public:
  GuardedMath(int ordinal, std::unique_ptr<CudaBackend> math)
      : ordinal_(ordinal), math_(std::move(math)) {}
  absl::Status SetStream(void* stream) {
    OnDevice on(ordinal_);
    return math_->SetStream(stream);
  }
  absl::Status Momentum(const MomentumArgs& args) override {
    OnDevice on(ordinal_);
    return math_->Momentum(args);
  }
  absl::Status Apply(const ApplyArgs& args) override {
    OnDevice on(ordinal_);
    return math_->Apply(args);
  }
  absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) override {
    OnDevice on(ordinal_);
    return math_->Orthogonalize(config, batch);
  }
  absl::Status Reserve(const NsConfig& config, int64_t count, int64_t rows,
                       int64_t cols) override {
    OnDevice on(ordinal_);
    return math_->Reserve(config, count, rows, cols);
  }

 private:
  int ordinal_;
  std::unique_ptr<CudaBackend> math_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::unique_ptr<CudaBackend> math)
      : ordinal_(ordinal), math_(ordinal, std::move(math)) {}

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool is_host() const override { return false; }
  MathBackend& math() override { return math_; }

  absl::Status SetStream(void* stream) override {
    stream_ = static_cast<cudaStream_t>(stream);
    return math_.SetStream(stream);
  }

  absl::StatusOr<void*> Allocate(size_t bytes, const std::string& what) override {
    OnDevice on(ordinal_);
    if (auto st = CudaStatus(on.status(), "selecting the GPU"); !st.ok()) return st;
    void* p = nullptr;
    if (auto st = CudaStatus(cudaMalloc(&p, bytes), absl::StrCat("allocating ", what, " (",
                                                                  bytes, " bytes on ", name(), ")"));
        !st.ok()) {
      return st;
    }
    // Zeroed on the step's stream before anything else uses it; setup only.
    absl::Status st = CudaStatus(cudaMemsetAsync(p, 0, bytes, stream_), "zeroing " + what);
    if (st.ok()) st = CudaStatus(cudaStreamSynchronize(stream_), "zeroing " + what);
    if (!st.ok()) {
      cudaFree(p);
      return st;
    }
    return p;
  }

  void Free(void* ptr) override {
    OnDevice on(ordinal_);
    cudaFree(ptr);
  }

  absl::StatusOr<std::unique_ptr<CopyProgram>> Prepare(const std::vector<CopyOp>& ops) override {
    std::vector<cuda::CopyChunk> chunks;
    auto program = std::make_unique<CudaProgram>();
    for (const CopyOp& op : ops) {
      program->elements_ += op.n;
      const size_t src_size = SizeOf(op.src_type), dst_size = SizeOf(op.dst_type);
      for (int64_t at = 0; at < op.n; at += cuda::kChunkElems) {
        cuda::CopyChunk c;
        c.src = static_cast<const char*>(op.src) + at * src_size;
        c.dst = static_cast<char*>(op.dst) + at * dst_size;
        c.n = static_cast<int32_t>(std::min<int64_t>(cuda::kChunkElems, op.n - at));
        c.src_type = static_cast<uint8_t>(op.src_type);
        c.dst_type = static_cast<uint8_t>(op.dst_type);
        c.via = static_cast<uint8_t>(op.via);
        c.pad = 0;
        chunks.push_back(c);
      }
    }
    program->count_ = static_cast<int64_t>(chunks.size());
    if (chunks.empty()) return std::unique_ptr<CopyProgram>(std::move(program));
    const size_t bytes = chunks.size() * sizeof(cuda::CopyChunk);
    absl::StatusOr<void*> mem = Allocate(bytes, "the exchange's copy descriptors");
    if (!mem.ok()) return mem.status();
    program->chunks_ = static_cast<cuda::CopyChunk*>(*mem);
    OnDevice on(ordinal_);
    absl::Status st = CudaStatus(cudaMemcpy(program->chunks_, chunks.data(), bytes,
                                           cudaMemcpyHostToDevice),
                                "uploading the exchange's copy descriptors");
    if (!st.ok()) return st;
    return std::unique_ptr<CopyProgram>(std::move(program));
  }

  absl::Status Run(const CopyProgram& program) override {
    const auto& p = static_cast<const CudaProgram&>(program);
    if (p.count_ == 0) return absl::OkStatus();
    OnDevice on(ordinal_);
    return CudaStatus(cuda::LaunchCopyChunks(p.chunks_, p.count_, stream_), "the exchange copy kernel");
  }

  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    OnDevice on(ordinal_);
    absl::Status st = CudaStatus(cudaStreamSynchronize(stream_), "waiting for the step's stream");
    if (st.ok() && bytes > 0) {
      st = CudaStatus(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost),
                     "copying optimizer state to the host");
    }
    return st;
  }

  absl::Status FromHost(void* device, const void* host, size_t bytes) override {
    OnDevice on(ordinal_);
    absl::Status st = CudaStatus(cudaStreamSynchronize(stream_), "waiting for the step's stream");
    if (st.ok() && bytes > 0) {
      st = CudaStatus(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice),
                     "copying optimizer state to the GPU");
    }
    return st;
  }

  absl::Status CopyBytes(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    OnDevice on(ordinal_);
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                     "copying on the GPU");
  }

 private:
  int ordinal_;
  GuardedMath math_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (", e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  if (ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", count, " are visible)"));
  }
  OnDevice on(ordinal);
  if (auto st = CudaStatus(on.status(), absl::StrCat("selecting CUDA device ", ordinal)); !st.ok()) {
    return st;
  }
  absl::StatusOr<std::unique_ptr<CudaBackend>> math = CudaBackend::Create();
  if (!math.ok()) return math.status();
  return std::unique_ptr<Device>(new CudaDevice(ordinal, std::move(math).value()));
}

}  // namespace muon
