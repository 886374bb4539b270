#include "muon/device/cuda/cuda_gpu_runtime.h"

#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "muon/device/cuda/copy_kernels.h"
#include "muon/math/cuda/cuda_status.h"

namespace muon {
namespace {

cudaStream_t S(GpuStream s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t E(GpuEvent e) { return static_cast<cudaEvent_t>(e); }

cudaMemcpyKind Kind(CopyKind k) {
  switch (k) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
    case CopyKind::kDefault: return cudaMemcpyDefault;
  }
  return cudaMemcpyDefault;
}

class CudaRuntime final : public GpuRuntime {
 public:
  std::string name() const override { return "cuda"; }

  absl::StatusOr<int> DeviceCount() override {
    int n = 0;
    absl::Status st = CudaStatus(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (!st.ok()) return st;
    return n;
  }
  absl::Status SetDevice(int ordinal) override {
    return CudaStatus(cudaSetDevice(ordinal), absl::StrCat("cudaSetDevice(", ordinal, ")"));
  }
  absl::StatusOr<int> GetDevice() override {
    int d = 0;
    absl::Status st = CudaStatus(cudaGetDevice(&d), "cudaGetDevice");
    if (!st.ok()) return st;
    return d;
  }

  absl::StatusOr<void*> Malloc(size_t bytes, const std::string& what) override {
    void* p = nullptr;
    absl::Status st = CudaStatus(cudaMalloc(&p, bytes), what);
    if (!st.ok()) return st;
    return p;
  }
  void Free(void* ptr) override { cudaFree(ptr); }
  absl::StatusOr<void*> HostAlloc(size_t bytes, const std::string& what) override {
    void* p = nullptr;
    absl::Status st = CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), what);
    if (!st.ok()) return st;
    return p;
  }
  void HostFree(void* ptr) override { cudaFreeHost(ptr); }

  absl::Status MemsetAsync(void* dst, int value, size_t bytes, GpuStream stream,
                           const std::string& what) override {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemsetAsync(dst, value, bytes, S(stream)), what);
  }
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           GpuStream stream, const std::string& what) override {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, Kind(kind), S(stream)), what);
  }
  absl::Status LaunchCopyChunks(const GpuCopyChunk* chunks, int64_t count, GpuStream stream,
                                const std::string& what) override {
    if (count == 0) return absl::OkStatus();
    const absl::Status pending = CudaPendingBefore(what);  // not ours to read or blame
    if (!pending.ok()) return pending;
    return CudaStatus(cuda::LaunchCopyChunks(chunks, count, S(stream)), what);
  }

  absl::StatusOr<bool> IsCapturing(GpuStream stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    absl::Status st = CudaStatus(cudaStreamIsCapturing(S(stream), &status), "cudaStreamIsCapturing");
    if (!st.ok()) return st;
    return status == cudaStreamCaptureStatusActive;
  }

  absl::StatusOr<GpuStream> StreamCreate() override {
    cudaStream_t s = nullptr;
    absl::Status st =
        CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!st.ok()) return st;
    return static_cast<GpuStream>(s);
  }
  void StreamDestroy(GpuStream stream) override {
    if (stream != nullptr) cudaStreamDestroy(S(stream));
  }
  absl::Status StreamSynchronize(GpuStream stream, const std::string& what) override {
    return CudaStatus(cudaStreamSynchronize(S(stream)), what);
  }

  absl::StatusOr<GpuEvent> EventCreate() override {
    cudaEvent_t e = nullptr;
    absl::Status st =
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (!st.ok()) return st;
    return static_cast<GpuEvent>(e);
  }
  void EventDestroy(GpuEvent event) override {
    if (event != nullptr) cudaEventDestroy(E(event));
  }
  absl::Status EventRecord(GpuEvent event, GpuStream stream) override {
    return CudaStatus(cudaEventRecord(E(event), S(stream)), "cudaEventRecord");
  }
  absl::Status StreamWaitEvent(GpuStream stream, GpuEvent event) override {
    return CudaStatus(cudaStreamWaitEvent(S(stream), E(event), 0), "cudaStreamWaitEvent");
  }
  absl::Status EventSynchronize(GpuEvent event, const std::string& what) override {
    return CudaStatus(cudaEventSynchronize(E(event)), what);
  }
  absl::StatusOr<bool> EventQuery(GpuEvent event) override {
    const cudaError_t e = cudaEventQuery(E(event));
    if (e == cudaErrorNotReady) return false;
    absl::Status st = CudaStatus(e, "cudaEventQuery");
    if (!st.ok()) return st;
    return true;
  }
};

}  // namespace

std::shared_ptr<GpuRuntime> MakeCudaRuntime() { return std::make_shared<CudaRuntime>(); }

}  // namespace muon
