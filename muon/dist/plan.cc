#include "muon/dist/plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "muon/common/tensor.h"
#include "muon/math/backend.h"

namespace muon {
namespace {

// ---- Handshake serialization (little-endian host order) ----

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

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <typename T>
uint64_t FnvValue(uint64_t h, T v) {
  return Fnv(h, &v, sizeof v);
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

std::vector<int> AssignRoundRobin(const std::vector<MatrixInfo>& matrices) {
  std::vector<int> owners(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const auto& h = matrices[i].holders;
    owners[i] = h[i % h.size()];
  }
  return owners;
}

std::vector<int> AssignBalanced(const std::vector<MatrixInfo>& matrices) {
  std::vector<size_t> order(matrices.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return matrices[a].ns_flops > matrices[b].ns_flops;
  });
  std::map<int, double> load;
  std::vector<int> owners(matrices.size());
  for (size_t i : order) {
    int best = -1;
    double best_load = 0;
    for (int r : matrices[i].holders) {  // ascending: ties go to the lower rank
      const double l = load[r];
      if (best < 0 || l < best_load) {
        best = r;
        best_load = l;
      }
    }
    owners[i] = best;
    load[best] += matrices[i].ns_flops;
  }
  return owners;
}

absl::StatusOr<Plan> BuildPlan(const std::vector<RankDesc>& ranks, int my_rank,
                               const PlanOptions& options) {
  const int world = static_cast<int>(ranks.size());
  // 1. Groups: every member of a rank's group must see the same member list.
  for (const RankDesc& r : ranks) {
    for (size_t g = 0; g < r.groups.size(); ++g) {
      const auto& members = r.groups[g];
      if (std::find(members.begin(), members.end(), r.world_rank) == members.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group ", g, " of rank ", r.world_rank, " does not contain that rank"));
      }
      for (int m : members) {
        if (m < 0 || m >= world) {
          return absl::InvalidArgumentError(absl::StrCat("group ", g, " of rank ", r.world_rank,
                                                         " names rank ", m, " outside the world"));
        }
        const auto& theirs = ranks[m].groups;
        if (std::find(theirs.begin(), theirs.end(), members) == theirs.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "group ", g, " of rank ", r.world_rank, " has members [",
              absl::StrJoin(members, ", "), "], but rank ", m,
              " has no group with these members (groups must be created the same way on every "
              "member)"));
        }
      }
    }
  }

