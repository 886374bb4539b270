// The host-side reduction of reduce_scatter, shared by the communicator
// adapters that reduce on the host (in-process, MPI) so that they agree bit
// for bit: blocks are summed in rank order 0, 1, ..., n-1 in float32 and the
// sum is rounded once to the element type (bf16/fp16: round to nearest even).
#ifndef MUON_COMM_ORDERED_SUM_H_
#define MUON_COMM_ORDERED_SUM_H_

#include <cstddef>
#include <cstdint>

#include "muon/common/dtype.h"

namespace muon {

// out[i] = round(((blocks[0][i] + blocks[1][i]) + ...) + blocks[n-1][i]) for
// i < count, each block holding `count` elements of type `t`. `out` may be
// one of the blocks (or overlap any of them element for element): every
// element is read from all blocks before it is written.
void SumInRankOrder(DType t, const void* const* blocks, int n, size_t count, void* out);

}  // namespace muon

#endif  // MUON_COMM_ORDERED_SUM_H_
