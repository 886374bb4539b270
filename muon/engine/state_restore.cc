#include "muon/engine/state_restore.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"

namespace muon {
namespace {

std::string ViewName(uint8_t v) { return absl::StrCat(static_cast<int>(v)); }

bool IsZero2(const Param& p) { return p.zero2_group >= 0; }

// This rank's own blob: the strict, positional check of a resume.
absl::Status PlanOwn(const std::vector<Param>& params, const SavedState& blob, bool set_up,
                     RestorePlan* plan) {
  if (blob.params.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state blob: holds ", blob.params.size(),
                                                   " parameters, the optimizer has ",
                                                   params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const SavedParam& s = blob.params[i];
    const std::string who = absl::StrCat("state blob, param '", p.name, "'");
    if (s.name != p.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the blob has '", s.name, "' at this position; register the parameters "
          "in the order they were saved"));
    }
    if (s.local_shape != p.value.shape || s.view != static_cast<uint8_t>(p.view)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": saved shape ", ShapeString(s.local_shape), " (view ", ViewName(s.view),
          ") differs from the registered ", ShapeString(p.value.shape), " (view ",
          static_cast<int>(p.view), ")",
          s.kind == kGlobalRuns && s.view == static_cast<uint8_t>(p.view)
              ? "; a checkpoint of another layout or world size loads with every rank's blob "
                "through muon_load_states"
              : ""));
    }
    // (Format 1 records no global shape; the parser gives it the local one.)
    if (blob.format >= 2 && s.global_shape != p.global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": saved global shape ", ShapeString(s.global_shape), " differs from the "
          "registered ", ShapeString(p.global_shape)));
    }
    // (Format 1 records no kind: every entry is a local piece.) A format-2
    // entry's kind is the path the parameter was registered on.
    const uint8_t kind = p.custom != nullptr ? kLocalOnly : kGlobalRuns;
    if (blob.format >= 2 && s.kind != kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the blob saved it ", s.kind == kLocalOnly ? "on the custom path (a local "
          "piece only)" : "with a layout (global runs)", ", the optimizer has it ",
          kind == kLocalOnly ? "on the custom path" : "with a layout",
          "; register it as it was saved"));
    }
    if (s.state_dtype != p.state_dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": saved momentum dtype ", DTypeName(s.state_dtype),
          " differs from this optimizer's ", DTypeName(p.state_dtype),
          " (check momentum_fp32 and the gradient dtype)"));
    }
    const bool holds = p.holds_state && !p.momentum.empty();
    if (s.nbytes == 0) {
      if (!holds) continue;
      // A ZeRO-2 param whose momentum its owner saved: before the first step
      // this rank does not know it does not own it.
      if (IsZero2(p) && !set_up) {
        plan->held_elsewhere.push_back(i);
        continue;
      }
      if (p.numel() == 0) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the blob holds none of its momentum (", p.momentum.size(),
          " bytes expected): it was saved by a rank that did not hold it; load every rank's "
          "blob with muon_load_states"));
    }
    if (!holds) {
      // Saved before the first step's setup, when every rank held a ZeRO-2
      // param's whole momentum (no rank knew its owner yet): what the owner
      // saved then is the momentum the setup kept (the setup drops the
      // others' copies), so this rank, which does not own it, loads nothing.
      if (IsZero2(p) && s.kind == kGlobalRuns && s.held == p.numel()) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the blob holds ", s.nbytes, " momentum bytes, but its momentum lives on its "
          "ZeRO-2 owner, another rank: load that rank's blob there"));
    }
    if (s.kind == kGlobalRuns && s.runs != SavedRuns(p)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the blob holds other elements of it than this rank's piece (another layout "
          "or world size saved it); load every rank's blob with muon_load_states"));
    }
    if (s.nbytes != p.momentum.size()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": holds ", s.nbytes,
                                                     " momentum bytes, expected ",
                                                     p.momentum.size()));
    }
    plan->copies.push_back({i, 0, s.bytes, static_cast<size_t>(s.nbytes)});
  }
  return absl::OkStatus();
}

// A disjoint piece of the global tensor and where its bytes are.
struct Segment {
  int64_t begin = 0, end = 0;
  const unsigned char* src = nullptr;  // the bytes of element `begin`
};

