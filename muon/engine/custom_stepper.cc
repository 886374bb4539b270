#include "muon/engine/custom_stepper.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {

absl::StatusOr<std::unique_ptr<CustomStepper>> CustomStepper::Create(std::vector<CustomUnit> units,
                                                                     int world_rank,
                                                                     const StepContext& ctx) {
  std::unique_ptr<CustomStepper> s(new CustomStepper(std::move(units), world_rank, ctx));
  const CustomUnit* largest = nullptr;
  s->stats_.matrices_total = static_cast<int64_t>(s->units_.size());
  for (const CustomUnit& c : s->units_) {
    if (c.owner != world_rank) continue;
    // (Registration refused a matrix whose working memory has no 64-bit
    // byte count; a plan is checked again.)
    if (c.rows < 0 || c.cols < 0 || (c.cols > 0 && c.rows > kMaxCustomElements / c.cols)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", c.name, "': a ", c.rows, " x ", c.cols,
          " custom-path matrix is larger than the owner can hold (", kMaxCustomElements,
          " elements at most)"));
    }
    if (largest == nullptr || c.rows * c.cols > largest->rows * largest->cols) largest = &c;
    ++s->stats_.matrices_owned;
  }
  if (largest != nullptr) {
    MUON_ASSIGN_OR_RETURN(
        s->slot_,
        DeviceBuffer::Make(ctx.device,
                           static_cast<size_t>(largest->rows * largest->cols) * sizeof(float),
                           absl::StrCat("the working copy of custom-path param '", largest->name,
                                        "' (", largest->rows, " x ", largest->cols, " fp32)")));
  }
  s->moment_ids_.assign(s->units_.size(), -1);
  for (size_t i = 0; i < s->units_.size() && ctx.moments != nullptr; ++i) {
    const CustomUnit& c = s->units_[i];
    if (c.owner == world_rank && c.local >= 0) {
      s->moment_ids_[i] = ctx.moments->Add(c.name, 0, SplitMomentCount(c.split, c.rows, c.cols));
    }
  }
  s->factors_.resize(s->units_.size());
  for (size_t i = 0; i < s->units_.size(); ++i) {
    const CustomUnit& c = s->units_[i];
    if (c.owner != world_rank) continue;
    absl::Status reserved;
    if (c.split.none()) {
      reserved = ctx.device->math().Reserve(ctx.options->ns, 1, c.rows, c.cols);
    } else if (!ctx.device->is_host()) {
      reserved = absl::UnimplementedError(
          "split_sizes (blocks orthogonalized apart) runs on the CPU backend only so far");
    } else {
      s->factors_[i] = BlockLrRatios(ctx.options->adjust_lr, c.split, c.rows, c.cols);
      reserved = s->split_blocks_.Reserve(ctx.device->math(), MemorySourceOf(ctx.device.get()),
                                          ctx.options->ns, c.split, 1, c.rows, c.cols,
                                          DType::kF32);
    }
    if (!reserved.ok()) {
      return absl::Status(reserved.code(),
                          absl::StrCat("param '", c.name, "': ", reserved.message()));
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
  float* slot = slot_.as<float>();
  if (owner && result.ok() && !failed) {
    std::copy(full, full + rows * cols, slot);
    const size_t at = static_cast<size_t>(&c - units_.data());
    const int moments = moment_ids_[at];
    const Options& o = *ctx_.options;
    const NorMuonStep normuon{o.normuon_beta2, o.normuon_eps, o.ns.dtype};
    float* v = moments >= 0 ? ctx_.moments->data(moments) : nullptr;
    if (!c.split.none()) {
      result = split_blocks_.Run(ctx_.device->math(), o.ns, c.split, factors_[at],
                                 moments >= 0 ? &normuon : nullptr, &v,
                                 {slot, 1, c.rows, c.cols, DType::kF32});
    } else {
      result = ctx_.device->math().Orthogonalize(o.ns, {slot, 1, c.rows, c.cols});
      if (result.ok() && moments >= 0) {  // NorMuon
        result = ctx_.device->math().NorMuon(normuon, {slot, 1, c.rows, c.cols}, &v);
      }
    }
    if (result.ok() && ctx_.options->skip_nonfinite_updates) {
      result = ctx_.device->math().CountNonFinite(DType::kF32, slot, c.rows * c.cols,
                                                  &stats_.nonfinite_updates);
    }
    if (result.ok()) {
      stats_.orthogonalized += 1;
      stats_.ns_flops += c.flops;
    }
  }
  st = p.custom->redistribute(owner ? slot : nullptr, c.rows, c.cols, c.owner, update,
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
  stats_.nonfinite_updates = 0;
  absl::Status first;
  for (const CustomUnit& c : units_) {
    if (c.local < 0) continue;
    absl::Status st = RunOne(c, stream, failed || !first.ok());
    if (first.ok()) first = st;
  }
  return first;
}

}  // namespace muon
