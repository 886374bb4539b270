// The setup handshake of the first step: every rank tells every other what
// it registered, each builds the plan from the same data, and all check
// that they built the same one. Every rank returns the same verdict, and no
// rank is left waiting in a collective because another found a problem.
//
// Collectives, in this order, on every rank:
//   GatherGroupMembers: one all_gather per group (each member's world rank);
//   AgreePlan:          on the world, an all_gather of message sizes, one of
//                       the messages (padded to the longest), and one of the
//                       verdicts (plan digest, or failed).
// A message is this rank's settings fingerprint (options every rank must
// share) followed by its description (SerializeRankDesc). Each all_gather
// moves host values through HostAllGather: with a GPU `device` (NCCL moves
// device memory only) they are staged through device buffers on `stream`.
#ifndef MUON_SHARDING_HANDSHAKE_H_
#define MUON_SHARDING_HANDSHAKE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muon/comm/comm.h"
#include "muon/device/device.h"
#include "muon/sharding/plan.h"

namespace muon {

// The handshake's wire form of a rank's description (host byte order).
std::string SerializeRankDesc(const RankDesc& desc);
// Errors (Internal) name `who` ("rank 3").
absl::StatusOr<RankDesc> ParseRankDesc(const std::string& bytes, const std::string& who);

// The world ranks of every group's members, in group-rank order.
absl::StatusOr<std::vector<std::vector<int>>> GatherGroupMembers(
    Comm& world, const std::vector<std::shared_ptr<Comm>>& groups, Device* device, void* stream);

// Exchanges `me` (this rank's description, groups filled in) and
// `fingerprint` over `world`, builds the plan and checks every rank built the
// same. `local_error`: a problem this rank found while describing itself; it
// still takes part in every collective, then every rank fails (this one with
// `local_error`, the others naming it). Ranks whose fingerprints differ fail
// with both named.
absl::StatusOr<Plan> AgreePlan(Comm& world, const RankDesc& me, const std::string& fingerprint,
                               const PlanOptions& options, const absl::Status& local_error,
                               Device* device, void* stream);

}  // namespace muon

#endif  // MUON_SHARDING_HANDSHAKE_H_
