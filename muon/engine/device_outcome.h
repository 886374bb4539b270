// A step's outcome on a GPU, without a host wait (include/libmuon/muon.h, muon_step):
// with more than one rank the verdicts stay on the device, where the math's
// VerdictGate turns them into the go-ahead the update kernels read (no rank
// applies a step some rank failed), and reach the host with the stream; the
// next step judges them before it does anything (Settle), so every rank
// returns a failed step's error at the same call. The step's non-finite
// count comes home the same way (one rank or more) and is read when asked.
// What the stream copies from or to the host lives in page-locked memory
// (StagingBuffer), so that no copy makes the host wait for the stream.
#ifndef MUON_ENGINE_DEVICE_OUTCOME_H_
#define MUON_ENGINE_DEVICE_OUTCOME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/device/device.h"
#include "muon/engine/options.h"
#include "muon/engine/outcome.h"
#include "muon/engine/registry.h"
#include "muon/engine/setup.h"

namespace muon {

class DeviceOutcome {
 public:
  // Ends step number `step` on the device: the verdicts (carried by the
  // exchange's last scatter, else one all_gather into the setup's buffers,
  // issued whatever failed), the go-ahead, `apply(gate)` (the gated updates)
  // when this rank succeeded, the copies home and a mark. Returns this
  // rank's outcome; the job's is judged by the next Settle. `capturing`
  // (the step goes into a CUDA graph): the gate still decides on the
  // device at every replay, but nothing comes home to be judged.
  absl::Status Finish(Registry& registry, StepSetup& setup, const Options& options,
                      LocalOutcome& local, void* stream, int64_t step, bool capturing,
                      const std::function<absl::Status(const int32_t* gate)>& apply);
  // One rank: the step's non-finite count home with the stream.
  absl::Status SendCountHome(const std::shared_ptr<Device>& device, const StepSetup& setup);
  // The finished step was counted by the optimizer (Settle gives it back
  // when the step failed).
  void Counted() { counted_ = true; }

  // The last finished step's verdicts, judged at the start of the next step
  // (its one host wait, on the last step's end).
  struct Settled {
    // OK when it succeeded (or none is pending). Else, with job_failed, the
    // error every rank returns (the failing ranks and causes, or the
    // differing values); without, an error of this rank alone (the wait
    // failed), which it refuses the step with.
    absl::Status status;
    bool job_failed = false;
    bool uncount = false;   // it failed and the optimizer had counted it
    bool restored = false;  // this rank's state was loaded since (no poisoning needed)
  };
  Settled Settle(Registry& registry, void* stream);
  // Refuses (FailedPrecondition) while the pending step failed on some rank.
  absl::Status PendingFailure(const Registry& registry) const;
  // The last step's non-finite count once the stream got there (-1 when the
  // wait fails); false when none is pending.
  bool TakeCount(Device& device, int64_t* count) const;
  // The step's count is known on the host already (skip_nonfinite).
  void DropCount() { count_pending_ = false; }
  // A state was loaded since the step: it is still judged at the next step
  // (every rank takes part in that), but no longer counted, poisoned for or
  // refused to save.
  void Restored() {
    counted_ = false;
    restored_ = true;
  }

 private:
  bool pending_ = false;
  bool counted_ = false;
  bool restored_ = false;
  int64_t step_ = 0;
  absl::Status local_;  // this rank's outcome of it
  Options options_;     // the hyper-parameters it stepped with (for the report)
  // The memory for `ranks` ranks: page-locked, made at the first step that
  // needs it; plain host memory (whose copies may make the host wait) when
  // that fails or a capture is under way (no CUDA allocation is permitted
  // then). Throws std::bad_alloc only.
  void Reserve(const std::shared_ptr<Device>& device, int ranks);
  unsigned char* base() const {
    return home_.size() != 0 ? home_.as<unsigned char>()
                             : const_cast<unsigned char*>(plain_.data());
  }
  unsigned char* mine() const { return base(); }  // read by the stream
  int64_t* nonfinite() const {                    // written by the stream
    return reinterpret_cast<int64_t*>(base() + kVerdictBytes);
  }
  unsigned char* verdicts() const {  // written by the stream
    return base() + kVerdictBytes + sizeof(int64_t);
  }
  // This rank's verdict, the non-finite count, then every rank's verdicts.
  StagingBuffer home_;
  std::vector<unsigned char> plain_;
  mutable bool count_pending_ = false;
};

}  // namespace muon

#endif  // MUON_ENGINE_DEVICE_OUTCOME_H_
