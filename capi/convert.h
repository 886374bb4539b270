// Every conversion between the C ABI's structs and enums (muon.h) and the
// core's types, in one place: the extern "C" shims only check their pointer
// arguments and call these. Status codes and the reduce_scatter dtype, which
// the communicator adapters share, are in codes.h. Every core enum is held to
// its MUON_* constants by static_asserts in convert.cc.
#ifndef LIBMUON_CAPI_CONVERT_H_
#define LIBMUON_CAPI_CONVERT_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libmuon/muon.h"
#include "muon/comm/struct_versions.h"
#include "muon/engine/optimizer.h"
#include "muon/engine/options.h"
#include "muon/engine/param.h"
#include "muon/engine/registry.h"

namespace muon {
namespace capi {

// Sizes of the first published versions of the extensible structs (the
// whole table, and the check of a caller's struct_size, in struct_versions.h).
constexpr size_t kOptionsV1Size = kOptionsStruct.oldest();
constexpr size_t kParamOptionsV1Size = kParamOptionsStruct.oldest();
constexpr size_t kStatsV1Size = kStatsStruct.oldest();

// The defaults of the C structs (the core's defaults), struct_size set to
// this library's sizeof.
void DefaultOptions(muon_options_t* o);
void DefaultParamOptions(muon_param_options_t* o);

// The caller's options (struct_size bytes of them, a size struct_versions.h
// accepts; fields past its size take their defaults) as core options,
// validated. Errors name the field ("options->lr: ...").
absl::StatusOr<Options> OptionsFromC(const muon_options_t& caller);

// Writes `o` into the caller's `out` (its first out->struct_size bytes, at
// most this library's sizeof; the caller checked the size; the struct_size
// stays the caller's). ns_table is NULL in the copy.
void OptionsToC(const Options& o, muon_options_t* out);

// A registration's parameter options (NULL: the defaults).
struct ParamRegistration {
  std::string name;
  int view = MUON_MATRIX_VIEW_2D;
  bool has_layout = false;  // global_shape or placements given
  DistSpec dist;
  double lr_scale = 1.0, weight_decay_scale = 1.0;
  BlockSplit split;
};
// `group_size(g)`: the size of group g (for SPLIT_SIZES), or an error.
absl::StatusOr<ParamRegistration> ParamOptionsFromC(
    const muon_param_options_t* options,
    const std::function<absl::StatusOr<int>(int group)>& group_size);

// A custom-path registration: `options` (required: the name) and `layout`.
struct CustomRegistration {
  std::string name;
  double lr_scale = 1.0, weight_decay_scale = 1.0;
  BlockSplit split;
  int64_t rows = 0;
  int64_t cols = 0;
  std::shared_ptr<CustomPath> path;  // the host's callbacks as core functions
};
absl::StatusOr<CustomRegistration> CustomFromC(const muon_param_options_t& options,
                                               const muon_custom_layout_t& layout);

// QK-Clip layers: the defaults, and the caller's layer (a size
// struct_versions.h accepts) as the core's (checked later, against the
// parameters). Errors name the field ("layer->num_heads: ...").
void DefaultQkClipLayer(muon_qk_clip_layer_t* layer);
absl::StatusOr<QkClipLayer> QkClipLayerFromC(const muon_qk_clip_layer_t& caller);

// Fills the counters of `out` (its struct_size was checked by the caller).
void StatsToC(const StepStats& s, muon_stats_t* out);

}  // namespace capi
}  // namespace muon

#endif  // LIBMUON_CAPI_CONVERT_H_
