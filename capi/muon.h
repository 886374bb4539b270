/*
 * libmuon: the Muon optimizer behind a stable C ABI.
 *
 * This header is the single source of truth for the library's behaviour. It is
 * pure C99 and includes only <stddef.h>, <stdint.h> and DLPack's header.
 *
 * ---------------------------------------------------------------------------
 * Conventions
 * ---------------------------------------------------------------------------
 * - Every fallible call returns a muon_status_t. MUON_OK is 0; other codes
 *   follow absl::StatusCode numbering. muon_status_string() gives static text
 *   for a code; muon_last_error_message() gives the detail of the last failed
 *   call on the calling thread, naming the parameter and the cause.
 * - On error nothing changes: out-parameters are untouched, nothing is
 *   half-registered, and a failed muon_step leaves parameters and optimizer
 *   state as they were before the call.
 * - Handles are pointers to incomplete structs. muon_destroy accepts NULL.
 * - Extensible structs start with `size_t struct_size`, only grow at the end,
 *   are passed by pointer, and are filled with defaults by their *_init
 *   function (usable from ctypes/cffi, which cannot expand macros).
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
 * before each muon_step; the library updates parameters in place.
 *
 * Devices and streams: this version computes on the CPU (kDLCPU tensors). The
 * `stream` argument of muon_step is reserved for stream-ordered GPU work and
 * is ignored for CPU tensors (pass NULL). Tensors on any other device are
 * refused at registration.
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

#define MUON_VERSION_MAJOR 0
#define MUON_VERSION_MINOR 1
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
  MUON_UNAVAILABLE = 14
} muon_status_t;

/* Static text for a status code ("OK", "INVALID_ARGUMENT", ...). Never NULL. */
MUON_API const char* muon_status_string(muon_status_t status);

/* Detail of the last failed call on this thread, "" if the last call on this
 * thread succeeded. Owned by the library; valid until the next libmuon call on
 * the same thread. Never NULL. */
MUON_API const char* muon_last_error_message(void);

/* The library's version (which may be newer than MUON_VERSION_* of the header
 * a program was compiled with). Any argument may be NULL. */
MUON_API void muon_get_version(int32_t* major, int32_t* minor, int32_t* patch);

/* ------------------------------------------------------------------------ */
/* Optimizer options                                                         */
/* ------------------------------------------------------------------------ */

/* How the learning rate is scaled by the matrix shape (A rows, B columns of
 * the matrix view). The decoupled weight decay always uses the unadjusted lr. */
typedef enum muon_adjust_lr_t {
  MUON_ADJUST_LR_ORIGINAL = 0,        /* lr * sqrt(max(1, A / B)) (torch default) */
  MUON_ADJUST_LR_MATCH_RMS_ADAMW = 1, /* lr * 0.2 * sqrt(max(A, B)) */
  MUON_ADJUST_LR_NONE = 2             /* lr */
} muon_adjust_lr_t;

/* The dtype Newton-Schulz computes in. BF16 mirrors torch.optim.Muon: the
 * input is rounded to bf16 and every product is rounded to bf16 (fp32
 * accumulation). FP32 keeps everything in fp32. */
typedef enum muon_ns_dtype_t {
  MUON_NS_DTYPE_BF16 = 0,
  MUON_NS_DTYPE_FP32 = 1
} muon_ns_dtype_t;

/* Where the Newton-Schulz coefficients of each iteration come from. */
typedef enum muon_ns_coefficients_t {
  /* (ns_a, ns_b, ns_c) at every iteration (torch.optim.Muon). */
  MUON_NS_COEFFICIENTS_FIXED = 0,
  /* ns_table[3*i .. 3*i+2] is (a, b, c) of iteration i; ns_table_rows rows.
   * Iterations past the last row reuse the last row. The table is copied. */
  MUON_NS_COEFFICIENTS_TABLE = 1,
  /* The built-in Polar Express table (degree-5 polynomials, one per
   * iteration); iterations past its end reuse its last row. */
  MUON_NS_COEFFICIENTS_POLAR_EXPRESS = 2
} muon_ns_coefficients_t;

