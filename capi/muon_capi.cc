// The extern "C" entry points: each converts C structs to the C++ core's
// types, runs it behind an exception firewall, and turns absl::Status into
// muon_status_t plus the thread-local error message.
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capi/capi_internal.h"
#include "capi/muon.h"
#include "muon/dist/comm.h"
#include "muon/engine/optimizer.h"

struct muon_optimizer {
  std::unique_ptr<muon::Optimizer> impl;
};

namespace {

using muon::capi::Guard;
using muon::capi::LastError;
using muon::capi::NullArg;

absl::Status CheckStructSize(const char* name, size_t given, size_t minimum) {
  if (given < minimum) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "->struct_size is ", given, ", smaller than the smallest known version (", minimum,
        " bytes); initialize it with its *_init function"));
  }
  return absl::OkStatus();
}

// Sizes of the first published versions; structs only grow past these.
constexpr size_t kOptionsV1Size = offsetof(muon_options_t, assignment);
constexpr size_t kParamOptionsV1Size = offsetof(muon_param_options_t, global_ndim);

// A copy of the caller's struct of `struct_size` bytes, filled to the size
// this library knows with defaults (for callers built against an older header).
template <typename T>
T ReadVersioned(const T* in, const T& defaults) {
  T out = defaults;
  std::memcpy(&out, in, in->struct_size < sizeof(T) ? in->struct_size : sizeof(T));
  out.struct_size = sizeof(T);
  return out;
}

void DefaultOptions(muon_options_t* o) {
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  const muon::Options d;
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
  o->adjust_lr = MUON_ADJUST_LR_ORIGINAL;
  o->ns_dtype = MUON_NS_DTYPE_BF16;
  o->momentum_fp32 = 0;
  o->assignment = MUON_ASSIGNMENT_BALANCED;
  o->prefetch_count = d.dist.prefetch_count;
  o->async_parallelism = d.dist.async_parallelism ? 1 : 0;
  o->round_bytes = static_cast<size_t>(d.dist.round_bytes);
}

void DefaultParamOptions(muon_param_options_t* o) {
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->matrix_view = MUON_MATRIX_VIEW_2D;
}

