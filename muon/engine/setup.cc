#include "muon/engine/setup.h"

#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/engine/outcome.h"
#include "muon/sharding/handshake.h"

namespace muon {
namespace {

// Settings every rank must share, compared in the handshake.
std::string Fingerprint(const Options& o) {
  std::string f = absl::StrCat("assignment=", static_cast<int>(o.dist.assignment),
                               " prefetch=", o.dist.prefetch_count,
                               " async=", o.dist.async_parallelism,
                               " round_bytes=", o.dist.round_bytes, " ns_steps=", o.ns.steps,
                               " ns_dtype=", static_cast<int>(o.ns.dtype), " eps=", o.ns.eps,
                               " momentum_fp32=", o.momentum_fp32,
                               " skip_nonfinite=", o.skip_nonfinite,
                               " update_scale=", o.update_scale,
                               " cautious_wd=", o.cautious_wd, " normuon=", o.normuon,
                               " normuon_beta2=", o.normuon_beta2,
                               " normuon_eps=", o.normuon_eps,
                               " ns_algorithm=", static_cast<int>(o.ns.algorithm),
                               " gram_restarts=", o.ns.gram_restarts,
                               " skip_nonfinite_updates=", o.skip_nonfinite_updates,
                               " coefficients=");
  for (const auto& c : o.ns.coefficients) absl::StrAppend(&f, c[0], ",", c[1], ",", c[2], ";");
  return f;
}

PlanOptions PlanOptionsOf(const Options& o) {
  PlanOptions po;
  po.assignment = o.dist.assignment;
  po.custom = o.dist.custom_assign;
  po.async_parallelism = o.dist.async_parallelism;
  po.round_bytes = o.dist.round_bytes;
  po.ns = o.ns;
  return po;
}

// What this rank registered, as the handshake sends it. A custom-path owner
// that is no world rank is this rank's error (*local_error), reported after
// the handshake so that no rank is left waiting.
RankDesc Describe(const Registry& registry, std::vector<std::vector<int>> members,
                  absl::Status* local_error) {
  const Comm& world = registry.world();
  RankDesc me;
  me.world_rank = world.rank();
  me.groups = std::move(members);
  for (const Param& p : registry.params()) {
    RankParamDesc d;
    d.name = p.name;
    d.param_dtype = static_cast<uint8_t>(p.value.dtype);
    d.state_dtype = static_cast<uint8_t>(p.state_dtype);
    d.view = static_cast<uint8_t>(p.view);
    d.global_shape = p.global_shape;
    d.layout = p.layout;
    d.zero2 = p.zero2_group >= 0 ? 1 : 0;
    d.lr_scale = p.lr_scale;
    d.weight_decay_scale = p.weight_decay_scale;
    d.split = p.split;
    if (p.custom) {
      std::string detail;
      const int owner = p.custom->assign(world.size(), &detail);
      if (owner < 0 || owner >= world.size()) {
        if (local_error->ok()) {
          *local_error = absl::InvalidArgumentError(absl::StrCat(
              "param '", p.name, "': assign_fn returned ", owner,
              "; it must be a world rank in [0, ", world.size(), ")",
              detail.empty() ? "" : ": ", detail));
        }
        d.custom_owner = 0;
      } else {
        d.custom_owner = owner;
      }
    }
    me.params.push_back(std::move(d));
  }
  return me;
}

}  // namespace

bool StepSetup::empty() const {
  // Each stepper's total is the plan's, the same on every rank: a rank that
  // holds no matrix of a non-empty job (ZeRO-2 groups it is not in, say)
  // still takes part in the step's world collectives.
  for (const Stepper* s : steppers()) {
    if (s->stats().matrices_total != 0) return false;
  }
  return true;
}

namespace {

// Moments the host set before the first step reach only the ranks that
// hold each parameter. A rank that orthogonalizes a matrix of a parameter it
// does not hold (SPREAD and SPLIT give matrices to such ranks) would start
// that matrix's moments at zero, a silent change of the resumed run:
// refused, naming the fix (a failure of the setup: every rank fails alike).
absl::Status CheckHostSetMoments(const Registry& registry, const MomentStash& stash,
                                 const OwnerMoments& moments, int rank) {
  if (!stash.set_by_host || stash.present) return absl::OkStatus();
  std::set<std::string> held;
  for (const Param& p : registry.params()) held.insert(p.name);
  for (const OwnerMoments::Entry& e : moments.entries()) {
    if (held.count(e.name) != 0 || stash.values.count({e.name, e.index}) != 0) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", e.name, "': rank ", rank, " orthogonalizes its matrix ", e.index,
        " without holding the parameter (SPREAD, SPLIT): resume NorMuon through the state "
        "blobs (muon_load_states) or with MUON_ASSIGNMENT_BALANCED; the moments the host "
        "set (muon_set_owned_moments) cannot reach this rank"));
  }
  return absl::OkStatus();
}