typedef struct muon_options_t {
  size_t struct_size;     /* sizeof(muon_options_t), set by muon_options_init */
  double lr;              /* learning rate, >= 0. Default 1e-3 */
  double weight_decay;    /* decoupled weight decay, >= 0. Default 0.1 */
  double momentum;        /* momentum mu in [0, 1). Default 0.95 */
  int32_t nesterov;       /* nonzero: Nesterov momentum. Default 1 */
  int32_t ns_steps;       /* Newton-Schulz iterations, 0 <= ns_steps < 100. Default 5 */
  double ns_a;            /* fixed coefficients. Default (3.4445, -4.7750, 2.0315) */
  double ns_b;
  double ns_c;
  double eps;             /* norm clamp, > 0. Default 1e-7 */
  int32_t ns_coefficients; /* muon_ns_coefficients_t. Default FIXED */
  int32_t ns_table_rows;   /* rows in ns_table (TABLE only), >= 1 */
  const double* ns_table;  /* ns_table_rows x 3, row-major (TABLE only); copied */
  int32_t adjust_lr;       /* muon_adjust_lr_t. Default ORIGINAL */
  int32_t ns_dtype;        /* muon_ns_dtype_t. Default BF16 */
  /* Nonzero: keep momentum buffers in fp32 whatever the gradient dtype.
   * Zero (default): momentum has the gradient's dtype, as in torch. */
  int32_t momentum_fp32;
  int32_t reserved0;       /* must be 0 */
} muon_options_t;

/* Fills *options with the defaults above and sets struct_size. `struct_size`
 * is the caller's sizeof(muon_options_t); it must be at least the size of the
 * first published version of the struct. */
MUON_API muon_status_t muon_options_init(muon_options_t* options, size_t struct_size);

/* sizeof the structs as this library build sees them (for binding checks). */
MUON_API size_t muon_sizeof_options(void);
MUON_API size_t muon_sizeof_param_options(void);

/* ------------------------------------------------------------------------ */
/* Optimizer                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct muon_optimizer muon_optimizer_t;

/* Creates an optimizer. `options` is copied (including ns_table). On success
 * *out receives a handle to release with muon_destroy. */
MUON_API muon_status_t muon_create(const muon_options_t* options, muon_optimizer_t** out);

/* Releases the optimizer and all its state. Accepts NULL. Parameter storage
 * stays the host's. */
MUON_API void muon_destroy(muon_optimizer_t* opt);

/* Current options, as set at creation and by the setters below. out->struct_size
 * must be set by the caller (muon_options_init does it); ns_table is NULL in the
 * copy handed out. */
MUON_API muon_status_t muon_get_options(const muon_optimizer_t* opt, muon_options_t* out);

/* Hyper-parameter changes between steps (LR schedules). They apply from the
 * next muon_step on. Same validity rules as the options. */
MUON_API muon_status_t muon_set_lr(muon_optimizer_t* opt, double lr);
MUON_API muon_status_t muon_set_weight_decay(muon_optimizer_t* opt, double weight_decay);
MUON_API muon_status_t muon_set_momentum(muon_optimizer_t* opt, double momentum);

/* ------------------------------------------------------------------------ */
/* Parameters                                                                */
/* ------------------------------------------------------------------------ */

/* How an N-D parameter is seen as one or more matrices. */
typedef enum muon_matrix_view_t {
  /* 2-D parameters only: the parameter is the matrix. */
  MUON_MATRIX_VIEW_2D = 0,
  /* (d0, d1, ..., dk) -> one (d0, d1*...*dk) matrix, e.g. conv filters. */
  MUON_MATRIX_VIEW_FLATTEN_TRAILING = 1,
  /* (n, d1, ..., dk) -> n matrices of (d1, d2*...*dk), e.g. stacked experts;
   * each slice is orthogonalized on its own. */
  MUON_MATRIX_VIEW_BATCHED_LEADING = 2
} muon_matrix_view_t;

