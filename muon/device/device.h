// Where a step's tensors live: device memory, the element copies of the
// exchange, and the math, all ordered on one stream. The engine runs the same
// pipeline on every device; a device only allocates, copies and computes.
//
// Two implementations: HostDevice (CPU memory, the CPU backend; this library)
// and CudaDevice (GPU memory, the CUDA backend; the libmuon_cuda.so plugin,
// loaded by cuda_loader.h when the first CUDA tensor is registered).
#ifndef MUON_DEVICE_DEVICE_H_
#define MUON_DEVICE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/common/dtype.h"
#include "muon/math/backend.h"

namespace muon {

// One element-wise copy of n elements: dst[i] = src[i] converted from
// src_type to dst_type, rounded through `via` on the way (a wire dtype the
// value travels in when a copy stands in for pack + unpack). Copies of one
// program never overlap in dst.
struct CopyOp {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t n = 0;
  DType src_type = DType::kF32;
  DType dst_type = DType::kF32;
  DType via = DType::kF32;
};

// Device memory holding elements of one dtype (e.g. where a parameter's
// update lives: an fp32 buffer, or its gradient's own memory).
struct LocalBuffer {
  void* data = nullptr;
  DType dtype = DType::kF32;
};

// A list of copies prepared once (on a GPU: its descriptors uploaded) and
// run every step as one launch.
class CopyProgram {
 public:
  virtual ~CopyProgram() = default;
  virtual int64_t elements() const = 0;
};

class Device {
 public:
  // The alignment, in bytes, of every block a host allocator hands out
  // (muon.h, muon_options_t.allocate).
  static constexpr size_t kAllocatorAlignment = 64;

  virtual ~Device();

  // "cpu" or "cuda:<ordinal>", for messages.
  virtual std::string name() const = 0;
  virtual bool is_host() const = 0;
  virtual MathBackend& math() = 0;

  // Makes this device the calling thread's current one (on a GPU: what
  // every communicator call and launch on its memory needs, whichever
  // thread makes it) and returns the one current before (-1 on the host),
  // which Unbind puts back.
  virtual absl::StatusOr<int> Bind() = 0;
  virtual void Unbind(int previous) = 0;

  // Orders every later call on `stream` (a cudaStream_t on a GPU; ignored on
  // the host). On a GPU, a stream other than the last call's first waits for
  // the point the last call ended at (EndCall): the library's own work (its
  // momentum, its workspace) stays ordered; the old stream itself is not
  // touched (the host may have destroyed it), and a stream capturing a CUDA
  // graph does not wait (a capture cannot wait for work outside it).
  virtual absl::Status SetStream(void* stream) = 0;
  // A call's work is all enqueued: marks its stream's point for SetStream.
  // Not while the stream captures (the mark would be inside the graph).
  virtual void EndCall() {}

  // Zero-filled device memory; ResourceExhausted naming `what` when short.
  // Through the host's allocator when one is set (SetAllocator), else the
  // device's own; counted either way (allocated_bytes). Setup-time only
  // (zeroing new memory waits for the stream).
  absl::StatusOr<void*> Allocate(size_t bytes, const std::string& what);
  void Free(void* ptr);
  // The optimizer's memory on this device now: every live Allocate.
  int64_t allocated_bytes() const;

  // A host allocator for this device's memory (muon_options_t.allocate):
  // allocate(ctx, bytes, device_type, device_id, stream) returns memory of
  // this device (DLPack device type and id), aligned to
  // kAllocatorAlignment bytes (Allocate refuses and releases a block that is
  // not), or NULL when short; release
  // gets it back with the same size. Both stream-ordered on the stream the
  // device has then. Set before the first allocation.
  struct Allocator {
    void* (*allocate)(void* ctx, size_t bytes, int32_t device_type, int32_t device_id,
                      void* stream) = nullptr;
    void (*release)(void* ctx, void* ptr, size_t bytes, int32_t device_type, int32_t device_id,
                    void* stream) = nullptr;
    void* ctx = nullptr;
  };
  absl::Status SetAllocator(const Allocator& allocator);

  virtual absl::StatusOr<std::unique_ptr<CopyProgram>> Prepare(const std::vector<CopyOp>& ops) = 0;
  // Runs a prepared program, stream-ordered.
  virtual absl::Status Run(const CopyProgram& program) = 0;

  // Byte copies between host and device memory. Synchronous: the stream's
  // earlier work is finished first (state save/load and tests only, never in
  // a step).
  virtual absl::Status ToHost(void* host, const void* device, size_t bytes) = 0;
  virtual absl::Status FromHost(void* device, const void* host, size_t bytes) = 0;
  // Stream-ordered copy between two device buffers.
  virtual absl::Status CopyBytes(void* dst, const void* src, size_t bytes) = 0;

  // Stream-ordered copies between host and device memory, for values a step
  // hands on without waiting (the step verdicts on a GPU): the host bytes
  // are read or written when the stream reaches the copy, so the host keeps
  // them valid and untouched until it waited (WaitMark). The host device
  // copies at once.
  virtual absl::Status FromHostAsync(void* device, const void* host, size_t bytes) = 0;
  virtual absl::Status ToHostAsync(void* host, const void* device, size_t bytes) = 0;
  // Stream-ordered zeroing of device memory.
  virtual absl::Status ZeroAsync(void* device, size_t bytes) = 0;
  // Whether the stream is being captured into a CUDA graph now: the host
  // then neither waits nor copies to its own memory (not permitted there).
  virtual bool Capturing() = 0;

