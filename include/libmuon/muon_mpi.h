/*
 * libmuon_mpi: an MPI communicator for libmuon's distributed engine.
 *
 * A separate library, so that libmuon.so never depends on MPI: link
 * libmuon_mpi.so (SONAME libmuon_mpi.so.1; it needs libmuon.so.1 and the
 * OpenMPI libmpi it was built against) only where MPI is used. Pure C99, like
 * muon.h; MPI's header is not needed to include it.
 *
 *   MPI_Comm world = MPI_COMM_WORLD;
 *   muon_comm_t comm;
 *   if (muon_comm_from_mpi(&world, &comm) != MUON_OK)
 *     fprintf(stderr, "%s\n", muon_mpi_last_error_message());
 *   muon_set_world(opt, &comm, &world_group);   (the optimizer releases it)
 */
#ifndef LIBMUON_MUON_MPI_H_
#define LIBMUON_MUON_MPI_H_

#include "libmuon/muon.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *out with a communicator over a duplicate of the MPI communicator
 * `*(MPI_Comm*)mpi_comm` (pass the address of an MPI_Comm). Collective: every
 * rank of that communicator calls it (MPI_Comm_dup). MPI must be initialized,
 * with MPI_THREAD_SERIALIZED or higher when the optimizer may call from its
 * helper thread (prefetch_count > 0; otherwise such calls fail with
 * FAILED_PRECONDITION). Buffers are host memory (muon_step's stream NULL).
 * reduce_scatter sums in rank order in float32 and rounds once, exactly as
 * the in-process communicator does. `release` frees the duplicate (unless MPI
 * is finalized by then).
 *
 * Errors: INVALID_ARGUMENT (NULL pointer, MPI_COMM_NULL, an
 * intercommunicator), FAILED_PRECONDITION (MPI not initialized, or
 * finalized); *out is untouched. The detail is in
 * muon_mpi_last_error_message(). */
MUON_API muon_status_t muon_comm_from_mpi(void* mpi_comm, muon_comm_t* out);

/* The detail of the last failed call of this library on the calling thread
 * (thread-local, owned by the library, valid until the next call on this
 * thread; "" after a success). Never NULL. */
MUON_API const char* muon_mpi_last_error_message(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LIBMUON_MUON_MPI_H_ */
