// The extern "C" entry points: each checks its pointer arguments, converts
// the C structs to the core's types (convert.h), runs the core behind the
// exception firewall, and reports absl::Status as muon_status_t plus the
// thread-local error message (capi_internal.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capi/capi_internal.h"
#include "muon/comm/codes.h"
#include "capi/convert.h"
#include "libmuon/muon.h"
#include "muon/comm/struct_versions.h"
#include "muon/comm/comm.h"
#include "muon/engine/optimizer.h"

struct muon_optimizer {
  std::unique_ptr<muon::Optimizer> impl;
};

namespace {

using muon::capi::CheckStructSize;
using muon::capi::Guard;
using muon::capi::LastError;
using muon::capi::NullArg;

// Fills the caller's extensible struct with `defaults`: its struct_size
// bytes, a size `versions` accepts (checked first, so that a refused call
// writes nothing). A caller built against an older header has a shorter
// struct: it gets the fields it has, and not one byte past them; a newer
// header's longer struct gets its unknown tail zeroed.
template <typename T>
absl::Status InitStruct(T* s, size_t struct_size, const char* name,
                        const muon::capi::VersionedStruct& versions, const T& defaults) {
  static_assert(std::is_trivially_copyable<T>::value, "a C struct");
  if (s == nullptr) return NullArg(name);
  absl::Status size_ok = CheckStructSize(versions, name, struct_size);
  if (!size_ok.ok()) return size_ok;
  std::memset(s, 0, struct_size);
  std::memcpy(s, &defaults, std::min(struct_size, sizeof defaults));
  s->struct_size = struct_size;
  return absl::OkStatus();
}

}  // namespace

