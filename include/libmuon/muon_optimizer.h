/* <libmuon/muon_optimizer.h>: the optimizer's life, its parameters (matrix views, placements,
 * the custom path) and its step.
 * A section of <libmuon/muon.h>, which includes every section in order:
 * include muon.h, not a section alone. Its conventions (muon.h's first
 * comment) hold here. */
#ifndef LIBMUON_MUON_OPTIMIZER_H_
#define LIBMUON_MUON_OPTIMIZER_H_

#ifndef LIBMUON_MUON_H_
#error "include <libmuon/muon.h>, which includes this section"
#endif

#ifdef __cplusplus
extern "C" {
#endif

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
   * (checked at the first step). */
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
   * split_dim 1. On a GPU the blocks are gathered, orthogonalized, scaled
   * and scattered in device memory, on the step's stream. Bad sizes fail here
   * with MUON_INVALID_ARGUMENT naming the parameter and the size. */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LIBMUON_MUON_OPTIMIZER_H_ */
