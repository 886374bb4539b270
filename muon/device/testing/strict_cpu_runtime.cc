#include "muon/device/testing/strict_cpu_runtime.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "muon/common/dtype.h"
#include "muon/device/device.h"
#include "muon/device/host_device.h"

namespace muon {


namespace {

#define MUON_STRICT_RETURN(expr)            \
  do {                                      \
    absl::Status strict_status_ = (expr);   \
    if (!strict_status_.ok()) return strict_status_; \
  } while (0)

constexpr size_t kAlign = 256;
constexpr unsigned char kFreshPattern = 0xA5;

size_t Rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

std::string Range(const void* ptr, size_t bytes) {
  return absl::StrFormat("%p (+%u bytes)", ptr, bytes);
}

}  // namespace

StrictCpuRuntime::StrictCpuRuntime(int devices, size_t capacity) {
  devices_.resize(static_cast<size_t>(std::max(devices, 1)));
  for (size_t d = 0; d < devices_.size(); ++d) {
    Arena& a = devices_[d];
    void* base = mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (base == MAP_FAILED) {
      failed_ = absl::ResourceExhaustedError(absl::StrCat(
          "strict-cpu runtime: could not reserve ", capacity, " bytes for device ", d));
      continue;
    }
    a.base = static_cast<unsigned char*>(base);
    a.capacity = capacity;
    a.null_stream = std::make_unique<Stream>();
    a.null_stream->device = static_cast<int>(d);
    a.exec_mu = std::make_unique<std::recursive_mutex>();
  }
}

StrictCpuRuntime::~StrictCpuRuntime() {
  for (Arena& a : devices_) {
    if (a.base != nullptr) munmap(a.base, a.capacity);
  }
  for (const auto& [p, bytes] : pinned_) std::free(const_cast<unsigned char*>(p));
}

absl::Status StrictCpuRuntime::SetDevice(int ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("strict-cpu runtime: device ", ordinal,
                                                   " does not exist (", devices_.size(),
                                                   " are visible)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_[std::this_thread::get_id()] = ordinal;
  return absl::OkStatus();
}

absl::StatusOr<int> StrictCpuRuntime::GetDevice() {
  std::lock_guard<std::mutex> lock(mu_);
  return CurrentLocked();
}

int StrictCpuRuntime::CurrentLocked() const {
  const auto it = current_.find(std::this_thread::get_id());
  return it == current_.end() ? 0 : it->second;  // a new thread starts on device 0
}

void StrictCpuRuntime::OpenLocked(int device) {
  Arena& a = devices_[device];
  if (a.open++ == 0) mprotect(a.base, a.capacity, PROT_READ | PROT_WRITE);
}

void StrictCpuRuntime::CloseLocked(int device) {
  Arena& a = devices_[device];
  if (--a.open == 0) mprotect(a.base, a.capacity, PROT_NONE);
}

absl::StatusOr<void*> StrictCpuRuntime::Malloc(size_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  MUON_STRICT_RETURN(CheckNotCapturingLocked(what));
  const int d = CurrentLocked();
  Arena& a = devices_[d];
  const size_t need = Rounded(bytes);
  size_t at = 0;  // first fit
  for (const auto& [offset, size] : a.live) {
    if (offset >= at + need) break;
    at = offset + Rounded(size);
  }
  if (at + need > a.capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": out of device memory (", bytes, " bytes on strict-cpu device ", d, ")"));
  }
  a.live[at] = bytes;
  ++a.counters.mallocs;
  OpenLocked(d);
  std::memset(a.base + at, kFreshPattern, need);  // never zeros, as cudaMalloc promises none
  CloseLocked(d);
  return static_cast<void*>(a.base + at);
}

void StrictCpuRuntime::Free(void* ptr) {
  if (ptr == nullptr) return;
  (void)RunAll(DeviceOf(ptr));  // as cudaFree: after the device's work
  std::lock_guard<std::mutex> lock(mu_);
  const int d = DeviceOfLocked(ptr);
  if (d >= 0) {
    Arena& a = devices_[d];
    const auto it = a.live.find(static_cast<size_t>(static_cast<unsigned char*>(ptr) - a.base));
    if (it != a.live.end()) {
      a.live.erase(it);
      ++a.counters.frees;
      return;
    }
  }
  if (failed_.ok()) {
    failed_ = absl::InvalidArgumentError(
        absl::StrFormat("strict-cpu runtime: Free(%p) of memory it did not allocate", ptr));
  }
}

