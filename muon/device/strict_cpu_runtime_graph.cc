// StrictCpuRuntime's CUDA-graph capture and replay (see the header).
#include <utility>

#include "muon/device/strict_cpu_runtime.h"

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
  s->graph.clear();
  ++capturing_;
  return absl::OkStatus();
}

absl::StatusOr<StrictCpuRuntime::Graph> StrictCpuRuntime::EndCapture(GpuStream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Stream* s = StreamOfLocked(stream);
  if (s == nullptr || !s->capturing) {
    return absl::InvalidArgumentError("strict-cpu runtime: the stream is not capturing");
  }
  s->capturing = false;
  --capturing_;
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
