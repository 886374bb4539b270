/*
 * libmuon: the Muon optimizer behind a stable C ABI.
 *
 * This header, with its sections (included at its end, in order:
 * muon_options.h, muon_optimizer.h, muon_comm.h, muon_state.h), is the single
 * source of truth for the library's behaviour. It is pure C99 and includes
 * only <stddef.h>, <stdint.h>, DLPack's header and its sections. Include
 * <libmuon/muon.h>; a section alone refuses to compile.
 *
 * ---------------------------------------------------------------------------
 * Conventions
 * ---------------------------------------------------------------------------
 * - Every fallible call returns a muon_status_t. MUON_OK is 0; other codes
 *   follow absl::StatusCode numbering. muon_status_string() gives static text
 *   for a code; muon_last_error_message() gives the detail of the last failed
 *   call on the calling thread, naming the parameter and the cause.
 * - On error nothing changes: out-parameters are untouched, nothing is
 *   half-registered. The one exception is muon_step once momentum updates
 *   began: see there (poisoning, outcome agreement).
 * - Handles are pointers to incomplete structs. muon_destroy accepts NULL.
 * - Extensible structs start with `size_t struct_size`, only grow at the end,
 *   are passed by pointer, and are filled with defaults by their *_init
 *   function (usable from ctypes/cffi, which cannot expand macros).
 *   struct_size must be the sizeof the struct had in some released header:
 *     muon_options_t        104 (0.1), 144 (0.2), 152 (0.4), 184 (0.5), 200 (0.6),
 *                           240 (0.7)
 *     muon_param_options_t  24 (0.1), 56 (0.2), 88 (0.7)
 *     muon_stats_t          80 (0.2), 96 (0.4), 128 (0.5)
 *     muon_custom_layout_t  56 (0.2)
 *     muon_comm_t           72 (0.2)
 *     muon_qk_clip_layer_t  96 (0.7)
 *   (LP64 sizes), or larger than this header's sizeof and a multiple of 8 (a
 *   newer header's struct: the fields this library does not know are not
 *   read, and *_init zeroes them). Any other size is refused with
 *   MUON_INVALID_ARGUMENT naming the struct, the size and the accepted
 *   sizes, before anything is read or written. A struct of an older
 *   version is read as that version (the fields it lacks take their
 *   defaults), and neither the library's *_init nor any call that fills a
 *   struct (muon_get_options, muon_get_stats) writes a byte past
 *   struct_size.
 * - Dimensions and offsets are int64_t, counts and byte sizes are size_t.
 *   Strings are UTF-8; a string passed in is copied before the call returns;
 *   a string handed out is owned by the library (see each function).
 *
 * Threading: one optimizer handle is used by one thread at a time (calls on the
 * same handle must not overlap). Distinct handles are fully independent. The
 * library keeps no hidden global state besides the thread-local error message.
 *
 * Tensors arrive as borrowed `const DLTensor*`. The library keeps the data
 * pointers (not the DLTensor structs themselves, which may be temporaries):
 * the storage of every registered parameter and gradient must stay valid and
 * unmoved until the optimizer is destroyed. The host writes gradients in place
 * before each muon_step; the library updates parameters in place. A tensor is
 * refused (MUON_INVALID_ARGUMENT, naming it) when its device code is none of
 * kDLCPU, kDLCUDA, kDLCUDAHost (read as an integer, whatever the host wrote),
 * its strides are not row-major contiguous, its byte size does not fit in 64
 * bits (the shape is named), or its data pointer is NULL while it has
 * elements or a nonzero byte_offset.
 *
 * Devices and streams: parameters may be host tensors (kDLCPU, or pinned
 * kDLCUDAHost) or CUDA tensors (kDLCUDA). The first registered parameter picks
 * the optimizer's device; every later one must be on the same device (one
 * optimizer per GPU). CUDA tensors are computed on that GPU by the plugin
 * libmuon_cuda.so, which libmuon.so loads at the first CUDA registration
 * from, in order: the path in the environment variable MUON_CUDA_PLUGIN, the
 * directory of libmuon.so, the dynamic loader's search path. libmuon.so itself
 * links no CUDA library; when the plugin or a usable GPU is missing, the
 * registration fails with MUON_UNAVAILABLE saying why and nothing changes.
 * On a GPU:
 *   - muon_step enqueues its work on `stream` (a cudaStream_t; NULL is the
 *     legacy default stream) and returns without waiting for the device. The
 *     gradients must be ready in stream order on `stream`; the parameters are
 *     updated in stream order on it. The communicators receive the same
 *     stream and device buffers (the NCCL adapter enqueues on it).
 *   - Device memory (momentum at registration, the step's buffers at the
 *     first step) is allocated once; later steps allocate nothing. The first
 *     step also waits for the device once (setup).
 *   - The CUDA device is made current for each call and the caller's current
 *     device is restored, so any thread may call.
 *   - The MUON_REPLICATED_ZERO2 mode and the custom path take host tensors only
 *     in this version (MUON_UNIMPLEMENTED for CUDA tensors).
 * For host tensors `stream` is only handed to the communicators (pass NULL).
 *
 * Host math and the environment (read when an optimizer first orthogonalizes;
 * docs/cpu.md): MUON_CPU_THREADS and OMP_NUM_THREADS
 * set the threads; MUON_CPU_BF16 = auto | amx | avx512_bf16 | onednn | emulated
 * picks the engine of bf16 Newton-Schulz (auto: libmuon's AMX kernel on AMX
 * CPUs, its AVX512-BF16 kernel on AMD's AVX512-BF16 CPUs, else fp32 products
 * rounded to bf16); MUON_CPU_FP32 = auto | avx512 | openblas picks the engine of
 * the fp32 products (auto: libmuon's AVX-512 kernel where the CPU has AVX-512,
 * whatever OpenBLAS's core, else OpenBLAS); MUON_CPU_ISA = amx |
 * avx512_bf16 | avx512 | avx2 | baseline caps the CPU features libmuon uses.
 * A value not listed, or an engine this CPU cannot run, fails the first
 * Newton-Schulz that needs it (muon_step or
 * muon_orthogonalize) with MUON_FAILED_PRECONDITION or MUON_INVALID_ARGUMENT
 * naming the setting and the fix; nothing is stepped.
 */
