// A GpuRuntime on the CPU that is at least as strict as CUDA, for running
// the GPU device's host logic in CI (see gpu_runtime.h):
//
//   - Each device's memory is an arena of its own: a region mapped with no
//     access, opened only while that device's streams run work. A host
//     thread that reads or writes device memory directly (as it could not on
//     a GPU) faults there. Every copy, memset and kernel launch (and, through
//     CheckDeviceMemory, every strict communicator call) is checked when
//     issued: a device-side pointer range must lie inside one live
//     allocation, a host-side one must not touch any; a kernel's memory must
//     be its stream's device's. Else the call fails naming itself, the
//     pointer and what it missed.
//   - Nothing runs when it is issued. Each stream keeps its work until the
//     host waits (StreamSynchronize, EventSynchronize, Free: the device's streams) or a stream that
//     waits on one of its events runs; then the stream runs exactly up to the
//     point needed. A host that reads a copy's destination before waiting
//     reads what was there before, and a stream that reads another's results
//     without an event reads stale memory. Host memory is read and written
//     when the work runs.
//   - Work is issued on a stream only while the stream's device is the
//     thread's current device (as a kernel launch requires; stricter than
//     CUDA for copies).
//   - Each device's null stream is a stream like the others (no implicit
//     ordering with them: stricter than CUDA's legacy default stream).
//   - Fresh allocations hold a pattern (0xA5 bytes), never zeros.
//   - Host memory that HostAlloc did not hand out is pageable: a copy to or
//     from it may make the host wait on a GPU, so each one is counted
//     (Counters::pageable_copies) for tests to assert that a step makes none.
//   - A failure of work that ran (a kernel's chunk pointing outside device
//     memory) is sticky, as a GPU fault is: every later call returns it.
//
// Gaps: memory is opened per device, so a host thread touching device k's
// memory while device k's streams run work on another thread is not caught.
//
// The current device is per thread (as CUDA's; a new thread starts on
// device 0), kept in the instance. Thread-safe: one mutex over the
// bookkeeping; work runs outside it.
#ifndef MUON_DEVICE_TESTING_STRICT_CPU_RUNTIME_H_
#define MUON_DEVICE_TESTING_STRICT_CPU_RUNTIME_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "muon/device/gpu_runtime.h"

namespace muon {

class StrictCpuRuntime final : public GpuRuntime {
 public:
  // `devices` devices of `capacity` bytes of address space each (reserved,
  // not committed).
  explicit StrictCpuRuntime(int devices = 1, size_t capacity = size_t{1} << 30);
  ~StrictCpuRuntime() override;
  StrictCpuRuntime(const StrictCpuRuntime&) = delete;
  StrictCpuRuntime& operator=(const StrictCpuRuntime&) = delete;

  std::string name() const override { return "strict-cpu"; }
  absl::StatusOr<int> DeviceCount() override { return static_cast<int>(devices_.size()); }
  absl::Status SetDevice(int ordinal) override;
  absl::StatusOr<int> GetDevice() override;

  absl::StatusOr<void*> Malloc(size_t bytes, const std::string& what) override;
  void Free(void* ptr) override;
  absl::StatusOr<void*> HostAlloc(size_t bytes, const std::string& what) override;
  void HostFree(void* ptr) override;

  absl::Status MemsetAsync(void* dst, int value, size_t bytes, GpuStream stream,
                           const std::string& what) override;
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           GpuStream stream, const std::string& what) override;
  absl::Status LaunchCopyChunks(const GpuCopyChunk* chunks, int64_t count, GpuStream stream,
                                const std::string& what) override;

  absl::StatusOr<bool> IsCapturing(GpuStream stream) override;
  absl::StatusOr<GpuStream> StreamCreate() override;
  void StreamDestroy(GpuStream stream) override;
  absl::Status StreamSynchronize(GpuStream stream, const std::string& what) override;

  absl::StatusOr<GpuEvent> EventCreate() override;
  void EventDestroy(GpuEvent event) override;
  absl::Status EventRecord(GpuEvent event, GpuStream stream) override;
  absl::Status StreamWaitEvent(GpuStream stream, GpuEvent event) override;
  absl::Status EventSynchronize(GpuEvent event, const std::string& what) override;
  absl::StatusOr<bool> EventQuery(GpuEvent event) override;

  // OK when [ptr, ptr + bytes) lies inside one live allocation; else an
  // error starting with `what`. Device memory of any device.
  absl::Status CheckDeviceMemory(const void* ptr, size_t bytes, const std::string& what) const;
  bool IsDeviceMemory(const void* ptr, size_t bytes) const;
  // The device whose arena holds `ptr`, or -1.
  int DeviceOf(const void* ptr) const;
  // The device a stream (NULL: the current device's null stream) belongs to, or -1.
  int DeviceOfStream(GpuStream stream) const;

