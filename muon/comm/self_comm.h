// The communicator of a world of one rank: the world a single-process
// optimizer runs its pipeline over. Every collective copies send to receive:
// host memory by memmove, GPU memory stream-ordered through the installed
// memory ops (memory_ops.h).
#ifndef MUON_COMM_SELF_COMM_H_
#define MUON_COMM_SELF_COMM_H_

#include "libmuon/muon.h"

namespace muon {

muon_comm_t SelfCommTable();

}  // namespace muon

#endif  // MUON_COMM_SELF_COMM_H_
