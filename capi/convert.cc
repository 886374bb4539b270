#include "capi/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/comm/codes.h"
#include "muon/comm/callback_error.h"
#include "muon/common/matrix_view.h"
#include "muon/common/status.h"
#include "muon/math/ns_config.h"
#include "muon/sharding/assignment.h"
#include "muon/sharding/layout.h"

namespace muon {
namespace capi {
namespace {

// Every core enum holds the numbers of its MUON_* constants.
#define MUON_SAME_VALUE_(c, core) static_assert(static_cast<int>(c) == static_cast<int>(core), #c)
MUON_SAME_VALUE_(MUON_ADJUST_LR_ORIGINAL, AdjustLr::kOriginal);
MUON_SAME_VALUE_(MUON_ADJUST_LR_MATCH_RMS_ADAMW, AdjustLr::kMatchRmsAdamW);
MUON_SAME_VALUE_(MUON_ADJUST_LR_NONE, AdjustLr::kNone);
MUON_SAME_VALUE_(MUON_ADJUST_LR_SPECTRAL_UNCLAMPED, AdjustLr::kSpectralUnclamped);
MUON_SAME_VALUE_(MUON_ADJUST_LR_SPECTRAL, AdjustLr::kSpectral);
MUON_SAME_VALUE_(MUON_NS_DTYPE_BF16, NsDtype::kBF16);
MUON_SAME_VALUE_(MUON_NS_DTYPE_FP32, NsDtype::kFP32);
MUON_SAME_VALUE_(MUON_NS_DTYPE_FP16, NsDtype::kFP16);
MUON_SAME_VALUE_(MUON_NS_STANDARD, NsAlgorithm::kStandard);
MUON_SAME_VALUE_(MUON_NS_GRAM, NsAlgorithm::kGram);
MUON_SAME_VALUE_(MUON_ASSIGNMENT_BALANCED, Assignment::kBalanced);
MUON_SAME_VALUE_(MUON_ASSIGNMENT_ROUND_ROBIN, Assignment::kRoundRobin);
MUON_SAME_VALUE_(MUON_ASSIGNMENT_SPREAD, Assignment::kSpread);
MUON_SAME_VALUE_(MUON_ASSIGNMENT_SPLIT, Assignment::kSplit);
MUON_SAME_VALUE_(MUON_ASSIGNMENT_CUSTOM, Assignment::kCustom);
MUON_SAME_VALUE_(MUON_MATRIX_VIEW_2D, MatrixView::k2D);
MUON_SAME_VALUE_(MUON_MATRIX_VIEW_FLATTEN_TRAILING, MatrixView::kFlattenTrailing);
MUON_SAME_VALUE_(MUON_MATRIX_VIEW_BATCHED_LEADING, MatrixView::kBatchedLeading);
MUON_SAME_VALUE_(MUON_PLACEMENT_SHARD, PlacementKind::kShard);
MUON_SAME_VALUE_(MUON_PLACEMENT_FLAT_RANGE, PlacementKind::kFlatRange);
MUON_SAME_VALUE_(MUON_PLACEMENT_REPLICATE, PlacementKind::kReplicate);
MUON_SAME_VALUE_(MUON_SPLIT_EVEN, ShardSplit::kEven);
MUON_SAME_VALUE_(MUON_SPLIT_CHUNK, ShardSplit::kChunk);
MUON_SAME_VALUE_(MUON_SPLIT_SIZES, ShardSplit::kSizes);
#undef MUON_SAME_VALUE_

// A copy of the caller's struct of `struct_size` bytes (a size
// CheckStructSize accepted: it ends on a field), filled to the size this
// library knows with defaults (for callers built against an older header).
template <typename T>
T ReadVersioned(const T* in, const T& defaults) {
  T out = defaults;
  std::memcpy(&out, in, in->struct_size < sizeof(T) ? in->struct_size : sizeof(T));
  out.struct_size = sizeof(T);
  return out;
}

absl::Status NullField(const char* name) {
  return absl::InvalidArgumentError(absl::StrCat(name, " is NULL"));
}

// The host's assign_fn (MUON_ASSIGNMENT_CUSTOM) as a core assignment.
CustomAssignFn AssignmentFromC(decltype(muon_options_t::assign_fn) fn, void* state) {
  return [fn, state](const std::vector<MatrixInfo>& infos,
                     std::vector<int>* owners) -> absl::Status {
    std::vector<muon_matrix_info_t> table(infos.size());
    std::vector<std::vector<int32_t>> holders(infos.size());
    for (size_t i = 0; i < infos.size(); ++i) {
      holders[i].assign(infos[i].holders.begin(), infos[i].holders.end());
      table[i] = muon_matrix_info_t{infos[i].param_name->c_str(), infos[i].index, infos[i].rows,
                                    infos[i].cols, infos[i].ns_flops, holders[i].data(),
                                    static_cast<int32_t>(holders[i].size()), 0};
    }
    std::vector<int32_t> out(infos.size(), -1);
    TakeCallbackError();
    const muon_status_t st = fn(state, table.size(), table.data(), out.data());
    const std::string detail = TakeCallbackError();
    if (st != MUON_OK) {
      return absl::Status(FromCStatus(st), absl::StrCat("assign_fn returned ",
                                                        CStatusName(st),
                                                        detail.empty() ? "" : ": ", detail));
    }
    owners->assign(out.begin(), out.end());
    return absl::OkStatus();
  };
}

// A built-in schedule's rows, refusing an iteration count it is not made for.
absl::Status UseSchedule(NsSchedule schedule, const char* name, int32_t steps, NsConfig* ns) {
  const int want = ScheduleSteps(schedule);
  if (want != 0 && steps != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->ns_steps is ", steps, "; MUON_NS_COEFFICIENTS_", name, " is a ", want,
        "-iteration schedule: set ns_steps = ", want));
  }
  ns->coefficients = ScheduleCoefficients(schedule);
  return absl::OkStatus();
}

absl::Status CoefficientsFromC(const muon_options_t& c, NsConfig* ns) {
  switch (c.ns_coefficients) {
    case MUON_NS_COEFFICIENTS_FIXED: {
      const std::pair<const char*, double> fields[] = {
          {"ns_a", c.ns_a}, {"ns_b", c.ns_b}, {"ns_c", c.ns_c}};
      for (const auto& [name, v] : fields) {
        if (!std::isfinite(v)) {
          return absl::InvalidArgumentError(
              absl::StrCat("options->", name, ": ", v, " is non-finite"));
        }
      }
      ns->coefficients = {{c.ns_a, c.ns_b, c.ns_c}};
      return absl::OkStatus();
    }
    case MUON_NS_COEFFICIENTS_TABLE:
      if (c.ns_table == nullptr) return NullField("options->ns_table (ns_coefficients = TABLE)");
      if (c.ns_table_rows < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "options->ns_table_rows is ", c.ns_table_rows, "; a TABLE needs at least one row"));
      }
      ns->coefficients.clear();
      for (int32_t i = 0; i < c.ns_table_rows; ++i) {
        for (int k = 0; k < 3; ++k) {
          const double v = c.ns_table[3 * i + k];
          if (!std::isfinite(v)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "options->ns_table row ", i, " (ns_table[", 3 * i + k, "]): ", v,
                " is non-finite"));
          }
        }
        ns->coefficients.push_back(
            {c.ns_table[3 * i], c.ns_table[3 * i + 1], c.ns_table[3 * i + 2]});
      }
      return absl::OkStatus();
    case MUON_NS_COEFFICIENTS_POLAR_EXPRESS:
      ns->coefficients = PolarExpressCoefficients();
      return absl::OkStatus();
    case MUON_NS_COEFFICIENTS_CANS:
      return UseSchedule(NsSchedule::kCans, "CANS", c.ns_steps, ns);
    case MUON_NS_COEFFICIENTS_DEEPSEEK_V4:
      return UseSchedule(NsSchedule::kDeepSeekV4, "DEEPSEEK_V4", c.ns_steps, ns);
    case MUON_NS_COEFFICIENTS_CUBIC5:
      return UseSchedule(NsSchedule::kCubic5, "CUBIC5", c.ns_steps, ns);
    case MUON_NS_COEFFICIENTS_AOL:
      ns->aol = true;
      return UseSchedule(NsSchedule::kAol, "AOL", c.ns_steps, ns);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "options->ns_coefficients: unknown value ", c.ns_coefficients,
          "; use MUON_NS_COEFFICIENTS_FIXED (0), TABLE (1), POLAR_EXPRESS (2), CANS (3), "
          "DEEPSEEK_V4 (4), CUBIC5 (5) or AOL (6)"));
  }
}

