#include "muon/sharding/handshake.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/sharding/handshake_wire.h"
#include "muon/comm/host_collectives.h"

namespace muon {
namespace {

// The wire form (handshake_wire.h).
using wire::GetMembers;
using wire::GetParams;
using wire::In;
using wire::Out;
using wire::PutMembers;
using wire::PutParams;

}  // namespace

std::string SerializeRankDesc(const RankDesc& d) {
  Out o;
  o.Put<int32_t>(d.world_rank);
  o.Put<uint32_t>(static_cast<uint32_t>(d.groups.size()));
  for (const auto& g : d.groups) PutMembers(o, g);
  PutParams(o, d.params, /*ranges=*/true);
  return o.Take();
}

absl::StatusOr<RankDesc> ParseRankDesc(const std::string& bytes, const std::string& who) {
  In in(bytes);
  RankDesc d;
  auto bad = [&] {
    return absl::InternalError(absl::StrCat(who, ": malformed handshake data"));
  };
  int32_t rank;
  uint32_t ngroups;
  if (!in.Get(&rank) || !in.Get(&ngroups) || ngroups > (1u << 16)) return bad();
  d.world_rank = rank;
  d.groups.resize(ngroups);
  for (auto& g : d.groups) {
    if (!GetMembers(in, &g)) return bad();
  }
  if (!GetParams(in, &d.params, /*ranges=*/true) || !in.AtEnd()) return bad();
  return d;
}

absl::Status GatherGroupMembers(Comm& world, const std::vector<std::shared_ptr<Comm>>& groups,
                                Device* device, void* stream,
                                std::vector<std::vector<int>>* members) {
  members->clear();
  absl::Status first;
  for (const auto& g : groups) {
    std::vector<int32_t> m(g->size(), -1);
    const int32_t mine = world.rank();
    const absl::Status st = HostCollectives(*g, device, stream)
                                .AllGather(&mine, m.data(), sizeof mine, "setup: group membership");
    if (first.ok()) first = st;
    members->emplace_back(m.begin(), m.end());
  }
  return first;
}

HandshakeKey KeyOf(const std::string& part) {
  HandshakeKey k;
  uint64_t h1 = 1469598103934665603ull, h2 = 0x243f6a8885a308d3ull;
  for (unsigned char c : part) {
    h1 = (h1 ^ c) * 1099511628211ull;
    h2 = (h2 ^ c) * 0xff51afd7ed558ccdull;
    h2 ^= h2 >> 29;
  }
  k.h1 = h1;
  k.h2 = h2;
  k.size = part.size();
  return k;
}

HandshakeParts SplitHandshake(const std::string& fingerprint, const RankDesc& me) {
  HandshakeParts parts;
  Out shared;
  shared.Str(fingerprint);
  PutParams(shared, me.params, /*ranges=*/false);
  parts.shared = shared.Take();
  Out own;
  own.Put<int32_t>(me.world_rank);
  own.Put<uint32_t>(static_cast<uint32_t>(me.groups.size()));
  for (const auto& g : me.groups) {
    Out members;
    PutMembers(members, g);
    parts.groups.push_back(members.Take());
    const HandshakeKey k = KeyOf(parts.groups.back());
    own.Put<uint64_t>(k.h1);
    own.Put<uint64_t>(k.h2);
    own.Put<uint64_t>(k.size);
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const RankParamDesc& p : me.params) {
    for (const Placement& pl : p.layout.placements) {
      if (pl.kind == PlacementKind::kFlatRange) ranges.push_back({pl.start, pl.length});
    }
  }
  own.Put<uint32_t>(static_cast<uint32_t>(ranges.size()));
  for (const auto& [start, length] : ranges) {
    own.Put<int64_t>(start);
    own.Put<int64_t>(length);
  }
  parts.own = own.Take();
  parts.header.shared = KeyOf(parts.shared);
  parts.header.own_size = parts.own.size();
  parts.shared_wire = CompressPart(parts.shared);
  parts.header.shared_wire_size = parts.shared_wire.size();
  return parts;
}

std::string CompressPart(const std::string& part) {
  uLongf size = compressBound(static_cast<uLong>(part.size()));
  std::string wire(size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(&wire[0]), &size,
                reinterpret_cast<const Bytef*>(part.data()), static_cast<uLong>(part.size()),
                Z_BEST_SPEED) != Z_OK) {
    return std::string();  // only without memory; then a receiver's ExpandPart fails
  }
  wire.resize(size);
  return wire;
}

