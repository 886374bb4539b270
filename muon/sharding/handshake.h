// The setup handshake of the first step: every rank learns what every other
// registered, each builds the plan from the same data, and all check that
// they built the same one. Every rank returns the same verdict, and no rank
// is left waiting in a collective because another found a problem.
//
// Collectives, in this order, on every rank:
//   GatherGroupMembers: one all_gather per group (each member's world rank);
//   AgreePlan:          on the world, an all_gather of 40-byte headers, an
//                       all_to_all_v of the own parts, an all_to_all_v of the
//                       shared parts, and an all_gather of the verdicts
//                       (plan digest, built or failed).
// Every rank issues all of them whatever fails on it.
// A rank's message (its settings fingerprint, options every rank must share,
// and its description) travels in parts (SplitHandshake), so that what many
// ranks share crosses the wire once per receiver, not once per sender:
//   shared: the fingerprint and the parameter table without the rank's
//           FlatRange ranges: the same on every rank of a pipeline stage
//           (of an expert-parallel rank);
//   groups: each group's member list: the same on every member;
//   own:    the world rank, a key (digest and size) per group, the
//           FlatRange ranges: the only part every rank sends to every rank.
// Each rank receives every distinct shared part and member list once, from
// one of the ranks that hold it (spread over them: a receiver j gets a part
// from the holder at j mod the number of holders; none when it holds the
// part itself; a shared part compressed, CompressPart), and puts every rank's description back together exactly as
// SerializeRankDesc / ParseRankDesc would carry it; BuildPlan then runs on
// the same data, with the same results and errors, as when every message is
// gathered whole. Each all_gather and all_to_all_v moves host values through
// muon/comm/host_collectives.h: with a GPU `device` (NCCL moves device memory only) they
// are staged through device buffers on `stream`.
#ifndef MUON_SHARDING_HANDSHAKE_H_
#define MUON_SHARDING_HANDSHAKE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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

// ---- The compact handshake's parts (exposed for tests and the setup
// benchmark, which measures what a rank receives).

// A part's key: two 64-bit digests of its bytes and its size. Parts with
// equal keys are taken to be equal (the chance that two different parts
// collide is about 2^-128 per pair).
struct HandshakeKey {
  uint64_t h1 = 0, h2 = 0, size = 0;
  friend bool operator==(const HandshakeKey& a, const HandshakeKey& b) {
    return a.h1 == b.h1 && a.h2 == b.h2 && a.size == b.size;
  }
  friend bool operator<(const HandshakeKey& a, const HandshakeKey& b) {
    if (a.h1 != b.h1) return a.h1 < b.h1;
    if (a.h2 != b.h2) return a.h2 < b.h2;
    return a.size < b.size;
  }
};
HandshakeKey KeyOf(const std::string& part);

// What each rank all_gathers first.
struct HandshakeHeader {
  HandshakeKey shared;
  uint64_t own_size = 0;
  uint64_t shared_wire_size = 0;  // the shared part's size as this rank sends it
};

struct HandshakeParts {
  std::string shared;               // fingerprint, parameter table without ranges
  std::string shared_wire;          // `shared` as it travels (CompressPart)
  std::string own;                  // world rank, group keys, FlatRange ranges
  std::vector<std::string> groups;  // each group's member list
  HandshakeHeader header;
};
HandshakeParts SplitHandshake(const std::string& fingerprint, const RankDesc& me);

// A shared part as it travels: zlib's fastest level. A parameter table is
// mostly names and shapes that repeat (DeepSeek-V3's 1,024 expert-rank
// tables: 9.0 MiB, 0.64 MiB compressed). Each holder sends its own
// compression and announces its size in its header, so ranks whose zlib
// builds compress differently still agree on every size.
std::string CompressPart(const std::string& part);
// Expands `wire` into *part and checks it against `key` (size and digests);
// false if it does not expand or does not match.
bool ExpandPart(const std::string& wire, const HandshakeKey& key, std::string* part);

// Every rank's keys (from the headers and the own parts, the same on every
// rank), the distinct parts and who holds them, and who sends which to whom.
class HandshakeDirectory {
 public:
  HandshakeDirectory(const std::vector<HandshakeHeader>& headers,
                     const std::vector<std::string>& owns);