absl::Status ToCoreOptions(const muon_options_t& c, muon::Options* out) {
  muon::Options o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  o.momentum = c.momentum;
  o.nesterov = c.nesterov != 0;
  o.ns.steps = c.ns_steps;
  o.ns.eps = c.eps;
  switch (c.ns_coefficients) {
    case MUON_NS_COEFFICIENTS_FIXED:
      o.ns.coefficients = {{c.ns_a, c.ns_b, c.ns_c}};
      break;
    case MUON_NS_COEFFICIENTS_TABLE:
      if (c.ns_table == nullptr) return NullArg("options->ns_table (ns_coefficients = TABLE)");
      if (c.ns_table_rows < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "options->ns_table_rows is ", c.ns_table_rows, "; a TABLE needs at least one row"));
      }
      o.ns.coefficients.clear();
      for (int32_t i = 0; i < c.ns_table_rows; ++i) {
        o.ns.coefficients.push_back(
            {c.ns_table[3 * i], c.ns_table[3 * i + 1], c.ns_table[3 * i + 2]});
      }
      break;
    case MUON_NS_COEFFICIENTS_POLAR_EXPRESS:
      o.ns.coefficients = muon::PolarExpressCoefficients();
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "options->ns_coefficients: unknown value ", c.ns_coefficients,
          "; use MUON_NS_COEFFICIENTS_FIXED (0), TABLE (1) or POLAR_EXPRESS (2)"));
  }
  if (c.ns_dtype != MUON_NS_DTYPE_BF16 && c.ns_dtype != MUON_NS_DTYPE_FP32) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->ns_dtype: unknown value ", c.ns_dtype,
                     "; use MUON_NS_DTYPE_BF16 (0) or MUON_NS_DTYPE_FP32 (1)"));
  }
  o.ns.dtype = c.ns_dtype == MUON_NS_DTYPE_FP32 ? muon::NsDtype::kFP32 : muon::NsDtype::kBF16;
  if (c.adjust_lr < 0 || c.adjust_lr > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->adjust_lr: unknown value ", c.adjust_lr,
        "; use MUON_ADJUST_LR_ORIGINAL (0), MATCH_RMS_ADAMW (1) or NONE (2)"));
  }
  o.adjust_lr = static_cast<muon::AdjustLr>(c.adjust_lr);
  o.momentum_fp32 = c.momentum_fp32 != 0;
  if (c.reserved0 != 0 || c.reserved1 != 0) {
    return absl::InvalidArgumentError("options->reserved0 and reserved1 must be 0");
  }
  o.dist.prefetch_count = c.prefetch_count;
  o.dist.async_parallelism = c.async_parallelism != 0;
  o.dist.round_bytes = c.round_bytes == 0 ? (int64_t{256} << 20)
                                          : static_cast<int64_t>(c.round_bytes);
  o.dist.assignment = static_cast<muon::Assignment>(c.assignment);
  if (c.assignment == MUON_ASSIGNMENT_CUSTOM && c.assign_fn != nullptr) {
    auto fn = c.assign_fn;
    void* state = c.assign_state;
    o.dist.custom_assign = [fn, state](const std::vector<muon::MatrixInfo>& infos,
                                       std::vector<int>* owners) -> absl::Status {
      std::vector<muon_matrix_info_t> table(infos.size());
      std::vector<std::vector<int32_t>> holders(infos.size());
      for (size_t i = 0; i < infos.size(); ++i) {
        holders[i].assign(infos[i].holders.begin(), infos[i].holders.end());
        table[i] = muon_matrix_info_t{infos[i].param_name->c_str(), infos[i].index,
                                      infos[i].rows, infos[i].cols, infos[i].ns_flops,
                                      holders[i].data(),
                                      static_cast<int32_t>(holders[i].size()), 0};
      }
      std::vector<int32_t> out(infos.size(), -1);
      muon::TakeCallbackError();
      const muon_status_t st = fn(state, table.size(), table.data(), out.data());
      const std::string detail = muon::TakeCallbackError();
      if (st != MUON_OK) {
        return absl::Status(muon::capi::FromCode(st),
                            absl::StrCat("assign_fn returned ", muon_status_string(st),
                                         detail.empty() ? "" : ": ", detail));
      }
      owners->assign(out.begin(), out.end());
      return absl::OkStatus();
    };
  }
  absl::Status valid = muon::ValidateOptions(o);
  if (!valid.ok()) return absl::Status(valid.code(), absl::StrCat("options->", valid.message()));
  *out = std::move(o);
  return absl::OkStatus();
}

}  // namespace

