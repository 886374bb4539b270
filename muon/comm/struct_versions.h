// The sizes every released header gave each extensible struct of the C ABI
// (muon.h's "Conventions"), and the one check of a caller's struct_size
// against them. A struct_size is accepted when it is one of its struct's
// published sizes, or larger than this library's sizeof and a multiple of the
// struct's alignment (a newer header's struct: its fields past this
// library's are not read, and are zeroed by *_init). Any other size would end
// inside a field (a torn pointer) or between versions, and is refused.
//
// Like muon.h and codes.h, the bottom of the house: the shims (convert.cc,
// muon_capi.cc) and the engine's communicator port (muon/comm/comm.cc) check
// through it. The static_asserts hold each version's size to the end of its
// last field, so that a field added at the end needs a new row here.
#ifndef MUON_COMM_STRUCT_VERSIONS_H_
#define MUON_COMM_STRUCT_VERSIONS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "libmuon/muon.h"

namespace muon {
namespace capi {

// One released version of a struct: its sizeof then, and the header version
// that published it.
struct StructVersion {
  size_t size;
  const char* version;
};

// An extensible struct: its C name, its *_init function (nullptr when it has
// none), its alignment and its published sizes, ascending; the last is this
// library's sizeof.
struct VersionedStruct {
  const char* type;
  const char* init;
  size_t align;
  const StructVersion* versions;
  size_t count;

