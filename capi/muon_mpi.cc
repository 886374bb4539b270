// The extern "C" entry points of libmuon_mpi.so (include/libmuon/muon_mpi.h).
#include "libmuon/muon_mpi.h"

#include "absl/status/status.h"
#include "capi/capi_internal.h"
#include "muon/comm/mpi_comm.h"

extern "C" {

muon_status_t muon_comm_from_mpi(void* mpi_comm, muon_comm_t* out) {
  return muon::capi::Guard("muon_comm_from_mpi", [&]() -> absl::Status {
    if (mpi_comm == nullptr) {
      return absl::InvalidArgumentError("mpi_comm is NULL (pass a pointer to an MPI_Comm)");
    }
    if (out == nullptr) return muon::capi::NullArg("out");
    muon_comm_t table;
    absl::Status made = muon::MakeMpiComm(mpi_comm, &table);
    if (!made.ok()) return made;
    *out = table;
    return absl::OkStatus();
  });
}

// This library's own copy of the thread-local message (capi_internal is
// linked into it, separately from libmuon.so's).
const char* muon_mpi_last_error_message(void) { return muon::capi::LastError().c_str(); }

}  // extern "C"
