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
 * rounded to bf16); MUON_CPU_ISA = amx | avx512_bf16 | avx512 | avx2 | baseline
 * caps the CPU features libmuon uses. A value not listed, or an engine this
 * CPU cannot run, fails the first bf16 Newton-Schulz (muon_step or
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

/* ------------------------------------------------------------------------ */
/* Optimizer options                                                         */
/* ------------------------------------------------------------------------ */

/* How the learning rate is scaled by the matrix shape (A rows, B columns of
 * the matrix view). The decoupled weight decay always uses the unadjusted lr. */
typedef enum muon_adjust_lr_t {
  MUON_ADJUST_LR_ORIGINAL = 0,        /* lr * sqrt(max(1, A / B)) (torch default) */
  MUON_ADJUST_LR_MATCH_RMS_ADAMW = 1, /* lr * 0.2 * sqrt(max(A, B)) */
  MUON_ADJUST_LR_NONE = 2,            /* lr */
  MUON_ADJUST_LR_SPECTRAL_UNCLAMPED = 3 /* lr * sqrt(A / B) (0.3) */
} muon_adjust_lr_t;

/* The dtype Newton-Schulz computes in. BF16 mirrors torch.optim.Muon: the
 * input is rounded to bf16 and every product is rounded to bf16 (fp32
 * accumulation). FP32 keeps everything in fp32. FP16 (0.7; CPU backend
 * only so far) normalizes in fp32, then rounds the input and every product
 * to fp16 (fp32 accumulation), as gram-newton-schulz does: fp16 keeps 3
 * more bits than bf16 where the normalized values live. */
typedef enum muon_ns_dtype_t {
  MUON_NS_DTYPE_BF16 = 0,
  MUON_NS_DTYPE_FP32 = 1,
  MUON_NS_DTYPE_FP16 = 2
} muon_ns_dtype_t;

/* How the iterations are computed (0.7). GRAM: Gram Newton-Schulz (Dao-AILab's
 * gram-newton-schulz): for the wide orientation W (m x n, m < n) the
 * iterations run on R = W W^T (m x m) and accumulate the polynomial Q that
 * W is multiplied by at the end, X = Q W; at each restart iteration
 * (ns_gram_restarts) W = Q W and R are formed afresh, which bounds the
 * round-off the chain of m x m products gathers. The same polynomial as
 * STANDARD, with m x m products in place of two m x n ones per iteration:
 * fewer FLOPs where n / m is large. A square matrix runs STANDARD. CPU
 * backend only so far; not with MUON_ASSIGNMENT_SPLIT. */
typedef enum muon_ns_algorithm_t {
  MUON_NS_STANDARD = 0,
  MUON_NS_GRAM = 1
} muon_ns_algorithm_t;

/* Where the Newton-Schulz coefficients of each iteration come from. */
typedef enum muon_ns_coefficients_t {
  /* (ns_a, ns_b, ns_c) at every iteration (torch.optim.Muon). */
  MUON_NS_COEFFICIENTS_FIXED = 0,
  /* ns_table[3*i .. 3*i+2] is (a, b, c) of iteration i; ns_table_rows rows.
   * Iterations past the last row reuse the last row. The table is copied. */
  MUON_NS_COEFFICIENTS_TABLE = 1,
  /* The built-in Polar Express table (degree-5 polynomials, one per
   * iteration); iterations past its end reuse its last row. */
  MUON_NS_COEFFICIENTS_POLAR_EXPRESS = 2,
  /* ---- 0.6: the schedules of Emerging-Optimizers (NVIDIA-NeMo), value for
   * value (4 decimals; cubic5 7) ---- */
  /* CANS, Chebyshev-accelerated (arXiv 2506.10935): 5 rows, the last reused
   * past them: (8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806),
   * (3.9619, -2.9541, 0.5630), (3.2866, -2.4647, 0.5074),
   * (2.2737, -1.6447, 0.4162). Any ns_steps. */
  MUON_NS_COEFFICIENTS_CANS = 3,
  /* DeepSeek-V4's hybrid: 8 x (3.4445, -4.7750, 2.0315), then
   * 2 x (2, -1.5, 0.5). ns_steps must be 10 (fewer would drop the two
   * finishing rows: INVALID_ARGUMENT naming ns_steps). */
  MUON_NS_COEFFICIENTS_DEEPSEEK_V4 = 4,
  /* The relaxed cubic schedule (c = 0): (3.3656576, -3.3420992),
   * (2.5744352, -1.4957376), (2.5368962, -1.4312570),
   * (2.4418906, -1.2764040), (2.2230472, -0.9630650). ns_steps must be 5.
   * A cubic iteration, this one's or any with c == 0 (FIXED, TABLE), runs
   * two products, X' = a X + b (X X^T) X, instead of three. */
  MUON_NS_COEFFICIENTS_CUBIC5 = 5,
  /* ---- 0.7 ---- */
  /* AOL: flash-newton-schulz's fit for pre-scaled input (Emerging-Optimizers'
   * "aol" rows): (4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959),
   * (2.7573, -3.2939, 1.4254), (2.7215, -3.0494, 1.3169); ns_steps must be
   * 4. Instead of the division by the Frobenius norm, each row i of the
   * matrix's wide orientation W (m x n, m <= n; a tall matrix's columns) is
   * scaled by 1 / sqrt(max(sum_j |(W W^T)_ij|, eps)) (AOL's bound: spectral
   * norm <= 1, and closer to orthogonal), computed in fp32 products and
   * double sums, then rounded to ns_dtype. One m x m x n product more than
   * the division. CPU backend only so far; ns_algorithm STANDARD only; not
   * with MUON_ASSIGNMENT_SPLIT. */
  MUON_NS_COEFFICIENTS_AOL = 6
} muon_ns_coefficients_t;

/* Who orthogonalizes each matrix (distributed engine). Every choice gives
 * each matrix to exactly one rank; all but SPREAD name only ranks that hold
 * a piece of the matrix. */
typedef enum muon_assignment_t {
  /* Greedy, largest Newton-Schulz cost first, to the least loaded holder. */
  MUON_ASSIGNMENT_BALANCED = 0,
  /* Matrix i (in the global order) to holder i mod (number of holders). */
  MUON_ASSIGNMENT_ROUND_ROBIN = 1,
  /* options->assign_fn decides. */
  MUON_ASSIGNMENT_CUSTOM = 2,
  /* BALANCED, then levelled within each group of ranks that matrices join
   * (ranks holding pieces of one matrix are joined: with pipeline stages a
   * group is a stage): while the group's busiest rank does more than 1.01x
   * the group's mean Newton-Schulz work and a move lowers it, it hands one
   * matrix to the group's least-loaded rank, which may hold none of it. Such
   * an owner receives the matrix's whole gradient and sends its whole update
   * back, so this trades bytes for balance: it pays where owners are forced
   * onto their holders (experts held by one EP rank each, with dense matrices
   * on top of some ranks) and the links are fast. Results are bit-identical
   * to BALANCED's. */
  MUON_ASSIGNMENT_SPREAD = 3,
  /* SPREAD, then, within each group of at least 4 matrices per rank (with
   * fewer, the sums below would move more than the exchange), costliest
   * first, a matrix that alone costs more than 1.01x the group's mean is
   * split over its owner and the group's least-loaded ranks (the fewest
   * whose parts come under the mean), and the whole matrices are levelled
   * again around the parts: each member gathers one block of the
   * matrix's wide orientation (a range of a tall matrix's rows, of a wide
   * one's columns), and the members orthogonalize it together, summing the
   * squares for its norm and, each iteration, their m x m Gram products
   * (2 all_to_all_v calls over the world per sum, every rank taking part;
   * each Gram sum moves about 2 m^2 fp32 values per member) before each
   * computes the polynomial. The split matrices run in a last round of
   * their own, a rank taking at most one part. Results equal the whole
   * matrix's up to the order of fp32 sums (bf16: rounded as the emulated
   * path rounds). Pays where one matrix bounds a stage's Newton-Schulz time
   * and the members share fast links (docs/SETUP_AT_SCALE.md); CPU backend
   * only so far (on a GPU the first step fails with MUON_UNIMPLEMENTED
   * when a matrix is split). */
  MUON_ASSIGNMENT_SPLIT = 4
} muon_assignment_t;

/* One matrix of the job, as the custom assignment sees it. Matrices are
 * ordered by parameter name, then by index within the parameter's matrix
 * view; matrices without elements are not listed (nothing is done for
 * them). Pointers are valid during the callback only. */
typedef struct muon_matrix_info_t {
  const char* param_name;
  int64_t index;            /* matrix index within the parameter (batched views) */
  int64_t rows;
  int64_t cols;
  double ns_flops;          /* cost of one orthogonalization */
  const int32_t* holders;   /* world ranks holding a piece, ascending */
  int32_t num_holders;
  int32_t reserved0;
} muon_matrix_info_t;

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
  /* ---- 0.2: distributed engine (ignored without a world communicator) ---- */
  int32_t assignment;      /* muon_assignment_t: who orthogonalizes each matrix. Default BALANCED */
  int32_t prefetch_count;  /* rounds whose exchange runs ahead of the math, >= 0. Default 1 */
  /* Nonzero (default): every owner computes in the same round. Zero with
   * prefetch_count 0: one matrix at a time in a fixed order (debug mode).
   * Results are bit-identical for every setting. */
  int32_t async_parallelism;
  int32_t reserved1;       /* must be 0 */
  /* Upper bound of the fp32 working memory one round may gather on a rank,
   * in bytes (0: 256 MiB; at most INT64_MAX). A matrix larger than this still
   * goes, alone. */
  size_t round_bytes;
  /* MUON_ASSIGNMENT_CUSTOM only: called once, at the first step, on every
   * rank with the same table; must write owners[i] (a world rank that holds
   * matrix i) for every i and return MUON_OK. The same answer is required on
   * every rank (checked). */
  muon_status_t (*assign_fn)(void* assign_state, size_t num_matrices,
                             const struct muon_matrix_info_t* matrices, int32_t* owners);
  void* assign_state;
  /* ---- 0.4 ---- */
  /* Non-finite gradients (NaN, +-Inf). Zero (default): stepped as torch does:
   * the momentum of an element that saw one becomes non-finite for good, and
   * Newton-Schulz spreads it over the matrix; muon_stats_t.nonfinite_grads
   * counts them (in the momentum pass, no extra pass). Nonzero: before the
   * step changes anything, every rank counts its gradients' non-finite
   * elements (one read of the gradients) and the ranks agree on the counts
   * (one all_gather of 8 bytes per rank); if any rank saw one, every rank
   * skips the step: MUON_OK, nothing changes, the step count stays and
   * muon_stats_t.steps_skipped grows, as mixed-precision training skips an
   * overflowing step. On a GPU the count is a kernel, and the host waits
   * for it (one wait per step, as a mixed-precision scaler's check of its
   * inf flag). Must be the same on every rank. */
  int32_t skip_nonfinite;
  /* ---- 0.5 ---- */
  /* The optimizer's own memory (momentum, update and exchange buffers, the
   * Newton-Schulz workspace, the copy descriptors, a custom-path owner's
   * copy of its matrix) from the host's allocator,
   * e.g. a framework's caching allocator; both NULL (default): the library's
   * own (cudaMalloc, calloc). allocate(ctx, bytes, device_type, device_id,
   * stream) returns memory of that device (DLPack type and id: kDLCUDA and
   * the GPU, or kDLCPU; pinned host memory serves kDLCPU too) or NULL when
   * short (the call that needed it then fails with MUON_RESOURCE_EXHAUSTED
   * naming the buffer). Every block must be aligned to at least 64 bytes
   * (the library's kernels rely on it): one that is not is handed back to
   * release at once, and the call that needed it fails with
   * MUON_INVALID_ARGUMENT naming the hook, the buffer, the block's address
   * and its alignment (cudaMalloc's blocks are 256-byte aligned; on the host
   * use aligned_alloc or posix_memalign: malloc's 16 bytes are not enough).
   * release(ctx, ptr, bytes, device_type, device_id, stream) takes it back.
   * Both are called on the thread of the libmuon call that allocates
   * (registration, the first step, muon_destroy), with the device current
   * and the stream the optimizer has then (NULL before its first step),
   * ordered on it: a stream-ordered allocator may reuse memory in stream
   * order. Set both or neither. ctx is handed back as is. */
  void* (*allocate)(void* ctx, size_t bytes, int32_t device_type, int32_t device_id,
                    void* stream);
  void (*release)(void* ctx, void* ptr, size_t bytes, int32_t device_type, int32_t device_id,
                  void* stream);
  void* allocator_ctx;
  /* Nonzero: each parameter's update lives in its gradient's own memory
   * between the momentum and the apply, instead of an update buffer per
   * parameter in the Newton-Schulz dtype (2 bytes per parameter element less
   * with ns_dtype BF16, 4 with FP32: the optimizer's memory is
   * then momentum plus one exchange round's working set). The gradients'
   * contents after muon_step are the step's orthogonalized updates (rounded
   * to the gradient's dtype, which holds them exactly: registration refuses
   * a gradient that cannot, i.e. float16 ones, and bfloat16 ones unless the
   * momentum and ns_dtype are bfloat16). After the first step a parameter
   * must keep its gradient storage (muon_rebind_param refuses another) and
   * always have one. Custom-path and MUON_REPLICATED_ZERO2 parameters keep
   * their buffer. Zero (default): gradients are only read, as torch's. */
  int32_t update_in_grad;
  /* ---- 0.6 ---- */
  /* Multiplies every Muon update after the lr adjustment (Emerging-Optimizers'
   * extra_scale_factor): param <- param - lr * adjust_lr(A, B) * update_scale
   * * update. Weight decay keeps the plain lr. Finite, >= 0. Default 1.0. An
   * update RMS target such as DeepSeek-V4's 0.18: MATCH_RMS_ADAMW (RMS 0.2)
   * with update_scale 0.9. Must be the same on every rank (checked). */
  double update_scale;
  /* Nonzero: cautious weight decay (arXiv 2510.12402, as Dion and
   * Emerging-Optimizers ship it): an element decays only where its update
   * and its value have the same sign (update * param >= 0; the update is
   * what param - lr * ... * update subtracts). Zero (default): every element
   * decays, as torch. Must be the same on every rank (checked). */
  int32_t cautious_wd;
  int32_t reserved2;       /* must be 0 */
  /* ---- 0.7 ---- */
  /* Nonzero: NorMuon (arXiv 2510.05491). The owner of each matrix keeps a
   * second moment per row of its orthogonalized update O (fp32, `rows`
   * values per matrix of the parameter's matrix view) and, after
   * Newton-Schulz, replaces O by its rows normalized with their norm kept:
   *   s_i = sum_j O_ij^2;  v_i <- v_i + (1 - normuon_beta2) (s_i / cols - v_i)
   *   d_i = sqrt(v_i) + normuon_eps
   *   O_ij <- O_ij / d_i * |O|_F / max(|O / d|_F, normuon_eps)
   * in double, v stored as fp32 and the result rounded to ns_dtype
   * (muon/math/normuon.h). This is Dion's NorMuon; Emerging-Optimizers'
   * AdaptiveMuon("normuon") normalizes the longer side and keeps no norm.
   * The lr adjustment, update_scale and weight decay apply after it as for
   * Muon. The moments are part of the state blob (format 3) on the rank
   * that owns each matrix. CPU backend only so far (on a GPU the first step
   * fails with MUON_UNIMPLEMENTED); not with MUON_ASSIGNMENT_SPLIT (refused
   * by muon_create). Zero (default): Muon. Must be the same on every rank,
   * as must the two below (checked). */
  int32_t normuon;
  int32_t reserved3;       /* must be 0 */
  double normuon_beta2;    /* the moments' decay, in [0, 1). Default 0.95 */
  double normuon_eps;      /* added to each row's root, finite, > 0. Default 1e-8 */
  int32_t ns_algorithm;    /* muon_ns_algorithm_t. Default STANDARD */
  /* Nonzero: a guard against non-finite updates (Dion's NaN guard). Each
   * owner counts the non-finite values of the updates it orthogonalized
   * (after NorMuon), and the ranks agree on the counts (one all_gather of 8
   * bytes per rank, after the step's outcome): if any rank saw one, no
   * parameter of any rank changes (the momentum keeps this step's
   * gradients, which were finite unless skip_nonfinite is off), the step
   * count grows and muon_stats_t.steps_skipped counts it. CPU backend only
   * so far; not with MUON_REPLICATED_ZERO2 parameters (their owners apply
   * inside the step): the first step fails naming the option. Zero
   * (default): a non-finite update is applied, as torch does. Must be the
   * same on every rank (checked). */
  int32_t skip_nonfinite_updates;
  /* GRAM: bit i restarts at iteration i (bit 0 has no effect: iteration 0
   * starts afresh). Default 1 << 2, gram-newton-schulz's. Must be the same
   * on every rank (checked), as ns_algorithm. */
  uint64_t ns_gram_restarts;
} muon_options_t;