extern "C" {

const char* muon_status_string(muon_status_t status) {
  switch (status) {
    case MUON_OK:
      return "OK";
    case MUON_CANCELLED:
      return "CANCELLED";
    case MUON_UNKNOWN:
      return "UNKNOWN";
    case MUON_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case MUON_NOT_FOUND:
      return "NOT_FOUND";
    case MUON_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case MUON_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case MUON_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case MUON_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case MUON_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case MUON_INTERNAL:
      return "INTERNAL";
    case MUON_UNAVAILABLE:
      return "UNAVAILABLE";
  }
  return "UNRECOGNIZED_STATUS";
}

const char* muon_last_error_message(void) { return LastError().c_str(); }

void muon_get_version(int32_t* major, int32_t* minor, int32_t* patch) {
  if (major) *major = MUON_VERSION_MAJOR;
  if (minor) *minor = MUON_VERSION_MINOR;
  if (patch) *patch = MUON_VERSION_PATCH;
}

size_t muon_sizeof_options(void) { return sizeof(muon_options_t); }
size_t muon_sizeof_param_options(void) { return sizeof(muon_param_options_t); }
size_t muon_sizeof_comm(void) { return sizeof(muon_comm_t); }
size_t muon_sizeof_stats(void) { return sizeof(muon_stats_t); }
size_t muon_sizeof_custom_layout(void) { return sizeof(muon_custom_layout_t); }
size_t muon_sizeof_gathered(void) { return sizeof(muon_gathered_t); }
size_t muon_sizeof_matrix_info(void) { return sizeof(muon_matrix_info_t); }
size_t muon_sizeof_placement(void) { return sizeof(muon_placement_t); }

muon_status_t muon_options_init(muon_options_t* options, size_t struct_size) {
  return Guard("muon_options_init", [&]() -> absl::Status {
    if (options == nullptr) return NullArg("options");
    if (struct_size < kOptionsV1Size) {
      return CheckStructSize("options", struct_size, kOptionsV1Size);
    }
    muon_options_t d;
    DefaultOptions(&d);
    // A caller with a newer, larger struct: zero what we do not know.
    std::memset(options, 0, struct_size);
    std::memcpy(options, &d, sizeof d);
    options->struct_size = struct_size;
    return absl::OkStatus();
  });
}

muon_status_t muon_param_options_init(muon_param_options_t* options, size_t struct_size) {
  return Guard("muon_param_options_init", [&]() -> absl::Status {
    if (options == nullptr) return NullArg("options");
    if (struct_size < kParamOptionsV1Size) {
      return CheckStructSize("options", struct_size, kParamOptionsV1Size);
    }
    muon_param_options_t d;
    DefaultParamOptions(&d);
    std::memset(options, 0, struct_size);
    std::memcpy(options, &d, sizeof d);
    options->struct_size = struct_size;
    return absl::OkStatus();
  });
}

muon_status_t muon_create(const muon_options_t* options, muon_optimizer_t** out) {
  return Guard("muon_create", [&]() -> absl::Status {
    if (options == nullptr) return NullArg("options");
    if (out == nullptr) return NullArg("out");
    absl::Status size_ok = CheckStructSize("options", options->struct_size, kOptionsV1Size);
    if (!size_ok.ok()) return size_ok;
    muon_options_t defaults;
    DefaultOptions(&defaults);
    const muon_options_t c = ReadVersioned(options, defaults);
    muon::Options core;
    absl::Status converted = ToCoreOptions(c, &core);
    if (!converted.ok()) return converted;
    auto created = muon::Optimizer::Create(core);
    if (!created.ok()) return created.status();
    auto handle = std::make_unique<muon_optimizer>();
    handle->impl = std::move(created).value();
    *out = handle.release();
    return absl::OkStatus();
  });
}

void muon_destroy(muon_optimizer_t* opt) {
  try {
    delete opt;
  } catch (...) {
  }
}

muon_status_t muon_get_options(const muon_optimizer_t* opt, muon_options_t* out) {
  return Guard("muon_get_options", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (out == nullptr) return NullArg("out");
    absl::Status size_ok = CheckStructSize("out", out->struct_size, kOptionsV1Size);
    if (!size_ok.ok()) return size_ok;
    const muon::Options& o = opt->impl->options();
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
    c.ns_coefficients = o.ns.coefficients.size() == 1 ? MUON_NS_COEFFICIENTS_FIXED
                                                      : MUON_NS_COEFFICIENTS_TABLE;
    c.ns_table_rows = static_cast<int32_t>(o.ns.coefficients.size());
    c.adjust_lr = static_cast<int32_t>(o.adjust_lr);
    c.ns_dtype = o.ns.dtype == muon::NsDtype::kFP32 ? MUON_NS_DTYPE_FP32 : MUON_NS_DTYPE_BF16;
    c.momentum_fp32 = o.momentum_fp32 ? 1 : 0;
    c.assignment = static_cast<int32_t>(o.dist.assignment);
    c.prefetch_count = o.dist.prefetch_count;
    c.async_parallelism = o.dist.async_parallelism ? 1 : 0;
    c.round_bytes = static_cast<size_t>(o.dist.round_bytes);
    const size_t n = out->struct_size < sizeof c ? out->struct_size : sizeof c;
    const size_t caller_size = out->struct_size;
    std::memcpy(out, &c, n);
    out->struct_size = caller_size;
    return absl::OkStatus();
  });
}

muon_status_t muon_set_lr(muon_optimizer_t* opt, double lr) {
  return Guard("muon_set_lr", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->SetLr(lr);
  });
}

muon_status_t muon_set_weight_decay(muon_optimizer_t* opt, double weight_decay) {
  return Guard("muon_set_weight_decay", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->SetWeightDecay(weight_decay);
  });
}