absl::StatusOr<Placement> PlacementFromC(
    const muon_placement_t& c, int i, const std::string& who,
    const std::function<absl::StatusOr<int>(int group)>& group_size) {
  Placement p;
  if (c.kind < 0 || c.kind > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": placement ", i, " has unknown kind ", c.kind));
  }
  if (c.kind == MUON_PLACEMENT_SHARD && (c.split < 0 || c.split > 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": placement ", i, " has unknown split ", c.split));
  }
  p.kind = static_cast<PlacementKind>(c.kind);
  p.group = c.group;
  p.dim = c.dim;
  p.split = static_cast<ShardSplit>(c.split);
  p.start = c.start;
  p.length = c.length;
  if (p.kind == PlacementKind::kShard && p.split == ShardSplit::kSizes) {
    if (c.sizes == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": placement ", i, " uses SPLIT_SIZES but sizes is NULL"));
    }
    absl::StatusOr<int> n = group_size(c.group);
    if (!n.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": placement ", i, ": ", n.status().message()));
    }
    p.sizes.assign(c.sizes, c.sizes + *n);
  }
  return p;
}

}  // namespace

void DefaultOptions(muon_options_t* o) {
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  const Options d;
  o->lr = d.lr;
  o->weight_decay = d.weight_decay;
  o->momentum = d.momentum;
  o->nesterov = d.nesterov ? 1 : 0;
  o->ns_steps = d.ns.steps;
  o->ns_a = d.ns.coefficients[0][0];
  o->ns_b = d.ns.coefficients[0][1];
  o->ns_c = d.ns.coefficients[0][2];
  o->eps = d.ns.eps;
  o->ns_coefficients = MUON_NS_COEFFICIENTS_FIXED;
  o->ns_table_rows = 0;
  o->ns_table = nullptr;
  o->adjust_lr = static_cast<int32_t>(d.adjust_lr);
  o->ns_dtype = static_cast<int32_t>(d.ns.dtype);
  o->momentum_fp32 = d.momentum_fp32 ? 1 : 0;
  o->assignment = static_cast<int32_t>(d.dist.assignment);
  o->prefetch_count = d.dist.prefetch_count;
  o->async_parallelism = d.dist.async_parallelism ? 1 : 0;
  o->round_bytes = static_cast<size_t>(d.dist.round_bytes);
  o->update_scale = d.update_scale;
  o->normuon_beta2 = d.normuon_beta2;
  o->normuon_eps = d.normuon_eps;
  o->ns_gram_restarts = d.ns.gram_restarts;
}