/* Fills *options with the defaults above and sets struct_size. `struct_size`
 * is the caller's sizeof(muon_options_t), one of the sizes in "Conventions"
 * above; exactly that many bytes are written. */
MUON_API muon_status_t muon_options_init(muon_options_t* options, size_t struct_size);

/* sizeof the structs as this library build sees them (for binding checks). */
MUON_API size_t muon_sizeof_options(void);
MUON_API size_t muon_sizeof_param_options(void);
MUON_API size_t muon_sizeof_comm(void);
MUON_API size_t muon_sizeof_stats(void);
MUON_API size_t muon_sizeof_custom_layout(void);
MUON_API size_t muon_sizeof_gathered(void);
MUON_API size_t muon_sizeof_matrix_info(void);
MUON_API size_t muon_sizeof_placement(void);
/* (muon_sizeof_qk_clip_layer: see QK-Clip below.) */

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

/* Distributed layouts: how the global tensor is split down to this rank's
 * piece. Placements apply in order, from the global tensor to the local one;
 * each one is over a group (a communicator added with muon_add_group or the
 * world). Groups a parameter does not mention are independent for it: a
 * parameter registered on some ranks only (expert parallel, pipeline stages)
 * lives only there. */
typedef enum muon_placement_kind_t {
  /* Split dimension `dim` of the current tensor over the group's ranks. */
  MUON_PLACEMENT_SHARD = 0,
  /* This rank holds elements [start, start + length) of the current tensor's
   * row-major flattening (possibly empty): ZeRO, FSDP1 flat parameters,
   * Megatron's distributed optimizer. Other ranks' ranges must tile it. */
  MUON_PLACEMENT_FLAT_RANGE = 1,
  /* Every rank of the group holds the whole current tensor (DDP, CP, the
   * replicate dimension of HSDP). Group rank 0's copy is the one sent. */
  MUON_PLACEMENT_REPLICATE = 2
} muon_placement_kind_t;