bool ExpandPart(const std::string& wire, const HandshakeKey& key, std::string* part) {
  // A size no handshake makes is not a part (keys come from the wire).
  if (key.size > kMaxHandshakePart) return false;
  part->assign(static_cast<size_t>(key.size), '\0');
  uLongf size = static_cast<uLongf>(key.size);
  const int rc = uncompress(reinterpret_cast<Bytef*>(part->empty() ? nullptr : &(*part)[0]), &size,
                            reinterpret_cast<const Bytef*>(wire.data()),
                            static_cast<uLong>(wire.size()));
  return rc == Z_OK && size == key.size && KeyOf(*part) == key;
}

HandshakeDirectory::HandshakeDirectory(const std::vector<HandshakeHeader>& headers,
                                       const std::vector<std::string>& owns) {
  const int n = static_cast<int>(headers.size());
  own_.resize(n);
  // Every (key, rank) claim: a rank's shared part and its groups.
  std::vector<std::pair<HandshakeKey, int>> claims;
  std::vector<std::vector<HandshakeKey>> group_keys(n);
  for (int r = 0; r < n; ++r) {
    claims.push_back({headers[r].shared, r});
    In in(owns[r]);
    Own& o = own_[r];
    uint32_t ngroups = 0, nranges = 0;
    bool ok = in.Get(&o.world_rank) && in.Get(&ngroups) && ngroups <= (1u << 16);
    for (uint32_t g = 0; ok && g < ngroups; ++g) {
      HandshakeKey k;
      ok = in.Get(&k.h1) && in.Get(&k.h2) && in.Get(&k.size);
      if (ok) group_keys[r].push_back(k);
    }
    ok = ok && in.Get(&nranges) && (owns[r].size() / 16) >= nranges;
    for (uint32_t i = 0; ok && i < nranges; ++i) {
      std::pair<int64_t, int64_t> range;
      ok = in.Get(&range.first) && in.Get(&range.second);
      o.ranges.push_back(range);
    }
    o.ok = ok && in.AtEnd();
    if (!o.ok) {
      group_keys[r].clear();
      o.ranges.clear();
    }
    for (const HandshakeKey& k : group_keys[r]) claims.push_back({k, r});
  }
  std::sort(claims.begin(), claims.end());
  claims.erase(std::unique(claims.begin(), claims.end()), claims.end());
  for (const auto& [k, r] : claims) {
    if (keys_.empty() || !(keys_.back() == k)) {
      keys_.push_back(k);
      holders_.emplace_back();
    }
    holders_.back().push_back(r);
  }
  auto index = [&](const HandshakeKey& k) {
    return static_cast<size_t>(std::lower_bound(keys_.begin(), keys_.end(), k) - keys_.begin());
  };
  shared_.resize(n);
  shared_wire_.resize(n);
  for (int r = 0; r < n; ++r) {
    shared_[r] = index(headers[r].shared);
    shared_wire_[r] = headers[r].shared_wire_size;
    for (const HandshakeKey& k : group_keys[r]) own_[r].groups.push_back(index(k));
  }
}

int HandshakeDirectory::Sender(size_t part, int receiver) const {
  const std::vector<int>& h = holders_[part];
  if (std::binary_search(h.begin(), h.end(), receiver)) return -1;
  return h[static_cast<size_t>(receiver) % h.size()];
}

std::vector<std::pair<size_t, size_t>> HandshakeDirectory::Held(int sender) const {
  std::vector<std::pair<size_t, size_t>> held = {{shared_[sender], 0}};
  for (size_t g = 0; g < own_[sender].groups.size(); ++g) {
    held.push_back({own_[sender].groups[g], g + 1});
  }
  std::sort(held.begin(), held.end());
  // One entry per part (two groups with the same members are one part).
  held.erase(std::unique(held.begin(), held.end(),
                         [](const auto& a, const auto& b) { return a.first == b.first; }),
             held.end());
  return held;
}

std::vector<std::vector<size_t>> HandshakeDirectory::Sent(int sender) const {
  const size_t n = shared_.size();
  std::vector<std::vector<size_t>> sent(n);
  for (const auto& [part, local] : Held(sender)) {
    const std::vector<int>& h = holders_[part];
    const size_t at = static_cast<size_t>(std::lower_bound(h.begin(), h.end(), sender) - h.begin());
    for (size_t j = at; j < n; j += h.size()) {
      if (!std::binary_search(h.begin(), h.end(), static_cast<int>(j))) sent[j].push_back(part);
    }
  }
  return sent;
}