void DefaultParamOptions(muon_param_options_t* o) {
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->matrix_view = MUON_MATRIX_VIEW_2D;
  o->lr_scale = 1.0;
  o->weight_decay_scale = 1.0;
}

absl::StatusOr<Options> OptionsFromC(const muon_options_t& caller) {
  absl::Status size_ok =
      CheckStructSize(kOptionsStruct, "options", caller.struct_size);
  if (!size_ok.ok()) return size_ok;
  muon_options_t defaults;
  DefaultOptions(&defaults);
  const muon_options_t c = ReadVersioned(&caller, defaults);
  Options o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  o.momentum = c.momentum;
  o.nesterov = c.nesterov != 0;
  o.ns.steps = c.ns_steps;
  o.ns.eps = c.eps;
  absl::Status coefficients = CoefficientsFromC(c, &o.ns);
  if (!coefficients.ok()) return coefficients;
  if (c.ns_dtype != MUON_NS_DTYPE_BF16 && c.ns_dtype != MUON_NS_DTYPE_FP32 &&
      c.ns_dtype != MUON_NS_DTYPE_FP16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->ns_dtype: unknown value ", c.ns_dtype,
        "; use MUON_NS_DTYPE_BF16 (0), MUON_NS_DTYPE_FP32 (1) or MUON_NS_DTYPE_FP16 (2)"));
  }
  o.ns.dtype = static_cast<NsDtype>(c.ns_dtype);
  if (c.ns_algorithm != MUON_NS_STANDARD && c.ns_algorithm != MUON_NS_GRAM) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->ns_algorithm: unknown value ", c.ns_algorithm,
                     "; use MUON_NS_STANDARD (0) or MUON_NS_GRAM (1)"));
  }
  o.ns.algorithm = static_cast<NsAlgorithm>(c.ns_algorithm);
  o.ns.gram_restarts = c.ns_gram_restarts;
  o.skip_nonfinite_updates = c.skip_nonfinite_updates != 0;
  if (c.adjust_lr < 0 || c.adjust_lr > 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->adjust_lr: unknown value ", c.adjust_lr,
        "; use MUON_ADJUST_LR_ORIGINAL (0), MATCH_RMS_ADAMW (1), NONE (2), "
        "SPECTRAL_UNCLAMPED (3) or SPECTRAL (4)"));
  }
  o.adjust_lr = static_cast<AdjustLr>(c.adjust_lr);
  o.momentum_fp32 = c.momentum_fp32 != 0;
  o.skip_nonfinite = c.skip_nonfinite != 0;
  if ((c.allocate == nullptr) != (c.release == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->", c.allocate == nullptr ? "allocate" : "release",
        " is NULL but options->", c.allocate == nullptr ? "release" : "allocate",
        " is not; set both (the host's allocator) or neither (the library's own)"));
  }
  o.allocator.allocate = c.allocate;
  o.allocator.release = c.release;
  o.allocator.ctx = c.allocator_ctx;
  o.update_in_grad = c.update_in_grad != 0;
  o.update_scale = c.update_scale;
  o.cautious_wd = c.cautious_wd != 0;
  o.normuon = c.normuon != 0;
  o.normuon_beta2 = c.normuon_beta2;
  o.normuon_eps = c.normuon_eps;
  if (c.reserved0 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->reserved0 is ", c.reserved0, "; it must be 0"));
  }
  if (c.reserved1 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->reserved1 is ", c.reserved1, "; it must be 0"));
  }
  if (c.reserved2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->reserved2 is ", c.reserved2, "; it must be 0"));
  }
  if (c.reserved3 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->reserved3 is ", c.reserved3, "; it must be 0"));
  }
  if (c.round_bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->round_bytes: ", c.round_bytes, " is too large (at most ",
                     std::numeric_limits<int64_t>::max(), ")"));
  }
  o.dist.prefetch_count = c.prefetch_count;
  o.dist.async_parallelism = c.async_parallelism != 0;
  o.dist.round_bytes =
      c.round_bytes == 0 ? (int64_t{256} << 20) : static_cast<int64_t>(c.round_bytes);
  o.dist.assignment = static_cast<Assignment>(c.assignment);
  if (c.assignment == MUON_ASSIGNMENT_CUSTOM && c.assign_fn != nullptr) {
    o.dist.custom_assign = AssignmentFromC(c.assign_fn, c.assign_state);
  }
  absl::Status valid = ValidateOptions(o);
  if (!valid.ok()) return absl::Status(valid.code(), absl::StrCat("options->", valid.message()));
  return o;
}