muon_status_t muon_set_momentum(muon_optimizer_t* opt, double momentum) {
  return Guard("muon_set_momentum", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->SetMomentum(momentum);
  });
}

muon_status_t muon_register_param(muon_optimizer_t* opt, const DLTensor* param,
                                  const DLTensor* grad, const muon_param_options_t* options,
                                  int64_t* param_id) {
  return Guard("muon_register_param", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (param_id == nullptr) return NullArg("param_id");
    muon_param_options_t po;
    DefaultParamOptions(&po);
    if (options != nullptr) {
      absl::Status size_ok =
          CheckStructSize("options", options->struct_size, kParamOptionsV1Size);
      if (!size_ok.ok()) return size_ok;
      po = ReadVersioned(options, po);
      if (po.reserved0 != 0) return absl::InvalidArgumentError("options->reserved0 must be 0");
    }
    muon::DistSpec spec;
    if (po.reserved1 != 0) return absl::InvalidArgumentError("options->reserved1 must be 0");
    if (po.replicated_mode != MUON_REPLICATED_HOST_AVERAGED &&
        po.replicated_mode != MUON_REPLICATED_ZERO2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options->replicated_mode: unknown value ", po.replicated_mode,
          "; use MUON_REPLICATED_HOST_AVERAGED (0) or MUON_REPLICATED_ZERO2 (1)"));
    }
    spec.zero2 = po.replicated_mode == MUON_REPLICATED_ZERO2;
    const bool has_layout = po.global_ndim > 0 || po.num_placements > 0;
    if (spec.zero2 && !has_layout) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", po.name ? po.name : "", "': MUON_REPLICATED_ZERO2 needs global_shape and a "
          "REPLICATE placement over the data-parallel group"));
    }
    if (has_layout) {
      const std::string who = absl::StrCat("param '", po.name ? po.name : "", "'");
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
      spec.global_shape.assign(po.global_shape, po.global_shape + po.global_ndim);
      for (int32_t i = 0; i < po.num_placements; ++i) {
        const muon_placement_t& c = po.placements[i];
        muon::Placement p;
        if (c.kind < 0 || c.kind > 2) {
          return absl::InvalidArgumentError(absl::StrCat(who, ": placement ", i, " has unknown kind ",
                                                         c.kind));
        }
        if (c.kind == MUON_PLACEMENT_SHARD && (c.split < 0 || c.split > 2)) {
          return absl::InvalidArgumentError(absl::StrCat(who, ": placement ", i,
                                                         " has unknown split ", c.split));
        }
        p.kind = static_cast<muon::PlacementKind>(c.kind);
        p.group = c.group;
        p.dim = c.dim;
        p.split = static_cast<muon::ShardSplit>(c.split);
        p.start = c.start;
        p.length = c.length;
        if (p.kind == muon::PlacementKind::kShard && p.split == muon::ShardSplit::kSizes) {
          if (c.sizes == nullptr) {
            return absl::InvalidArgumentError(
                absl::StrCat(who, ": placement ", i, " uses SPLIT_SIZES but sizes is NULL"));
          }
          auto group_size = opt->impl->GroupSize(c.group);
          if (!group_size.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat(who, ": placement ", i, ": ", group_size.status().message()));
          }
          p.sizes.assign(c.sizes, c.sizes + *group_size);
        }
        spec.placements.push_back(std::move(p));
      }
    }
    auto id = opt->impl->RegisterParam(param, grad, po.name ? po.name : "", po.matrix_view,
                                       has_layout ? &spec : nullptr);
    if (!id.ok()) return id.status();
    *param_id = *id;
    return absl::OkStatus();
  });
}