typedef enum muon_split_t {
  MUON_SPLIT_EVEN = 0,   /* size divisible by the group size; equal parts */
  MUON_SPLIT_CHUNK = 1,  /* torch.chunk: ceil(size / n) each, tail short or empty */
  MUON_SPLIT_SIZES = 2   /* explicit sizes, one per group rank */
} muon_split_t;

typedef struct muon_placement_t {
  int32_t kind;          /* muon_placement_kind_t */
  int32_t group;         /* group id */
  int32_t dim;           /* SHARD: the dimension of the current tensor */
  int32_t split;         /* SHARD: muon_split_t */
  const int64_t* sizes;  /* SHARD with SPLIT_SIZES: group-size entries (copied) */
  int64_t start;         /* FLAT_RANGE: this rank's first element */
  int64_t length;        /* FLAT_RANGE: this rank's element count */
} muon_placement_t;

/* How a parameter replicated over a data-parallel group is stepped. */
typedef enum muon_replicated_mode_t {
  /* The host averaged the gradients (DDP); every replica keeps momentum and
   * receives the orthogonalized update. */
  MUON_REPLICATED_HOST_AVERAGED = 0,
  /* ZeRO-2 style: the placements must be exactly one REPLICATE over a group;
   * each rank passes its own (un-averaged) gradient. Same-shape parameters
   * are grouped; for each block of up to group-size of them, one
   * reduce_scatter averages the gradients (sum in group-rank order, then
   * divided by the group size) onto their owners (block-cyclic), each owner
   * keeps the momentum of its parameters only (1/N of the state), steps
   * them, and one all_gather hands the new values to every replica. */
  MUON_REPLICATED_ZERO2 = 1
} muon_replicated_mode_t;