  // 2. Parameters by name, with each holder's piece.
  Plan plan;
  std::map<std::string, int> index;
  std::map<std::string, std::pair<int, const RankParamDesc*>> first;  // who registered it first
  for (const RankDesc& r : ranks) {
    for (size_t i = 0; i < r.params.size(); ++i) {
      const RankParamDesc& p = r.params[i];
      auto it = first.find(p.name);
      if (it == first.end()) {
        first[p.name] = {r.world_rank, &p};
        continue;
      }
      const RankParamDesc& q = *it->second.second;
      const int qr = it->second.first;
      if (p.global_shape != q.global_shape || p.view != q.view) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " registered global shape ",
            ShapeString(q.global_shape), " (view ", q.view, ") but rank ", r.world_rank,
            " registered ", ShapeString(p.global_shape), " (view ", p.view,
            "); every rank must register the same parameters with the same global shapes"));
      }
      if ((p.custom_owner >= 0) != (q.custom_owner >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " and rank ", r.world_rank,
            " registered it differently (one on the custom path, one with a layout)"));
      }
      if (p.zero2 != q.zero2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': rank ", qr, " and rank ", r.world_rank,
            " registered it with different replicated modes"));
      }
      if (p.custom_owner != q.custom_owner) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': assign_fn chose rank ", q.custom_owner, " on rank ", qr,
            " but rank ", p.custom_owner, " on rank ", r.world_rank,
            "; it must give the same owner on every rank"));
      }
      if (p.param_dtype != q.param_dtype || p.state_dtype != q.state_dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name, "': ranks ", qr, " and ", r.world_rank,
            " registered it with different dtypes (or momentum_fp32 settings)"));
      }
    }
  }
  // ZeRO-2 parameters move over their own group: every member of a holder's
  // group must hold them too (so every member runs the same blocks).
  for (const RankDesc& r : ranks) {
    for (const RankParamDesc& d : r.params) {
      if (!d.zero2) continue;
      const auto& members = r.groups[d.layout.placements[0].group];
      for (int m : members) {
        bool holds = false;
        for (const RankParamDesc& e : ranks[m].params) holds = holds || (e.name == d.name && e.zero2);
        if (!holds) {
          return absl::InvalidArgumentError(absl::StrCat(
              "param '", d.name, "': registered in ZeRO-2 mode over a group with rank ", m,
              " (by rank ", r.world_rank, "), but rank ", m, " did not register it that way"));
        }
      }
    }
  }
  for (const auto& [name, who] : first) {
    const RankParamDesc& cd = *who.second;
    if (cd.zero2) {
      plan.zero2_matrices += cd.view == 2 ? cd.global_shape[0] : 1;
      continue;
    }
    if (cd.custom_owner >= 0) {
      CustomUnit cu;
      cu.name = name;
      cu.owner = cd.custom_owner;
      cu.rows = cd.global_shape[0];
      cu.cols = cd.global_shape[1];
      cu.flops = NewtonSchulzFlops(cu.rows, cu.cols, options.ns_steps);
      std::vector<int> holders;
      for (const RankDesc& r : ranks) {
        for (size_t i = 0; i < r.params.size(); ++i) {
          if (r.params[i].name != name) continue;
          holders.push_back(r.world_rank);
          if (r.world_rank == my_rank) cu.local = static_cast<int>(i);
        }
      }
      if (std::find(holders.begin(), holders.end(), cu.owner) == holders.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", name, "': assign_fn chose rank ", cu.owner,
            ", which did not register it (holders: ", absl::StrJoin(holders, ", "), ")"));
      }
      plan.custom.push_back(std::move(cu));
      continue;
    }
    PlanParam pp;
    pp.name = name;
    const RankParamDesc& d = *who.second;
    pp.state_dtype = d.state_dtype;
    const auto& s = d.global_shape;
    auto prod = [&](size_t from) {
      int64_t n = 1;
      for (size_t k = from; k < s.size(); ++k) n *= s[k];
      return n;
    };
    if (d.view == 2) {
      pp.batch = s[0];
      pp.rows = s[1];
      pp.cols = prod(2);
    } else {
      pp.rows = s[0];
      pp.cols = prod(1);
    }
    index[name] = static_cast<int>(plan.params.size());
    plan.params.push_back(std::move(pp));
  }
  for (const RankDesc& r : ranks) {
    std::vector<int> sizes, coords;
    for (const auto& members : r.groups) {
      sizes.push_back(static_cast<int>(members.size()));
      coords.push_back(static_cast<int>(
          std::find(members.begin(), members.end(), r.world_rank) - members.begin()));
    }
    for (size_t i = 0; i < r.params.size(); ++i) {
      const RankParamDesc& d = r.params[i];
      if (d.custom_owner >= 0 || d.zero2) continue;
      PlanParam& pp = plan.params[index[d.name]];
      auto piece = ComputePiece(d.layout, sizes, coords,
                                absl::StrCat("param '", d.name, "' on rank ", r.world_rank));
      if (!piece.ok()) return piece.status();
      if (r.world_rank == my_rank) {
        pp.local = static_cast<int>(i);
        pp.local_holder = static_cast<int>(pp.holders.size());
      }
      pp.holders.push_back({r.world_rank, std::move(piece).value()});
    }
  }
  for (PlanParam& pp : plan.params) {
    std::vector<const Piece*> pieces;
    for (const Holder& h : pp.holders) pieces.push_back(&h.piece);
    std::vector<int> who;
    for (const Holder& h : pp.holders) who.push_back(h.rank);
    auto tiled = CheckTiling(pieces, pp.batch * pp.rows * pp.cols,
                             absl::StrCat("param '", pp.name, "' (registered on ranks ",
                                          absl::StrJoin(who, ", "), ")"));
    if (!tiled.ok()) return tiled;
  }

  // 3. Units (one per matrix), their holders, and the assignment.
  std::vector<MatrixInfo> infos;
  for (size_t pi = 0; pi < plan.params.size(); ++pi) {
    const PlanParam& pp = plan.params[pi];
    const int64_t per = pp.rows * pp.cols;
    for (int64_t k = 0; k < pp.batch; ++k) {
      Unit u;
      u.param = static_cast<int>(pi);
      u.index = k;
      u.flops = NewtonSchulzFlops(pp.rows, pp.cols, options.ns_steps);
      MatrixInfo info{&pp.name, k, pp.rows, pp.cols, u.flops, {}};
      for (size_t h = 0; h < pp.holders.size(); ++h) {
        const Piece& piece = pp.holders[h].piece;
        bool meets = false;
        for (const Run& run : piece.runs) {
          if (run.offset < (k + 1) * per && run.offset + run.length > k * per) {
            meets = true;
            break;
          }
        }
        if (!meets && per > 0) continue;
        u.receivers.push_back(static_cast<int>(h));
        if (piece.canonical) u.senders.push_back(static_cast<int>(h));
        info.holders.push_back(pp.holders[h].rank);
      }
      plan.units.push_back(std::move(u));
      infos.push_back(std::move(info));
    }
  }
  std::vector<int> owners;
  switch (options.assignment) {
    case Assignment::kBalanced:
      owners = AssignBalanced(infos);
      break;
    case Assignment::kRoundRobin:
      owners = AssignRoundRobin(infos);
      break;
    case Assignment::kCustom: {
      owners.assign(infos.size(), -1);
      auto st = options.custom(infos, &owners);
      if (!st.ok()) return st;
      for (size_t i = 0; i < infos.size(); ++i) {
        const auto& h = infos[i].holders;
        if (std::find(h.begin(), h.end(), owners[i]) == h.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "custom assignment: matrix ", infos[i].index, " of param '", *infos[i].param_name,
              "' was given to rank ", owners[i], ", which holds no piece of it (holders: ",
              absl::StrJoin(h, ", "), ")"));
        }
      }
      break;
    }
  }

  // 4. Rounds. Without async parallelism one matrix per round, in order;
  // otherwise each owner fills rounds up to the memory budget.
  std::vector<int64_t> round_of(world, 0), bytes_in(world, 0);
  int rounds = 0;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    Unit& u = plan.units[i];
    u.owner = owners[i];
    const PlanParam& pp = plan.params[u.param];
    if (!options.async_parallelism) {
      u.round = static_cast<int>(i);
    } else {
      const int64_t b = pp.rows * pp.cols * 4;
      if (bytes_in[u.owner] > 0 && bytes_in[u.owner] + b > options.round_bytes) {
        ++round_of[u.owner];
        bytes_in[u.owner] = 0;
      }
      bytes_in[u.owner] += b;
      u.round = static_cast<int>(round_of[u.owner]);
    }
    rounds = std::max(rounds, u.round + 1);
  }
  plan.rounds = rounds;

  uint64_t h = 1469598103934665603ull;
  for (const Unit& u : plan.units) {
    h = Fnv(h, plan.params[u.param].name.data(), plan.params[u.param].name.size());
    h = FnvValue(h, u.index);
    h = FnvValue(h, u.owner);
    h = FnvValue(h, u.round);
  }
  for (const CustomUnit& c : plan.custom) {
    h = Fnv(h, c.name.data(), c.name.size());
    h = FnvValue(h, c.owner);
  }
  plan.digest = h;
  return plan;
}

}  // namespace muon
