// Assembles a muon_comm_t from an adapter's callbacks (header-only, so the
// separate MPI library can use it without linking the core).
#ifndef MUON_COMM_TABLE_H_
#define MUON_COMM_TABLE_H_

#include <cstring>

#include "libmuon/muon.h"

namespace muon {

// The callbacks an adapter provides; release may be null.
struct CommCallbacks {
  decltype(muon_comm_t::all_gather) all_gather;
  decltype(muon_comm_t::all_to_all_v) all_to_all_v;
  decltype(muon_comm_t::broadcast) broadcast;
  decltype(muon_comm_t::reduce_scatter) reduce_scatter;
  decltype(muon_comm_t::barrier) barrier;
  decltype(muon_comm_t::release) release;
};

inline muon_comm_t MakeCommTable(void* ctx, int rank, int size, const CommCallbacks& cb) {
  muon_comm_t t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.ctx = ctx;
  t.rank = rank;
  t.size = size;
  t.all_gather = cb.all_gather;
  t.all_to_all_v = cb.all_to_all_v;
  t.broadcast = cb.broadcast;
  t.reduce_scatter = cb.reduce_scatter;
  t.barrier = cb.barrier;
  t.release = cb.release;
  return t;
}

}  // namespace muon

#endif  // MUON_COMM_TABLE_H_