typedef struct muon_param_options_t {
  size_t struct_size;   /* sizeof(muon_param_options_t), set by muon_param_options_init */
  /* UTF-8, copied; used in error messages. With a world communicator it is
   * the parameter's identity across ranks: required, and every rank holding
   * a piece of the parameter registers it under the same name. */
  const char* name;
  int32_t matrix_view;  /* muon_matrix_view_t. Default 2D */
  int32_t reserved0;    /* must be 0 */
  /* ---- 0.2: distributed layout ---- */
  /* The global tensor's shape (global_ndim entries, copied). global_ndim 0
   * (default): the local tensor is the whole parameter. */
  int32_t global_ndim;
  int32_t num_placements;
  const int64_t* global_shape;
  const muon_placement_t* placements;  /* num_placements entries, copied */
  /* muon_replicated_mode_t. Default HOST_AVERAGED. */
  int32_t replicated_mode;
  int32_t reserved1;    /* must be 0 */
  /* ---- 0.7: per-parameter multipliers (Megatron's lr_mult, wd_mult) ---- */
  /* The parameter steps with lr * lr_scale (the update: lr * lr_scale *
   * adjust_lr(A, B) * update_scale) and decays with weight_decay *
   * weight_decay_scale (and the plain lr). Finite, >= 0. Default 1.0 each.
   * With a world, every rank holding a piece registers the same values
   * (checked at the first step). weight_decay_scale other than 1 runs on
   * the CPU backend only so far (on a GPU the first step fails, naming it). */
  double lr_scale;
  double weight_decay_scale;
  /* Split blocks (Megatron-core's split_qkv, Dion's split sizes): each
   * matrix of the parameter (under its matrix view, of the global shape) is
   * orthogonalized as independent blocks, each normalized on its own with
   * NorMuon and lr-adjusted (adjust_lr) for its own shape. Along split_dim
   * (0: rows, 1: columns) the num_split_sizes sizes (copied) repeat with
   * period P = their sum, which must divide the matrix's extent there;
   * block j gathers the j-th piece of every period, in order. A fused QKV
   * [q + k + v, hidden]: sizes {q, k, v}. Megatron's GQA layout (per query
   * group: q_per_group * head_dim query rows, head_dim key rows, head_dim
   * value rows) is sizes {q_per_group * head_dim, head_dim, head_dim}: the
   * queries of every group form one block, as Megatron-core splits it. One
   * head per block: num_heads sizes of head_dim. Default 0 sizes: the whole
   * matrix. Every holder registers the same split (checked at the first
   * step). A split matrix's whole lives on one owner (never split over
   * ranks by MUON_ASSIGNMENT_SPLIT); its blocks run there one after
   * another. NorMuon's moments (muon_get_moments) are one per row of the
   * matrix for split_dim 0, and rows per block, block after block, for
   * split_dim 1. CPU backend only so far (on a GPU the first step fails,
   * naming the parameter). Bad sizes fail here with MUON_INVALID_ARGUMENT
   * naming the parameter and the size. */
  int32_t split_dim;
  int32_t num_split_sizes;
  const int64_t* split_sizes;
} muon_param_options_t;

MUON_API muon_status_t muon_param_options_init(muon_param_options_t* options,
                                               size_t struct_size);

/* Registers a parameter and its gradient. Both are borrowed (see above) and
 * must: live on the optimizer's device (see "Devices and streams" above; the
 * first parameter picks it); have the same shape and the same dtype, one
 * of float32, bfloat16 or float16; be row-major contiguous (strides NULL or
 * compact; any stride is accepted on dimensions of size 1); have at least two
 * dimensions (0-D and 1-D parameters belong to AdamW), and exactly two unless
 * a matrix view is chosen in `options`. `options` may be NULL (defaults; the
 * parameter is named "param<id>"). Registration is closed by the first
 * muon_step: later registrations fail with MUON_FAILED_PRECONDITION. On
 * success *param_id receives the parameter's id: 0, 1, 2, ... in order of
 * registration. The momentum buffer starts at zero.
 *
 * Matrices a declaration may ask for: a matrix view (of the global shape,
 * when one is given) declares matrices, and the first muon_step plans each
 * one that has elements (a few hundred bytes on every rank). A matrix
 * without elements (a zero row or column count) has an empty update: it is
 * not planned, moved or orthogonalized, costs nothing however many are
 * declared (a [2^32, 0, 3] BATCHED_LEADING parameter steps at once), and
 * counts in muon_stats_t.matrices_total but in no rank's matrices_owned
 * (nor in the custom assignment's table). One parameter may declare at most
 * 2^20 (1,048,576) matrices with elements: more is refused here with
 * MUON_INVALID_ARGUMENT naming the parameter, its shape and the count,
 * whatever this rank holds of it. A job may declare at most 2^22
 * (4,194,304) matrices with elements, every rank's parameters counted once
 * by name (custom-path and ZeRO-2 ones included): more fails the first
 * muon_step, on every rank and before anything is planned or changed, with
 * MUON_INVALID_ARGUMENT naming the parameter (in name order) at which the
 * count passes the cap; registration then stays open. */
MUON_API muon_status_t muon_register_param(muon_optimizer_t* opt, const DLTensor* param,
                                           const DLTensor* grad,
                                           const muon_param_options_t* options,
                                           int64_t* param_id);

/* The fully custom path, for layouts no placement list describes: the host
 * decides who orthogonalizes the matrix, gathers it there and hands the
 * pieces back, through callbacks that receive `state`. The parameter is one
 * global_rows x global_cols matrix (matrix_view is ignored); every rank that
 * holds a piece registers it under the same name (a world is required).
 * At each step, after momentum, the library calls on every rank that
 * registered it, in the order of parameter names:
 *   gather_fn: `local` holds this rank's update values (fp32, local_numel, in
 *     the local tensor's order). On the rank `owner`, the callback points
 *     out->data at the whole update matrix (fp32, row-major, host-owned, valid
 *     until redistribute_fn returns) and sets out->rows and out->cols; the
 *     library checks them against the registered shape and refuses a
 *     mismatch. Elsewhere it leaves `out` alone.
 *   redistribute_fn: on the owner, `full` holds the orthogonalized matrix;
 *     every rank writes its local_numel values into `local`.
 * Both are collective among the holders (the host's own communication) and
 * return MUON_OK or an error (with muon_set_callback_error for detail).
 * The declaration: global_rows and global_cols are at least 1; this rank's
 * piece has at most global_rows * global_cols elements; and the product is
 * at most (2^63 - 1) / 16 elements (the owner holds an fp32 copy of the
 * matrix and the Newton-Schulz workspace, 16 bytes per element, counted in
 * 64 bits); otherwise muon_register_param_custom fails with
 * MUON_INVALID_ARGUMENT naming the parameter. The owner's copy has the
 * declared size, however small the pieces: it is allocated once, at the
 * first muon_step, with the optimizer's other memory (through
 * muon_options_t.allocate when set, counted in muon_stats_t.memory_bytes);
 * when that fails, the first step fails on every rank before gather_fn or
 * redistribute_fn runs, changing nothing, with MUON_RESOURCE_EXHAUSTED
 * naming the parameter and the bytes. */
typedef struct muon_gathered_t {
  const float* data;
  int64_t rows;
  int64_t cols;
} muon_gathered_t;

typedef struct muon_custom_layout_t {
  size_t struct_size;     /* sizeof(muon_custom_layout_t) */
  void* state;            /* the host's, passed to every callback */
  int64_t global_rows;
  int64_t global_cols;
  /* The world rank that orthogonalizes the matrix, called once at the first
   * step on every holder; every holder must give the same rank, one of the
   * holders (checked). A negative return is an error (attach detail with
   * muon_set_callback_error); the step then fails on every rank. */
  int32_t (*assign_fn)(void* state, const char* param_name, int32_t world_size);
  muon_status_t (*gather_fn)(void* state, const float* local, int64_t local_numel,
                             int32_t owner, muon_gathered_t* out, void* stream);
  muon_status_t (*redistribute_fn)(void* state, const float* full, int64_t rows, int64_t cols,
                                   int32_t owner, float* local, int64_t local_numel,
                                   void* stream);
} muon_custom_layout_t;

