// The MPI adapter: a muon_comm_t over a duplicate of the host's MPI_Comm.
// Built into //capi:libmuon_mpi.so only, so libmuon.so never depends on MPI.
//
//   all_gather      MPI_Allgather (MPI_BYTE; MPI_IN_PLACE when send is this
//                   rank's block of recv)
//   all_to_all_v    MPI_Irecv/MPI_Isend per peer in a shifted pairwise order,
//                   then MPI_Waitall (MPI_Alltoallv's int counts and
//                   displacements could only be checked rank by rank, and a
//                   rank failing alone would leave the others waiting)
//   broadcast       MPI_Bcast (MPI_BYTE)
//   reduce_scatter  MPI_Alltoall of the blocks, then the rank-ordered fp32
//                   sum of ordered_sum.h: bit-identical to the in-process
//                   adapter for float32, bfloat16 and float16 alike (a
//                   reducing collective would add in an order of MPI's
//                   choosing)
//   barrier         MPI_Barrier
//
// No size is limited by MPI's int counts: every message is at most 1 GiB;
// larger transfers go in pieces (all_gather and reduce_scatter pieces use a
// datatype whose extent is the whole block, so the pieces land in place).
// Buffers are host memory: a non-NULL stream is refused. Errors come back
// from MPI (MPI_ERRORS_RETURN on the duplicate) and carry MPI's error string. When MPI was initialized below
// MPI_THREAD_SERIALIZED, a call from a thread other than MPI's main thread is
// refused (the optimizer calls from a helper thread with prefetch_count > 0).
#ifndef MUON_COMM_MPI_COMM_H_
#define MUON_COMM_MPI_COMM_H_

#include "absl/status/status.h"
#include "libmuon/muon.h"

namespace muon {

// Fills *out with a communicator over a duplicate (MPI_Comm_dup, collective
// over `*mpi_comm`) of `*mpi_comm` (an MPI_Comm*). The table's `release`
// frees the duplicate (unless MPI is finalized by then).
//
// Test hook: the environment variable MUON_MPI_MAX_MESSAGE_BYTES (read here)
// lowers the size above which all_to_all_v splits messages.
absl::Status MakeMpiComm(void* mpi_comm, muon_comm_t* out);

}  // namespace muon

#endif  // MUON_COMM_MPI_COMM_H_