typedef struct muon_param_options_t {
  size_t struct_size;   /* sizeof(muon_param_options_t), set by muon_param_options_init */
  const char* name;     /* optional, UTF-8, copied; used in error messages */
  int32_t matrix_view;  /* muon_matrix_view_t. Default 2D */
  int32_t reserved0;    /* must be 0 */
} muon_param_options_t;

MUON_API muon_status_t muon_param_options_init(muon_param_options_t* options,
                                               size_t struct_size);

/* Registers a parameter and its gradient. Both are borrowed (see above) and
 * must: live on the CPU (kDLCPU); have the same shape and the same dtype, one
 * of float32, bfloat16 or float16; be row-major contiguous (strides NULL or
 * compact; any stride is accepted on dimensions of size 1); have at least two
 * dimensions (0-D and 1-D parameters belong to AdamW), and exactly two unless
 * a matrix view is chosen in `options`. `options` may be NULL (defaults; the
 * parameter is named "param<id>"). Registration is closed by the first
 * muon_step: later registrations fail with MUON_FAILED_PRECONDITION. On
 * success *param_id receives the parameter's id: 0, 1, 2, ... in order of
 * registration. The momentum buffer starts at zero. */
MUON_API muon_status_t muon_register_param(muon_optimizer_t* opt, const DLTensor* param,
                                           const DLTensor* grad,
                                           const muon_param_options_t* options,
                                           int64_t* param_id);

/* Number of registered parameters. */
MUON_API muon_status_t muon_num_params(const muon_optimizer_t* opt, size_t* count);

/* One optimizer step over every registered parameter, reading the gradients'
 * current contents:
 *   B <- lerp(B, g, 1 - momentum)
 *   U <- nesterov ? lerp(g, B, momentum) : B
 *   O <- NewtonSchulz(U)           (per matrix of the matrix view)
 *   p <- p * (1 - lr * weight_decay)
 *   p <- p - adjusted_lr * O
 * `stream` is ignored for CPU tensors (pass NULL). Fails with
 * MUON_FAILED_PRECONDITION when no parameter is registered. On failure no
 * parameter or state has been changed. */
MUON_API muon_status_t muon_step(muon_optimizer_t* opt, void* stream);

/* Number of completed steps. */
MUON_API muon_status_t muon_step_count(const muon_optimizer_t* opt, int64_t* count);

/* ------------------------------------------------------------------------ */
/* State (checkpoint and resume)                                             */
/* ------------------------------------------------------------------------ */

/* The dtype of a parameter's momentum buffer (the gradient's, or float32 with
 * momentum_fp32). The buffer has the parameter's shape. */
MUON_API muon_status_t muon_get_state_dtype(const muon_optimizer_t* opt, int64_t param_id,
                                            DLDataType* dtype);

/* Copies a parameter's momentum buffer into `dst`, a host-owned CPU tensor of
 * the parameter's shape and the state dtype (contiguous). */
MUON_API muon_status_t muon_get_state(const muon_optimizer_t* opt, int64_t param_id,
                                      const DLTensor* dst);

/* Overwrites a parameter's momentum buffer from `src` (same rules as dst). */
MUON_API muon_status_t muon_set_state(muon_optimizer_t* opt, int64_t param_id,
                                      const DLTensor* src);

/* Whole-optimizer state as one self-describing byte blob: a header, the step
 * count, and for every parameter its name, shape, dtype and momentum bytes.
 * With buffer == NULL, *size receives the bytes needed. Otherwise `capacity`
 * must be at least that and *size receives the bytes written. Hyper-parameters
 * are not part of the blob (the host owns its schedule). */
MUON_API muon_status_t muon_save_state(const muon_optimizer_t* opt, void* buffer,
                                       size_t capacity, size_t* size);

/* Restores a blob written by muon_save_state into an optimizer that has the
 * same parameters registered in the same order (same shapes, dtypes and
 * state dtypes). Validates the whole blob before changing anything. A
 * resumed optimizer continues bit for bit like the one that saved. */
MUON_API muon_status_t muon_load_state(muon_optimizer_t* opt, const void* buffer, size_t size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LIBMUON_MUON_H_ */