void OptionsToC(const Options& o, muon_options_t* out) {
  muon_options_t c;
  DefaultOptions(&c);
  c.lr = o.lr;
  c.weight_decay = o.weight_decay;
  c.momentum = o.momentum;
  c.nesterov = o.nesterov ? 1 : 0;
  c.ns_steps = o.ns.steps;
  c.eps = o.ns.eps;
  c.ns_a = o.ns.coefficients[0][0];
  c.ns_b = o.ns.coefficients[0][1];
  c.ns_c = o.ns.coefficients[0][2];
  c.ns_coefficients =
      o.ns.coefficients.size() == 1 ? MUON_NS_COEFFICIENTS_FIXED : MUON_NS_COEFFICIENTS_TABLE;
  c.ns_table_rows = static_cast<int32_t>(o.ns.coefficients.size());
  c.adjust_lr = static_cast<int32_t>(o.adjust_lr);
  c.ns_dtype = static_cast<int32_t>(o.ns.dtype);
  c.momentum_fp32 = o.momentum_fp32 ? 1 : 0;
  c.assignment = static_cast<int32_t>(o.dist.assignment);
  c.prefetch_count = o.dist.prefetch_count;
  c.async_parallelism = o.dist.async_parallelism ? 1 : 0;
  c.round_bytes = static_cast<size_t>(o.dist.round_bytes);
  c.skip_nonfinite = o.skip_nonfinite ? 1 : 0;
  c.allocate = o.allocator.allocate;
  c.release = o.allocator.release;
  c.allocator_ctx = o.allocator.ctx;
  c.update_in_grad = o.update_in_grad ? 1 : 0;
  c.update_scale = o.update_scale;
  c.cautious_wd = o.cautious_wd ? 1 : 0;
  c.normuon = o.normuon ? 1 : 0;
  c.normuon_beta2 = o.normuon_beta2;
  c.normuon_eps = o.normuon_eps;
  c.ns_algorithm = static_cast<int32_t>(o.ns.algorithm);
  c.ns_gram_restarts = o.ns.gram_restarts;
  c.skip_nonfinite_updates = o.skip_nonfinite_updates ? 1 : 0;
  const size_t caller_size = out->struct_size;
  std::memcpy(out, &c, caller_size < sizeof c ? caller_size : sizeof c);
  out->struct_size = caller_size;
}

