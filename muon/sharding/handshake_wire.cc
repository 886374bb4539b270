#include "muon/sharding/handshake_wire.h"

namespace muon {
namespace wire {

void PutParams(Out& o, const std::vector<RankParamDesc>& params, bool ranges) {
  o.Put<uint32_t>(static_cast<uint32_t>(params.size()));
  for (const RankParamDesc& p : params) {
    o.Str(p.name);
    o.Put<uint8_t>(p.param_dtype);
    o.Put<uint8_t>(p.state_dtype);
    o.Put<uint8_t>(p.view);
    o.Put<int32_t>(p.custom_owner);
    o.Put<uint8_t>(p.zero2);
    o.Put<double>(p.lr_scale);
    o.Put<double>(p.weight_decay_scale);
    o.Put<int32_t>(p.split.dim);
    o.Ints(p.split.sizes);
    o.Ints(p.global_shape);
    o.Ints(p.layout.global_shape);
    o.Put<uint32_t>(static_cast<uint32_t>(p.layout.placements.size()));
    for (const Placement& pl : p.layout.placements) {
      o.Put<int32_t>(static_cast<int32_t>(pl.kind));
      o.Put<int32_t>(pl.group);
      o.Put<int32_t>(pl.dim);
      o.Put<int32_t>(static_cast<int32_t>(pl.split));
      o.Ints(pl.sizes);
      if (ranges) {
        o.Put<int64_t>(pl.start);
        o.Put<int64_t>(pl.length);
      }
    }
  }
}

bool GetParams(In& in, std::vector<RankParamDesc>* params, bool ranges) {
  uint32_t nparams;
  if (!in.Get(&nparams)) return false;
  for (uint32_t i = 0; i < nparams; ++i) {
    RankParamDesc p;
    uint32_t nplace;
    if (!in.Str(&p.name) || !in.Get(&p.param_dtype) || !in.Get(&p.state_dtype) ||
        !in.Get(&p.view) || !in.Get(&p.custom_owner) || !in.Get(&p.zero2) ||
        !in.Get(&p.lr_scale) || !in.Get(&p.weight_decay_scale) || !in.Get(&p.split.dim) ||
        !in.Ints(&p.split.sizes) || !in.Ints(&p.global_shape) ||
        !in.Ints(&p.layout.global_shape) || !in.Get(&nplace) || nplace > 64) {
      return false;
    }
    p.layout.placements.resize(nplace);
    for (Placement& pl : p.layout.placements) {
      int32_t kind, group, dim, split;
      if (!in.Get(&kind) || !in.Get(&group) || !in.Get(&dim) || !in.Get(&split) ||
          !in.Ints(&pl.sizes)) {
        return false;
      }
      if (ranges && (!in.Get(&pl.start) || !in.Get(&pl.length))) return false;
      pl.kind = static_cast<PlacementKind>(kind);
      pl.group = group;
      pl.dim = dim;
      pl.split = static_cast<ShardSplit>(split);
    }
    params->push_back(std::move(p));
  }
  return true;
}

void PutMembers(Out& o, const std::vector<int>& g) {
  o.Put<uint32_t>(static_cast<uint32_t>(g.size()));
  for (int m : g) o.Put<int32_t>(m);
}

bool GetMembers(In& in, std::vector<int>* g) {
  uint32_t n;
  if (!in.Get(&n) || n > (1u << 24)) return false;
  g->resize(n);
  for (int& m : *g) {
    int32_t v;
    if (!in.Get(&v)) return false;
    m = v;
  }
  return true;
}

}  // namespace wire
}  // namespace muon