absl::StatusOr<std::vector<SharedRankDesc>> HandshakeDirectory::AssembleShared(
    const std::vector<std::string>& bytes, const std::string& fingerprint, int my_rank) const {
  // Each distinct part parsed once.
  struct Table {
    bool parsed = false, fingerprint_ok = false, ok = false;
    std::string fingerprint;
    std::shared_ptr<const std::vector<RankParamDesc>> params;
    size_t flat_ranges = 0;  // FlatRange placements in the table
  };
  struct Members {
    bool parsed = false, ok = false;
    std::vector<int> members;
  };
  std::vector<Table> tables(keys_.size());
  std::vector<Members> groups(keys_.size());
  const int n = world();
  std::vector<SharedRankDesc> ranks(n);
  for (int r = 0; r < n; ++r) {
    auto bad = [&] {
      return absl::InternalError(absl::StrCat("rank ", r, ": malformed handshake data"));
    };
    const size_t s = shared_[r];
    Table& t = tables[s];
    if (!t.parsed) {
      t.parsed = true;
      In in(bytes[s]);
      auto params = std::make_shared<std::vector<RankParamDesc>>();
      t.fingerprint_ok = bytes[s].size() == keys_[s].size && in.Str(&t.fingerprint);
      t.ok = t.fingerprint_ok && GetParams(in, params.get(), /*ranges=*/false) && in.AtEnd();
      params->shrink_to_fit();  // held for the whole setup: no spare capacity
      for (const RankParamDesc& p : *params) {
        for (const Placement& pl : p.layout.placements) {
          if (pl.kind == PlacementKind::kFlatRange) ++t.flat_ranges;
        }
      }
      t.params = std::move(params);
    }
    if (!t.fingerprint_ok) {
      return absl::InternalError("setup: malformed handshake message");
    }
    if (t.fingerprint != fingerprint) {
      return absl::InvalidArgumentError(absl::StrCat(
          "setup: rank ", r, " runs with different optimizer options (", t.fingerprint,
          ") than rank ", my_rank, " (", fingerprint, "); every rank must use the same options"));
    }
    const Own& o = own_[r];
    if (!t.ok || !o.ok) return bad();
    SharedRankDesc& d = ranks[r];
    d.world_rank = o.world_rank;
    for (size_t g : o.groups) {
      Members& m = groups[g];
      if (!m.parsed) {
        m.parsed = true;
        In in(bytes[g]);
        m.ok = bytes[g].size() == keys_[g].size && GetMembers(in, &m.members) && in.AtEnd();
      }
      if (!m.ok) return bad();
      d.groups.push_back(m.members);
    }
    // Each FlatRange placement takes the rank's next range, in order.
    if (o.ranges.size() != t.flat_ranges) return bad();
    if (t.flat_ranges == 0) {
      d.params = t.params;  // the table as it is: shared
      continue;
    }
    auto params = std::make_shared<std::vector<RankParamDesc>>(*t.params);
    size_t next = 0;
    for (RankParamDesc& p : *params) {
      for (Placement& pl : p.layout.placements) {
        if (pl.kind != PlacementKind::kFlatRange) continue;
        pl.start = o.ranges[next].first;
        pl.length = o.ranges[next].second;
        ++next;
      }
    }
    d.params = std::move(params);
  }
  return ranks;
}

absl::StatusOr<std::vector<RankDesc>> HandshakeDirectory::Assemble(
    const std::vector<std::string>& bytes, const std::string& fingerprint, int my_rank) const {
  MUON_ASSIGN_OR_RETURN(std::vector<SharedRankDesc> shared,
                        AssembleShared(bytes, fingerprint, my_rank));
  std::vector<RankDesc> ranks(shared.size());
  for (size_t r = 0; r < shared.size(); ++r) {
    ranks[r].world_rank = shared[r].world_rank;
    ranks[r].groups = std::move(shared[r].groups);
    ranks[r].params = *shared[r].params;
  }
  return ranks;
}

namespace {

constexpr const char* kHandshakeOp = "setup: handshake";

// The tables and buffers of one all_to_all_v of host bytes over the world,
// per rank.
struct AllToAllBytes {
  explicit AllToAllBytes(int n) : send_bytes(n), send_offsets(n), recv_bytes(n), recv_offsets(n) {}
  std::vector<size_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
  std::string send, recv;
};

// This rank's side of AgreePlan's collectives: where they run, and its first
// failure (after which it goes on taking part in every collective).
struct HandshakeRun {
  Comm& world;
  Device* device;
  void* stream;
  absl::Status failed;