namespace {

// The per-parameter multipliers and split blocks both registrations take
// (the split's fit to the matrices is checked at registration).
absl::Status ReadParamExtras(const muon_param_options_t& po, double* lr_scale,
                             double* weight_decay_scale, BlockSplit* split) {
  for (const auto& [v, field] : {std::pair<double, const char*>{po.lr_scale, "lr_scale"},
                                 {po.weight_decay_scale, "weight_decay_scale"}}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options->", field, ": ", v, " is invalid; it must be a finite number >= 0"));
    }
  }
  *lr_scale = po.lr_scale;
  *weight_decay_scale = po.weight_decay_scale;
  if (po.num_split_sizes < 0 || po.num_split_sizes > kMaxSplitSizes ||
      (po.num_split_sizes > 0 && po.split_sizes == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->num_split_sizes: ", po.num_split_sizes, " is invalid; give 0 (no split) or 1 "
        "to ", kMaxSplitSizes, " sizes at options->split_sizes"));
  }
  if (po.num_split_sizes == 0 && po.split_dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->split_dim: ", po.split_dim, " is set but no split_sizes are given"));
  }
  split->dim = po.split_dim;
  split->sizes.assign(po.split_sizes, po.split_sizes + po.num_split_sizes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParamRegistration> ParamOptionsFromC(
    const muon_param_options_t* options,
    const std::function<absl::StatusOr<int>(int group)>& group_size) {
  muon_param_options_t po;
  DefaultParamOptions(&po);
  if (options != nullptr) {
    absl::Status size_ok =
        CheckStructSize(kParamOptionsStruct, "options", options->struct_size);
    if (!size_ok.ok()) return size_ok;
    po = ReadVersioned(options, po);
    if (po.reserved0 != 0) return absl::InvalidArgumentError("options->reserved0 must be 0");
  }
  ParamRegistration r;
  r.name = po.name ? po.name : "";
  r.view = po.matrix_view;
  if (po.reserved1 != 0) return absl::InvalidArgumentError("options->reserved1 must be 0");
  MUON_RETURN_IF_ERROR(
      ReadParamExtras(po, &r.lr_scale, &r.weight_decay_scale, &r.split));
  if (po.replicated_mode != MUON_REPLICATED_HOST_AVERAGED &&
      po.replicated_mode != MUON_REPLICATED_ZERO2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->replicated_mode: unknown value ", po.replicated_mode,
        "; use MUON_REPLICATED_HOST_AVERAGED (0) or MUON_REPLICATED_ZERO2 (1)"));
  }
  r.dist.zero2 = po.replicated_mode == MUON_REPLICATED_ZERO2;
  r.has_layout = po.global_ndim > 0 || po.num_placements > 0;
  const std::string who = absl::StrCat("param '", r.name, "'");
  if (r.dist.zero2 && !r.has_layout) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": MUON_REPLICATED_ZERO2 needs global_shape and a REPLICATE placement over the "
        "data-parallel group"));
  }
  if (!r.has_layout) return r;
  if (po.global_ndim <= 0 || po.global_ndim > 16 || po.global_shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": options->global_ndim (", po.global_ndim, ") and global_shape must describe "
        "the global tensor when placements are given"));
  }
  if (po.num_placements < 0 || po.num_placements > 64 ||
      (po.num_placements > 0 && po.placements == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": options->num_placements (", po.num_placements, ") and placements disagree"));
  }
  r.dist.global_shape.assign(po.global_shape, po.global_shape + po.global_ndim);
  for (int32_t i = 0; i < po.num_placements; ++i) {
    absl::StatusOr<Placement> p = PlacementFromC(po.placements[i], i, who, group_size);
    if (!p.ok()) return p.status();
    r.dist.placements.push_back(*std::move(p));
  }
  return r;
}

