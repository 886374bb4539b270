// The communicator conformance suite (muon/comm/testing) against the MPI
// adapter (libmuon_mpi.so) under mpirun: over MPI_COMM_WORLD, over a split
// communicator (every other world rank, in reverse order), and with every
// message cut into 7-byte pieces. Exits nonzero on any failure or skipped
// check, on any rank.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "libmuon/muon.h"
#include "libmuon/muon_mpi.h"
#include "muon/comm/testing/conformance.h"

namespace {

int Run(MPI_Comm comm, const char* what, int rank) {
  muon_comm_t table;
  if (muon_comm_from_mpi(&comm, &table) != MUON_OK) {
    std::fprintf(stderr, "rank %d: %s: muon_comm_from_mpi failed: %s\n", rank, what,
                 muon_mpi_last_error_message());
    return 1;
  }
  std::vector<std::string> skipped;
  const std::vector<std::string> failures = muon::RunConformance(table, {}, &skipped);
  for (const std::string& f : failures) std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, f.c_str());
  // The adapter provides every collective: nothing may be skipped.
  for (const std::string& s : skipped) std::fprintf(stderr, "rank %d: %s: skipped %s\n", rank, what, s.c_str());
  table.release(table.ctx);
  return failures.empty() && skipped.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0, rank = 0, size = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failed = Run(MPI_COMM_WORLD, "world", rank);
  MPI_Comm reversed;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &reversed);
  failed += Run(reversed, "split, reversed", rank);
  MPI_Comm_free(&reversed);
  setenv("MUON_MPI_MAX_MESSAGE_BYTES", "7", 1);
  failed += Run(MPI_COMM_WORLD, "7-byte messages", rank);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("conformance over MPI on %d processes: %s\n", size,
                any == 0 ? "every check passed" : "FAILED");
  }
  MPI_Finalize();
  return any == 0 ? 0 : 1;
}
