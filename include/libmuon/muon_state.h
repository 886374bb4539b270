/* <libmuon/muon_state.h>: QK-Clip, and the state: momentum, NorMuon's moments, the state
 * blob (checkpoint and resume).
 * A section of <libmuon/muon.h>, which includes every section in order:
 * include muon.h, not a section alone. Its conventions (muon.h's first
 * comment) hold here. */
#ifndef LIBMUON_MUON_STATE_H_
#define LIBMUON_MUON_STATE_H_

#ifndef LIBMUON_MUON_H_
#error "include <libmuon/muon.h>, which includes this section"
#endif

#ifdef __cplusplus
extern "C" {
#endif

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
 * (TP, FSDP, flat ranges, replicas) and world size. Not collective: call
 * it on every rank after muon_step (and before the next forward pass).
 * *clipped_heads (optional) receives the heads clipped. tau finite and > 0.
 * max_logits is host memory. Parameters on a GPU: MUON_FAILED_PRECONDITION
 * (nothing scaled), naming muon_qk_clip_on_stream. */
MUON_API muon_status_t muon_qk_clip(muon_optimizer_t* opt, int64_t layer_id,
                                    const float* max_logits, int32_t num_heads, double tau,
                                    int32_t* clipped_heads);

/* muon_qk_clip on any device: on a GPU the scaling (one launch per run of
 * a head's elements in this rank's pieces) is enqueued on `stream` (a
 * cudaStream_t; NULL: the legacy default stream), ordered after the last
 * muon_step's stream as a step is, and the host does not wait; the factors
 * are computed on the host from max_logits before it returns. Host memory:
 * as muon_qk_clip (`stream` is not used). Since 0.7. */
MUON_API muon_status_t muon_qk_clip_on_stream(muon_optimizer_t* opt, int64_t layer_id,
                                              const float* max_logits, int32_t num_heads,
                                              double tau, void* stream, int32_t* clipped_heads);

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

/* The same, for checkpoints whose host puts the ranks' pieces together
 * (muon.Muon's state_dict under a distributed config, for
 * torch.distributed.checkpoint): after the first step neither call refuses
 * a matrix another rank owns. muon_get_owned_moments writes zeros for it and
 * sets owned[k] (`owned_count` = the parameter's number of matrices, its
 * batch) to 0, and 1 for each matrix whose values this rank gives: after the
 * first step exactly one rank of the job owns each matrix with elements
 * (a matrix split over ranks, MUON_ASSIGNMENT_SPLIT: its first member; one
 * without elements reads as zeros, flagged 1 everywhere), before it
 * every rank gives what was loaded or set (all flagged 1). Taking matrix k
 * from any rank that flags it gives the whole moments. `owned` may be NULL.
 * muon_set_owned_moments takes the whole moments (as muon_set_moments) on
 * every rank that holds the parameter and keeps the matrices this rank owns
 * (every member of a split matrix keeps its; before the first step: all of
 * them, as muon_set_moments). Set before the first step, moments reach only
 * the ranks that hold their parameter: when SPREAD or SPLIT gives a matrix
 * to a rank that does not, and the host set moments other than zero, the
 * first step fails on every rank with MUON_FAILED_PRECONDITION naming the
 * parameter (resume through the state blobs, which carry every owner's). Neither call
 * is a collective. Since 0.7. */
MUON_API muon_status_t muon_get_owned_moments(const muon_optimizer_t* opt, int64_t param_id,
                                              const DLTensor* dst, uint8_t* owned,
                                              int64_t owned_count);
MUON_API muon_status_t muon_set_owned_moments(muon_optimizer_t* opt, int64_t param_id,
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

#endif /* LIBMUON_MUON_STATE_H_ */