absl::StatusOr<CustomRegistration> CustomFromC(const muon_param_options_t& options,
                                               const muon_custom_layout_t& layout) {
  absl::Status size_ok =
      CheckStructSize(kParamOptionsStruct, "options", options.struct_size);
  if (!size_ok.ok()) return size_ok;
  size_ok = CheckStructSize(kCustomLayoutStruct, "layout", layout.struct_size);
  if (!size_ok.ok()) return size_ok;
  muon_param_options_t defaults;
  DefaultParamOptions(&defaults);
  const muon_param_options_t po = ReadVersioned(&options, defaults);
  CustomRegistration r;
  r.name = po.name ? po.name : "";
  if (po.global_ndim != 0 || po.num_placements != 0 || po.replicated_mode != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", r.name, "': a custom-path parameter takes no global_shape, placements or "
        "replicated_mode"));
  }
  MUON_RETURN_IF_ERROR(
      ReadParamExtras(po, &r.lr_scale, &r.weight_decay_scale, &r.split));
  const muon_custom_layout_t c = layout;
  r.rows = c.global_rows;
  r.cols = c.global_cols;
  r.path = std::make_shared<CustomPath>();
  // A callback's status with its detail (muon_set_callback_error) as the message.
  auto returned = [](muon_status_t st) {
    const std::string detail = TakeCallbackError();
    return StatusFromC(st, detail.empty() ? CStatusName(st) : detail);
  };
  if (c.assign_fn) {
    const std::string name = r.name;
    r.path->assign = [c, name](int world, std::string* detail) {
      TakeCallbackError();
      const int owner = c.assign_fn(c.state, name.c_str(), world);
      *detail = TakeCallbackError();
      return owner;
    };
  }
  if (c.gather_fn) {
    r.path->gather = [c, returned](const float* local, int64_t n, int owner, const float** full,
                                   int64_t* rows, int64_t* cols, void* stream) -> absl::Status {
      muon_gathered_t out{nullptr, -1, -1};
      TakeCallbackError();
      absl::Status st = returned(c.gather_fn(c.state, local, n, owner, &out, stream));
      if (!st.ok()) return st;
      *full = out.data;
      *rows = out.rows;
      *cols = out.cols;
      return absl::OkStatus();
    };
  }
  if (c.redistribute_fn) {
    r.path->redistribute = [c, returned](const float* full, int64_t rows, int64_t cols, int owner,
                                         float* local, int64_t n, void* stream) {
      TakeCallbackError();
      return returned(c.redistribute_fn(c.state, full, rows, cols, owner, local, n, stream));
    };
  }
  return r;
}