  void Note(const absl::Status& st) {
    if (failed.ok() && !st.ok()) failed = st;
  }
  // A size from the wire that no handshake makes: that part travels as no
  // bytes (on every rank alike: they all hold the same headers).
  size_t Capped(uint64_t size, int sender, const char* what) {
    if (size <= kMaxHandshakePart) return static_cast<size_t>(size);
    Note(absl::InternalError(absl::StrCat("setup: rank ", sender, " announced a ", what, " of ",
                                          size, " bytes, more than a handshake part may hold (",
                                          kMaxHandshakePart, "); its header arrived damaged")));
    return 0;
  }
  // Sends x->send as its send tables say and receives sizes[j] bytes from
  // each rank j into x->recv, in rank order (its receive tables).
  void AllToAllV(const std::vector<size_t>& sizes, AllToAllBytes* x) {
    size_t total = 0;
    for (size_t j = 0; j < sizes.size(); ++j) {
      x->recv_bytes[j] = sizes[j];
      x->recv_offsets[j] = total;
      total += sizes[j];
    }
    x->recv.resize(total);
    Note(HostCollectives(world, device, stream)
             .AllToAllV({x->send.data(), &x->send_bytes, &x->send_offsets, x->send.size()},
                        {&x->recv[0], &x->recv_bytes, &x->recv_offsets, total}, kHandshakeOp));
  }
};

// 1. The headers: every rank's shared key and own part's size. 2. The own
// parts, each to every rank. Returns the directory they make.
HandshakeDirectory ExchangeOwnParts(HandshakeRun& run, const HandshakeParts& mine) {
  const int n = run.world.size();
  std::vector<HandshakeHeader> headers(n);
  run.Note(HostCollectives(run.world, run.device, run.stream)
               .AllGather(&mine.header, headers.data(), sizeof(HandshakeHeader), kHandshakeOp));
  AllToAllBytes x(n);
  std::vector<size_t> sizes(n);
  const size_t own_sent = mine.own.size() <= kMaxHandshakePart ? mine.own.size() : 0;
  x.send.reserve(own_sent * n);
  for (int j = 0; j < n; ++j) {
    x.send_bytes[j] = own_sent;
    x.send_offsets[j] = x.send.size();
    x.send.append(mine.own, 0, own_sent);
    sizes[j] = run.Capped(headers[j].own_size, j, "part of its own");
  }
  run.AllToAllV(sizes, &x);
  std::string().swap(x.send);
  std::vector<std::string> owns(n);
  for (int j = 0; j < n; ++j) owns[j] = x.recv.substr(x.recv_offsets[j], x.recv_bytes[j]);
  std::string().swap(x.recv);
  return HandshakeDirectory(headers, owns);
}

// The parts received in `x` from each rank j (from[j], each of
// part_bytes[j] bytes as it travelled) into bytes[part], a compressed one
// expanded. A part that does not expand to its key fails the setup on this
// rank (the error returned) after the verdicts: every rank still joins them.
absl::Status UnpackParts(const AllToAllBytes& x, const HandshakeDirectory& dir,
                         const std::vector<std::vector<size_t>>& from,
                         const std::vector<std::vector<size_t>>& part_bytes,
                         std::vector<std::string>* bytes) {
  absl::Status received;
  for (size_t j = 0; j < from.size(); ++j) {
    size_t at = x.recv_offsets[j];
    for (size_t i = 0; i < from[j].size(); ++i) {
      const size_t part = from[j][i], size = part_bytes[j][i];
      if (!dir.Compressed(part, static_cast<int>(j))) {
        (*bytes)[part] = x.recv.substr(at, size);
      } else if (!ExpandPart(x.recv.substr(at, size), dir.key(part), &(*bytes)[part]) &&
                 received.ok()) {
        received = absl::InternalError(absl::StrCat(
            "setup: the parameter table rank ", j, " sent does not expand to its digest"));
      }
      at += size;
    }
  }
  return received;
}

// 3. The distinct shared parts and member lists this rank does not hold,
// each from one of its holders (a shared part compressed). A part whose
// size no handshake makes travels as no bytes, on both sides. Returns every
// part's bytes this rank holds or received (UnpackParts: *received).
std::vector<std::string> ExchangeSharedParts(HandshakeRun& run, const HandshakeDirectory& dir,
                                             const HandshakeParts& mine,
                                             absl::Status* received) {
  const int n = run.world.size(), self = run.world.rank();
  std::vector<std::string> bytes(dir.parts());
  for (const auto& [part, local] : dir.Held(self)) {
    bytes[part] = local == 0 ? mine.shared : mine.groups[local - 1];
  }
  AllToAllBytes x(n);
  const std::vector<std::vector<size_t>> sent = dir.Sent(self);
  for (int j = 0; j < n; ++j) {
    x.send_offsets[j] = x.send.size();
    for (size_t part : sent[j]) {
      if (dir.WireSize(part, self) > kMaxHandshakePart) continue;
      x.send += dir.Compressed(part, self) ? mine.shared_wire : bytes[part];
    }
    x.send_bytes[j] = x.send.size() - x.send_offsets[j];
  }
  std::vector<std::vector<size_t>> from(n);  // the parts each rank sends this one
  for (size_t part = 0; part < dir.parts(); ++part) {
    const int s = dir.Sender(part, self);
    if (s >= 0) from[s].push_back(part);
  }
  std::vector<std::vector<size_t>> part_bytes(n);  // each received part's, as it travels
  std::vector<size_t> sizes(n, 0);
  for (int j = 0; j < n; ++j) {
    for (size_t part : from[j]) {
      part_bytes[j].push_back(run.Capped(dir.WireSize(part, j), j, "handshake part"));
      sizes[j] += part_bytes[j].back();
    }
  }
  run.AllToAllV(sizes, &x);
  std::string().swap(x.send);
  *received = UnpackParts(x, dir, from, part_bytes, &bytes);
  return bytes;
}

// 4. The plan check: every rank's verdict (its plan's digest, and whether it
// was built, in words no damaged byte turns into each other; neither:
// damage), gathered and held against this rank's `plan`. Returns the plan,
// this rank's failure, or (*own false) another rank's that it could not
// build the plan.
absl::StatusOr<Plan> CheckVerdicts(HandshakeRun& run, Plan plan, bool* own) {
  const int n = run.world.size();
  constexpr uint64_t kBuilt = 0x544c495542u, kFailed = 0x44454c494146u;  // "BUILT", "FAILED"
  struct Verdict {
    uint64_t digest;
    uint64_t state;
  } my_verdict{run.failed.ok() ? plan.digest : 0, run.failed.ok() ? kBuilt : kFailed};
  std::vector<Verdict> verdicts(n, Verdict{0, 0});
  run.Note(HostCollectives(run.world, run.device, run.stream)
               .AllGather(&my_verdict, verdicts.data(), sizeof my_verdict, "setup: plan check"));
  for (int r = 0; r < n && run.failed.ok(); ++r) {
    if (verdicts[r].state != kBuilt && verdicts[r].state != kFailed) {
      run.failed = absl::InternalError(absl::StrCat("setup: rank ", r,
                                                    "'s plan check arrived damaged"));
    } else if (verdicts[r].state == kBuilt && verdicts[r].digest != plan.digest) {
      run.failed = absl::InvalidArgumentError(absl::StrCat(
          "setup: rank ", r, " computed a different plan than rank ", run.world.rank(),
          " (a custom assignment must give the same owners on every rank)"));
    }
  }
  if (!run.failed.ok()) return run.failed;
  // Another rank's failure, which every rank reads alike: that rank reports
  // its cause when the ranks agree on the setup's outcome.
  if (own != nullptr) *own = false;
  for (int r = 0; r < n; ++r) {
    if (verdicts[r].state == kFailed) {
      return absl::InvalidArgumentError(
          absl::StrCat("setup: rank ", r, " could not build the plan (see its error)"));
    }
  }
  return std::move(plan);
}

}  // namespace