int StrictCpuRuntime::DeviceOfLocked(const void* ptr) const {
  const auto* p = static_cast<const unsigned char*>(ptr);
  for (size_t d = 0; d < devices_.size(); ++d) {
    const Arena& a = devices_[d];
    if (a.base != nullptr && p >= a.base && p < a.base + a.capacity) return static_cast<int>(d);
  }
  return -1;
}

absl::Status StrictCpuRuntime::CheckLocked(const void* ptr, size_t bytes,
                                           const std::string& what) const {
  if (bytes == 0) return absl::OkStatus();  // nothing is touched
  const int d = DeviceOfLocked(ptr);
  if (d < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", Range(ptr, bytes), " is not device memory (host memory)"));
  }
  const Arena& a = devices_[d];
  const size_t offset = static_cast<size_t>(static_cast<const unsigned char*>(ptr) - a.base);
  auto it = a.live.upper_bound(offset);
  if (it != a.live.begin()) {
    --it;
    if (offset < it->first + std::max<size_t>(it->second, 1)) {
      if (offset + bytes <= it->first + it->second) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", Range(ptr, bytes), " runs past the end of its device allocation ",
          Range(a.base + it->first, it->second)));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", Range(ptr, bytes), " is not device memory (freed, or never allocated)"));
}

absl::Status StrictCpuRuntime::CheckHostLocked(const void* ptr, size_t bytes,
                                               const std::string& what) const {
  if (bytes == 0) return absl::OkStatus();
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": NULL host pointer"));
  const auto* p = static_cast<const unsigned char*>(ptr);
  for (size_t d = 0; d < devices_.size(); ++d) {
    const Arena& a = devices_[d];
    if (a.base != nullptr && p < a.base + a.capacity && p + bytes > a.base) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", Range(ptr, bytes),
                                                     " is device memory (device ", d,
                                                     ") where host memory belongs"));
    }
  }
  return absl::OkStatus();
}

absl::Status StrictCpuRuntime::CheckDeviceMemory(const void* ptr, size_t bytes,
                                                 const std::string& what) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckLocked(ptr, bytes, what);
}

bool StrictCpuRuntime::IsDeviceMemory(const void* ptr, size_t bytes) const {
  return CheckDeviceMemory(ptr, bytes, "").ok();
}

int StrictCpuRuntime::DeviceOf(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  return DeviceOfLocked(ptr);
}

absl::Status StrictCpuRuntime::CheckNotCapturingLocked(const std::string& what) const {
  if (capturing_ == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": not permitted while a stream is capturing a CUDA graph"));
}

absl::Status StrictCpuRuntime::CheckCurrentLocked(const Stream* s, const std::string& what) const {
  const int current = CurrentLocked();
  if (s->device == current) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": work issued on a stream of device ", s->device, " while device ", current,
      " is this thread's current device (make the stream's device current first)"));
}

StrictCpuRuntime::Stream* StrictCpuRuntime::StreamOfLocked(GpuStream s) const {
  if (s == nullptr) return devices_[CurrentLocked()].null_stream.get();
  for (const auto& st : streams_) {
    if (st.get() == s) return st.get();
  }
  return nullptr;
}

int StrictCpuRuntime::DeviceOfStream(GpuStream stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Stream* s = StreamOfLocked(stream);
  return s == nullptr ? -1 : s->device;
}

absl::StatusOr<StrictCpuRuntime::Stream*> StrictCpuRuntime::WorkStreamLocked(
    GpuStream stream, const std::string& what) {
  if (!failed_.ok()) return failed_;
  Stream* s = StreamOfLocked(stream);
  if (s == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: unknown stream %p", what, stream));
  }
  MUON_STRICT_RETURN(CheckCurrentLocked(s, what));
  return s;
}

absl::Status StrictCpuRuntime::EnqueueLocked(Stream* s, std::function<absl::Status()> work) {
  if (s->capturing) {
    s->origin->graph.push_back(std::move(work));  // the host's issue order: a valid order
    if (s != s->origin) s->unjoined = true;
    for (auto& e : events_) {
      if (e->captured != nullptr && e->stream == s) e->covers_all = false;
    }
    return absl::OkStatus();
  }
  s->items.push_back(std::move(work));
  ++s->issued;
  return absl::OkStatus();
}

