// The communicator conformance suite: one set of checks that every adapter
// (and any host's muon_comm_t) must pass. Every rank of a group calls
// RunConformance at the same time with its own table (threads or
// processes); each rank issues the same collectives in the same order
// whatever it finds, so a failing check never leaves a peer waiting.
//
// Covered: the table's fields (struct_size, rank in range, ranks distinct);
// all_gather (0 and 1 byte, an odd size, over 1 MiB, in place);
// all_to_all_v (no traffic; ragged counts, some zero, with gaps between the
// blocks on both sides, the self block; bytes outside the received blocks
// untouched); broadcast from every root and of 0 bytes; reduce_scatter of
// float32, bfloat16 and float16 with 0, 1 and thousands of elements against
// the rank-order fp32 sum rounded once (bit for bit, or within a tolerance);
// barrier; and error returns on every rank for an unknown reduce_scatter
// dtype and a broadcast root outside the group, after which the table still
// works. broadcast and barrier are optional: NULL skips their checks.
#ifndef MUON_COMM_TESTING_CONFORMANCE_H_
#define MUON_COMM_TESTING_CONFORMANCE_H_

#include <string>
#include <vector>

#include "capi/muon.h"

namespace muon {

struct ConformanceOptions {
  // reduce_scatter: bit for bit against the rank-order fp32 sum (the host
  // adapters), or within a relative tolerance (an adapter that sums in
  // another order or precision, as NCCL does).
  bool exact_sums = true;
  void* stream = nullptr;  // handed to every call
};

// The failures this rank saw, each "<check>: <what>"; empty when the table
// conforms. Skipped checks (NULL optional collectives) are listed in
// *skipped when it is given.
std::vector<std::string> RunConformance(const muon_comm_t& table,
                                        const ConformanceOptions& options = ConformanceOptions(),
                                        std::vector<std::string>* skipped = nullptr);

}  // namespace muon

#endif  // MUON_COMM_TESTING_CONFORMANCE_H_