  // The communication lane: on a GPU, a device on a second stream of the same
  // GPU, sharing this one's memory, made with the first call and kept for
  // this device's lifetime; the exchanges run there so that round r + 1's
  // exchange overlaps round r's math. `stream` is its stream (what the
  // communicators get). The host device has none (device NULL): its
  // exchanges run in line.
  struct Lane {
    Device* device = nullptr;
    void* stream = nullptr;
  };
  virtual absl::StatusOr<Lane> CommLane() { return Lane{}; }
  // Order between this device's stream and a lane's, without a host wait:
  // Signal(k) records point k of this stream (k < the count ReserveSignals
  // made, at setup); AwaitSignal(from, k) orders this stream's later work
  // after `from`'s point k. Nothing on the host device.
  virtual absl::Status ReserveSignals(int count) {
    (void)count;
    return absl::OkStatus();
  }
  virtual absl::Status Signal(int k) {
    (void)k;
    return absl::OkStatus();
  }
  virtual absl::Status AwaitSignal(Device& from, int k) {
    (void)from;
    (void)k;
    return absl::OkStatus();
  }

  // Host memory that the stream reads and writes in a step's stream-ordered
  // copies (FromHostAsync, ToHostAsync) without the host waiting for it:
  // page-locked on a GPU, plain on the host. Setup-time only (not while a
  // stream captures). Not counted in allocated_bytes.
  virtual absl::StatusOr<void*> AllocateStaging(size_t bytes, const std::string& what) = 0;
  virtual void FreeStaging(void* ptr) = 0;

  // Marks the stream's current point (replacing the last mark); WaitMark
  // blocks the host until the stream passed it (at once on the host device,
  // and when nothing was marked).
  virtual absl::Status Mark() = 0;
  virtual absl::Status WaitMark() = 0;

 protected:
  // The device's own memory, and what Allocate needs of a device: zeroing
  // new memory (before anything else uses it), and where it lives.
  virtual absl::StatusOr<void*> AllocateOwn(size_t bytes, const std::string& what) = 0;
  virtual void FreeOwn(void* ptr) = 0;
  virtual absl::Status ZeroNew(void* ptr, size_t bytes, const std::string& what) = 0;
  virtual int32_t dl_device_type() const = 0;  // kDLCPU or kDLCUDA
  virtual int32_t dl_device_id() const = 0;
  virtual void* current_stream() const = 0;

 private:
  mutable std::mutex alloc_mu_;
  Allocator allocator_;
  std::map<void*, size_t> live_;  // pointer -> bytes
  int64_t live_bytes_ = 0;
};

// `device` made the calling thread's current one for a scope (Bind), and the
// caller's put back after (Unbind): what the communicators and launches of a
// libmuon call need, whichever thread makes it. Its end is the call's end
// (EndCall).
class CurrentDevice {
 public:
  explicit CurrentDevice(Device& device) : device_(device) {
    absl::StatusOr<int> previous = device.Bind();
    status_ = previous.status();
    if (previous.ok()) previous_ = *previous;
  }
  ~CurrentDevice() {
    if (!status_.ok()) return;
    device_.EndCall();
    device_.Unbind(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  Device& device_;
  int previous_ = -1;
  absl::Status status_;
};

// Memory of one kind, owned by a buffer (move-only) and zero-filled when
// made; it keeps its device alive. `Kind` says how the device hands it out
// and takes it back: DeviceBuffer (Allocate / Free: the device's memory,
// counted) and StagingBuffer (AllocateStaging / FreeStaging: host memory a
// step's stream-ordered copies use).
template <typename Kind>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  OwnedMemory(const OwnedMemory&) = delete;
  OwnedMemory& operator=(const OwnedMemory&) = delete;
  OwnedMemory(OwnedMemory&& o) noexcept { *this = std::move(o); }
  OwnedMemory& operator=(OwnedMemory&& o) noexcept {
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
  ~OwnedMemory() { Reset(); }

  static absl::StatusOr<OwnedMemory> Make(std::shared_ptr<Device> device, size_t bytes,
                                          const std::string& what) {
    OwnedMemory b;
    if (bytes == 0) return b;
    absl::StatusOr<void*> p = Kind::Allocate(*device, bytes, what);
    if (!p.ok()) return p.status();
    b.device_ = std::move(device);
    b.ptr_ = *p;
    b.bytes_ = bytes;
    return b;
  }
  void Reset() {
    if (ptr_ != nullptr && device_) Kind::Free(*device_, ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    device_.reset();
  }
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  std::shared_ptr<Device> device_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct DeviceMemoryKind {
  static absl::StatusOr<void*> Allocate(Device& device, size_t bytes, const std::string& what) {
    return device.Allocate(bytes, what);
  }
  static void Free(Device& device, void* ptr) { device.Free(ptr); }
};
struct StagingMemoryKind {
  // (AllocateStaging's memory is not zeroed: this zeroes it.)
  static absl::StatusOr<void*> Allocate(Device& device, size_t bytes, const std::string& what);
  static void Free(Device& device, void* ptr) { device.FreeStaging(ptr); }
};

using DeviceBuffer = OwnedMemory<DeviceMemoryKind>;
using StagingBuffer = OwnedMemory<StagingMemoryKind>;

// `device`'s Allocate and Free, as a math backend's source of memory.
MemorySource MemorySourceOf(Device* device);

}  // namespace muon

#endif  // MUON_DEVICE_DEVICE_H_