  // Issues `work` on `stream` (a strict communicator's stream-ordered
  // collective); it runs when the stream is run, on the thread that runs it,
  // with the stream's device memory open. A failure is sticky.
  absl::Status Enqueue(GpuStream stream, std::function<absl::Status()> work);

  // Work issued and not yet run, on every stream (tests).
  int64_t pending() const;

  // CUDA graphs, as a global-mode stream capture: between BeginCapture and
  // EndCapture the stream's work is recorded, not run, and while any stream
  // captures, what CUDA refuses then is refused (allocation, freeing, host
  // waits, copies from or to host memory). Fork and join as in CUDA: a
  // stream that waits for an event recorded on a capturing stream joins that
  // capture (its work is recorded into the same graph, in the order the host
  // issued it, which respects every event); EndCapture fails, as CUDA's
  // "unjoined" error, when a joined stream has work the origin stream did not
  // wait for (an event recorded after it). Waiting, within a capture, for an
  // event recorded outside it is refused (CUDA's capture isolation).
  // Replay issues the recorded work again on a stream (kernel arguments as
  // recorded, memory as it is then).
  struct Graph {
    int device = 0;
    std::vector<std::function<absl::Status()>> work;
  };
  absl::Status BeginCapture(GpuStream stream);
  absl::StatusOr<Graph> EndCapture(GpuStream stream);
  absl::Status Replay(const Graph& graph, GpuStream stream);

  // What the host asked of device `d` so far (tests: what a step costs).
  struct Counters {
    int64_t stream_waits = 0;  // StreamSynchronize
    int64_t event_waits = 0;   // EventSynchronize
    int64_t mallocs = 0;
    int64_t frees = 0;
    int64_t pageable_copies = 0;  // stream-ordered copies from or to pageable host memory
    int64_t host_allocs = 0;      // HostAlloc while this device was current
  };
  Counters counters(int device) const;

 private:
  // A stream's work not yet run. `issued` counts every item ever issued,
  // `executed` those that ran (their positions are what events record).
  struct Stream {
    int device = 0;
    bool capturing = false;
    Stream* origin = nullptr;  // while capturing: the stream the capture began on
    bool unjoined = false;     // joined: work the origin has not waited for
    std::vector<std::function<absl::Status()>> graph;  // the origin's: recorded while capturing
    std::deque<std::function<absl::Status()>> items;
    int64_t issued = 0;
    int64_t executed = 0;
  };
  struct Event {
    Stream* stream = nullptr;  // of the last record; null: never recorded (complete)
    int64_t target = 0;        // the stream's items up to the record
    Stream* captured = nullptr;  // recorded within a capture: its origin (else null)
    bool covers_all = false;     // captured: the recording stream had no later work (yet)
  };
  struct Arena {
    unsigned char* base = nullptr;
    size_t capacity = 0;
    std::map<size_t, size_t> live;  // offset -> bytes
    int open = 0;                   // work of this device running now
    std::unique_ptr<Stream> null_stream;
    Counters counters;
    // Held by the thread running any of this device's stream work: a
    // device's streams run one item at a time (as the runtime's lanes order
    // them), and a wait inside one (for another stream of the device) runs
    // the other on the same thread. Devices run concurrently (a collective's
    // item waits for its peers on other devices).
    std::unique_ptr<std::recursive_mutex> exec_mu;
  };

  Stream* StreamOfLocked(GpuStream s) const;
  // Work may be issued on a stream only while its device is current (as
  // kernel launches require).
  absl::Status CheckCurrentLocked(const Stream* s, const std::string& what) const;
  // The stream work named `what` goes on: known, its device current, the
  // runtime not failed.
  absl::StatusOr<Stream*> WorkStreamLocked(GpuStream stream, const std::string& what);
  // Refuses what a capture in progress does not permit.
  absl::Status CheckNotCapturingLocked(const std::string& what) const;
  int CurrentLocked() const;
  absl::Status EnqueueLocked(Stream* s, std::function<absl::Status()> work);
  absl::Status RunUntil(Stream* s, int64_t target);
  // Runs every stream of `device` (-1: of every device).
  absl::Status RunAll(int device);
  void OpenLocked(int device);
  void CloseLocked(int device);
  int DeviceOfLocked(const void* ptr) const;
  absl::Status CheckLocked(const void* ptr, size_t bytes, const std::string& what) const;
  absl::Status CheckHostLocked(const void* ptr, size_t bytes, const std::string& what) const;
  bool PinnedLocked(const void* ptr, size_t bytes) const;

  mutable std::mutex mu_;
  std::vector<Arena> devices_;
  std::map<std::thread::id, int> current_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::unique_ptr<Stream>> retired_;  // destroyed, all their work run
  std::vector<std::unique_ptr<Event>> events_;
  absl::Status failed_;  // sticky
  int capturing_ = 0;    // streams capturing now
  std::map<const unsigned char*, size_t> pinned_;  // HostAlloc's blocks: start -> bytes
};

}  // namespace muon

#endif  // MUON_DEVICE_TESTING_STRICT_CPU_RUNTIME_H_