  constexpr size_t oldest() const { return versions[0].size; }
  constexpr size_t current() const { return versions[count - 1].size; }
};

namespace struct_versions_internal {

// The size of a struct of alignment `align` whose last field ends at `end`.
constexpr size_t Padded(size_t end, size_t align) { return (end + align - 1) / align * align; }

// The byte after field `f` of struct T, padded to T's alignment: the sizeof
// of a version of T whose last field is f.
#define MUON_SIZE_ENDING_AT_(T, f)                                                   \
  ::muon::capi::struct_versions_internal::Padded(offsetof(T, f) + sizeof(T::f), \
                                                 alignof(T))

inline constexpr StructVersion kOptions[] = {
    {MUON_SIZE_ENDING_AT_(muon_options_t, reserved0), "0.1"},
    {MUON_SIZE_ENDING_AT_(muon_options_t, assign_state), "0.2"},
    {MUON_SIZE_ENDING_AT_(muon_options_t, skip_nonfinite), "0.4"},
    {MUON_SIZE_ENDING_AT_(muon_options_t, update_in_grad), "0.5"},
    {MUON_SIZE_ENDING_AT_(muon_options_t, reserved2), "0.6"},
    {MUON_SIZE_ENDING_AT_(muon_options_t, ns_gram_restarts), "0.7"},
};
inline constexpr StructVersion kParamOptions[] = {
    {MUON_SIZE_ENDING_AT_(muon_param_options_t, reserved0), "0.1"},
    {MUON_SIZE_ENDING_AT_(muon_param_options_t, reserved1), "0.2"},
    {MUON_SIZE_ENDING_AT_(muon_param_options_t, split_sizes), "0.7"},
};
inline constexpr StructVersion kStats[] = {
    {MUON_SIZE_ENDING_AT_(muon_stats_t, matrices_owned), "0.2"},
    {MUON_SIZE_ENDING_AT_(muon_stats_t, steps_skipped), "0.4"},
    {MUON_SIZE_ENDING_AT_(muon_stats_t, bytes_per_param), "0.5"},
};
inline constexpr StructVersion kCustomLayout[] = {
    {MUON_SIZE_ENDING_AT_(muon_custom_layout_t, redistribute_fn), "0.2"},
};
inline constexpr StructVersion kComm[] = {
    {MUON_SIZE_ENDING_AT_(muon_comm_t, release), "0.2"},
};
inline constexpr StructVersion kQkClipLayer[] = {
    {MUON_SIZE_ENDING_AT_(muon_qk_clip_layer_t, alpha), "0.7"},
};
#undef MUON_SIZE_ENDING_AT_

// The next version starts where the one before ended: the first field of
// each later version sits at the earlier version's size.
static_assert(kOptions[0].size == offsetof(muon_options_t, assignment), "options 0.2 starts");
static_assert(kOptions[1].size == offsetof(muon_options_t, skip_nonfinite), "options 0.4 starts");
static_assert(kOptions[2].size == offsetof(muon_options_t, allocate), "options 0.5 starts");
static_assert(kOptions[3].size == offsetof(muon_options_t, update_scale), "options 0.6 starts");
static_assert(kOptions[4].size == offsetof(muon_options_t, normuon), "options 0.7 starts");
static_assert(kParamOptions[0].size == offsetof(muon_param_options_t, global_ndim),
              "param options 0.2 starts");
static_assert(kStats[0].size == offsetof(muon_stats_t, nonfinite_grads), "stats 0.4 starts");
static_assert(kStats[1].size == offsetof(muon_stats_t, memory_bytes), "stats 0.5 starts");
// The last version is this header's struct: a field added at the end fails
// here until it has its row above.
static_assert(kOptions[5].size == sizeof(muon_options_t), "muon_options_t grew: add a version");
static_assert(kParamOptions[1].size == offsetof(muon_param_options_t, lr_scale),
              "param options 0.7 starts");
static_assert(kParamOptions[2].size == sizeof(muon_param_options_t),
              "muon_param_options_t grew: add a version");
static_assert(kStats[2].size == sizeof(muon_stats_t), "muon_stats_t grew: add a version");
static_assert(kCustomLayout[0].size == sizeof(muon_custom_layout_t),
              "muon_custom_layout_t grew: add a version");
static_assert(kComm[0].size == sizeof(muon_comm_t), "muon_comm_t grew: add a version");
static_assert(kQkClipLayer[0].size == sizeof(muon_qk_clip_layer_t),
              "muon_qk_clip_layer_t grew: add a version");
#if defined(__x86_64__) || defined(__aarch64__)
// The numbers themselves on LP64 (tests/c_api/c99_test.c freezes the offsets).
static_assert(kOptions[0].size == 104 && kOptions[1].size == 144 && kOptions[2].size == 152 &&
                  kOptions[3].size == 184 && kOptions[4].size == 200 && kOptions[5].size == 240,
              "muon_options_t's published sizes");
static_assert(kParamOptions[0].size == 24 && kParamOptions[1].size == 56 &&
                  kParamOptions[2].size == 88,
              "muon_param_options_t's published sizes");
static_assert(kStats[0].size == 80 && kStats[1].size == 96 && kStats[2].size == 128,
              "muon_stats_t's published sizes");
static_assert(kCustomLayout[0].size == 56, "muon_custom_layout_t's published size");
static_assert(kComm[0].size == 72, "muon_comm_t's published size");
static_assert(kQkClipLayer[0].size == 96, "muon_qk_clip_layer_t's published size");
#endif

template <size_t N>
constexpr size_t Count(const StructVersion (&)[N]) {
  return N;
}

}  // namespace struct_versions_internal

namespace svi = struct_versions_internal;
inline constexpr VersionedStruct kOptionsStruct{"muon_options_t", "muon_options_init",
                                                alignof(muon_options_t), svi::kOptions,
                                                svi::Count(svi::kOptions)};
inline constexpr VersionedStruct kParamOptionsStruct{
    "muon_param_options_t", "muon_param_options_init", alignof(muon_param_options_t),
    svi::kParamOptions, svi::Count(svi::kParamOptions)};
inline constexpr VersionedStruct kStatsStruct{"muon_stats_t", "muon_stats_init",
                                              alignof(muon_stats_t), svi::kStats,
                                              svi::Count(svi::kStats)};
inline constexpr VersionedStruct kCustomLayoutStruct{"muon_custom_layout_t", nullptr,
                                                     alignof(muon_custom_layout_t),
                                                     svi::kCustomLayout,
                                                     svi::Count(svi::kCustomLayout)};
inline constexpr VersionedStruct kCommStruct{"muon_comm_t", nullptr, alignof(muon_comm_t),
                                             svi::kComm, svi::Count(svi::kComm)};
inline constexpr VersionedStruct kQkClipLayerStruct{
    "muon_qk_clip_layer_t", "muon_qk_clip_layer_init", alignof(muon_qk_clip_layer_t),
    svi::kQkClipLayer, svi::Count(svi::kQkClipLayer)};

// OK when `given` is a size `s` accepts (see the top); otherwise
// InvalidArgument "<owner>->struct_size is <given>, <why>; <type>'s published
// sizes are ...". `owner` names the struct's parameter ("options", "world").
// Allocates nothing when the size is accepted (muon_get_stats may run in a
// training step).
inline absl::Status CheckStructSize(const VersionedStruct& s, absl::string_view owner,
                                    size_t given) {
  for (size_t i = 0; i < s.count; ++i) {
    if (given == s.versions[i].size) return absl::OkStatus();
  }
  if (given > s.current() && given % s.align == 0) return absl::OkStatus();
  std::string why;
  if (given < s.oldest()) {
    why = absl::StrCat("smaller than the smallest published ", s.type);
  } else if (given < s.current()) {
    why = absl::StrCat("not the size of any published ", s.type,
                       " (it ends inside a field or between two versions)");
  } else {
    why = absl::StrCat("larger than this library's ", s.type, " but not a multiple of ", s.align,
                       " bytes, as every version's sizeof is");
  }
  std::string sizes;
  for (size_t i = 0; i < s.count; ++i) {
    absl::StrAppend(&sizes, i == 0 ? "" : (i + 1 == s.count ? " and " : ", "), s.versions[i].size,
                    " (", s.versions[i].version, i + 1 == s.count ? ", sizeof(" : "",
                    i + 1 == s.count ? s.type : "", i + 1 == s.count ? ") here" : "", ")");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      owner, "->struct_size is ", given, ", ", why, "; ", s.type, "'s published sizes are ", sizes,
      ", and a larger multiple of ", s.align, " is a newer header's struct; set it to sizeof(",
      s.type, ")", s.init != nullptr ? absl::StrCat(" (", s.init, " does)") : std::string()));
}

}  // namespace capi
}  // namespace muon

#endif  // MUON_COMM_STRUCT_VERSIONS_H_