absl::Status StrictCpuRuntime::Enqueue(GpuStream stream, std::function<absl::Status()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<Stream*> s = WorkStreamLocked(stream, "stream work");
  if (!s.ok()) return s.status();
  return EnqueueLocked(*s, std::move(work));
}

absl::Status StrictCpuRuntime::MemsetAsync(void* dst, int value, size_t bytes, GpuStream stream,
                                           const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<Stream*> work_stream = WorkStreamLocked(stream, what);
  if (!work_stream.ok()) return work_stream.status();
  Stream* s = *work_stream;
  absl::Status st = CheckLocked(dst, bytes, absl::StrCat(what, ": memset destination"));
  if (!st.ok()) return st;
  if (bytes > 0 && DeviceOfLocked(dst) != s->device) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": memset of device ",
                                                   DeviceOfLocked(dst), " memory on a stream of "
                                                   "device ", s->device));
  }
  return EnqueueLocked(s, [dst, value, bytes] {
    std::memset(dst, value, bytes);
    return absl::OkStatus();
  });
}

absl::Status StrictCpuRuntime::MemcpyAsync(void* dst, const void* src, size_t bytes,
                                           CopyKind kind, GpuStream stream,
                                           const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<Stream*> work_stream = WorkStreamLocked(stream, what);
  if (!work_stream.ok()) return work_stream.status();
  Stream* s = *work_stream;
  bool src_device = kind != CopyKind::kHostToDevice;
  bool dst_device = kind != CopyKind::kDeviceToHost;
  if (kind == CopyKind::kDefault) {
    src_device = DeviceOfLocked(src) >= 0;
    dst_device = DeviceOfLocked(dst) >= 0;
  }
  const std::string src_what = absl::StrCat(what, ": copy source");
  const std::string dst_what = absl::StrCat(what, ": copy destination");
  absl::Status st =
      src_device ? CheckLocked(src, bytes, src_what) : CheckHostLocked(src, bytes, src_what);
  if (st.ok()) {
    st = dst_device ? CheckLocked(dst, bytes, dst_what) : CheckHostLocked(dst, bytes, dst_what);
  }
  if (!st.ok()) return st;
  if (s->capturing && (!src_device || !dst_device)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": a copy from or to host memory is not permitted in a CUDA graph capture"));
  }
  if ((!src_device && !PinnedLocked(src, bytes)) || (!dst_device && !PinnedLocked(dst, bytes))) {
    ++devices_[static_cast<size_t>(s->device)].counters.pageable_copies;
  }
  if (bytes == 0) return EnqueueLocked(s, [] { return absl::OkStatus(); });
  // Memory of another device than the stream's (a peer copy) is opened too.
  std::vector<int> others;
  for (const void* p : {static_cast<const void*>(dst), src}) {
    const int d = DeviceOfLocked(p);
    if (d >= 0 && d != s->device) others.push_back(d);
  }
  return EnqueueLocked(s, [this, dst, src, bytes, others] {
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int d : others) OpenLocked(d);
    }
    std::memmove(dst, src, bytes);
    std::lock_guard<std::mutex> l(mu_);
    for (int d : others) CloseLocked(d);
    return absl::OkStatus();
  });
}

