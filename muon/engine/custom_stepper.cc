#include "muon/engine/custom_stepper.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {

absl::StatusOr<std::unique_ptr<CustomStepper>> CustomStepper::Create(std::vector<CustomUnit> units,
                                                                     int world_rank,
                                                                     const StepContext& ctx) {
  std::unique_ptr<CustomStepper> s(new CustomStepper(std::move(units), world_rank, ctx));
  int64_t most = 0;
  s->stats_.matrices_total = static_cast<int64_t>(s->units_.size());
  for (const CustomUnit& c : s->units_) {
    if (c.owner != world_rank) continue;
    most = std::max(most, c.rows * c.cols);
    ++s->stats_.matrices_owned;
  }
  try {
    s->slot_.resize(static_cast<size_t>(most));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory for the custom-path matrix");
  }
  for (const CustomUnit& c : s->units_) {
    if (c.owner == world_rank) {
      MUON_RETURN_IF_ERROR(ctx.device->math().Reserve(ctx.options->ns, 1, c.rows, c.cols));
    }
  }
  return s;
}

absl::Status CustomStepper::RunOne(const CustomUnit& c, void* stream, bool failed) {
  // The callbacks are the host's collectives: they are called whatever failed
  // before (so that the other holders' calls pair up); after a failure the
  // owner skips Newton-Schulz and hands back what the slot holds, and the
  // update buffer (scratch) is not applied.
  Param& p = (*ctx_.params)[c.local];
  float* update = ctx_.update(c.local);
  auto who = [&] { return absl::StrCat("param '", p.name, "'"); };  // errors only
  const float* full = nullptr;
  int64_t rows = -1, cols = -1;
  const bool owner = c.owner == me_;
  absl::Status result;
  absl::Status st = p.custom->gather(update, p.numel(), c.owner, &full, &rows, &cols, stream);
  if (!st.ok()) {
    result = absl::Status(st.code(), absl::StrCat(who(), ": gather_fn failed: ", st.message()));
  } else if (owner && (full == nullptr || rows != c.rows || cols != c.cols)) {
    result = absl::InvalidArgumentError(absl::StrCat(
        who(), ": gather_fn returned a ", rows, " x ", cols, " matrix",
        full == nullptr ? " with no data" : "", "; the parameter is registered as ", c.rows,
        " x ", c.cols));
  }
  if (owner && result.ok() && !failed) {
    std::copy(full, full + rows * cols, slot_.begin());
    result = ctx_.device->math().Orthogonalize(ctx_.options->ns,
                                               {slot_.data(), 1, c.rows, c.cols});
    if (result.ok()) {
      stats_.orthogonalized += 1;
      stats_.ns_flops += c.flops;
    }
  }
  st = p.custom->redistribute(owner ? slot_.data() : nullptr, c.rows, c.cols, c.owner, update,
                              p.numel(), stream);
  if (!st.ok() && result.ok()) {
    result = absl::Status(st.code(), absl::StrCat(who(), ": redistribute_fn failed: ",
                                                  st.message()));
  }
  return result;
}

absl::Status CustomStepper::Run(void* stream, bool failed) {
  stats_.orthogonalized = 0;
  stats_.ns_flops = 0;
  absl::Status first;
  for (const CustomUnit& c : units_) {
    if (c.local < 0) continue;
    absl::Status st = RunOne(c, stream, failed || !first.ok());
    if (first.ok()) first = st;
  }
  return first;
}

}  // namespace muon