// Several ranks' blobs: each param's global elements found wherever they are.
absl::Status PlanAny(const std::vector<Param>& params, const std::vector<SavedState>& blobs,
                     RestorePlan* plan) {
  // A custom-path parameter's layout is the host's: a blob records its bytes
  // as some rank's local piece, with no global coordinates, so nothing tells
  // whose piece it is (another rank's piece of the same shape would load as
  // this rank's). The whole call is refused, before any copy is planned.
  for (const Param& p : params) {
    if (p.custom != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "param '", p.name, "' is on the custom path: its layout is the host's, so no blob "
          "says which rank's piece of it an entry holds, and muon_load_states restores "
          "nothing while one is registered; restore this rank's own blob with "
          "muon_load_state, or each parameter with muon_set_state"));
    }
  }
  // name -> (blob, entry) of every entry with momentum.
  std::map<std::string, std::vector<std::pair<size_t, const SavedParam*>>> by_name;
  for (size_t b = 0; b < blobs.size(); ++b) {
    if (blobs[b].format < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state blob ", b, ": format ", blobs[b].format, " carries no global coordinates; "
          "load a format-1 blob into the rank that saved it with muon_load_state"));
    }
    if (blobs[b].step_count != blobs[0].step_count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state blobs 0 and ", b, " were saved at different steps (", blobs[0].step_count,
          " and ", blobs[b].step_count, "); load the blobs of one checkpoint"));
    }
    for (const SavedParam& s : blobs[b].params) {
      if (s.nbytes > 0) by_name[s.name].push_back({b, &s});
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (!p.holds_state || p.momentum.empty() || p.numel() == 0) continue;
    const std::string who = absl::StrCat("state for param '", p.name, "'");
    const auto found = by_name.find(p.name);
    if (found == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": none of the ", blobs.size(), " blobs holds it"));
    }
    const size_t elem = SizeOf(p.state_dtype);
    std::vector<Segment> sources;
    for (const auto& [b, s] : found->second) {
      if (s->kind != kGlobalRuns || s->global_shape != p.global_shape ||
          s->view != static_cast<uint8_t>(p.view) || s->state_dtype != p.state_dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": blob ", b, " saved it as ", ShapeString(s->global_shape), " (view ",
            ViewName(s->view), ", ", DTypeName(s->state_dtype), s->kind == kLocalOnly ?
            ", a local piece only" : "", "), the optimizer has ", ShapeString(p.global_shape),
            " (view ", static_cast<int>(p.view), ", ", DTypeName(p.state_dtype), ")"));
      }
      const unsigned char* at = s->bytes;
      for (const Run& r : s->runs) {
        sources.push_back({r.offset, r.offset + r.length, at});
        at += static_cast<size_t>(r.length) * elem;
      }
    }
    // Disjoint, sorted: the first copy of each element. Within one blob the
    // runs are disjoint (ParseStateBlob); across blobs the same element is
    // normal, each replica's copy (replicas are equal).
    std::sort(sources.begin(), sources.end(),
              [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
    std::vector<Segment> cover;
    int64_t until = 0;
    for (const Segment& s : sources) {
      if (s.end <= until) continue;
      const int64_t from = std::max(s.begin, until);
      cover.push_back({from, s.end, s.src + static_cast<size_t>(from - s.begin) * elem});
      until = s.end;
    }
    size_t local = 0;  // elements of the piece placed so far
    for (const Run& r : p.piece.runs) {
      int64_t at = r.offset;
      const int64_t end = r.offset + r.length;
      auto it = std::upper_bound(cover.begin(), cover.end(), at,
                                 [](int64_t v, const Segment& s) { return v < s.begin; });
      if (it != cover.begin()) --it;
      while (at < end) {
        if (it == cover.end() || it->begin > at || it->end <= at) {
          const int64_t gap_end = it == cover.end() || it->begin <= at ? end
                                                                        : std::min(end, it->begin);
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": its global elements [", at, ", ", gap_end, ") are in none of the ",
              blobs.size(), " blobs (hand every rank's blob of the checkpoint)"));
        }
        const int64_t n = std::min(end, it->end) - at;
        plan->copies.push_back({i, local * elem,
                                it->src + static_cast<size_t>(at - it->begin) * elem,
                                static_cast<size_t>(n) * elem});
        local += static_cast<size_t>(n);
        at += n;
        ++it;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestorePlan> PlanRestore(const std::vector<Param>& params,
                                        const std::vector<SavedState>& blobs, bool own_blob,
                                        bool set_up) {
  RestorePlan plan;
  if (blobs.empty()) return absl::InvalidArgumentError("no state blob given");
  plan.step_count = blobs[0].step_count;
  if (own_blob) {
    if (blobs.size() != 1) return absl::InvalidArgumentError("one blob: this rank's own");
    MUON_RETURN_IF_ERROR(PlanOwn(params, blobs[0], set_up, &plan));
  } else {
    MUON_RETURN_IF_ERROR(PlanAny(params, blobs, &plan));
  }
  return plan;
}

}  // namespace muon