// Everything the steps need, allocated once (local: may fail on one rank).
absl::Status Build(Registry& registry, const Options& options,
                   const std::vector<std::vector<int>>& members, Plan& plan, Comm& world,
                   const MomentStash& stash, StepSetup* s) {
  std::vector<Param>& params = registry.params();
  for (const Param& p : params) {
    if (registry.UpdateInGrad(p)) {  // in the gradient's own memory (update_in_grad)
      s->updates.push_back({p.grad.data, p.grad.dtype});
      continue;
    }
    // With Newton-Schulz in bf16 an exchange-stepped parameter's buffer is
    // bf16: it holds the momentum output, which the owner rounds to bf16
    // before anything else (as torch's .bfloat16() does; rounding here is
    // the same rounding), then the bf16 orthogonalized update: both exactly,
    // in half the bytes. Custom-path and ZeRO-2 parameters keep fp32.
    const DType dtype = Registry::Exchanged(p) && options.ns.dtype == NsDtype::kBF16
                            ? DType::kBF16
                            : DType::kF32;
    MUON_ASSIGN_OR_RETURN(
        DeviceBuffer b,
        DeviceBuffer::Make(registry.device(), static_cast<size_t>(p.numel()) * SizeOf(dtype),
                           absl::StrCat("the update buffer of param '", p.name, "'")));
    s->updates.push_back({b.data(), dtype});
    s->update_buffers.push_back(std::move(b));
  }
  MUON_ASSIGN_OR_RETURN(s->scalar_buffer,
                        DeviceBuffer::Make(registry.device(), sizeof(StepScalars),
                                           "the step's hyper-parameters"));
  s->momentum_args.reserve(params.size());
  s->apply_args.reserve(params.size());
  s->nonfinite_counts.assign(static_cast<size_t>(world.size()), 0);
  StepContext ctx;
  ctx.device = registry.device();
  ctx.scalars = s->scalars();
  ctx.options = &options;
  ctx.params = &params;
  ctx.updates = &s->updates;
  if (options.skip_nonfinite_updates && plan.zero2_matrices > 0) {
    return absl::UnimplementedError(
        "skip_nonfinite_updates: MUON_REPLICATED_ZERO2 parameters are applied by their owners "
        "inside the step, before the ranks could agree to skip it; turn it off");
  }
  if (options.skip_nonfinite_updates && !registry.device()->is_host()) {
    const std::shared_ptr<Device>& d = registry.device();
    MUON_ASSIGN_OR_RETURN(
        s->nonfinite_updates,
        DeviceBuffer::Make(d, sizeof(int64_t), "the non-finite update count"));
    ctx.nonfinite_updates = s->nonfinite_updates.as<int64_t>();
    if (world.size() > 1) {
      MUON_ASSIGN_OR_RETURN(s->update_count_send,
                            DeviceBuffer::Make(d, sizeof(int64_t), "the non-finite update count"));
      MUON_ASSIGN_OR_RETURN(
          s->update_counts,
          DeviceBuffer::Make(d, sizeof(int64_t) * static_cast<size_t>(world.size()),
                             "every rank's non-finite update count"));
    }
  }
  if (options.normuon) {
    s->moments = std::make_unique<OwnerMoments>();
    ctx.moments = s->moments.get();
  }
  // The exchange's last scatter ends the step unless the job has custom-path
  // or ZeRO-2 matrices (the plan is the job's: the same answer on every rank).
  const bool exchange_ends_step = plan.custom.empty() && plan.zero2_matrices == 0;
  MUON_ASSIGN_OR_RETURN(s->exchange,
                        ExchangeStepper::Create(plan, ctx, world, exchange_ends_step));
  MUON_ASSIGN_OR_RETURN(s->custom, CustomStepper::Create(std::move(plan.custom), world.rank(), ctx));
  MUON_ASSIGN_OR_RETURN(s->zero2, Zero2Stepper::Create(registry.groups(), members,
                                                       plan.zero2_matrices, ctx));
  if (s->moments != nullptr) {
    MUON_RETURN_IF_ERROR(CheckHostSetMoments(registry, stash, *s->moments, world.rank()));
    MUON_RETURN_IF_ERROR(s->moments->Allocate(registry.device(), stash));
  }
  if (!registry.device()->is_host()) {
    s->nonfinite_args.reserve(registry.params().size());
    MUON_ASSIGN_OR_RETURN(s->nonfinite, DeviceBuffer::Make(registry.device(), sizeof(int64_t),
                                                           "the non-finite gradient count"));
  }
  if (!registry.device()->is_host() && world.size() > 1) {
    const std::shared_ptr<Device>& d = registry.device();
    const size_t all = kVerdictBytes * static_cast<size_t>(world.size());
    MUON_ASSIGN_OR_RETURN(s->verdict_send, DeviceBuffer::Make(d, kVerdictBytes, "the step verdict"));
    MUON_ASSIGN_OR_RETURN(s->verdicts, DeviceBuffer::Make(d, all, "the step verdicts"));
    MUON_ASSIGN_OR_RETURN(s->gate, DeviceBuffer::Make(d, sizeof(int32_t), "the step's go-ahead"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SetUpSteps(Registry& registry, const Options& options, const MomentStash& stash,
                        void* stream, std::unique_ptr<StepSetup>* setup) {
  setup->reset();
  Comm& world = registry.world();
  Device* device = registry.device().get();
  // This rank's first failure; it goes on taking part in every collective.
  LocalOutcome local;
  std::vector<std::vector<int>> members;
  local.Note(GatherGroupMembers(world, registry.groups(), device, stream, &members));
  absl::Status described;
  const RankDesc me = Describe(registry, members, &described);
  local.Note(described);
  bool own = true;
  absl::StatusOr<Plan> plan = AgreePlan(world, me, Fingerprint(options), PlanOptionsOf(options),
                                        local.status(), device, stream, &own);
  // A failure every rank read alike from the plan check (a rank that could
  // not build the plan, which reports its cause below; plans that differ).
  absl::Status job_error;
  if (!plan.ok() && own) local.Note(plan.status());
  if (!plan.ok() && !own) job_error = plan.status();

  auto s = std::make_unique<StepSetup>();
  if (plan.ok()) local.Note(Build(registry, options, members, *plan, world, stash, s.get()));
  // What each rank allocated is its own: the ranks agree on it (and on the
  // hyper-parameters) before any step, so that none steps alone.
  bool job_failed = false;
  const absl::Status agreed = AgreeOutcome(world, device, local, options, stream,
                                           "the first step's setup", nullptr, nullptr,
                                           &job_failed);
  if (agreed.ok() && job_error.ok()) {
    *setup = std::move(s);
    return absl::OkStatus();
  }
  if (agreed.ok()) return job_error;
  // Set up here, and nothing this rank received says the job failed: the
  // failure is this rank's last collective, and the others may have gone on.
  if (local.ok() && plan.ok() && job_error.ok() && !job_failed) *setup = std::move(s);
  return agreed;
}

}  // namespace muon
