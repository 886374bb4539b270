#include "muon/sharding/handshake.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/sharding/host_gather.h"

namespace muon {
namespace {

// ---- Serialization (host byte order: every rank of a job shares it) ----

class Out {
 public:
  template <typename T>
  void Put(T v) {
    buf_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void Str(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  void Ints(const std::vector<int64_t>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (int64_t x : v) Put<int64_t>(x);
  }
  std::string Take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class In {
 public:
  explicit In(const std::string& b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!Get(&n) || b_.size() - pos_ < n) return false;
    s->assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Ints(std::vector<int64_t>* v) {
    uint32_t n;
    if (!Get(&n) || (b_.size() - pos_) / 8 < n) return false;
    v->resize(n);
    for (auto& x : *v) Get(&x);
    return true;
  }
  bool AtEnd() const { return pos_ == b_.size(); }

 private:
  const std::string& b_;
  size_t pos_ = 0;
};

// A handshake message: the fingerprint, then the description.
std::string Frame(const std::string& fingerprint, const std::string& desc) {
  std::string out;
  const uint32_t n = static_cast<uint32_t>(fingerprint.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += fingerprint;
  out += desc;
  return out;
}

}  // namespace

std::string SerializeRankDesc(const RankDesc& d) {
  Out o;
  o.Put<int32_t>(d.world_rank);
  o.Put<uint32_t>(static_cast<uint32_t>(d.groups.size()));
  for (const auto& g : d.groups) {
    o.Put<uint32_t>(static_cast<uint32_t>(g.size()));
    for (int m : g) o.Put<int32_t>(m);
  }
  o.Put<uint32_t>(static_cast<uint32_t>(d.params.size()));
  for (const RankParamDesc& p : d.params) {
    o.Str(p.name);
    o.Put<uint8_t>(p.param_dtype);
    o.Put<uint8_t>(p.state_dtype);
    o.Put<uint8_t>(p.view);
    o.Put<int32_t>(p.custom_owner);
    o.Put<uint8_t>(p.zero2);
    o.Ints(p.global_shape);
    o.Ints(p.layout.global_shape);
    o.Put<uint32_t>(static_cast<uint32_t>(p.layout.placements.size()));
    for (const Placement& pl : p.layout.placements) {
      o.Put<int32_t>(static_cast<int32_t>(pl.kind));
      o.Put<int32_t>(pl.group);
      o.Put<int32_t>(pl.dim);
      o.Put<int32_t>(static_cast<int32_t>(pl.split));
      o.Ints(pl.sizes);
      o.Put<int64_t>(pl.start);
      o.Put<int64_t>(pl.length);
    }
  }
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
    uint32_t n;
    if (!in.Get(&n) || n > (1u << 24)) return bad();
    g.resize(n);
    for (int& m : g) {
      int32_t v;
      if (!in.Get(&v)) return bad();
      m = v;
    }
  }
  uint32_t nparams;
  if (!in.Get(&nparams)) return bad();
  for (uint32_t i = 0; i < nparams; ++i) {
    RankParamDesc p;
    uint32_t nplace;
    if (!in.Str(&p.name) || !in.Get(&p.param_dtype) || !in.Get(&p.state_dtype) ||
        !in.Get(&p.view) || !in.Get(&p.custom_owner) || !in.Get(&p.zero2) || !in.Ints(&p.global_shape) || !in.Ints(&p.layout.global_shape) ||
        !in.Get(&nplace) || nplace > 64) {
      return bad();
    }
    p.layout.placements.resize(nplace);
    for (Placement& pl : p.layout.placements) {
      int32_t kind, group, dim, split;
      if (!in.Get(&kind) || !in.Get(&group) || !in.Get(&dim) || !in.Get(&split) ||
          !in.Ints(&pl.sizes) || !in.Get(&pl.start) || !in.Get(&pl.length)) {
        return bad();
      }
      pl.kind = static_cast<PlacementKind>(kind);
      pl.group = group;
      pl.dim = dim;
      pl.split = static_cast<ShardSplit>(split);
    }
    d.params.push_back(std::move(p));
  }
  if (!in.AtEnd()) return bad();
  return d;
}

absl::StatusOr<std::vector<std::vector<int>>> GatherGroupMembers(
    Comm& world, const std::vector<std::shared_ptr<Comm>>& groups, Device* device, void* stream) {
  std::vector<std::vector<int>> members;
  for (const auto& g : groups) {
    std::vector<int32_t> m(g->size());
    const int32_t mine = world.rank();
    MUON_RETURN_IF_ERROR(HostAllGather(*g, device, &mine, m.data(), sizeof mine, stream,
                                       "setup: group membership"));
    members.emplace_back(m.begin(), m.end());
  }
  return members;
}

absl::StatusOr<Plan> AgreePlan(Comm& world, const RankDesc& me, const std::string& fingerprint,
                               const PlanOptions& options, const absl::Status& local_error,
                               Device* device, void* stream) {
  // Every rank's message, padded to the longest.
  const std::string mine = Frame(fingerprint, SerializeRankDesc(me));
  const int n = world.size();
  std::vector<uint64_t> sizes(n);
  const uint64_t my_size = mine.size();
  MUON_RETURN_IF_ERROR(HostAllGather(world, device, &my_size, sizes.data(), sizeof my_size, stream,
                                     "setup: handshake"));
  const uint64_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::string padded = mine;
  padded.resize(longest);
  std::string all(longest * n, '\0');
  MUON_RETURN_IF_ERROR(
      HostAllGather(world, device, padded.data(), &all[0], longest, stream, "setup: handshake"));

  // Every rank now holds the same data and reaches the same verdict; a rank
  // that fails alone (a custom assignment) still joins the digest exchange.
  Plan plan;
  absl::Status built = [&]() -> absl::Status {
    if (!local_error.ok()) return local_error;
    std::vector<RankDesc> ranks;
    for (int r = 0; r < n; ++r) {
      const std::string msg = all.substr(r * longest, sizes[r]);
      uint32_t fl = 0;
      if (msg.size() < 4) return absl::InternalError("setup: malformed handshake message");
      std::memcpy(&fl, msg.data(), 4);
      const std::string fp = msg.substr(4, fl);
      if (fp != fingerprint) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setup: rank ", r, " runs with different optimizer options (", fp, ") than rank ",
            world.rank(), " (", fingerprint, "); every rank must use the same options"));
      }
      MUON_ASSIGN_OR_RETURN(RankDesc d,
                            ParseRankDesc(msg.substr(4 + fl), absl::StrCat("rank ", r)));
      ranks.push_back(std::move(d));
    }
    MUON_ASSIGN_OR_RETURN(plan, BuildPlan(ranks, world.rank(), options));
    return absl::OkStatus();
  }();
  struct Verdict {
    uint64_t digest;
    uint64_t failed;
  } my_verdict{built.ok() ? plan.digest : 0, built.ok() ? 0u : 1u};
  std::vector<Verdict> verdicts(n);
  MUON_RETURN_IF_ERROR(HostAllGather(world, device, &my_verdict, verdicts.data(),
                                     sizeof my_verdict, stream, "setup: plan check"));
  if (!built.ok()) return built;
  for (int r = 0; r < n; ++r) {
    if (verdicts[r].failed) {
      return absl::InvalidArgumentError(
          absl::StrCat("setup: rank ", r, " could not build the plan (see its error)"));
    }
    if (verdicts[r].digest != plan.digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "setup: rank ", r, " computed a different plan than rank ", world.rank(),
          " (a custom assignment must give the same owners on every rank)"));
    }
  }
  return plan;
}

}  // namespace muon
