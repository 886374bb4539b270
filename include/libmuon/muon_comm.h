/* <libmuon/muon_comm.h>: communicators (the host's table of collectives, in-process
 * worlds, NCCL) and the stats of what moved.
 * A section of <libmuon/muon.h>, which includes every section in order:
 * include muon.h, not a section alone. Its conventions (muon.h's first
 * comment) hold here. */
#ifndef LIBMUON_MUON_COMM_H_
#define LIBMUON_MUON_COMM_H_

#ifndef LIBMUON_MUON_H_
#error "include <libmuon/muon.h>, which includes this section"
#endif

#ifdef __cplusplus
extern "C" {
#endif

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
  double ns_flops;                /* Newton-Schulz FLOPs this rank computed, as
                                   * whole products count them (the iteration's,
                                   * Gram's or a split part's; a GPU's symmetric
                                   * products in tiles compute less: the same
                                   * figure, fewer operations) */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LIBMUON_MUON_COMM_H_ */