absl::Status StrictCpuRuntime::LaunchCopyChunks(const GpuCopyChunk* chunks, int64_t count,
                                                GpuStream stream, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative chunk count"));
  absl::StatusOr<Stream*> work_stream = WorkStreamLocked(stream, what);
  if (!work_stream.ok()) return work_stream.status();
  Stream* s = *work_stream;
  if (count == 0) return absl::OkStatus();
  absl::Status st = CheckLocked(chunks, static_cast<size_t>(count) * sizeof(GpuCopyChunk),
                                absl::StrCat(what, ": the chunk array"));
  if (!st.ok()) return st;
  if (DeviceOfLocked(chunks) != s->device) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the chunk array is on device ", DeviceOfLocked(chunks),
                     ", the stream on device ", s->device));
  }
  const int device = s->device;
  return EnqueueLocked(s, [this, chunks, count, what, device]() -> absl::Status {
    // What the kernel reads when it runs: the chunks, then their memory,
    // which must be its own device's.
    std::vector<CopyOp> ops;
    for (int64_t i = 0; i < count; ++i) {
      const GpuCopyChunk c = chunks[i];
      if (c.src_type > 2 || c.dst_type > 2 || c.via > 2 || c.n < 0 || c.n > kGpuChunkElems) {
        return absl::InternalError(absl::StrCat(what, ": chunk ", i, " is malformed"));
      }
      CopyOp op;
      op.src = c.src;
      op.dst = c.dst;
      op.n = c.n;
      op.src_type = static_cast<DType>(c.src_type);
      op.dst_type = static_cast<DType>(c.dst_type);
      op.via = static_cast<DType>(c.via);
      std::lock_guard<std::mutex> lock(mu_);
      const size_t src_bytes = static_cast<size_t>(c.n) * SizeOf(op.src_type);
      const size_t dst_bytes = static_cast<size_t>(c.n) * SizeOf(op.dst_type);
      absl::Status st = CheckLocked(op.src, src_bytes, absl::StrCat(what, ": chunk ", i, " source"));
      if (st.ok()) {
        st = CheckLocked(op.dst, dst_bytes, absl::StrCat(what, ": chunk ", i, " destination"));
      }
      if (st.ok() && c.n > 0 &&
          (DeviceOfLocked(op.src) != device || DeviceOfLocked(op.dst) != device)) {
        st = absl::InvalidArgumentError(
            absl::StrCat(what, ": chunk ", i, " touches another device's memory than device ",
                         device, " it runs on"));
      }
      if (!st.ok()) return st;
      ops.push_back(op);
    }
    RunCopiesOnHost(ops);
    return absl::OkStatus();
  });
}

absl::StatusOr<GpuStream> StrictCpuRuntime::StreamCreate() {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(std::make_unique<Stream>());
  streams_.back()->device = CurrentLocked();
  return static_cast<GpuStream>(streams_.back().get());
}

void StrictCpuRuntime::StreamDestroy(GpuStream stream) {
  if (stream == nullptr) return;
  Stream* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = StreamOfLocked(stream);
    if (s == nullptr) return;
  }
  (void)RunUntil(s, -1);  // as CUDA: work already issued completes
  std::lock_guard<std::mutex> lock(mu_);
  // Unknown to every later call, but kept: an event recorded on it, and a
  // wait for that event already issued on another stream, still point to it
  // (as in CUDA, they stay valid and complete).
  for (auto& x : streams_) {
    if (x.get() == s) retired_.push_back(std::move(x));
  }
  streams_.erase(std::remove(streams_.begin(), streams_.end(), nullptr), streams_.end());
}

absl::Status StrictCpuRuntime::RunUntil(Stream* s, int64_t target) {
  std::recursive_mutex* exec = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (target < 0) target = s->issued;
    if (s->executed >= target) return failed_;
    exec = devices_[static_cast<size_t>(s->device)].exec_mu.get();
  }
  std::lock_guard<std::recursive_mutex> running(*exec);
  while (true) {
    std::function<absl::Status()> item;
    bool healthy = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (s->executed >= target || s->items.empty()) return failed_;
      item = std::move(s->items.front());
      s->items.pop_front();
      OpenLocked(s->device);
      healthy = failed_.ok();
    }
    // Run without the runtime's lock: a collective waits here for its peers.
    // After a fault nothing more runs (its results would be garbage).
    absl::Status st = healthy ? item() : absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu_);
    CloseLocked(s->device);
    ++s->executed;
    if (!st.ok() && failed_.ok()) failed_ = st;  // sticky, as a GPU fault is
  }
}

absl::Status StrictCpuRuntime::RunAll(int device) {
  std::vector<Stream*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d].null_stream != nullptr && (device < 0 || device == static_cast<int>(d))) {
        all.push_back(devices_[d].null_stream.get());
      }
    }
    for (const auto& s : streams_) {
      if (device < 0 || s->device == device) all.push_back(s.get());
    }
  }
  absl::Status first;
  for (Stream* s : all) {
    absl::Status st = RunUntil(s, -1);
    if (first.ok()) first = st;
  }
  return first;
}

