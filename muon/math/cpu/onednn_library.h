// oneDNN 2.x (libdnnl.so.2), opened with dlopen the first time the oneDNN
// bf16 engine is asked for (MUON_CPU_BF16=onednn), never before: libmuon.so
// does not link it, so a process that never asks needs no oneDNN installed
// (the wheel ships without it). Only oneDNN's header is compiled in; the
// functions native_bf16.cc calls are looked up by name.
//
// Thread-safe: the library is opened once per process and never closed.
#ifndef MUON_MATH_CPU_ONEDNN_LIBRARY_H_
#define MUON_MATH_CPU_ONEDNN_LIBRARY_H_

#include <string>

#include "absl/status/statusor.h"
#include "oneapi/dnnl/dnnl.h"

namespace muon {

// The oneDNN functions libmuon calls, without their dnnl_ prefix.
#define MUON_ONEDNN_FUNCTIONS(X)                                                         \
  X(engine_create) X(engine_destroy) X(get_effective_cpu_isa) X(matmul_desc_init)         \
  X(memory_create) X(memory_desc_get_size) X(memory_desc_init_by_strides)                 \
  X(memory_destroy) X(memory_set_data_handle) X(post_ops_append_sum) X(post_ops_create)   \
  X(post_ops_destroy) X(primitive_attr_create) X(primitive_attr_destroy)                  \
  X(primitive_attr_set_output_scales) X(primitive_attr_set_post_ops)                      \
  X(primitive_attr_set_scratchpad_mode) X(primitive_create) X(primitive_desc_create)      \
  X(primitive_desc_destroy) X(primitive_desc_query_md) X(primitive_destroy)               \
  X(primitive_execute) X(stream_create) X(stream_destroy) X(stream_wait)

struct OneDnn {
#define MUON_ONEDNN_MEMBER(name) decltype(&::dnnl_##name) name = nullptr;
  MUON_ONEDNN_FUNCTIONS(MUON_ONEDNN_MEMBER)
#undef MUON_ONEDNN_MEMBER
};

// The functions, or FailedPrecondition naming the library and what is
// missing (not installed; a oneDNN 3.x, which dropped matmul_desc_init).
// MUON_ONEDNN_LIBRARY names another file to open instead of libdnnl.so.2.
// The first call's answer holds for the process.
absl::StatusOr<const OneDnn*> LoadOneDnn();

// Opens `file` (a dlopen name or path) and looks the functions up, each call
// anew; a library that opened is kept open.
absl::StatusOr<OneDnn> OpenOneDnn(const std::string& file);

}  // namespace muon

#endif  // MUON_MATH_CPU_ONEDNN_LIBRARY_H_
