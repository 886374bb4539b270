// The GPU runtime the GPU device's host logic is written against: device
// selection, memory, stream-ordered copies, streams, events and the copy
// kernel. Two implementations: the CUDA runtime (the libmuon_cuda.so
// plugin), and StrictCpuRuntime (testing/strict_cpu_runtime.h), which runs the same
// host logic on the CPU in CI with device semantics at least as strict as
// CUDA's, so that a host read without the wait it needs, a stream using
// another's results without an event, or a host pointer where device memory
// belongs fails there instead of on a GPU.
//
// Handles: a stream or event is an opaque pointer (a cudaStream_t /
// cudaEvent_t under CUDA); the null stream is the default stream. Every call
// names what it does in its error (`what`, e.g. "zeroing the update buffer").
// Calls from several threads are allowed; ordering between threads is the
// caller's, as with CUDA.
#ifndef MUON_DEVICE_GPU_RUNTIME_H_
#define MUON_DEVICE_GPU_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muon/device/gpu_copy_chunk.h"

namespace muon {

using GpuStream = void*;
using GpuEvent = void*;

// kDefault: the runtime tells from the pointers (cudaMemcpyDefault).
enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kDefault };

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;

  // "cuda" or "strict-cpu", for messages.
  virtual std::string name() const = 0;

  // The number of devices, and the calling thread's current one.
  virtual absl::StatusOr<int> DeviceCount() = 0;
  virtual absl::Status SetDevice(int ordinal) = 0;
  virtual absl::StatusOr<int> GetDevice() = 0;

  // Device memory, not initialised. Free waits for every stream first (as
  // cudaFree does).
  virtual absl::StatusOr<void*> Malloc(size_t bytes, const std::string& what) = 0;
  virtual void Free(void* ptr) = 0;
  // Page-locked host memory (cudaHostAlloc), which a stream-ordered copy
  // reads or writes without the host waiting; a copy to or from any other
  // host memory may make the host wait for the stream (CUDA: "might be
  // synchronous"). Not while a stream captures.
  virtual absl::StatusOr<void*> HostAlloc(size_t bytes, const std::string& what) = 0;
  virtual void HostFree(void* ptr) = 0;

  // Stream-ordered. Host memory given to a copy is read or written when the
  // stream reaches the copy, not when it is issued: the host keeps it alive
  // and unchanged (a source) or unread (a destination) until it waited.
  virtual absl::Status MemsetAsync(void* dst, int value, size_t bytes, GpuStream stream,
                                   const std::string& what) = 0;
  virtual absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                   GpuStream stream, const std::string& what) = 0;
  // Runs `count` chunks (an array in device memory) of the copy kernel.
  virtual absl::Status LaunchCopyChunks(const GpuCopyChunk* chunks, int64_t count,
                                        GpuStream stream, const std::string& what) = 0;

  // Whether `stream` is capturing work into a CUDA graph.
  virtual absl::StatusOr<bool> IsCapturing(GpuStream stream) = 0;

  virtual absl::StatusOr<GpuStream> StreamCreate() = 0;
  virtual void StreamDestroy(GpuStream stream) = 0;
  // The host waits until everything issued on `stream` ran.
  virtual absl::Status StreamSynchronize(GpuStream stream, const std::string& what) = 0;

  virtual absl::StatusOr<GpuEvent> EventCreate() = 0;
  virtual void EventDestroy(GpuEvent event) = 0;
  // The event completes when `stream` reaches this point.
  virtual absl::Status EventRecord(GpuEvent event, GpuStream stream) = 0;
  // Later work on `stream` waits for the event's last record (as of this call).
  virtual absl::Status StreamWaitEvent(GpuStream stream, GpuEvent event) = 0;
  // The host waits for the event's last record; true from EventQuery when it
  // completed (never waits).
  virtual absl::Status EventSynchronize(GpuEvent event, const std::string& what) = 0;
  virtual absl::StatusOr<bool> EventQuery(GpuEvent event) = 0;
};

}  // namespace muon

#endif  // MUON_DEVICE_GPU_RUNTIME_H_