muon_status_t muon_register_param_custom(muon_optimizer_t* opt, const DLTensor* param,
                                         const DLTensor* grad, const muon_param_options_t* options,
                                         const muon_custom_layout_t* layout, int64_t* param_id) {
  return Guard("muon_register_param_custom", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (param_id == nullptr) return NullArg("param_id");
    if (options == nullptr) return NullArg("options (the name is required)");
    if (layout == nullptr) return NullArg("layout");
    absl::Status size_ok = CheckStructSize("options", options->struct_size, kParamOptionsV1Size);
    if (!size_ok.ok()) return size_ok;
    if (layout->struct_size < sizeof(muon_custom_layout_t)) {
      return CheckStructSize("layout", layout->struct_size, sizeof(muon_custom_layout_t));
    }
    muon_param_options_t defaults;
    DefaultParamOptions(&defaults);
    const muon_param_options_t po = ReadVersioned(options, defaults);
    const std::string name = po.name ? po.name : "";
    if (po.global_ndim != 0 || po.num_placements != 0 || po.replicated_mode != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", name, "': a custom-path parameter takes no global_shape, placements or "
          "replicated_mode"));
    }
    const muon_custom_layout_t c = *layout;
    auto path = std::make_shared<muon::CustomPath>();
    if (c.assign_fn) {
      path->assign = [c, name](int world) {
        muon::TakeCallbackError();
        return c.assign_fn(c.state, name.c_str(), world);
      };
    }
    if (c.gather_fn) {
      path->gather = [c](const float* local, int64_t n, int owner, const float** full,
                         int64_t* rows, int64_t* cols, void* stream) -> absl::Status {
        muon_gathered_t out{nullptr, -1, -1};
        muon::TakeCallbackError();
        const muon_status_t st = c.gather_fn(c.state, local, n, owner, &out, stream);
        const std::string detail = muon::TakeCallbackError();
        if (st != MUON_OK) {
          return absl::Status(muon::capi::FromCode(st), detail.empty() ? muon_status_string(st) : detail);
        }
        *full = out.data;
        *rows = out.rows;
        *cols = out.cols;
        return absl::OkStatus();
      };
    }
    if (c.redistribute_fn) {
      path->redistribute = [c](const float* full, int64_t rows, int64_t cols, int owner,
                               float* local, int64_t n, void* stream) -> absl::Status {
        muon::TakeCallbackError();
        const muon_status_t st =
            c.redistribute_fn(c.state, full, rows, cols, owner, local, n, stream);
        const std::string detail = muon::TakeCallbackError();
        if (st != MUON_OK) {
          return absl::Status(muon::capi::FromCode(st), detail.empty() ? muon_status_string(st) : detail);
        }
        return absl::OkStatus();
      };
    }
    auto id = opt->impl->RegisterCustomParam(param, grad, name, c.global_rows, c.global_cols,
                                             std::move(path));
    if (!id.ok()) return id.status();
    *param_id = *id;
    return absl::OkStatus();
  });
}

muon_status_t muon_rebind_param(muon_optimizer_t* opt, int64_t param_id, const DLTensor* param,
                                const DLTensor* grad) {
  return Guard("muon_rebind_param", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (param == nullptr) return NullArg("param");
    return opt->impl->RebindParam(param_id, param, grad);
  });
}

muon_status_t muon_num_params(const muon_optimizer_t* opt, size_t* count) {
  return Guard("muon_num_params", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (count == nullptr) return NullArg("count");
    *count = opt->impl->num_params();
    return absl::OkStatus();
  });
}

muon_status_t muon_step(muon_optimizer_t* opt, void* stream) {
  return Guard("muon_step", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->Step(stream);
  });
}

muon_status_t muon_step_count(const muon_optimizer_t* opt, int64_t* count) {
  return Guard("muon_step_count", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (count == nullptr) return NullArg("count");
    *count = opt->impl->step_count();
    return absl::OkStatus();
  });
}

muon_status_t muon_set_world(muon_optimizer_t* opt, const muon_comm_t* world,
                             int32_t* group_id) {
  return Guard("muon_set_world", [&]() -> absl::Status {
    if (world == nullptr) return NullArg("world");
    // From here on the library owns the table's release, even on failure.
    auto comm = muon::Comm::Create(*world, "world");
    if (!comm.ok()) {
      if (world->release) world->release(world->ctx);
      return comm.status();
    }
    if (opt == nullptr) return NullArg("opt");
    if (group_id == nullptr) return NullArg("group_id");
    auto id = opt->impl->SetWorld(*comm);
    if (!id.ok()) return id.status();
    *group_id = *id;
    return absl::OkStatus();
  });
}