  int world() const { return static_cast<int>(shared_.size()); }
  // The distinct parts in ascending key order, each with its holders
  // (ascending world rank: the ranks whose header or own part names it).
  size_t parts() const { return keys_.size(); }
  const HandshakeKey& key(size_t part) const { return keys_[part]; }
  // The rank that sends `part` to `receiver`, or -1 when the receiver holds
  // it.
  int Sender(size_t part, int receiver) const;
  // Whether `sender` sends `part` compressed (it is the sender's shared
  // part: its shared_wire), and the bytes it sends for it.
  bool Compressed(size_t part, int sender) const { return part == shared_[sender]; }
  uint64_t WireSize(size_t part, int sender) const {
    return Compressed(part, sender) ? shared_wire_[sender] : keys_[part].size;
  }
  // The parts `sender` sends each rank (indexed by receiver), each list in
  // ascending order.
  std::vector<std::vector<size_t>> Sent(int sender) const;
  // Every part `sender` holds (ascending), each with the index of its bytes
  // among `mine`: shared first, then the groups in order.
  std::vector<std::pair<size_t, size_t>> Held(int sender) const;

  // Every rank's description, put back together from the directory and the
  // parts' bytes (`bytes[part]`: every part this rank received or holds; the
  // others may be empty). Checks every rank's fingerprint against
  // `fingerprint` and names the first that differs, as the handshake did
  // when every message travelled whole; a part that does not parse fails
  // (Internal) naming the first rank that sent it.
  absl::StatusOr<std::vector<RankDesc>> Assemble(const std::vector<std::string>& bytes,
                                                 const std::string& fingerprint,
                                                 int my_rank) const;
  // Assemble with the parameter tables shared: the ranks whose shared part
  // is the same and who have no FlatRange ranges point to one parsed table
  // (the others get their own copy, ranges filled in). The same
  // descriptions and the same errors as Assemble; what AgreePlan uses.
  absl::StatusOr<std::vector<SharedRankDesc>> AssembleShared(
      const std::vector<std::string>& bytes, const std::string& fingerprint, int my_rank) const;

 private:
  struct Own {
    bool ok = false;
    int32_t world_rank = 0;
    std::vector<size_t> groups;  // part indices
    std::vector<std::pair<int64_t, int64_t>> ranges;
  };
  std::vector<size_t> shared_;  // per rank: its shared part's index
  std::vector<uint64_t> shared_wire_;  // per rank: its shared part's size as it sends it
  std::vector<Own> own_;
  std::vector<HandshakeKey> keys_;
  std::vector<std::vector<int>> holders_;  // per part, ascending
};

// The world ranks of every group's members, in group-rank order, into
// *members. Every group's all_gather is issued whatever happens to the others
// (so that no member is left waiting); the first failure is returned, with
// what arrived kept in *members.
absl::Status GatherGroupMembers(Comm& world, const std::vector<std::shared_ptr<Comm>>& groups,
                                Device* device, void* stream,
                                std::vector<std::vector<int>>* members);

// The most bytes a rank's own part, or one shared part or member list (as it
// travels and as it expands), may hold. Sizes come from the wire: a larger
// one is no handshake a job makes (a million FlatRange placements take 16
// MiB of own part) but damage, refused before anything is allocated for it.
// Every rank sees the same headers, so every rank treats such a part alike:
// it travels as no bytes and every rank fails the setup naming its sender.
constexpr uint64_t kMaxHandshakePart = uint64_t{1} << 28;  // 256 MiB

// Exchanges `me` (this rank's description, groups filled in) and
// `fingerprint` over `world`, builds the plan and checks every rank built the
// same. Every rank issues every collective of the handshake whatever fails
// (its own description, a collective, the data received), so that a failure
// leaves no rank waiting and no collective mis-paired. `local_error`: a
// problem this rank found before (describing itself, its group
// memberships); it still takes part in every collective, then every rank
// fails (this one with `local_error`, the others naming it). Ranks whose
// fingerprints differ fail with both named.
// On failure, *own (optional) says whether the cause is this rank's own (its
// `local_error`, one of its collectives, the plan it built from what it
// received, a plan check that differs from its plan or arrived damaged) or
// only another rank's verdict that it could not build the plan, which every
// rank reads alike: that rank reports its cause when the setup's outcome is
// agreed, and this one reports OK there.
absl::StatusOr<Plan> AgreePlan(Comm& world, const RankDesc& me, const std::string& fingerprint,
                               const PlanOptions& options, const absl::Status& local_error,
                               Device* device, void* stream, bool* own = nullptr);

}  // namespace muon

#endif  // MUON_SHARDING_HANDSHAKE_H_
