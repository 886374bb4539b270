// StrictCpuRuntime's CUDA-graph capture and replay (see the header).
#include <utility>

#include "muon/device/testing/strict_cpu_runtime.h"

namespace muon {

absl::StatusOr<bool> StrictCpuRuntime::IsCapturing(GpuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const Stream* s = StreamOfLocked(stream);
  return s != nullptr && s->capturing;
}

absl::Status StrictCpuRuntime::BeginCapture(GpuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Stream* s = StreamOfLocked(stream);
  if (s == nullptr || stream == nullptr || s->capturing) {
    return absl::InvalidArgumentError(
        "strict-cpu runtime: capture needs a created stream that is not capturing");
  }
  s->capturing = true;
  s->origin = s;
  s->unjoined = false;
  s->graph.clear();
  ++capturing_;
  return absl::OkStatus();
}

absl::StatusOr<StrictCpuRuntime::Graph> StrictCpuRuntime::EndCapture(GpuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Stream* s = StreamOfLocked(stream);
  if (s == nullptr || !s->capturing || s->origin != s) {
    return absl::InvalidArgumentError(
        "strict-cpu runtime: the stream is not the origin of a capture");
  }
  // Every stream that joined leaves the capture; one with work the origin
  // did not wait for fails it (CUDA: cudaErrorStreamCaptureUnjoined).
  bool unjoined = false;
  for (auto& other : streams_) {
    if (other.get() == s || !other->capturing || other->origin != s) continue;
    unjoined = unjoined || other->unjoined;
    other->capturing = false;
    other->origin = nullptr;
    other->unjoined = false;
    --capturing_;
  }
  for (auto& e : events_) {
    if (e->captured == s) e->captured = nullptr, e->stream = nullptr;  // not waitable after
  }
  s->capturing = false;
  s->origin = nullptr;
  --capturing_;
  if (unjoined) {
    s->graph.clear();
    return absl::FailedPreconditionError(
        "strict-cpu runtime: the capture ended with a joined stream's work not waited for by the "
        "origin stream (CUDA: cudaErrorStreamCaptureUnjoined)");
  }
  Graph g;
  g.device = s->device;
  g.work.swap(s->graph);
  return g;
}

absl::Status StrictCpuRuntime::Replay(const Graph& graph, GpuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  Stream* s = StreamOfLocked(stream);
  if (s == nullptr || s->device != graph.device) {
    return absl::InvalidArgumentError("strict-cpu runtime: replay on a stream of another device");
  }
  for (const auto& w : graph.work) {
    absl::Status st = EnqueueLocked(s, w);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace muon