/* Registers a parameter on the custom path (see above). `options` gives the
 * name (required); its layout fields must be unset. */
MUON_API muon_status_t muon_register_param_custom(muon_optimizer_t* opt, const DLTensor* param,
                                                  const DLTensor* grad,
                                                  const muon_param_options_t* options,
                                                  const muon_custom_layout_t* layout,
                                                  int64_t* param_id);

/* Points a registered parameter at new storage between steps (hosts whose
 * framework reallocates a tensor, e.g. torch's zero_grad(set_to_none=True)
 * followed by a fresh .grad). `param` and `grad` must have the registered
 * shape and dtype and follow the same rules as at registration (`param` and
 * `grad` may not share storage). `grad` may be
 * NULL without a world: the parameter is skipped by the next steps (no
 * momentum update, no change), as torch skips parameters without a gradient,
 * until a gradient is bound again. With a world every rank steps every
 * parameter, so NULL is refused. */
MUON_API muon_status_t muon_rebind_param(muon_optimizer_t* opt, int64_t param_id,
                                         const DLTensor* param, const DLTensor* grad);

/* Number of registered parameters. */
MUON_API muon_status_t muon_num_params(const muon_optimizer_t* opt, size_t* count);

/* One optimizer step over every registered parameter, reading the gradients'
 * current contents:
 *   B <- lerp(B, g, 1 - momentum)
 *   U <- nesterov ? lerp(g, B, momentum) : B
 *   O <- NewtonSchulz(U)           (per matrix of the matrix view)
 *   p <- p * (1 - lr * weight_decay)
 *   p <- p - adjusted_lr * O
 * `stream` is handed to the communicators (NULL for CPU tensors). With a
 * world, muon_step is collective: every rank of the world calls it, and the
 * first call runs a setup handshake that checks every rank registered
 * consistent parameters, layouts, groups and options (errors name the first
 * parameter or rank that differs, on every rank).
 * Fails with MUON_FAILED_PRECONDITION when no parameter is registered (with a
 * world: on no rank; registration then stays open, as before the call).
 * Fails with MUON_OUT_OF_RANGE, before anything changes, when the step
 * count is INT64_MAX - 1, the largest a state blob holds (one more step
 * could not be saved and loaded again); it calls no collective, so with a
 * world every rank refuses alike (the ranks of a job count the same steps).
 * A failure before the exchange (setup, validation, memory) changes nothing.
 * Outcome agreement: with a world of more than one rank, every rank returns
 * the same status for a step. A rank whose own part fails (a communicator or
 * callback failure, the math, a refusal because it is poisoned) keeps taking
 * part in every remaining collective of the step, changing no more state;
 * the ranks exchange a 16-byte verdict each (status code and a digest of
 * lr, weight_decay, momentum, nesterov, adjust_lr) on the step's last
 * collective: the last exchange round's all_to_all_v carries every rank's
 * verdict to every rank (no collective added), or, when custom-path or
 * ZeRO-2 matrices are stepped after it, one all_gather of them ends the
 * step; only when something is wrong does a second all_gather carry each
 * rank's cause. Every rank returns the first failing rank's code with the
 * failing ranks and causes named (or INVALID_ARGUMENT naming the ranks'
 * differing hyper-parameters), and no update is applied. The first step's
 * setup is agreed the same way (the setup waits for `stream` once): every
 * rank issues every setup collective (group memberships, the handshake, the
 * plan check, the agreement) whatever fails on it, and every rank returns
 * the same error; a setup that failed changed nothing, and the next
 * muon_step sets up again. One case cannot be told apart on the failing
 * rank: its own setup succeeded and the agreement's all_gather failed on it
 * after its verdict left, so the others may have stepped on. That rank keeps
 * the setup and takes part in the step's collectives refusing, so every rank
 * fails that same muon_step, and is poisoned as below.
 * libmuon has no collective timeout (nor do NCCL and MPI collectives): a
 * rank that returns, crashes or stops calling without entering a collective
 * the others entered (a host error before muon_step, a muon_step skipped on
 * one rank) leaves them waiting in that collective. Every failure inside
 * muon_step is carried through the step's collectives as above; one outside
 * it is the host's to handle (abort the job, or its communicators).
 * On a GPU (CUDA tensors, more than one rank) a step does not wait for its
 * verdicts: they stay in device memory, where a kernel turns them into the
 * step's go-ahead, which the update kernels read, so no rank applies a step
 * some rank failed or stepped with other hyper-parameters; they are copied
 * to the host on `stream` at the step's end. The host judges them at the
 * start of the next muon_step, before that step does anything: its one
 * wait, on the previous step's end (long passed in a training loop, where
 * the forward and backward passes ran since; no wait for the current
 * stream, no allocation). So a step's muon_step returns OK on every rank
 * whose own part succeeded (a rank whose part failed returns its error at
 * once); when the verdicts say the step failed, nothing of it was applied,
 * the next muon_step returns that step's error on every rank (the failing
 * ranks and causes, or the differing values; the step count is set back)
 * and poisons as below, and muon_save_state refuses until then. Every rank
 * takes part in that judgement, a rank that restored its state since too (it
 * returns the error but is not poisoned again): so restore every rank after
 * the call that returned the error everywhere.
 * The values the stream copies to and from the host (the verdicts, the
 * non-finite count) live in page-locked memory made at the first step, so
 * no copy makes the host wait for the stream.
 * CUDA graphs: a GPU step after the first may be captured on `stream` and
 * replayed, `stream` being the last step's or another (torch.cuda.graph
 * captures on a stream of its own; the capture is not ordered after the
 * last step's stream, which the caller orders as torch's recipe does by
 * synchronizing first). It allocates, waits and copies to and from the
 * host nothing during capture; the step count is the captured call's, and muon_get_stats
 * does not see replays). The kernels read lr, weight_decay and momentum from
 * device memory when they run, written on the stream by every muon_step not
 * being captured and by muon_push_hyperparameters: a replay uses the values
 * pushed last, so a schedule is muon_set_lr then muon_push_hyperparameters
 * before each replay. With several ranks every rank captures the same step
 * (between two uncaptured calls: no rank may be waiting in muon_step while
 * another captures, as CUDA's global capture mode requires) and replays its
 * graph as often as the others (the graphs hold the collectives); the
 * exchanges fork onto the communication stream inside the graph and join
 * back. A replay's verdicts are the captured call's (no failure, its
 * hyper-parameters' digest): push the same values on every rank, and a
 * device error in a replay surfaces as the runtime's error, not as a step
 * outcome. skip_nonfinite steps cannot be captured (they wait for a count).
 * A failure after this rank's verdict left (its last collective itself, a
 * device error applying the update) poisons that rank alone; its refusal of
 * the next step is agreed like any failure, so every rank fails that one.
 * A failure once momentum updates began (on any rank, agreed as above) leaves
 * momentum buffers (and ZeRO-2 parameters) half-updated, so the optimizer is
 * poisoned: it refuses further steps (FAILED_PRECONDITION,
 * saying how many parameters are restored so far) until the host restores
 * the state of every parameter it holds, with one muon_load_state of a whole
 * blob or muon_set_state for each of them (restoring one is not enough), and
 * its parameters from its own checkpoint. An unexpected internal failure
 * (out of memory) once momentum updates began poisons the same way. No retry
 * and no fallback to a non-distributed step ever happens. */