void DefaultQkClipLayer(muon_qk_clip_layer_t* layer) {
  std::memset(layer, 0, sizeof *layer);
  layer->struct_size = sizeof *layer;
  layer->q_param = layer->k_param = -1;
  layer->alpha = 0.5;
}

absl::StatusOr<QkClipLayer> QkClipLayerFromC(const muon_qk_clip_layer_t& caller) {
  absl::Status size_ok = CheckStructSize(kQkClipLayerStruct, "layer", caller.struct_size);
  if (!size_ok.ok()) return size_ok;
  muon_qk_clip_layer_t defaults;
  DefaultQkClipLayer(&defaults);
  const muon_qk_clip_layer_t c = ReadVersioned(&caller, defaults);
  for (const auto& [v, name] : {std::pair<int64_t, const char*>{c.q_param, "q_param"},
                                {c.k_param, "k_param"}}) {
    if (v < 0 || v > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer->", name, ": ", v, " is not a registered parameter's id"));
    }
  }
  if (c.num_heads <= 0 || c.num_kv_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer->num_heads: ", c.num_heads, " (num_kv_heads ", c.num_kv_heads,
        "); num_heads must be >= 1 and num_kv_heads >= 0 (0: num_heads)"));
  }
  const int64_t rows[] = {c.q_first_row, c.q_head_stride, c.q_head_rows, c.q_rotary_rows,
                          c.k_first_row, c.k_head_stride, c.k_head_rows};
  const char* names[] = {"q_first_row", "q_head_stride", "q_head_rows", "q_rotary_rows",
                         "k_first_row", "k_head_stride", "k_head_rows"};
  for (size_t i = 0; i < 7; ++i) {
    // (Bounded so that first_row + heads * stride cannot overflow.)
    if (rows[i] < 0 || rows[i] > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat("layer->", names[i], ": ", rows[i],
                                                     " is out of range (0 to 2^40)"));
    }
  }
  QkClipLayer l;
  l.q = {static_cast<int>(c.q_param), c.q_first_row, c.q_head_stride, c.q_head_rows,
         c.q_rotary_rows};
  l.k = {static_cast<int>(c.k_param), c.k_first_row, c.k_head_stride, c.k_head_rows, 0};
  l.num_heads = c.num_heads;
  l.num_kv_heads = c.num_kv_heads;
  l.alpha = c.alpha;
  return l;
}

void StatsToC(const StepStats& s, muon_stats_t* out) {
  const size_t caller_size = out->struct_size;
  const muon_stats_t full{caller_size,        s.steps,   s.traffic.bytes_sent,
                          s.traffic.bytes_received, s.traffic.collectives, s.rounds,
                          s.matrices_orthogonalized, s.ns_flops, s.matrices_total,
                          s.matrices_owned, s.nonfinite_grads, s.steps_skipped,
                          s.memory_bytes, s.momentum_bytes, s.param_elements,
                          s.bytes_per_param};
  // An older caller's struct is shorter: it gets the fields it has.
  std::memcpy(out, &full, std::min(caller_size, sizeof full));
}

}  // namespace capi
}  // namespace muon
