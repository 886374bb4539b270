#include "muon/engine/outcome.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "muon/common/status.h"
#include "muon/comm/host_collectives.h"

namespace muon {
namespace {

constexpr size_t kReportBytes = 512;             // code, then text (truncated)

struct Verdict {
  uint32_t magic;
  int32_t code;
  uint64_t digest;
};
static_assert(sizeof(Verdict) == 16, "the verdict is 16 bytes on the wire");

const char* AdjustName(AdjustLr a) {
  switch (a) {
    case AdjustLr::kOriginal: return "original";
    case AdjustLr::kMatchRmsAdamW: return "match_rms_adamw";
    case AdjustLr::kNone: return "none";
    case AdjustLr::kSpectralUnclamped: return "spectral_unclamped";
    case AdjustLr::kSpectral: return "spectral";
  }
  return "?";
}

// Every rank's `bytes` bytes, in rank order, through host or device memory.
absl::Status GatherAll(Comm& world, Device* device, const void* mine, size_t bytes,
                       std::vector<unsigned char>* all, void* stream, const std::string& op) {
  all->assign(static_cast<size_t>(world.size()) * bytes, 0);
  return HostCollectives(world, device, stream).AllGather(mine, all->data(), bytes, op);
}

std::string ReportText(const unsigned char* report) {
  const char* text = reinterpret_cast<const char*>(report + 4);
  return std::string(text, strnlen(text, kReportBytes - 4));
}

}  // namespace

void WriteVerdict(int32_t code, uint64_t digest, unsigned char out[kVerdictBytes]) {
  const Verdict v{kVerdictMagic, code, digest};
  std::memcpy(out, &v, sizeof v);
}

// The shortest text that reads back as the same double.
std::string Shortest(double v) {
  for (int digits = 1; digits < 17; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string HyperText(const Options& o) {
  return absl::StrCat("lr=", Shortest(o.lr), ", weight_decay=", Shortest(o.weight_decay),
                      ", momentum=", Shortest(o.momentum), ", nesterov=",
                      o.nesterov ? "true" : "false", ", adjust_lr=", AdjustName(o.adjust_lr));
}

uint64_t HyperDigest(const Options& o) {
  // FNV-1a over the values' bytes: equal values, equal digests.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const double values[3] = {o.lr, o.weight_decay, o.momentum};
  mix(values, sizeof values);
  const int32_t flags[2] = {o.nesterov ? 1 : 0, static_cast<int32_t>(o.adjust_lr)};
  mix(flags, sizeof flags);
  return h;
}

const std::string& AgreeingLabel(const std::string& what, std::string* label) {
  constexpr char kAgreeing[] = "agreeing on the outcome of ";
  // Room for longer step numbers than this one: a step grows nothing.
  const size_t size = sizeof kAgreeing - 1 + what.size();
  if (label->capacity() < size) label->reserve(size + 32);
  label->assign(kAgreeing).append(what);
  return *label;
}

namespace {
bool JobFailed(const unsigned char* all, int n);
}  // namespace

absl::Status AgreeOutcome(Comm& world, Device* device, const LocalOutcome& local,
                          const Options& options, void* stream, const std::string& what,
                          const std::vector<unsigned char>* exchanged, AgreeScratch* scratch,
                          bool* job_failed) {
  if (job_failed != nullptr) *job_failed = false;
  if (world.size() == 1) return local.status();
  const size_t bytes = static_cast<size_t>(world.size()) * sizeof(Verdict);
  if (exchanged != nullptr && exchanged->size() == bytes) {
    if (job_failed != nullptr) *job_failed = JobFailed(exchanged->data(), world.size());
    return JudgeVerdicts(world, device, local, options, stream, what, exchanged->data(), bytes);
  }
  AgreeScratch own;
  AgreeScratch& s = scratch != nullptr ? *scratch : own;
  const Verdict mine{kVerdictMagic, static_cast<int32_t>(local.status().code()),
                     HyperDigest(options)};
  const absl::Status gathered = GatherAll(world, device, &mine, sizeof mine, &s.verdicts, stream,
                                          AgreeingLabel(what, &s.label));
  // When this rank's all_gather failed but the verdicts still reached it
  // (the data moved before the failure) and they say the job failed, the
  // others judge them alike and gather the reports: so does this rank, and
  // returns the same error. Else its failure is its own: returned here, and
  // the others (who may have judged the step OK) learn it at the next step.
  const bool job = JobFailed(s.verdicts.data(), world.size());
  if (job_failed != nullptr) *job_failed = job;
  if (!gathered.ok() && !job) return gathered;
  return JudgeVerdicts(world, device, local, options, stream, what, s.verdicts.data(), bytes);
}

namespace {

Verdict VerdictAt(const unsigned char* all, int r) {
  Verdict v;
  std::memcpy(&v, all + static_cast<size_t>(r) * sizeof v, sizeof v);
  return v;
}

// What every rank that holds these verdicts judges a failure of the job: a
// verdict that arrived intact and says its rank failed, or intact verdicts
// whose hyper-parameters differ.
bool JobFailed(const unsigned char* all, int n) {
  bool intact = true, differ = false;
  for (int r = 0; r < n; ++r) {
    const Verdict x = VerdictAt(all, r);
    if (x.magic != kVerdictMagic) {
      intact = false;
      continue;
    }
    if (x.code != 0) return true;
    differ = differ || x.digest != VerdictAt(all, 0).digest;
  }
  return intact && differ;
}

}  // namespace

bool VerdictsSayOk(const unsigned char* all, int n) {
  const uint64_t digest = n > 0 ? VerdictAt(all, 0).digest : 0;
  for (int r = 0; r < n; ++r) {
    const Verdict x = VerdictAt(all, r);
    if (x.magic != kVerdictMagic || x.code != 0 || x.digest != digest) return false;
  }
  return true;
}

absl::Status JudgeVerdicts(Comm& world, Device* device, const LocalOutcome& local,
                           const Options& options, void* stream, const std::string& what,
                           const unsigned char* verdicts, size_t bytes) {
  const int n = world.size();
  if (bytes != static_cast<size_t>(n) * sizeof(Verdict)) {
    return absl::InternalError(absl::StrCat(what, ": ", bytes, " bytes of verdicts for ", n,
                                            " ranks"));
  }
  // A verdict that arrived damaged (the communicator mis-paired or spoiled
  // this rank's receive) counts for nothing; the intact ones are judged.
  bool failed = false, differ = false, damaged = false;
  for (int r = 0; r < n; ++r) {
    const Verdict x = VerdictAt(verdicts, r);
    if (x.magic != kVerdictMagic) {
      damaged = true;
      continue;
    }
    failed = failed || x.code != 0;
    differ = differ || x.digest != VerdictAt(verdicts, 0).digest;
  }
  differ = differ && !damaged;
  if (!failed && !differ) {
    if (!damaged) return local.status();  // (not OK: failed after its verdict left)
    return absl::InternalError(absl::StrCat(
        what, ": a rank's verdict arrived damaged; the communicator mis-paired or spoiled the "
        "collectives of this step", local.ok() ? "" : " (and this rank failed: ",
        local.ok() ? "" : local.status().message(), local.ok() ? "" : ")"));
  }
  // Something to tell: every rank's report (its failure, or its values).
  std::vector<Verdict> v(static_cast<size_t>(n));
  std::memcpy(v.data(), verdicts, bytes);
  std::vector<unsigned char> all;
  unsigned char report[kReportBytes] = {};
  const int32_t code = static_cast<int32_t>(local.status().code());
  std::memcpy(report, &code, 4);
  const std::string text = local.ok() ? HyperText(options)
                                      : absl::StrCat(absl::StatusCodeToString(local.status().code()),
                                                     ": ", local.status().message());
  std::memcpy(report + 4, text.data(), std::min(text.size(), kReportBytes - 5));
  const absl::Status reported = GatherAll(world, device, report, kReportBytes, &all, stream,
                                          absl::StrCat("reporting the outcome of ", what));
  if (failed) {
    // Bounded: the first few failing ranks' causes, each cut short; when the
    // causes did not reach this rank, their codes (the verdicts did, as on
    // every rank: the same code as the others return).
    constexpr int kNamed = 4;
    constexpr size_t kCause = 240;
    int first = -1, count = 0;
    std::string causes;
    for (int r = 0; r < n; ++r) {
      const Verdict& x = v[static_cast<size_t>(r)];
      if (x.magic != kVerdictMagic || x.code == 0) continue;  // (damaged: counts for nothing)
      if (first < 0) first = r;
      if (++count > kNamed) continue;
      std::string cause =
          reported.ok() ? ReportText(all.data() + static_cast<size_t>(r) * kReportBytes)
                        : absl::StatusCodeToString(static_cast<absl::StatusCode>(x.code));
      if (cause.size() > kCause) cause = cause.substr(0, kCause) + "...";
      absl::StrAppend(&causes, causes.empty() ? "" : "; ", "rank ", r, ": ", cause);
    }
    if (count > kNamed) absl::StrAppend(&causes, "; and ", count - kNamed, " more rank(s)");
    return absl::Status(
        static_cast<absl::StatusCode>(v[static_cast<size_t>(first)].code),
        absl::StrCat(what, " failed on ", count, " of ", n, " ranks (", causes, "); ",
                     reported.ok() ? "every rank returns this error"
                                   : absl::StrCat("their causes could not be gathered here: ",
                                                  reported.message())));
  }
  if (!reported.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the ranks step with different hyper-parameters; their values could not be "
        "gathered here (", reported.message(), "); set the same lr, weight_decay, momentum, "
        "nesterov and adjust_lr on every rank"));
  }
  std::string values;
  for (int r = 0; r < n; ++r) {
    if (r > 0 && v[static_cast<size_t>(r)].digest == v[static_cast<size_t>(r - 1)].digest) {
      continue;
    }
    absl::StrAppend(&values, values.empty() ? "" : "; ", "rank ", r, " has ",
                    ReportText(all.data() + static_cast<size_t>(r) * kReportBytes));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": the ranks step with different hyper-parameters (", values,
      "); set the same lr, weight_decay, momentum, nesterov and adjust_lr on every rank"));
}

}  // namespace muon