extern "C" {

const char* muon_status_string(muon_status_t status) {
  // A C host may pass any value of the enum's integer type, one no
  // enumerator names included; in C++ reading such a value as a
  // muon_status_t is undefined, so its bytes are read as the int they are.
  static_assert(sizeof(muon_status_t) == sizeof(int32_t), "muon_status_t is 32 bits");
  int32_t code = 0;
  std::memcpy(&code, &status, sizeof code);
  return muon::StatusCodeName(code);
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
size_t muon_sizeof_qk_clip_layer(void) { return sizeof(muon_qk_clip_layer_t); }

muon_status_t muon_options_init(muon_options_t* options, size_t struct_size) {
  return Guard("muon_options_init", [&]() -> absl::Status {
    muon_options_t d;
    muon::capi::DefaultOptions(&d);
    return InitStruct(options, struct_size, "options", muon::capi::kOptionsStruct, d);
  });
}

muon_status_t muon_param_options_init(muon_param_options_t* options, size_t struct_size) {
  return Guard("muon_param_options_init", [&]() -> absl::Status {
    muon_param_options_t d;
    muon::capi::DefaultParamOptions(&d);
    return InitStruct(options, struct_size, "options", muon::capi::kParamOptionsStruct, d);
  });
}

muon_status_t muon_create(const muon_options_t* options, muon_optimizer_t** out) {
  return Guard("muon_create", [&]() -> absl::Status {
    if (options == nullptr) return NullArg("options");
    if (out == nullptr) return NullArg("out");
    absl::StatusOr<muon::Options> core = muon::capi::OptionsFromC(*options);
    if (!core.ok()) return core.status();
    auto created = muon::Optimizer::Create(*core);
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
    absl::Status size_ok =
        CheckStructSize(muon::capi::kOptionsStruct, "out", out->struct_size);
    if (!size_ok.ok()) return size_ok;
    muon::capi::OptionsToC(opt->impl->options(), out);
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

muon_status_t muon_push_hyperparameters(muon_optimizer_t* opt, void* stream) {
  return Guard("muon_push_hyperparameters", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->PushHyperparameters(stream);
  });
}

muon_status_t muon_register_param(muon_optimizer_t* opt, const DLTensor* param,
                                  const DLTensor* grad, const muon_param_options_t* options,
                                  int64_t* param_id) {
  return Guard("muon_register_param", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (param_id == nullptr) return NullArg("param_id");
    auto r = muon::capi::ParamOptionsFromC(
        options, [&](int group) { return opt->impl->GroupSize(group); });
    if (!r.ok()) return r.status();
    auto id = opt->impl->RegisterParam(param, grad, r->name, r->view,
                                       r->has_layout ? &r->dist : nullptr, r->split);
    if (!id.ok()) return id.status();
    opt->impl->SetParamScales(*id, r->lr_scale, r->weight_decay_scale);  // checked above
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
    auto r = muon::capi::CustomFromC(*options, *layout);
    if (!r.ok()) return r.status();
    auto id = opt->impl->RegisterCustomParam(param, grad, r->name, r->rows, r->cols,
                                             std::move(r->path), r->split);
    if (!id.ok()) return id.status();
    opt->impl->SetParamScales(*id, r->lr_scale, r->weight_decay_scale);  // checked above
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

muon_status_t muon_orthogonalize(muon_optimizer_t* opt, const DLTensor* in, const DLTensor* out,
                                 int32_t matrix_view, void* stream) {
  return Guard("muon_orthogonalize", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (in == nullptr) return NullArg("in");
    if (out == nullptr) return NullArg("out");
    return opt->impl->Orthogonalize(in, out, matrix_view, stream);
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
    // A table of a size no header had is not read at all, its release
    // included (it may lie past the caller's struct): it stays the host's.
    absl::Status size_ok = CheckStructSize(muon::capi::kCommStruct, "world", world->struct_size);
    if (!size_ok.ok()) return size_ok;
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
    // As muon_set_world: a refused size leaves the table, and its release, alone.
    absl::Status size_ok = CheckStructSize(muon::capi::kCommStruct, name, comm->struct_size);
    if (!size_ok.ok()) return size_ok;
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
    muon_stats_t zeros;
    std::memset(&zeros, 0, sizeof zeros);
    return InitStruct(stats, struct_size, "stats", muon::capi::kStatsStruct, zeros);
  });
}

muon_status_t muon_get_stats(const muon_optimizer_t* opt, muon_stats_t* stats) {
  return Guard("muon_get_stats", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (stats == nullptr) return NullArg("stats");
    absl::Status size_ok =
        CheckStructSize(muon::capi::kStatsStruct, "stats", stats->struct_size);
    if (!size_ok.ok()) return size_ok;
    muon::capi::StatsToC(opt->impl->stats(), stats);
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

muon_status_t muon_qk_clip_layer_init(muon_qk_clip_layer_t* layer, size_t struct_size) {
  return Guard("muon_qk_clip_layer_init", [&]() -> absl::Status {
    muon_qk_clip_layer_t d;
    muon::capi::DefaultQkClipLayer(&d);
    return InitStruct(layer, struct_size, "layer", muon::capi::kQkClipLayerStruct, d);
  });
}

muon_status_t muon_register_qk_clip(muon_optimizer_t* opt, const muon_qk_clip_layer_t* layer,
                                    int64_t* layer_id) {
  return Guard("muon_register_qk_clip", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (layer == nullptr) return NullArg("layer");
    if (layer_id == nullptr) return NullArg("layer_id");
    absl::StatusOr<muon::QkClipLayer> core = muon::capi::QkClipLayerFromC(*layer);
    if (!core.ok()) return core.status();
    absl::StatusOr<int64_t> id = opt->impl->RegisterQkClip(*core);
    if (!id.ok()) return id.status();
    *layer_id = *id;
    return absl::OkStatus();
  });
}

muon_status_t muon_qk_clip(muon_optimizer_t* opt, int64_t layer_id, const float* max_logits,
                           int32_t num_heads, double tau, int32_t* clipped_heads) {
  return Guard("muon_qk_clip", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (max_logits == nullptr) return NullArg("max_logits");
    return opt->impl->QkClip(layer_id, max_logits, num_heads, tau, nullptr, false,
                             clipped_heads);
  });
}

muon_status_t muon_qk_clip_on_stream(muon_optimizer_t* opt, int64_t layer_id,
                                     const float* max_logits, int32_t num_heads, double tau,
                                     void* stream, int32_t* clipped_heads) {
  return Guard("muon_qk_clip_on_stream", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (max_logits == nullptr) return NullArg("max_logits");
    return opt->impl->QkClip(layer_id, max_logits, num_heads, tau, stream, true, clipped_heads);
  });
}

muon_status_t muon_get_moments(const muon_optimizer_t* opt, int64_t param_id,
                               const DLTensor* dst) {
  return Guard("muon_get_moments", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->CopyMomentsOut(param_id, dst);
  });
}

muon_status_t muon_set_moments(muon_optimizer_t* opt, int64_t param_id, const DLTensor* src) {
  return Guard("muon_set_moments", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->CopyMomentsIn(param_id, src);
  });
}

muon_status_t muon_get_owned_moments(const muon_optimizer_t* opt, int64_t param_id,
                                     const DLTensor* dst, uint8_t* owned, int64_t owned_count) {
  return Guard("muon_get_owned_moments", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->CopyMomentsOut(param_id, dst, /*owned_only=*/true, owned, owned_count);
  });
}

muon_status_t muon_set_owned_moments(muon_optimizer_t* opt, int64_t param_id,
                                     const DLTensor* src) {
  return Guard("muon_set_owned_moments", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    return opt->impl->CopyMomentsIn(param_id, src, /*owned_only=*/true);
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

muon_status_t muon_load_states(muon_optimizer_t* opt, const void* const* buffers,
                               const size_t* sizes, size_t count) {
  return Guard("muon_load_states", [&]() -> absl::Status {
    if (opt == nullptr) return NullArg("opt");
    if (buffers == nullptr) return NullArg("buffers");
    if (sizes == nullptr) return NullArg("sizes");
    if (count == 0) return absl::InvalidArgumentError("count: 0 blobs; hand at least one");
    for (size_t k = 0; k < count; ++k) {
      if (buffers[k] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("buffers[", k, "] is NULL"));
      }
    }
    return opt->impl->LoadStates(reinterpret_cast<const unsigned char* const*>(buffers), sizes,
                                 count);
  });
}

}  // extern "C"