muon_status_t muon_add_group(muon_optimizer_t* opt, const muon_comm_t* comm, int32_t* group_id) {
  return Guard("muon_add_group", [&]() -> absl::Status {
    if (comm == nullptr) return NullArg("comm");
    const std::string name =
        opt ? absl::StrCat("group ", opt->impl->num_groups()) : std::string("group");
    auto group = muon::Comm::Create(*comm, name);
    if (!group.ok()) {
      if (comm->release) comm->release(comm->ctx);
      return group.status();
    }
    if (opt == nullptr) return NullArg("opt");
    if (group_id == nullptr) return NullArg("group_id");
    auto id = opt->impl->AddGroup(*group);
    if (!id.ok()) return id.status();
    *group_id = *id;
    return absl::OkStatus();
  });
}

muon_status_t muon_stats_init(muon_stats_t* stats, size_t struct_size) {
  return Guard("muon_stats_init", [&]() -> absl::Status {
    if (stats == nullptr) return NullArg("stats");
    if (struct_size < sizeof(muon_stats_t)) {
      return CheckStructSize("stats", struct_size, sizeof(muon_stats_t));
    }
    std::memset(stats, 0, struct_size);
    stats->struct_size = struct_size;
    return absl::OkStatus();
  });
}

muon_status_t muon_get_stats(const muon_optimizer_t* opt, muon_stats_t* stats) {
  return Guard("muon_get_stats", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (stats == nullptr) return NullArg("stats");
    absl::Status size_ok = CheckStructSize("stats", stats->struct_size, sizeof(muon_stats_t));
    if (!size_ok.ok()) return size_ok;
    const muon::StepStats& s = opt->impl->stats();
    stats->steps = s.steps;
    stats->bytes_sent = s.bytes_sent;
    stats->bytes_received = s.bytes_received;
    stats->collectives = s.collectives;
    stats->rounds = s.rounds;
    stats->matrices_orthogonalized = s.matrices_orthogonalized;
    stats->ns_flops = s.ns_flops;
    stats->matrices_total = s.matrices_total;
    stats->matrices_owned = s.matrices_owned;
    return absl::OkStatus();
  });
}

muon_status_t muon_get_state_dtype(const muon_optimizer_t* opt, int64_t param_id,
                                   DLDataType* dtype) {
  return Guard("muon_get_state_dtype", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (dtype == nullptr) return NullArg("dtype");
    auto p = opt->impl->GetParam(param_id);
    if (!p.ok()) return p.status();
    *dtype = muon::ToDLDataType((*p)->state_dtype);
    return absl::OkStatus();
  });
}

muon_status_t muon_get_state(const muon_optimizer_t* opt, int64_t param_id, const DLTensor* dst) {
  return Guard("muon_get_state", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->CopyStateOut(param_id, dst);
  });
}

muon_status_t muon_set_state(muon_optimizer_t* opt, int64_t param_id, const DLTensor* src) {
  return Guard("muon_set_state", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->CopyStateIn(param_id, src);
  });
}

muon_status_t muon_save_state(const muon_optimizer_t* opt, void* buffer, size_t capacity,
                              size_t* size) {
  return Guard("muon_save_state", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (size == nullptr) return NullArg("size");
    const size_t needed = opt->impl->StateBlobSize();
    if (buffer == nullptr) {
      *size = needed;
      return absl::OkStatus();
    }
    if (capacity < needed) {
      return absl::OutOfRangeError(absl::StrCat("capacity ", capacity, " is too small; the state needs ",
                                                needed, " bytes (call with buffer = NULL to ask)"));
    }
    absl::Status saved = opt->impl->SaveState(static_cast<unsigned char*>(buffer));
    if (!saved.ok()) return saved;
    *size = needed;
    return absl::OkStatus();
  });
}

muon_status_t muon_load_state(muon_optimizer_t* opt, const void* buffer, size_t size) {
  return Guard("muon_load_state", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (buffer == nullptr) return NullArg("buffer");
    return opt->impl->LoadState(static_cast<const unsigned char*>(buffer), size);
  });
}

}  // extern "C"