#ifndef LIBMUON_MUON_H_
#define LIBMUON_MUON_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MUON_API __declspec(dllexport)
#elif defined(__GNUC__)
#define MUON_API __attribute__((visibility("default")))
#else
#define MUON_API
#endif

/* This header's version (CHANGELOG.md). A MINOR adds functions, enum values
 * and struct fields at their struct's end (read through struct_size), so a
 * caller built against an older header of the same MAJOR keeps working; while
 * MAJOR is 0 a MINOR may also remove what the previous one marked deprecated
 * (named in CHANGELOG.md). A PATCH changes no declaration. A new MAJOR may
 * break the ABI. */
#define MUON_VERSION_MAJOR 0
#define MUON_VERSION_MINOR 7
#define MUON_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

/* Numbered like absl::StatusCode. */
typedef enum muon_status_t {
  MUON_OK = 0,
  MUON_CANCELLED = 1,
  MUON_UNKNOWN = 2,
  MUON_INVALID_ARGUMENT = 3,
  MUON_NOT_FOUND = 5,
  MUON_ALREADY_EXISTS = 6,
  MUON_RESOURCE_EXHAUSTED = 8, /* out of memory */
  MUON_FAILED_PRECONDITION = 9,
  MUON_OUT_OF_RANGE = 11,
  MUON_UNIMPLEMENTED = 12,
  MUON_INTERNAL = 13,
  MUON_UNAVAILABLE = 14,
  /* Not codes: they make every int32 a value of the type (the enum is int32
   * wide), so that a status a host callback returns outside the list above
   * is no undefined value on the C++ side; libmuon reads such a status as
   * MUON_UNKNOWN and never returns one. */
  MUON_STATUS_RANGE_MIN_ = -2147483647 - 1,
  MUON_STATUS_RANGE_MAX_ = 2147483647
} muon_status_t;

/* Static text for a status code ("OK", "INVALID_ARGUMENT", ...). Never NULL.
 * Defined for any value of the enum's integer type: a number the header does
 * not declare gives "UNRECOGNIZED_STATUS". */
MUON_API const char* muon_status_string(muon_status_t status);

/* Detail of the last failed call on this thread, "" if the last call on this
 * thread succeeded. Owned by the library; valid until the next libmuon call on
 * the same thread. Never NULL. */
MUON_API const char* muon_last_error_message(void);

/* The library's version (which may be newer than MUON_VERSION_* of the header
 * a program was compiled with). Any argument may be NULL. */
MUON_API void muon_get_version(int32_t* major, int32_t* minor, int32_t* patch);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The sections, in order (each opens its own extern "C" block). */
#include "libmuon/muon_options.h"
#include "libmuon/muon_optimizer.h"
#include "libmuon/muon_comm.h"
#include "libmuon/muon_state.h"

#endif /* LIBMUON_MUON_H_ */
