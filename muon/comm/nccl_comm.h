// The NCCL adapter: a muon_comm_t over the host's ncclComm_t.
//
// NCCL's functions are resolved at run time from the NCCL the process has
// already loaded: first the process's global symbols (dlsym(RTLD_DEFAULT)),
// then a libnccl.so.2 loaded with RTLD_LOCAL (dlopen with RTLD_NOLOAD, which
// never loads a library). libmuon neither links nor loads NCCL, so the host
// and libmuon always use the same copy. Every collective is enqueued on the
// stream muon_step was given; nothing synchronizes the device.
//
//   all_gather, broadcast, reduce_scatter  ncclAllGather, ncclBroadcast,
//                                          ncclReduceScatter (ncclSum)
//   all_to_all_v                           one ncclGroupStart/End of ncclSend
//                                          and ncclRecv per peer (bytes)
//   barrier                                a 1-byte in-place ncclAllGather
//                                          over a scratch buffer from
//                                          ncclMemAlloc (NCCL >= 2.19)
//
// reduce_scatter sums in NCCL's order and precision (bf16/fp16 in their own
// type): unlike the host adapters, results may differ in the last bits from
// a rank-ordered fp32 sum.
//
// No NCCL header is needed: the few types are declared below (ncclComm_t is
// an opaque pointer, the enums are small ints); nccl_comm_test checks them
// against nccl.h where the CUDA toolkit provides it.
#ifndef MUON_COMM_NCCL_COMM_H_
#define MUON_COMM_NCCL_COMM_H_

#include "absl/status/status.h"
#include "libmuon/muon.h"

namespace muon {

// The values of NCCL's enums that the adapter passes or interprets.
namespace nccl_abi {
constexpr int kSuccess = 0;              // ncclSuccess
constexpr int kUnhandledCudaError = 1;   // ncclUnhandledCudaError
constexpr int kSystemError = 2;          // ncclSystemError
constexpr int kInternalError = 3;        // ncclInternalError
constexpr int kInvalidArgument = 4;      // ncclInvalidArgument
constexpr int kInvalidUsage = 5;         // ncclInvalidUsage
constexpr int kRemoteError = 6;          // ncclRemoteError
constexpr int kInProgress = 7;           // ncclInProgress
constexpr int kUint8 = 1;                // ncclUint8
constexpr int kFloat16 = 6;              // ncclFloat16
constexpr int kFloat32 = 7;              // ncclFloat32
constexpr int kBfloat16 = 9;             // ncclBfloat16
constexpr int kSum = 0;                  // ncclSum
}  // namespace nccl_abi

// Fills *out with a communicator over `nccl_comm` (an ncclComm_t). Fails
// with Unavailable when no NCCL is loaded in the process or the loaded one
// lacks a function the adapter needs, with InvalidArgument when NCCL refuses
// the communicator. The table's ctx holds what was resolved; `release` frees
// the barrier's scratch buffer (it never destroys the host's ncclComm_t).
absl::Status MakeNcclComm(void* nccl_comm, muon_comm_t* out);

}  // namespace muon

#endif  // MUON_COMM_NCCL_COMM_H_