MUON_API muon_status_t muon_step(muon_optimizer_t* opt, void* stream);

/* Writes the current lr, weight_decay and momentum (muon_set_lr, ...) to the
 * device memory the step's kernels read, ordered on `stream`: call it before
 * each replay of a captured muon_step whose values changed (an uncaptured
 * muon_step writes them itself). Not collective; with several ranks every
 * rank pushes the same values (a captured step cannot compare them). Before
 * the first muon_step it does nothing (that step writes them). */
MUON_API muon_status_t muon_push_hyperparameters(muon_optimizer_t* opt, void* stream);

/* Newton-Schulz on its own, what torch's _zeropower_via_newtonschulz
 * computes: every matrix of `in` (seen through `matrix_view`, a
 * muon_matrix_view_t; 2D takes exactly one matrix) is read as float32,
 * orthogonalized with the optimizer's Newton-Schulz options (ns_steps, the
 * coefficients, eps, ns_dtype; the others do not matter) and written to `out`,
 * rounded to out's dtype. `in` and `out` are contiguous tensors of one shape,
 * float32, bfloat16 or float16 (the dtypes may differ); `out` may be `in`
 * itself (in place) but may not overlap it otherwise. They live on the
 * optimizer's device once a parameter is registered; before that, on the
 * host or any CUDA device (the call then uses that device for itself). Not
 * collective: the world, if any, takes no part. Host tensors are done when
 * the call returns; on a GPU the work is ordered on `stream`, and the call
 * returns once it is done (it allocates and frees an fp32 working copy of
 * `in`). Errors name `in` or `out` and the cause; `out` is then undefined. */
MUON_API muon_status_t muon_orthogonalize(muon_optimizer_t* opt, const DLTensor* in,
                                          const DLTensor* out, int32_t matrix_view,
                                          void* stream);

/* Number of completed steps. */
MUON_API muon_status_t muon_step_count(const muon_optimizer_t* opt, int64_t* count);

/* ------------------------------------------------------------------------ */
/* Communicators (distributed engine)                                        */
/* ------------------------------------------------------------------------ */

/* Element types of reduce_scatter. */
typedef enum muon_dtype_t {
  MUON_DTYPE_FLOAT32 = 0,
  MUON_DTYPE_BFLOAT16 = 1,
  MUON_DTYPE_FLOAT16 = 2
} muon_dtype_t;

/* A communicator over one group of ranks, supplied by the host as a table of
 * C function pointers (or filled by an adapter below). The library copies
 * the table. Every collective is called with the same arguments' shapes on
 * every rank of the group, in the same order; `stream` is the stream given
 * to muon_step (NULL for CPU tensors; for GPU buffers the call must be
 * stream-ordered on it). A callback returns MUON_OK or an error status; it
 * may attach detail with muon_set_callback_error before returning.
 *
 * Threading: the library calls the collectives of one optimizer from the
 * thread that calls muon_step (or, with prefetch_count > 0 and more than one
 * exchange round, from one helper thread of the optimizer while muon_step
 * runs; the thread is started once, at the first step, and ends with
 * muon_destroy); calls on one group never overlap. `release` (optional) is called once for every muon_set_world or
 * muon_add_group call the table was given to: when that optimizer is
 * destroyed, or before the call returns if it fails, except when the call
 * refuses the table's struct_size: then nothing of the table is read, as
 * "Conventions" says of any refused size, `release` included, and ctx stays
 * the host's to release. A host that gives one
 * context to several calls (several optimizers, or the world and a group)
 * counts references itself, or passes release = NULL and frees `ctx` after
 * the optimizers are destroyed. The library never frees `ctx` otherwise. */
typedef struct muon_comm_t {
  size_t struct_size;  /* sizeof(muon_comm_t) */
  void* ctx;           /* passed to every callback */
  int32_t rank;        /* this rank's position in the group, 0 <= rank < size */
  int32_t size;        /* ranks in the group, >= 1 */
  /* recv (size * bytes) receives every rank's `bytes` bytes of send, rank r at r * bytes. */
  muon_status_t (*all_gather)(void* ctx, const void* send, void* recv, size_t bytes,
                              void* stream);
  /* Sends send_bytes[p] bytes at send + send_offsets[p] to each rank p and
   * receives recv_bytes[p] bytes from p at recv + recv_offsets[p]; arrays
   * have `size` entries; a count may be 0. */
  muon_status_t (*all_to_all_v)(void* ctx, const void* send, const size_t* send_bytes,
                                const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                                const size_t* recv_offsets, void* stream);
  /* buf (bytes) of rank `root` is copied to every rank's buf. Optional: the
   * optimizer never calls it (NULL is accepted); the library's adapters
   * provide it for hosts that use the tables themselves. */
  muon_status_t (*broadcast)(void* ctx, void* buf, size_t bytes, int32_t root, void* stream);
  /* send holds size * count elements of `dtype`; recv (count elements)
   * receives the sum over ranks of block `rank`. */
  muon_status_t (*reduce_scatter)(void* ctx, const void* send, void* recv, size_t count,
                                  int32_t dtype, void* stream);
  /* Returns once every rank of the group has called it. Optional, as
   * broadcast. */
  muon_status_t (*barrier)(void* ctx, void* stream);
  void (*release)(void* ctx);
} muon_comm_t;

/* Called by a communicator callback (on the thread the library called it
 * from) to attach a message to the error status it is about to return. The
 * text is copied. */
MUON_API void muon_set_callback_error(const char* message);

/* The world: every rank taking part in this optimizer's step (all ranks of
 * the job that register Muon parameters). Set once, before registering
 * parameters with placements; also usable as a placement group (its id is
 * written to *group_id). Without a world the optimizer is single-process. */
MUON_API muon_status_t muon_set_world(muon_optimizer_t* opt, const muon_comm_t* world,
                                      int32_t* group_id);

/* Adds a group (TP, FSDP, DP, EP, ...) for placements; *group_id receives its
 * id. Every rank of the world adds its groups in the same order (checked at
 * the first step). */
MUON_API muon_status_t muon_add_group(muon_optimizer_t* opt, const muon_comm_t* comm,
                                      int32_t* group_id);

/* What moved and what was computed, on this rank. */
typedef struct muon_stats_t {
  size_t struct_size;
  int64_t steps;
  /* Last step: */
  int64_t bytes_sent;             /* payload this rank sent to other ranks */
  int64_t bytes_received;         /* payload this rank received from other ranks */
  int64_t collectives;            /* communicator calls issued */
  int64_t rounds;                 /* exchange rounds */
  int64_t matrices_orthogonalized;
  double ns_flops;                /* Newton-Schulz FLOPs this rank computed */
  /* Planned, the same every step: */
  int64_t matrices_total;         /* matrices in the whole job (those without elements
                                   * included: nothing is done for them, so they count
                                   * in no rank's matrices_owned) */
  int64_t matrices_owned;         /* of which this rank orthogonalizes (a matrix split
                                   * over ranks, MUON_ASSIGNMENT_SPLIT, counts on each
                                   * of its members, here and in
                                   * matrices_orthogonalized) */
  /* ---- 0.4 (a caller's older, shorter struct gets the fields it has) ---- */
  /* Last step: non-finite gradient elements this rank's momentum pass read
   * (ZeRO-2: the averaged gradients of the matrices it owns), or with
   * skip_nonfinite, its gradients'. On a GPU the kernel counts them and the
   * count reaches the host with the stream: muon_get_stats waits for the
   * last step's end to read it. */
  int64_t nonfinite_grads;
  int64_t steps_skipped;          /* steps skipped with skip_nonfinite, in all */
  /* ---- 0.5 ---- */
  /* Memory, now: the optimizer's own memory on its device (everything it
   * allocated: momentum, each parameter's update buffer, the exchange and
   * working buffers, the Newton-Schulz workspace), of which momentum, the
   * elements of the parameter pieces this rank holds, and memory_bytes per
   * such element (0 without parameters). */
  int64_t memory_bytes;
  int64_t momentum_bytes;
  int64_t param_elements;
  double bytes_per_param;
} muon_stats_t;