absl::StatusOr<Plan> AgreePlan(Comm& world, const RankDesc& me, const std::string& fingerprint,
                               const PlanOptions& options, const absl::Status& local_error,
                               Device* device, void* stream, bool* own) {
  if (own != nullptr) *own = true;
  const HandshakeParts mine = SplitHandshake(fingerprint, me);
  // This rank's first failure; it goes on taking part in every collective.
  HandshakeRun run{world, device, stream, local_error};
  const HandshakeDirectory dir = ExchangeOwnParts(run, mine);
  absl::Status received;
  std::vector<std::string> bytes = ExchangeSharedParts(run, dir, mine, &received);
  // Every rank that received the same data reaches the same verdict; a rank
  // that fails alone (a custom assignment, a collective) still joins the
  // digest exchange.
  Plan plan;
  if (run.failed.ok()) {
    run.failed = [&]() -> absl::Status {
      MUON_RETURN_IF_ERROR(received);
      MUON_ASSIGN_OR_RETURN(std::vector<SharedRankDesc> ranks,
                            dir.AssembleShared(bytes, fingerprint, world.rank()));
      std::vector<std::string>().swap(bytes);
      MUON_ASSIGN_OR_RETURN(plan, BuildPlan(ranks, world.rank(), options));
      return absl::OkStatus();
    }();
  }
  return CheckVerdicts(run, std::move(plan), own);
}

}  // namespace muon
