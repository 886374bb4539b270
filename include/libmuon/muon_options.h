/* <libmuon/muon_options.h>: the optimizer's options: the Newton-Schulz dtype, algorithm and
 * coefficients, the assignment of matrices to ranks, muon_options_t.
 * A section of <libmuon/muon.h>, which includes every section in order:
 * include muon.h, not a section alone. Its conventions (muon.h's first
 * comment) hold here. */
#ifndef LIBMUON_MUON_OPTIONS_H_
#define LIBMUON_MUON_OPTIONS_H_

#ifndef LIBMUON_MUON_H_
#error "include <libmuon/muon.h>, which includes this section"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Optimizer options                                                         */
/* ------------------------------------------------------------------------ */

/* How the learning rate is scaled by the matrix shape (A rows, B columns of
 * the matrix view). The decoupled weight decay always uses the unadjusted lr. */
typedef enum muon_adjust_lr_t {
  MUON_ADJUST_LR_ORIGINAL = 0,        /* lr * sqrt(max(1, A / B)) (torch default) */
  MUON_ADJUST_LR_MATCH_RMS_ADAMW = 1, /* lr * 0.2 * sqrt(max(A, B)) */
  MUON_ADJUST_LR_NONE = 2,            /* lr */
  MUON_ADJUST_LR_SPECTRAL_UNCLAMPED = 3, /* lr * sqrt(A / B) (0.3) */
  /* lr * sqrt(max(A, B)) (0.7): Scion's and Emerging-Optimizers' "spectral"
   * scale, Megatron-core's default muon_scale_mode; MATCH_RMS_ADAMW is 0.2
   * times it. */
  MUON_ADJUST_LR_SPECTRAL = 4
} muon_adjust_lr_t;

/* The dtype Newton-Schulz computes in. BF16 mirrors torch.optim.Muon: the
 * input is rounded to bf16 and every product is rounded to bf16 (fp32
 * accumulation). FP32 keeps everything in fp32. FP16 (0.7; CPU and CUDA
 * backends) normalizes in fp32, then rounds the input and every product
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
 * and CUDA backends (bf16 or fp32; on a GPU as cuBLASLt products). Under
 * MUON_ASSIGNMENT_SPLIT (CPU and CUDA backends) the members sum their
 * blocks' shares of R where it is formed (the start, each restart), and
 * each runs the m x m iterations and multiplies its block by Q. */
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
   * double sums, then rounded to ns_dtype. That product W W^T, scaled on
   * both sides, is the first iteration's gram (as flash-newton-schulz reuses
   * it): no product more than 4 plain iterations. CPU backend only so far
   * (on a GPU, whole or split, the setup fails with MUON_UNIMPLEMENTED naming
   * it until its GPU test has run on one); ns_algorithm STANDARD only. Under
   * MUON_ASSIGNMENT_SPLIT the members sum their blocks' shares of W W^T (one
   * sum, in place of the norm's). */
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
   * computes the polynomial (GRAM: its R where formed; AOL: the first
   * gram in place of the norm; NorMuon: one more sum, the rows' squares,
   * every member keeping the matrix's moments). The split matrices run in
   * a last round of their own, a rank taking at most one part. Results
   * equal the whole matrix's up to the order of fp32 sums (bf16, fp16:
   * rounded as the emulated path rounds). Pays where one matrix bounds a stage's Newton-Schulz time
   * and the members share fast links (docs/SETUP_AT_SCALE.md). CPU and CUDA
   * backends: on a GPU the sums cross through device buffers on the
   * communication stream and each member's block runs its products in fp32
   * (bf16 and fp16 rounded after each, as the CPU's emulated path), Gram
   * Newton-Schulz's m x m iterations included; AOL as ns_coefficients AOL
   * says. */
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
   * that owns each matrix (under MUON_ASSIGNMENT_SPLIT on each member of a
   * split matrix, alike). CPU and CUDA backends (on a GPU the moments live
   * in device memory; a matrix split over ranks: CPU only so far, as is
   * MUON_ASSIGNMENT_SPLIT there). Zero (default): Muon. Must be the same on every rank,
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
   * count grows and muon_stats_t.steps_skipped counts it. On a GPU the
   * count is a kernel after each batch's Newton-Schulz, and the host waits
   * for it after the exchange (one wait per step; a step being captured
   * into a CUDA graph fails naming the option). Not with
   * MUON_REPLICATED_ZERO2 parameters (their owners apply inside the step):
   * the first step fails naming the option. Zero
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LIBMUON_MUON_OPTIONS_H_ */