MUON_API muon_status_t muon_stats_init(muon_stats_t* stats, size_t struct_size);
MUON_API muon_status_t muon_get_stats(const muon_optimizer_t* opt, muon_stats_t* stats);

/* In-process communicators: N ranks as threads of one process (tests,
 * single-process multi-GPU). The world object is shared by the threads;
 * every member of a group calls muon_inprocess_comm with the same rank
 * list, and gets its own table. Tables stay valid until released (an
 * optimizer releases the tables it was given); the world is freed when it
 * is destroyed and every table of it is released.
 * GPU buffers: once a CUDA optimizer exists in the process (the plugin is
 * loaded), the copies go through the CUDA runtime (any memory, several ranks
 * on one GPU included): each collective first waits for the caller's stream,
 * enqueues its copies on it and waits for them before returning, so a call
 * blocks the host (a test and single-process adapter, not a fast path).
 * reduce_scatter sums host memory only. Without the plugin, buffers must be
 * host memory and the stream NULL.
 * The tables muon_inprocess_comm and muon_comm_from_nccl fill report each
 * callback's outcome on the calling thread like any libmuon call: a host that
 * calls one itself reads why it failed with muon_last_error_message(). */
typedef struct muon_inprocess_world muon_inprocess_world_t;

MUON_API muon_status_t muon_inprocess_world_create(int32_t size, muon_inprocess_world_t** out);
MUON_API void muon_inprocess_world_destroy(muon_inprocess_world_t* world);
/* Aborts every communicator of `world`, as ncclCommAbort does: a rank waiting
 * for members that will never arrive (a rank that failed or returned without
 * entering the collective) is released with MUON_UNAVAILABLE, and every later
 * collective fails the same way, so every rank's muon_step fails and none
 * hangs. A collective every member had entered finishes as usual. For a
 * host whose rank threads can fail outside libmuon; thread-safe, may be
 * called from any thread (a watchdog), NULL is ignored; irreversible: create
 * a new world to go on. */
MUON_API void muon_inprocess_world_abort(muon_inprocess_world_t* world);

/* Fills *out with world rank `rank`'s communicator over the group of world
 * ranks `ranks[0 .. num_ranks)` (ranks == NULL: the whole world, in order);
 * `rank` must be in the list; out->rank is its position there. As with NCCL
 * and MPI communicators, the k-th call a rank makes for a given list joins
 * the k-th group over that list: two tables over the same ranks (say the
 * world and a data-parallel group of the same members) stay separate. */
MUON_API muon_status_t muon_inprocess_comm(muon_inprocess_world_t* world, const int32_t* ranks,
                                           int32_t num_ranks, int32_t rank, muon_comm_t* out);

/* NCCL: fills *out with a communicator over the host's `ncclComm_t`
 * (passed as void*), resolving NCCL's functions from the NCCL library the
 * process has already loaded (never loading a second one). Fails with
 * MUON_UNAVAILABLE when no NCCL is loaded. Buffers must be GPU memory. */
MUON_API muon_status_t muon_comm_from_nccl(void* nccl_comm, muon_comm_t* out);

/* ------------------------------------------------------------------------ */
/* QK-Clip (MuonClip, Kimi K2)                                               */
/* ------------------------------------------------------------------------ */

/* One attention layer's query and key heads, as rows of the global matrices
 * (2D view, one matrix) of registered parameters: query head h is rows
 * [q_first_row + h * q_head_stride, + q_head_rows) of q_param, key head g
 * rows [k_first_row + g * k_head_stride, + k_head_rows) of k_param (the same
 * parameter for a fused QKV projection: the rows may not meet). Zeros ask
 * for the plain case: num_kv_heads = num_heads; head_rows = (rows -
 * first_row) / heads (which must divide); head_stride = head_rows. For
 * MLA, the last q_rotary_rows of each query head are its rotary part (the
 * key's rotary part is shared by all heads and not scaled). Since 0.7. */
typedef struct muon_qk_clip_layer_t {
  size_t struct_size;     /* sizeof(muon_qk_clip_layer_t), set by muon_qk_clip_layer_init */
  int64_t q_param;        /* the parameter holding the query rows (its id) */
  int64_t k_param;        /* the key rows' parameter (may be q_param) */
  int32_t num_heads;      /* query heads, >= 1: one max logit each */
  int32_t num_kv_heads;   /* key heads (GQA); num_heads is a multiple. 0: num_heads */
  int64_t q_first_row;
  int64_t q_head_stride;  /* 0: q_head_rows */
  int64_t q_head_rows;    /* 0: see above */
  int64_t q_rotary_rows;  /* MLA: of q_head_rows, the last ones. Default 0 */
  int64_t k_first_row;
  int64_t k_head_stride;  /* 0: k_head_rows */
  int64_t k_head_rows;    /* 0: see above */
  double alpha;           /* the queries' share of the clip, in [0, 1]. Default 0.5 */
} muon_qk_clip_layer_t;

/* Fills *layer with the defaults (q_param and k_param -1, the rest as
 * above) and sets struct_size (96 bytes in 0.7). */
MUON_API muon_status_t muon_qk_clip_layer_init(muon_qk_clip_layer_t* layer, size_t struct_size);
MUON_API size_t muon_sizeof_qk_clip_layer(void);

/* Registers a layer for muon_qk_clip and returns its id (0, 1, ... in
 * registration order). Checked here: the parameters exist, are not on the
 * custom path, have one matrix, and hold the heads; the counts and alpha.
 * Not collective: every rank holding a piece of either parameter registers
 * the layer. */
MUON_API muon_status_t muon_register_qk_clip(muon_optimizer_t* opt,
                                             const muon_qk_clip_layer_t* layer,
                                             int64_t* layer_id);

/* QK-Clip of layer `layer_id` (Kimi K2): with S_h = max_logits[h] (the
 * layer's largest attention logit of query head h over the step, num_heads
 * of them, as every rank must pass them) and gamma_h = tau / S_h for each
 * head with S_h > tau (others 1: also a head whose S_h is <= 0 or not
 * finite keeps its weights):
 *   MHA:  W_q[h] *= gamma_h^alpha,  W_k[h] *= gamma_h^(1 - alpha)
 *   GQA:  W_k[g] *= gamma_g^(1 - alpha), gamma_g the smallest gamma of key
 *         head g's query heads; W_q[h] *= gamma_h / gamma_g^(1 - alpha), so
 *         that every head's logits scale by exactly its gamma_h
 *   MLA:  a query head's rotary rows *= gamma_h
 * Each factor is computed in double and applied in fp32 (param * factor,
 * rounded to the parameter's dtype, as torch's mul_). This rank scales the
 * elements of its own pieces only; the result is the same at any layout
 * (TP, FSDP, flat ranges, replicas) and world size. Not collective, no
 * stream: call it on every rank after muon_step (and before the next
 * forward pass). *clipped_heads (optional) receives the heads clipped.
 * tau finite and > 0. Host memory (CPU backend) only so far. */
