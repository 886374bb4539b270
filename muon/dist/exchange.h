// This rank's part of each exchange round: which elements it sends to and
// receives from each peer, in which order, and where the matrices it owns sit
// in its working buffer. Built once from the Plan; run every step.
//
// Gather (round r): every canonical holder of a matrix owned by rank o sends
// its elements of that matrix (the momentum-updated values, in the state
// dtype) to o, which assembles whole matrices in `slots`. Scatter: o sends
// each holder (every copy) its elements of the orthogonalized matrix (in the
// Newton-Schulz dtype), written into the holder's local update buffer.
// Nothing else moves: a rank receives a whole matrix only if it owns it.
#ifndef MUON_DIST_EXCHANGE_H_
#define MUON_DIST_EXCHANGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/common/dtype.h"
#include "muon/dist/comm.h"
#include "muon/dist/plan.h"

namespace muon {

// A span of one local parameter's update buffer.
struct LocalSpan {
  int param = 0;  // this rank's param index (registration order)
  int64_t pos = 0;
  int64_t length = 0;
  DType wire = DType::kF32;
};

// A span of the working buffer of owned matrices.
struct SlotSpan {
  int64_t pos = 0;
  int64_t length = 0;
  DType wire = DType::kF32;
};

struct ShapeBatch {
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // in slots (floats)
  int64_t count = 0;   // matrices
};

struct RoundTable {
  std::vector<int> units;           // units of this round this rank takes part in
  std::vector<ShapeBatch> batches;  // owned matrices grouped by shape
  int64_t slot_floats = 0;
  int64_t owned = 0;
  double flops = 0;
  std::vector<std::vector<LocalSpan>> gather_send;  // per peer
  std::vector<std::vector<SlotSpan>> gather_recv;   // per peer
  std::vector<std::vector<SlotSpan>> scatter_send;  // per peer
  std::vector<std::vector<LocalSpan>> scatter_recv; // per peer
  std::string label;  // names the round's first parameter, for errors
};

// Builds the tables of every round for `my_rank`. `state_dtypes` are the
// wire dtypes of the gather per plan param; `ns_wire` the scatter's.
std::vector<RoundTable> BuildRoundTables(const Plan& plan, int my_rank, int world,
                                         DType ns_wire);

// Runs one direction of a round over `comm`: packs from the sources, calls
// all_to_all_v once, unpacks into the destinations. `updates[p]` is this
// rank's param p's fp32 update buffer.
absl::Status RunGather(const RoundTable& t, Comm& comm, const std::vector<float*>& updates,
                       float* slots, std::vector<unsigned char>* send,
                       std::vector<unsigned char>* recv, void* stream);
absl::Status RunScatter(const RoundTable& t, Comm& comm, const std::vector<float*>& updates,
                        const float* slots, std::vector<unsigned char>* send,
                        std::vector<unsigned char>* recv, void* stream);

// Largest send / receive byte counts over all rounds and directions.
size_t MaxExchangeBytes(const std::vector<RoundTable>& tables);

}  // namespace muon

#endif  // MUON_DIST_EXCHANGE_H_