absl::Status StrictCpuRuntime::StreamSynchronize(GpuStream stream, const std::string& what) {
  Stream* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = StreamOfLocked(stream);
    if (s != nullptr) ++devices_[s->device].counters.stream_waits;
    MUON_STRICT_RETURN(CheckNotCapturingLocked(what));
  }
  if (s == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: stream %p is not one of the runtime's streams", what, stream));
  }
  absl::Status st = RunUntil(s, -1);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
  return st;
}

absl::StatusOr<GpuEvent> StrictCpuRuntime::EventCreate() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::make_unique<Event>());
  return static_cast<GpuEvent>(events_.back().get());
}

void StrictCpuRuntime::EventDestroy(GpuEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.erase(std::remove_if(events_.begin(), events_.end(),
                               [event](const std::unique_ptr<Event>& e) { return e.get() == event; }),
                events_.end());
}

absl::Status StrictCpuRuntime::EventRecord(GpuEvent event, GpuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  Stream* s = StreamOfLocked(stream);
  auto* e = static_cast<Event*>(event);
  const bool known = std::any_of(events_.begin(), events_.end(),
                                 [e](const std::unique_ptr<Event>& x) { return x.get() == e; });
  if (s == nullptr || !known) {
    return absl::InvalidArgumentError(
        "strict-cpu runtime: EventRecord on an unknown stream or event");
  }
  e->stream = s;
  e->target = s->issued;
  e->captured = s->capturing ? s->origin : nullptr;
  e->covers_all = s->capturing;
  return absl::OkStatus();
}

absl::Status StrictCpuRuntime::StreamWaitEvent(GpuStream stream, GpuEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  auto* e = static_cast<Event*>(event);
  const bool known = std::any_of(events_.begin(), events_.end(),
                                 [e](const std::unique_ptr<Event>& x) { return x.get() == e; });
  Stream* s = StreamOfLocked(stream);
  if (s == nullptr || !known) {
    return absl::InvalidArgumentError(
        "strict-cpu runtime: StreamWaitEvent on an unknown stream or event");
  }
  if (e->captured != nullptr) {
    // Within a capture the graph's order (the host's) already holds it: a
    // fork joins `s` to the capture, a wait of the origin joins the lane back.
    if (s->capturing && s->origin != e->captured) {
      return absl::FailedPreconditionError(
          "strict-cpu runtime: StreamWaitEvent joins two captures (not permitted)");
    }
    if (!s->capturing) {
      s->capturing = true;
      s->origin = e->captured;
      s->unjoined = false;
      ++capturing_;
    }
    if (s == s->origin && e->stream != s && e->covers_all) e->stream->unjoined = false;
    return absl::OkStatus();
  }
  if (s->capturing && e->stream != nullptr) {
    return absl::FailedPreconditionError(
        "strict-cpu runtime: a capturing stream waits for an event recorded outside the "
        "capture (CUDA refuses it: capture isolation)");
  }
  Stream* target_stream = e->stream;  // the record as of now
  const int64_t target = e->target;
  if (target_stream == nullptr) return absl::OkStatus();  // never recorded: complete
  return EnqueueLocked(s, [this, target_stream, target] { return RunUntil(target_stream, target); });
}

absl::Status StrictCpuRuntime::EventSynchronize(GpuEvent event, const std::string& what) {
  Stream* s = nullptr;
  int64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto* e = static_cast<Event*>(event);
    s = e->stream;
    target = e->target;
    if (s != nullptr) ++devices_[s->device].counters.event_waits;
    MUON_STRICT_RETURN(CheckNotCapturingLocked(what));
  }
  if (s == nullptr) return absl::OkStatus();
  absl::Status st = RunUntil(s, target);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
  return st;
}

absl::StatusOr<bool> StrictCpuRuntime::EventQuery(GpuEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  auto* e = static_cast<Event*>(event);
  return e->stream == nullptr || e->stream->executed >= e->target;
}

StrictCpuRuntime::Counters StrictCpuRuntime::counters(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return devices_[static_cast<size_t>(device)].counters;
}

int64_t StrictCpuRuntime::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const Arena& a : devices_) {
    if (a.null_stream != nullptr) n += static_cast<int64_t>(a.null_stream->items.size());
  }
  for (const auto& s : streams_) n += static_cast<int64_t>(s->items.size());
  return n;
}

}  // namespace muon