MUON_API muon_status_t muon_qk_clip(muon_optimizer_t* opt, int64_t layer_id,
                                    const float* max_logits, int32_t num_heads, double tau,
                                    int32_t* clipped_heads);

/* ------------------------------------------------------------------------ */
/* State (checkpoint and resume)                                             */
/* ------------------------------------------------------------------------ */

/* The dtype of a parameter's momentum buffer (the gradient's, or float32 with
 * momentum_fp32). The buffer has the parameter's shape. */
MUON_API muon_status_t muon_get_state_dtype(const muon_optimizer_t* opt, int64_t param_id,
                                            DLDataType* dtype);

/* Copies a parameter's momentum buffer into `dst`, a contiguous tensor of the
 * parameter's shape and the state dtype, in host memory or on the optimizer's
 * GPU. A host tensor is filled before the call returns (on a GPU it first
 * waits for the last step's stream); a GPU tensor is filled in stream order
 * on the stream of the last muon_step. */
MUON_API muon_status_t muon_get_state(const muon_optimizer_t* opt, int64_t param_id,
                                      const DLTensor* dst);

/* Overwrites a parameter's momentum buffer from `src` (same rules as dst).
 * On a poisoned optimizer (see muon_step) this counts the parameter as
 * restored; the optimizer steps again once every parameter holding state on
 * this rank has been restored. */
MUON_API muon_status_t muon_set_state(muon_optimizer_t* opt, int64_t param_id,
                                      const DLTensor* src);

/* NorMuon's second moments of a parameter (muon_options_t.normuon): fp32,
 * one per row of each matrix of its global matrix view, matrix after matrix
 * (batch x rows values; a matrix without elements has none and reads as
 * zeros). `dst` / `src` is a contiguous float32 tensor in host memory of
 * exactly that many elements (any shape). Before the first step,
 * muon_get_moments reads what was loaded or set (zeros when nothing), and
 * muon_set_moments keeps the values for whichever rank turns out to own the
 * matrices (the first step hands them over). After it, the moments live on
 * each matrix's owner: either call fails with MUON_FAILED_PRECONDITION
 * unless this rank owns every matrix of the parameter (a world of one owns
 * all); the state blobs carry everyone's (muon_save_state, muon_load_states).
 * MUON_FAILED_PRECONDITION too without normuon. */
MUON_API muon_status_t muon_get_moments(const muon_optimizer_t* opt, int64_t param_id,
                                        const DLTensor* dst);
MUON_API muon_status_t muon_set_moments(muon_optimizer_t* opt, int64_t param_id,
                                        const DLTensor* src);

/* Whole-optimizer state as one self-describing byte blob (host memory; on a
 * GPU the call waits for the last step's stream): a header, the step
 * count, and for every parameter its name, local and global shape, dtype, the
 * global elements its momentum bytes hold (format 2; see muon_load_states)
 * and those bytes (none for a ZeRO-2 parameter another rank owns).
 * With buffer == NULL, *size receives the bytes needed. Otherwise `capacity`
 * must be at least that and *size receives the bytes written. Hyper-parameters
 * are not part of the blob (the host owns its schedule). */
MUON_API muon_status_t muon_save_state(const muon_optimizer_t* opt, void* buffer,
                                       size_t capacity, size_t* size);

/* Restores this rank's own blob, written by muon_save_state (format 2, or
 * format 1 of libmuon 0.3), into an optimizer that has the same parameters
 * registered in the same order (same shapes, dtypes and state dtypes) with
 * the same layout. Before the first step, a ZeRO-2 parameter this rank held
 * no momentum of when it saved is left to its owner (the first step fails,
 * agreed on every rank, if this rank owns it now). After it, a ZeRO-2
 * parameter this rank does not own, saved before the first step (when every
 * rank held its whole momentum), loads nothing here: its owner's blob of
 * that time holds the momentum the setup kept. Validates the whole blob
 * before changing anything (a refused blob restores nothing): the magic bytes
 * and format version, the reserved and padding words (zero), a step count in
 * [0, INT64_MAX), no bytes after the last parameter, and for each parameter
 * its name and position, local and global shape, view, kind (custom path or
 * not), dtype, its runs of global elements (each inside the global tensor;
 * together in increasing order without overlap, and this rank's piece) and a
 * byte count of exactly their elements (none for a ZeRO-2 parameter another
 * rank owned). A custom-path parameter's entry is a local piece without
 * global coordinates: nothing tells which rank saved it, so it must be this
 * rank's own. A resumed optimizer continues bit for bit like the one that
 * saved; loading a whole blob also lifts a poisoning (see muon_step). */
MUON_API muon_status_t muon_load_state(muon_optimizer_t* opt, const void* buffer, size_t size);

/* Resume anywhere: restores the momentum of this rank's parameters from the
 * blobs of several ranks, e.g. every blob of a checkpoint saved at another
 * world size or with another layout (FSDP, TP x FSDP, flat ranges, ZeRO-2;
 * the host reads all of them on every rank, or gathers them). A blob
 * (format 2, what muon_save_state writes) lists, for every parameter, the
 * global elements its momentum bytes hold (offsets into the row-major
 * flattened global tensor); each of this rank's pieces is looked up there by
 * name, global shape, matrix view and state dtype, in whichever blob holds
 * its elements (replicas' copies are equal; the first is taken). Every blob
 * is first validated whole, on its own: the header as by muon_load_state, no
 * bytes after the last entry, and in each entry known dtype and kind, shapes
 * whose element counts fit int64, runs each inside the global tensor and
 * together in increasing order without overlap, and a byte count of exactly
 * their elements (or none). Runs of different blobs may overlap (replicas).
 * Fails with MUON_INVALID_ARGUMENT, changing nothing, naming the blob (its
 * index) where one is at fault, the parameter and the cause: a blob that
 * fails that validation, a blob whose global shape, view or dtype differs,
 * blobs saved at different steps, a format-1 blob (no global coordinates),
 * global elements no blob holds (the first are named). Fails with
 * MUON_FAILED_PRECONDITION, restoring nothing, while any custom-path
 * parameter is registered: its entries carry no global coordinates, so
 * nothing says whose piece one holds; restore this rank's own blob with
 * muon_load_state, or each parameter with muon_set_state. Entries of
 * parameters this rank does not hold (other pipeline stages, experts) are
 * ignored. The step count is the blobs'.
 * Before the first step it restores every rank's full momentum of ZeRO-2
 * parameters; the setup then keeps it on their owners. Also lifts a
 * poisoning. The parameters themselves are the host's to restore. */
MUON_API muon_status_t muon_load_states(muon_optimizer_t* opt, const void* const* buffers,
                                        const size_t* sizes, size_t count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LIBMUON_MUON_H_ */
