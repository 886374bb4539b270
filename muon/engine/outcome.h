// Outcome agreement: every rank of a job returns the same verdict for a step.
//
// A rank whose own part of a step fails (a communicator call, a host
// callback, the math, a refusal because it is poisoned) notes the failure in
// its LocalOutcome and goes on taking part in every remaining collective of
// the step, changing no more state; then the ranks agree on one 16-byte
// verdict per rank (the failure's code and a digest of the hyper-parameters
// the rank stepped with), exchanged on the step's last collective (the
// exchange stepper's last scatter carries them) or all-gathered here; only
// when some rank failed or the digests differ does a second all_gather carry
// each rank's report (the cause, or its hyper-parameters), so that every
// rank returns the same error naming the ranks and causes, or the differing
// values. A failure after this rank's verdict left poisons the rank, which
// then refuses the next step in its verdict, so every rank learns it there.
#ifndef MUON_ENGINE_OUTCOME_H_
#define MUON_ENGINE_OUTCOME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/comm/comm.h"
#include "muon/device/device.h"
#include "muon/engine/options.h"
#include "muon/comm/host_collectives.h"

namespace muon {

// This rank's part of one step: the first failure, kept while the rank goes
// on taking part.
class LocalOutcome {
 public:
  bool ok() const { return first_.ok(); }
  void Note(const absl::Status& st) {
    if (first_.ok() && !st.ok()) first_ = st;
  }
  const absl::Status& status() const { return first_; }

 private:
  absl::Status first_;
};

// One rank's verdict on the wire: 16 bytes (a magic word, the status code,
// the hyper-parameters' digest).
constexpr size_t kVerdictBytes = 16;
constexpr uint32_t kVerdictMagic = 0x5644554du;  // "MUDV", the first word
void WriteVerdict(int32_t code, uint64_t digest, unsigned char out[kVerdictBytes]);
// True when every one of the n verdicts at `all` says OK with verdict 0's
// digest (what VerdictGate computes on a device).
bool VerdictsSayOk(const unsigned char* all, int n);

// The hyper-parameters every rank must step with, as text (for messages)
// and as a digest (for the verdict).
std::string HyperText(const Options& o);
uint64_t HyperDigest(const Options& o);

// What AgreeOutcome reuses from one step to the next, so that agreeing on a
// step that went well allocates nothing once warm (the caller keeps it).
struct AgreeScratch {
  std::vector<unsigned char> verdicts;  // every rank's, when gathered here
  std::string label;                    // the gather's name, for its errors
};

// "agreeing on the outcome of <what>", the agreement's all_gather, rebuilt in
// *label (with room for longer step numbers: allocates nothing once warm).
const std::string& AgreeingLabel(const std::string& what, std::string* label);

// The job's verdict on a step, the same on every rank of `world` (`what`
// names the step in messages, e.g. "step 3"): OK when every rank succeeded
// with the same hyper-parameters; else the first failing rank's code with
// every failing rank and its cause named, or INVALID_ARGUMENT naming the
// ranks' differing hyper-parameters. A world of one returns `local` as is.
// When a verdict cannot be exchanged (the all_gather itself fails), that
// error is returned on the ranks where it failed.
// `device`: where a device communicator (NCCL) wants the verdicts staged (on
// a GPU the agreement waits for the step's stream); NULL or a host device:
// host memory.
// `exchanged`: every rank's verdict (rank order) when the step's last
// collective already carried them (the exchange stepper's last scatter);
// then only a problem costs a collective (the reports). A failure of this
// rank after its verdict left (local fails, the verdicts say OK) is this
// rank's alone: returned here, learnt by the others at the next step.
// `scratch`: kept by the caller between steps (NULL: this call's own).
// When this rank's all_gather fails but every verdict still arrived and
// some say their rank failed, this rank judges them as the others do (the
// reports included) and returns the same error; else the all_gather's error.
// *job_failed (optional): whether the verdicts this rank holds say the job
// failed (a rank's failure, or differing hyper-parameters), a judgement
// every rank that received them shares; false when the error is this
// rank's alone (its own failure after its verdict left, its collective).
absl::Status AgreeOutcome(Comm& world, Device* device, const LocalOutcome& local,
                          const Options& options, void* stream, const std::string& what,
                          const std::vector<unsigned char>* exchanged = nullptr,
                          AgreeScratch* scratch = nullptr, bool* job_failed = nullptr);

// AgreeOutcome's judgement of verdicts every rank already holds (`all`, rank
// order, the same bytes on every rank): on a GPU the verdicts of a step are
// judged at the next step, from a copy the stream made. Collective only when
// something is wrong (the reports), which every rank then sees alike.
absl::Status JudgeVerdicts(Comm& world, Device* device, const LocalOutcome& local,
                           const Options& options, void* stream, const std::string& what,
                           const unsigned char* all, size_t bytes);
inline absl::Status JudgeVerdicts(Comm& world, Device* device, const LocalOutcome& local,
                                  const Options& options, void* stream, const std::string& what,
                                  const std::vector<unsigned char>& all) {
  return JudgeVerdicts(world, device, local, options, stream, what, all.data(), all.size());
}

}  // namespace muon

#endif  // MUON_ENGINE_OUTCOME_H_
