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
#ifndef MUON_SHARDING_EXCHANGE_H_
#define MUON_SHARDING_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "muon/common/dtype.h"
#include "muon/device/device.h"
#include "muon/comm/comm.h"
#include "muon/sharding/plan.h"

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
  std::vector<int> units;  // indices into Plan::units, in slot order
  // >= 0: matrices of this parameter (Plan::params), orthogonalized in the
  // blocks of its split (PlanParam::split); -1: whole matrices of any.
  int split_param = -1;
};

// An owned part of a split matrix (Unit::parts > 1) in the working buffer:
// its block, packed as PlanNewtonSchulzBlock (ns_program.h) stores it.
struct BlockSlot {
  int unit = 0;        // index into Plan::units
  int64_t offset = 0;  // in slots (elements)
  int64_t m = 0, width = 0;
  bool tall = false;
};

struct RoundTable {
  std::vector<int> units;           // units of this round this rank takes part in
  std::vector<ShapeBatch> batches;  // owned whole matrices grouped by shape
  std::vector<BlockSlot> blocks;    // owned parts of split matrices, in unit order
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

// One round's exchange bound to this rank's buffers, prepared once at
// setup: per direction, the pack copies (update storage or fp32 slots ->
// wire bytes of the send buffer), the all_to_all_v byte counts and offsets,
// and the unpack copies (wire bytes -> slots or update storage). Running it
// allocates nothing.
struct BoundExchange {
  struct Direction {
    std::unique_ptr<CopyProgram> pack, unpack;
    std::vector<size_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
    std::string label;  // "gathering <round label>", for errors
    // With a trailer: per peer, where the trailer bytes sit in send / recv
    // (right after that peer's pieces); empty without one.
    size_t trailer = 0;
    std::vector<size_t> send_trailers, recv_trailers;
  };
  Direction gather, scatter;
  bool single_rank = false;  // a world of one: no collective, pieces copied directly
};

// `updates[p]` is where this rank's param p's update lives (its fp32 update
// buffer, or with update_in_grad its gradient's own memory); `slots` the
// round's working buffer of owned matrices (elements of its dtype, fp32 or
// the backend's SlotDtype; the tables' slot offsets count elements);
// `send`/`recv` hold
// MaxExchangeBytes(tables) bytes. All are memory of `device`.
// `scatter_trailer` > 0: the scatter direction also carries that many bytes
// from every rank to every rank (itself included), after each peer's pieces;
// send and recv then hold MaxExchangeBytes(tables) + size * scatter_trailer.
absl::StatusOr<BoundExchange> BindExchange(const RoundTable& t, Device& device,
                                           const std::vector<LocalBuffer>& updates,
                                           LocalBuffer slots,
                                           unsigned char* send, unsigned char* recv,
                                           bool single_rank, size_t scatter_trailer = 0);

// Runs one direction (b.gather or b.scatter): pack, one all_to_all_v over
// `comm` on `stream`, unpack. The all_to_all_v is issued even when packing
// failed (the other ranks' calls must pair up); nothing is unpacked then.
// With a trailer (d.trailer > 0): `trailer_out` (d.trailer bytes of host
// memory) is written into every peer's trailer before the call, and every
// peer's trailer lands in `trailers_in` (size * d.trailer bytes, rank order)
// after it, whether the call reported an error or not (the bytes moved; the
// caller judges them). On the host device both copies happen at once; on a
// GPU they are stream-ordered and nothing waits: `trailer_out` is read when
// the stream reaches it (keep it unchanged until a wait), and `trailers_in`
// is device memory.
// `trailer_out_on_device`: trailer_out is device memory instead (written on
// the stream before; what a CUDA graph capture can copy).
absl::Status RunExchange(const BoundExchange& b, const BoundExchange::Direction& d, Comm& comm,
                         Device& device, unsigned char* send, unsigned char* recv, void* stream,
                         const unsigned char* trailer_out = nullptr,
                         unsigned char* trailers_in = nullptr,
                         bool trailer_out_on_device = false);

// Largest send / receive byte counts over all rounds and directions.
size_t MaxExchangeBytes(const std::vector<RoundTable>& tables);

}  // namespace muon

#endif  // MUON_SHARDING_EXCHANGE_H_
