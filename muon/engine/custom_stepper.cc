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

absl::Status CustomStepper::RunOne(const CustomUnit& c, void* stream) {
  Param& p = (*ctx_.params)[c.local];
  float* update = ctx_.update(c.local);
  const std::string who = absl::StrCat("param '", p.name, "'");
  const float* full = nullptr;
  int64_t rows = -1, cols = -1;
  const bool owner = c.owner == me_;
  absl::Status st = p.custom->gather(update, p.numel(), c.owner, &full, &rows, &cols, stream);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(who, ": gather_fn failed: ", st.message()));
  }
  if (owner) {
    if (full == nullptr || rows != c.rows || cols != c.cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": gather_fn returned a ", rows, " x ", cols, " matrix",
          full == nullptr ? " with no data" : "", "; the parameter is registered as ", c.rows,
          " x ", c.cols));
    }
    std::copy(full, full + rows * cols, slot_.begin());
    MUON_RETURN_IF_ERROR(
        ctx_.device->math().Orthogonalize(ctx_.options->ns, {slot_.data(), 1, c.rows, c.cols}));
    stats_.orthogonalized += 1;
    stats_.ns_flops += c.flops;
  }
  st = p.custom->redistribute(owner ? slot_.data() : nullptr, c.rows, c.cols, c.owner, update,
                              p.numel(), stream);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(who, ": redistribute_fn failed: ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status CustomStepper::Run(void* stream) {
  stats_.orthogonalized = 0;
  stats_.ns_flops = 0;
  for (const CustomUnit& c : units_) {
    if (c.local >= 0) MUON_RETURN_IF_ERROR(RunOne(c, stream));
  }
  return absl::OkStatus();
}

}  // namespace muon
