// The communicator conformance suite: one set of checks that every adapter
// (and any host's muon_comm_t) must pass. Every rank of a group calls
// RunConformance at the same time with its own table (threads or
// processes); each rank issues the same collectives in the same order
// whatever it finds, so a failing check never leaves a peer waiting.
//
// Covered, with data that depends on the sender, the receiver and the
// position, so that a mix-up shows:
//   - the table's fields: struct_size >= sizeof(muon_comm_t), 0 <= rank <
//     size, and the ranks of the group distinct and in place (an all_gather
//     of the ranks);
//   - all_gather of 0 and 1 byte, an odd size and over 1 MiB (across any
//     chunking), and in place (send == recv + rank * bytes);
//   - all_to_all_v with no traffic; ragged counts (different per pair, some
//     zero, the self block) laid out with gaps between the blocks on both
//     sides, in rank order and in reverse order, and packed back to back;
//     received bytes compared exactly, bytes outside the received blocks
//     untouched;
//   - broadcast from every root, of 0 bytes and of over 1 MiB;
//   - reduce_scatter of float32, bfloat16 and float16, 0, 1 and 2053
//     elements, against the sum in rank order 0, 1, ..., n-1 in fp32
//     rounded once to the element type (round to nearest even), computed by
//     this suite's own arithmetic, bit for bit (or within a tolerance, see
//     ConformanceOptions). Among the elements are probes whose rank-order
//     sum differs from the sum in reverse order (from 3 ranks up for
//     float32, 4 for the 16-bit types) and from the sum in double precision
//     (from 3 ranks up); conformance_defects_test holds the suite to that;
//   - barrier;
//   - send buffers left unchanged by every collective;
//   - error returns on every rank for unknown reduce_scatter dtypes (3, 7,
//     -1) and broadcast roots outside the group (-1, size), after which the
//     table still works (an all_gather).
// broadcast and barrier are optional: NULL skips their checks, which are
// then listed as skipped.
#ifndef MUON_COMM_TESTING_CONFORMANCE_H_
#define MUON_COMM_TESTING_CONFORMANCE_H_

#include <string>
#include <vector>

#include "libmuon/muon.h"

namespace muon {

struct ConformanceOptions {
  // reduce_scatter: true compares bit for bit with the rank-order fp32 sum
  // rounded once (the library's host adapters). false accepts any order of
  // summation and accumulation in the element type (real NCCL): an element
  // may differ from that sum by at most 2 * n * u * sum(|x_r|) (+ 2^-24 for
  // float16), u being the element type's unit roundoff (2^-24, 2^-8, 2^-11).
  bool exact_sums = true;
  // false leaves out the all_gather and broadcast of over 1 MiB (quicker
  // runs, for tests of the suite itself).
  bool large = true;
  void* stream = nullptr;  // handed to every call
};

// The failures this rank saw, each "<check>: <what>"; empty when the table
// conforms. The checks skipped (for a NULL optional collective) are listed
// in *skipped when it is given, each "<check> (<why>)".
std::vector<std::string> RunConformance(const muon_comm_t& table,
                                        const ConformanceOptions& options = ConformanceOptions(),
                                        std::vector<std::string>* skipped = nullptr);

}  // namespace muon

#endif  // MUON_COMM_TESTING_CONFORMANCE_H_
