// Fuzzes the distributed layout logic without communication: a world of 2 to
// 4 ranks with fuzzed groups (partitions of the world, fuzzed member order),
// parameters with fuzzed global shapes (small, or huge dimensions around an
// empty one, or a batch past the per-parameter cap), views, dtypes and kinds:
// placement lists (SHARD even / chunk / sizes, FLAT_RANGE, REPLICATE,
// possibly invalid), ZeRO-2 (one REPLICATE over a group) or the custom path
// (a fuzzed owner), each registered on all ranks, on a fuzzed subset, on the
// members of one group only (a ZeRO-2 group or a stage without the other
// ranks), or on one rank; so that some ranks hold none of a kind. Every
// rank's description goes through the handshake's wire form
// (SerializeRankDesc, ParseRankDesc), then BuildPlan runs once per rank, as
// the first step's handshake does.
//
// Never crash. Every rank reaches the same verdict and the same plan digest.
// A parameter declaring more matrices with elements than kMaxParamMatrices,
// or a custom-path owner that did not register the parameter, makes the plan
// refused. An accepted plan is the job's on every rank: one unit per matrix
// with elements (none for empty ones, counted apart), the ZeRO-2 matrices,
// the custom-path parameters with their owners, and each rank's own entries
// (holders, local indices) for exactly what it registered.
// An independent model of the placements (each rank's piece computed element
// by element on an explicit index tensor) must agree with ComputePiece and
// PieceShape, and a layout the model refuses makes the plan refused. When the
// plan is accepted: the canonical copies tile each tensor exactly once (every
// element of every matrix is held by some rank), each unit's owner holds a
// piece of its matrix, and the exchange tables of all ranks (BuildRoundTables),
// run as all_to_all_v would run them, agree on byte counts and wire dtypes
// between every sender and receiver, assemble every owned matrix exactly once
// in its slot, and hand every holder each of its local elements exactly once.
//
// MUON_FUZZ_VERBOSE=1 prints each job (to triage an input).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "muon/common/dtype.h"
#include "muon/common/matrix_view.h"
#include "muon/sharding/exchange.h"
#include "muon/sharding/handshake.h"
#include "muon/sharding/layout.h"
#include "muon/sharding/plan.h"

namespace muon {
namespace {

constexpr int64_t kModelLimit = int64_t{1} << 16;  // elements the model simulates

// ---- The model: a rank's piece as the explicit list of global indices ----

struct ModelPiece {
  bool valid = true;
  std::vector<int64_t> shape;
  std::vector<int64_t> idx;  // global flat index of each local element, local order
  bool canonical = true;
};

bool Mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// numel of `shape`, or -1 when a dimension is negative or the product of
// its nonzero dimensions overflows (the library refuses such shapes).
int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t nonzero = 1;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0)
      empty = true;
    else if (!Mul(nonzero, d, &nonzero))
      return -1;
  }
  return empty ? 0 : nonzero;
}

// The piece of the rank at `coords` in groups of `sizes`; nullopt-like
// (valid = false) when the layout breaks a documented rule. `simulate`:
// also fill idx (the global numel is small enough).
ModelPiece Model(const Layout& layout, const std::vector<int>& sizes,
                 const std::vector<int>& coords, bool simulate) {
  ModelPiece m;
  m.shape = layout.global_shape;
  const int64_t numel = Numel(m.shape);
  if (numel < 0) {
    m.valid = false;
    return m;
  }
  if (simulate) {
    m.idx.resize(numel);
    for (int64_t i = 0; i < numel; ++i) m.idx[i] = i;
  }
  std::vector<bool> used(sizes.size(), false);
  for (const Placement& p : layout.placements) {
    if (p.group < 0 || p.group >= static_cast<int>(sizes.size()) || used[p.group]) {
      m.valid = false;
      return m;
    }
    used[p.group] = true;
    const int64_t n = sizes[p.group], r = coords[p.group];
    if (p.kind == PlacementKind::kReplicate) {
      if (r != 0) m.canonical = false;
      continue;
    }
    if (p.kind == PlacementKind::kFlatRange) {
      const int64_t cur = Numel(m.shape);
      if (p.start < 0 || p.length < 0 || p.start > cur || p.length > cur - p.start) {
        m.valid = false;
        return m;
      }
      if (simulate) {
        m.idx = std::vector<int64_t>(m.idx.begin() + p.start, m.idx.begin() + p.start + p.length);
      }
      m.shape = {p.length};
      continue;
    }
    if (p.kind != PlacementKind::kShard || p.dim < 0 || p.dim >= static_cast<int>(m.shape.size())) {
      m.valid = false;
      return m;
    }
    const int64_t d = m.shape[p.dim];
    int64_t a = 0, b = 0;
    if (p.split == ShardSplit::kEven) {
      if (d % n != 0) {
        m.valid = false;
        return m;
      }
      a = r * (d / n);
      b = a + d / n;
    } else if (p.split == ShardSplit::kChunk) {
      // (In 128 bits: a dimension may be near INT64_MAX beside an empty one.)
      const int64_t c = d / n + (d % n != 0);
      a = static_cast<int64_t>(std::min<__int128>(static_cast<__int128>(r) * c, d));
      b = static_cast<int64_t>(std::min<__int128>(static_cast<__int128>(a) + c, d));
    } else if (p.split == ShardSplit::kSizes) {
      if (p.sizes.size() != static_cast<size_t>(n)) {
        m.valid = false;
        return m;
      }
      int64_t total = 0;
      for (size_t k = 0; k < p.sizes.size(); ++k) {
        if (p.sizes[k] < 0 || __builtin_add_overflow(total, p.sizes[k], &total)) {
          m.valid = false;
          return m;
        }
        if (static_cast<int64_t>(k) < r) a = total;
      }
      if (total != d) {
        m.valid = false;
        return m;
      }
      b = a + p.sizes[r];
    } else {
      m.valid = false;
      return m;
    }
    if (simulate && numel > 0) {
      // Row-major slice [a, b) of dimension dim (an empty tensor has no
      // elements to slice, however large its other dimensions).
      int64_t outer = 1, inner = 1;
      for (int i = 0; i < p.dim; ++i) outer *= m.shape[i];
      for (size_t i = p.dim + 1; i < m.shape.size(); ++i) inner *= m.shape[i];
      std::vector<int64_t> next;
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = a; j < b; ++j) {
          for (int64_t e = 0; e < inner; ++e) next.push_back(m.idx[(o * d + j) * inner + e]);
        }
      }
      m.idx = std::move(next);
    }
    m.shape[p.dim] = b - a;
  }
  return m;
}

std::vector<int64_t> Expand(const Piece& piece) {
  std::vector<int64_t> out;
  for (const Run& r : piece.runs) {
    for (int64_t i = 0; i < r.length; ++i) out.push_back(r.offset + i);
  }
  return out;
}

// ---- The job ----

struct Job {
  int world = 0;
  std::vector<RankDesc> ranks;
  PlanOptions options;
  std::vector<uint8_t> owner_choices;  // the custom assignment's answers
  DType ns_wire = DType::kBF16;
};

// Group families: each a partition of the world; rank r's group g (g >= 1) is
// its part of family g - 1, its members ordered by a fuzzed key.
std::vector<std::vector<std::vector<int>>> MakeFamilies(FuzzedDataProvider& in, int world) {
  const int families = in.ConsumeIntegralInRange<int>(0, 2);
  std::vector<std::vector<std::vector<int>>> groups_of(world);  // [rank][family] -> members
  for (int f = 0; f < families; ++f) {
    std::vector<int> color(world), key(world);
    const int style = in.ConsumeIntegralInRange<int>(0, 3);
    for (int r = 0; r < world; ++r) {
      if (style == 0)
        color[r] = r / 2;  // consecutive pairs (TP inside a node)
      else if (style == 1)
        color[r] = r % 2;  // strided (DP across nodes)
      else if (style == 2)
        color[r] = 0;  // the world again, as a second group
      else
        color[r] = in.ConsumeIntegralInRange<int>(0, world - 1);
      key[r] = in.ConsumeBool() ? r : in.ConsumeIntegralInRange<int>(0, 7);
    }
    for (int r = 0; r < world; ++r) {
      std::vector<int> members;
      for (int m = 0; m < world; ++m) {
        if (color[m] == color[r]) members.push_back(m);
      }
      std::stable_sort(members.begin(), members.end(),
                       [&](int a, int b) { return key[a] < key[b]; });
      groups_of[r].push_back(members);
    }
  }
  return groups_of;
}

// Cut points of `total` into n parts, from fuzzed fractions (a tiling), or
// raw fuzzed values.
std::vector<int64_t> Parts(FuzzedDataProvider& in, int64_t total, int n,
                           const std::vector<uint8_t>& fractions, bool raw) {
  std::vector<int64_t> cuts;
  if (raw) {
    for (int k = 0; k < n; ++k) {
      cuts.push_back(in.ConsumeBool() ? SpecialInt(in) : in.ConsumeIntegralInRange<int64_t>(-2, 9));
    }
    return cuts;
  }
  std::vector<int64_t> at = {0};
  for (int k = 0; k + 1 < n; ++k) {
    const int64_t f = fractions[k % fractions.size()];
    at.push_back(total < 0 ? 0 : static_cast<int64_t>((static_cast<__int128>(total) * f) / 255));
  }
  std::sort(at.begin(), at.end());
  at.push_back(total);
  for (int k = 0; k < n; ++k) cuts.push_back(at[k + 1] - at[k]);
  return cuts;
}

struct PlacementTemplate {
  Placement base;
  bool raw = false;  // sizes / ranges: raw fuzzed values instead of a tiling
  std::vector<uint8_t> fractions;
};

// Rank r's placement list for a parameter: the template, with the SIZES and
// FLAT_RANGE parts this rank's coordinates give.
std::vector<Placement> Realize(FuzzedDataProvider& in, const std::vector<PlacementTemplate>& t,
                               const std::vector<int64_t>& global_shape,
                               const std::vector<int>& sizes, const std::vector<int>& coords) {
  std::vector<Placement> out;
  std::vector<int64_t> shape = global_shape;
  for (const PlacementTemplate& pt : t) {
    Placement p = pt.base;
    const bool known = p.group >= 0 && p.group < static_cast<int>(sizes.size());
    const int n = known ? sizes[p.group] : 1;
    const int c = known ? coords[p.group] : 0;
    if (p.kind == PlacementKind::kShard && p.split == ShardSplit::kSizes) {
      const int64_t d = p.dim >= 0 && p.dim < static_cast<int>(shape.size()) ? shape[p.dim] : 0;
      p.sizes = Parts(in, d, n, pt.fractions, pt.raw);
      if (!pt.raw && in.ConsumeIntegralInRange<int>(0, 15) == 0) p.sizes.pop_back();
    }
    if (p.kind == PlacementKind::kFlatRange) {
      const int64_t cur = Numel(shape);
      if (pt.raw || cur < 0) {
        p.start = in.ConsumeBool() ? SpecialInt(in) : in.ConsumeIntegralInRange<int64_t>(-1, 9);
        p.length = in.ConsumeBool() ? SpecialInt(in) : in.ConsumeIntegralInRange<int64_t>(-1, 9);
      } else {
        const std::vector<int64_t> parts = Parts(in, cur, n, pt.fractions, false);
        p.start = 0;
        for (int k = 0; k < c; ++k) p.start += parts[k];
        p.length = parts[c];
      }
    }
    // Track the shape as the model would, to size the next placement's parts.
    Layout one{shape, {p}};
    std::vector<int> s = sizes, co = coords;
    ModelPiece m = Model(one, s, co, false);
    if (m.valid) shape = m.shape;
    out.push_back(p);
  }
  return out;
}

Job MakeJob(FuzzedDataProvider& in) {
  Job job;
  job.world = in.ConsumeIntegralInRange<int>(2, 4);
  const int world = job.world;
  auto families = MakeFamilies(in, world);
  std::vector<std::vector<int>> sizes(world), coords(world);
  for (int r = 0; r < world; ++r) {
    RankDesc d;
    d.world_rank = r;
    std::vector<int> all;
    for (int m = 0; m < world; ++m) all.push_back(m);
    d.groups.push_back(all);
    for (const auto& g : families[r]) d.groups.push_back(g);
    for (const auto& g : d.groups) {
      sizes[r].push_back(static_cast<int>(g.size()));
      coords[r].push_back(static_cast<int>(std::find(g.begin(), g.end(), r) - g.begin()));
    }
    job.ranks.push_back(d);
  }
  const int num_groups = static_cast<int>(job.ranks[0].groups.size());

  const int params = in.ConsumeIntegralInRange<int>(1, 3);
  for (int pi = 0; pi < params; ++pi) {
    RankParamDesc d;
    d.name = std::string(1, static_cast<char>('a' + in.ConsumeIntegralInRange<int>(0, 4))) +
             std::to_string(pi);
    const int ndim = in.ConsumeIntegralInRange<int>(1, 4);
    const bool extreme = in.ConsumeIntegralInRange<int>(0, 15) == 0;
    for (int i = 0; i < ndim; ++i) {
      d.global_shape.push_back(
          extreme && in.ConsumeBool() ? SpecialInt(in) : in.ConsumeIntegralInRange<int64_t>(0, 6));
    }
    // Extreme dimensions are for shapes the library must refuse (negative,
    // overflowing) and for empty ones of any size (whose matrices cost
    // nothing); any other valid shape stays small, as its cost is its size.
    const int64_t numel = Numel(d.global_shape);
    if (numel > 0 || (numel == 0 && !extreme)) {
      for (int64_t& x : d.global_shape) x = x < 0 ? 0 : x % 7;
    }
    bool batched = false;
    if (extreme && numel > 0 && in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      // A batch just past the per-parameter cap: refused before it is planned.
      d.global_shape = {kMaxParamMatrices + in.ConsumeIntegralInRange<int64_t>(1, 2), 1,
                        in.ConsumeIntegralInRange<int64_t>(1, 2)};
      batched = true;
    }
    d.view = static_cast<uint8_t>(in.ConsumeIntegralInRange<int>(0, 3) % 3);
    if (batched) d.view = 2;
    d.param_dtype = d.state_dtype = static_cast<uint8_t>(in.ConsumeIntegralInRange<int>(0, 2));
    // The kind: ZeRO-2 (1 in 8), the custom path (1 in 16), else placements.
    const int kind = in.ConsumeIntegralInRange<int>(0, 15);
    d.zero2 = kind % 8 == 0 ? 1 : 0;
    if (kind == 1) d.custom_owner = in.ConsumeIntegralInRange<int>(0, world);  // world: nobody
    d.layout.global_shape = d.global_shape;
    std::vector<PlacementTemplate> t;
    if (d.custom_owner >= 0) {
      // The custom path: no layout (the host moves the pieces); mostly the
      // 2-D shape the registry admits.
      if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
        d.global_shape.resize(2, 1);
        d.layout.global_shape = d.global_shape;
      }
    } else if (d.zero2) {
      // What the registry admits in ZeRO-2 mode: one REPLICATE over a known group.
      PlacementTemplate pt;
      pt.base.kind = PlacementKind::kReplicate;
      pt.base.group = in.ConsumeIntegralInRange<int>(0, num_groups - 1);
      t.push_back(pt);
    } else {
      const int k = in.ConsumeIntegralInRange<int>(0, 3);
      for (int i = 0; i < k; ++i) {
        PlacementTemplate pt;
        pt.base.kind = static_cast<PlacementKind>(in.ConsumeIntegralInRange<int>(0, 2));
        pt.base.group = in.ConsumeIntegralInRange<int>(0, 15) == 0
                            ? in.ConsumeIntegralInRange<int>(-1, num_groups)
                            : in.ConsumeIntegralInRange<int>(0, num_groups - 1);
        pt.base.dim = in.ConsumeIntegralInRange<int>(-1, 3);
        if (pt.base.dim < 0 && in.ConsumeBool()) pt.base.dim = 0;
        pt.base.split = static_cast<ShardSplit>(in.ConsumeIntegralInRange<int>(0, 2));
        pt.raw = in.ConsumeIntegralInRange<int>(0, 7) == 0;
        const int nf = in.ConsumeIntegralInRange<int>(1, 3);
        for (int f = 0; f < nf; ++f) pt.fractions.push_back(in.ConsumeIntegral<uint8_t>());
        t.push_back(pt);
      }
    }
    // Who registers it: every rank, or (bits 4-5 of `mask`) the ranks of the
    // mask, the members of one group of one rank (a ZeRO-2 group or a stage
    // that leaves the other ranks out), or one rank.
    const bool everywhere = in.ConsumeIntegralInRange<int>(0, 3) != 0;
    const uint8_t mask = in.ConsumeIntegral<uint8_t>();
    std::vector<bool> registers(world, true);
    if (!everywhere) {
      const int pattern = (mask >> 4) & 3;
      const int k = (mask & 3) % world;
      const auto& group = job.ranks[k].groups[(mask >> 6) % num_groups];
      for (int r = 0; r < world; ++r) {
        registers[r] = pattern <= 1   ? (mask & (1u << r)) != 0
                       : pattern == 2 ? std::find(group.begin(), group.end(), r) != group.end()
                                      : r == k;
      }
    }
    for (int r = 0; r < world; ++r) {
      if (!registers[r]) continue;
      RankParamDesc mine = d;
      mine.layout.placements = Realize(in, t, d.global_shape, sizes[r], coords[r]);
      if (in.ConsumeIntegralInRange<int>(0, 31) == 0) {
        // One rank disagrees about something (a rejection path).
        switch (in.ConsumeIntegralInRange<int>(0, 3)) {
          case 0: mine.view = static_cast<uint8_t>((mine.view + 1) % 3); break;
          case 1: mine.param_dtype = static_cast<uint8_t>((mine.param_dtype + 1) % 3); break;
          case 2:
            if (!mine.global_shape.empty()) mine.global_shape[0] ^= 1;
            mine.layout.global_shape = mine.global_shape;
            break;
          default:
            // (ZeRO-2 keeps its one REPLICATE: the registry admits nothing else.)
            if (!mine.zero2) mine.layout.placements.clear();
            break;
        }
      }
      // The registry checks every layout against the rank's own coordinates;
      // BuildPlan checks them again, except ZeRO-2 ones (whose pieces it
      // never computes): a ZeRO-2 layout the registry refuses is not sent.
      if (mine.zero2 && !Model(mine.layout, sizes[r], coords[r], false).valid) continue;
      job.ranks[r].params.push_back(mine);
    }
  }
  // Registration order differs between ranks (the plan sorts by name).
  for (RankDesc& r : job.ranks) {
    if (in.ConsumeBool()) std::reverse(r.params.begin(), r.params.end());
  }

  job.options.assignment = static_cast<Assignment>(in.ConsumeIntegralInRange<int>(0, 2));
  job.options.async_parallelism = in.ConsumeBool();
  static const int64_t kRoundBytes[] = {1, 16, 64, 256, 4096, int64_t{256} << 20};
  job.options.round_bytes = kRoundBytes[in.ConsumeIntegralInRange<int>(0, 5)];
  job.options.ns.steps = in.ConsumeIntegralInRange<int>(0, 5);
  job.ns_wire = in.ConsumeBool() ? DType::kBF16 : DType::kF32;
  const int choices = in.ConsumeIntegralInRange<int>(1, 4);
  for (int i = 0; i < choices; ++i) job.owner_choices.push_back(in.ConsumeIntegral<uint8_t>());
  const std::vector<uint8_t> owner_choices = job.owner_choices;
  job.options.custom = [owner_choices, world](const std::vector<MatrixInfo>& infos,
                                              std::vector<int>* owners) -> absl::Status {
    for (size_t i = 0; i < infos.size(); ++i) {
      const uint8_t c = owner_choices[i % owner_choices.size()];
      const auto& h = infos[i].holders;
      // Mostly a holder; sometimes any rank (maybe none of the holders): refused.
      (*owners)[i] =
          (c & 0xf0) == 0xf0 || h.empty() ? static_cast<int>(c % (world + 1)) - 1 : h[c % h.size()];
    }
    return absl::OkStatus();
  };
  return job;
}

// MUON_FUZZ_VERBOSE=1: prints each job (to triage a crashing input).
void Dump(const Job& job) {
  static const bool verbose = std::getenv("MUON_FUZZ_VERBOSE") != nullptr;
  if (!verbose) return;
  auto ints = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (int64_t x : v) s += std::to_string(x) + " ";
    return s + "]";
  };
  std::fprintf(stderr, "world %d, assignment %d\n", job.world,
               static_cast<int>(job.options.assignment));
  for (const RankDesc& r : job.ranks) {
    std::fprintf(stderr, "rank %d groups:", r.world_rank);
    for (const auto& g : r.groups) {
      std::fprintf(stderr, " (");
      for (int m : g) std::fprintf(stderr, "%d ", m);
      std::fprintf(stderr, ")");
    }
    std::fprintf(stderr, "\n");
    for (const RankParamDesc& p : r.params) {
      std::fprintf(stderr, "  %s shape %s view %d dtype %d zero2 %d custom_owner %d:",
                   p.name.c_str(), ints(p.global_shape).c_str(), p.view, p.param_dtype, p.zero2,
                   p.custom_owner);
      for (const Placement& pl : p.layout.placements) {
        std::fprintf(stderr, " {kind %d group %d dim %d split %d sizes %s start %lld len %lld}",
                     static_cast<int>(pl.kind), pl.group, pl.dim, static_cast<int>(pl.split),
                     ints(pl.sizes).c_str(), static_cast<long long>(pl.start),
                     static_cast<long long>(pl.length));
      }
      std::fprintf(stderr, "\n");
    }
  }
}

// ---- The checks of an accepted plan ----

// One direction of one round, run as all_to_all_v runs it: every sender's
// spans (in order) against the receiver's spans for it.
template <typename SendSpan, typename RecvSpan, typename ReadFn, typename WriteFn>
void Transfer(const std::vector<SendSpan>& send, const std::vector<RecvSpan>& recv, ReadFn read,
              WriteFn write) {
  std::vector<std::pair<int64_t, DType>> stream;  // values with their wire dtype
  size_t send_bytes = 0, recv_bytes = 0;
  for (const SendSpan& s : send) {
    FUZZ_CHECK(s.length >= 0);
    send_bytes += static_cast<size_t>(s.length) * SizeOf(s.wire);
    for (int64_t i = 0; i < s.length; ++i) stream.push_back({read(s, i), s.wire});
  }
  size_t at = 0;
  for (const RecvSpan& r : recv) {
    FUZZ_CHECK(r.length >= 0);
    recv_bytes += static_cast<size_t>(r.length) * SizeOf(r.wire);
    for (int64_t i = 0; i < r.length; ++i) {
      FUZZ_CHECK(at < stream.size());
      FUZZ_CHECK(stream[at].second == r.wire);
      write(r, i, stream[at].first);
      ++at;
    }
  }
  FUZZ_CHECK(at == stream.size());
  FUZZ_CHECK(send_bytes == recv_bytes);
}

void CheckAccepted(const Job& job, const std::vector<Plan>& plans,
                   const std::vector<std::vector<ModelPiece>>& model) {
  const int world = job.world;
  const Plan& plan = plans[0];
  // Units: one per matrix, owned by a rank holding a piece of it.
  for (const Unit& u : plan.units) {
    FUZZ_CHECK(u.param >= 0 && u.param < static_cast<int>(plan.params.size()));
    const PlanParam& pp = plan.params[u.param];
    FUZZ_CHECK(u.index >= 0 && u.index < pp.batch);
    FUZZ_CHECK(u.round >= 0 && u.round < plan.rounds);
    const int64_t per = pp.rows * pp.cols;
    FUZZ_CHECK(per > 0);  // an empty matrix has no unit
    bool owner_holds = false;
    for (const Holder& h : pp.holders) {
      if (h.rank != u.owner) continue;
      const ModelPiece* m = nullptr;
      for (size_t i = 0; i < job.ranks[h.rank].params.size(); ++i) {
        if (job.ranks[h.rank].params[i].name == pp.name) m = &model[h.rank][i];
      }
      FUZZ_CHECK(m != nullptr);
      for (int64_t g : m->idx) owner_holds = owner_holds || g / per == u.index;
    }
    FUZZ_CHECK(owner_holds);
  }

  // The exchange of every round, on every rank's tables.
  std::vector<std::vector<RoundTable>> tables(world);
  for (int r = 0; r < world; ++r) {
    tables[r] = BuildRoundTables(plans[r], r, world, job.ns_wire);
    FUZZ_CHECK(static_cast<int>(tables[r].size()) == plan.rounds);
  }
  // Update buffers hold each element's global index; results start empty.
  std::vector<std::vector<std::vector<int64_t>>> updates(world), results(world);
  for (int r = 0; r < world; ++r) {
    for (const ModelPiece& m : model[r]) {
      updates[r].push_back(m.idx);
      results[r].push_back(std::vector<int64_t>(m.idx.size(), -1));
    }
  }
  auto local = [&](std::vector<std::vector<std::vector<int64_t>>>& bufs, int r, const LocalSpan& s,
                   int64_t i) -> int64_t& {
    FUZZ_CHECK(s.param >= 0 && s.param < static_cast<int>(bufs[r].size()));
    auto& b = bufs[r][s.param];
    FUZZ_CHECK(s.pos >= 0 && s.pos + i < static_cast<int64_t>(b.size()));
    return b[s.pos + i];
  };
  for (int round = 0; round < plan.rounds; ++round) {
    std::vector<std::vector<int64_t>> slots(world);
    for (int r = 0; r < world; ++r) slots[r].assign(tables[r][round].slot_floats, -1);
    auto slot = [&](int r, const SlotSpan& s, int64_t i) -> int64_t& {
      FUZZ_CHECK(s.pos >= 0 && s.pos + i < static_cast<int64_t>(slots[r].size()));
      return slots[r][s.pos + i];
    };
    for (int from = 0; from < world; ++from) {
      for (int to = 0; to < world; ++to) {
        Transfer(
            tables[from][round].gather_send[to], tables[to][round].gather_recv[from],
            [&](const LocalSpan& s, int64_t i) { return local(updates, from, s, i); },
            [&](const SlotSpan& s, int64_t i, int64_t v) {
              int64_t& dst = slot(to, s, i);
              FUZZ_CHECK(dst == -1);  // written once
              dst = v;
            });
      }
    }
    // Every owned matrix is whole in its slot: batches by shape, in unit order.
    for (int r = 0; r < world; ++r) {
      const RoundTable& t = tables[r][round];
      std::map<std::pair<int64_t, int64_t>, std::vector<int>> owned;
      int64_t count = 0;
      for (size_t i = 0; i < plan.units.size(); ++i) {
        const Unit& u = plan.units[i];
        if (u.owner != r || u.round != round) continue;
        const PlanParam& pp = plan.params[u.param];
        owned[{pp.rows, pp.cols}].push_back(static_cast<int>(i));
        ++count;
      }
      FUZZ_CHECK(t.owned == count);
      int64_t batched = 0;
      for (const ShapeBatch& b : t.batches) {
        const auto& units = owned[{b.rows, b.cols}];
        FUZZ_CHECK(b.count == static_cast<int64_t>(units.size()));
        batched += b.count;
        for (int64_t j = 0; j < b.count; ++j) {
          const Unit& u = plan.units[units[j]];
          const int64_t per = b.rows * b.cols;
          for (int64_t e = 0; e < per; ++e) {
            FUZZ_CHECK(b.offset + j * per + e < static_cast<int64_t>(slots[r].size()));
            FUZZ_CHECK(slots[r][b.offset + j * per + e] == u.index * per + e);
          }
        }
      }
      FUZZ_CHECK(batched == count);
    }
    for (int from = 0; from < world; ++from) {
      for (int to = 0; to < world; ++to) {
        Transfer(
            tables[from][round].scatter_send[to], tables[to][round].scatter_recv[from],
            [&](const SlotSpan& s, int64_t i) { return slot(from, s, i); },
            [&](const LocalSpan& s, int64_t i, int64_t v) {
              int64_t& dst = local(results, to, s, i);
              FUZZ_CHECK(dst == -1);  // written once
              dst = v;
            });
      }
    }
  }
  // Every holder got each of its elements back (ZeRO-2 and custom-path
  // parameters move elsewhere).
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < results[r].size(); ++i) {
      if (job.ranks[r].params[i].zero2 || job.ranks[r].params[i].custom_owner >= 0) continue;
      FUZZ_CHECK(results[r][i] == updates[r][i]);
    }
  }
}

// What the job declares, from the descriptions alone (an accepted plan has
// every parameter registered alike: the first registration speaks for all).
struct JobFacts {
  struct Kind {
    int64_t batch = 1, with_elements = 0;
    int zero2 = 0;
    int custom_owner = -1;
    std::vector<int> ranks;  // that registered it, ascending
  };
  std::map<std::string, Kind> params;
  bool over_cap = false;              // a parameter declares too many matrices with elements
  bool custom_owner_missing = false;  // a custom-path owner did not register its parameter
};

// The matrix view of `shape` (muon_matrix_view_t `view`) as batch x rows x
// cols, when the shape fits it.
bool ViewOf(const std::vector<int64_t>& shape, int view, int64_t* batch, int64_t* rows,
            int64_t* cols) {
  if (shape.size() < 2 || Numel(shape) < 0) return false;
  auto prod = [&](size_t from) {
    int64_t n = 1;
    for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
    return n;
  };
  *batch = 1;
  if (view == 0) {
    if (shape.size() != 2) return false;
    *rows = shape[0];
    *cols = shape[1];
  } else if (view == 1) {
    *rows = shape[0];
    *cols = prod(1);
  } else if (view == 2) {
    if (shape.size() < 3) return false;
    *batch = shape[0];
    *rows = shape[1];
    *cols = prod(2);
  } else {
    return false;
  }
  return true;
}

JobFacts FactsOf(const Job& job) {
  JobFacts f;
  for (const RankDesc& r : job.ranks) {
    for (const RankParamDesc& p : r.params) {
      auto [it, added] = f.params.try_emplace(p.name);
      JobFacts::Kind& k = it->second;
      k.ranks.push_back(r.world_rank);
      if (!added) continue;
      k.zero2 = p.zero2;
      k.custom_owner = p.custom_owner;
      int64_t rows = 0, cols = 0;
      if (ViewOf(p.global_shape, p.custom_owner >= 0 ? 0 : p.view, &k.batch, &rows, &cols)) {
        k.with_elements = rows > 0 && cols > 0 ? k.batch : 0;
        f.over_cap = f.over_cap || k.with_elements > kMaxParamMatrices;
      }
    }
  }
  for (const auto& [name, k] : f.params) {
    if (k.custom_owner >= 0 &&
        std::find(k.ranks.begin(), k.ranks.end(), k.custom_owner) == k.ranks.end()) {
      f.custom_owner_missing = true;
    }
  }
  return f;
}

// An accepted plan is the job's on every rank: the same units, matrix counts
// and custom-path owners, one unit per matrix with elements, and each rank's
// own entries for exactly what it registered (none on a rank that holds no
// parameter of a kind).
void CheckJobWide(const Job& job, const JobFacts& facts, const std::vector<Plan>& plans) {
  const int world = job.world;
  int64_t units = 0, empty = 0, zero2 = 0;
  std::vector<std::string> custom, layout;
  for (const auto& [name, k] : facts.params) {
    if (k.zero2) {
      zero2 += k.batch;
    } else if (k.custom_owner >= 0) {
      custom.push_back(name);
    } else {
      layout.push_back(name);
      units += k.with_elements;
      empty += k.batch - k.with_elements;
    }
  }
  FUZZ_CHECK(static_cast<int>(plans.size()) == world);
  for (int r = 0; r < world; ++r) {
    const Plan& plan = plans[r];
    // (Split matrices aside: this fuzzer's assignments never split.)
    FUZZ_CHECK(static_cast<int64_t>(plan.units.size()) == units);
    FUZZ_CHECK(plan.empty_matrices == empty);
    FUZZ_CHECK(plan.zero2_matrices == zero2);
    FUZZ_CHECK(plan.rounds == plans[0].rounds);
    for (size_t u = 0; u < plan.units.size(); ++u) {
      FUZZ_CHECK(plan.units[u].param == plans[0].units[u].param);
      FUZZ_CHECK(plan.units[u].index == plans[0].units[u].index);
      FUZZ_CHECK(plan.units[u].owner == plans[0].units[u].owner);
      FUZZ_CHECK(plan.units[u].owner >= 0 && plan.units[u].owner < world);
    }
    // This rank's index of each parameter it registered, by name.
    std::map<std::string, int> mine;
    for (size_t i = 0; i < job.ranks[r].params.size(); ++i) {
      mine[job.ranks[r].params[i].name] = static_cast<int>(i);
    }
    FUZZ_CHECK(plan.params.size() == layout.size());
    for (size_t i = 0; i < plan.params.size(); ++i) {
      const PlanParam& pp = plan.params[i];
      FUZZ_CHECK(pp.name == layout[i]);
      const JobFacts::Kind& k = facts.params.at(pp.name);
      FUZZ_CHECK(pp.holders.size() == k.ranks.size());
      for (size_t h = 0; h < pp.holders.size(); ++h) FUZZ_CHECK(pp.holders[h].rank == k.ranks[h]);
      const auto it = mine.find(pp.name);
      FUZZ_CHECK(pp.local == (it == mine.end() ? -1 : it->second));
      FUZZ_CHECK((pp.local_holder >= 0) == (pp.local >= 0));
      if (pp.local_holder >= 0) FUZZ_CHECK(pp.holders[pp.local_holder].rank == r);
    }
    FUZZ_CHECK(plan.custom.size() == custom.size());
    for (size_t i = 0; i < plan.custom.size(); ++i) {
      const CustomUnit& c = plan.custom[i];
      FUZZ_CHECK(c.name == custom[i]);
      const JobFacts::Kind& k = facts.params.at(c.name);
      FUZZ_CHECK(c.owner == k.custom_owner);
      FUZZ_CHECK(std::find(k.ranks.begin(), k.ranks.end(), c.owner) != k.ranks.end());
      const auto it = mine.find(c.name);
      FUZZ_CHECK(c.local == (it == mine.end() ? -1 : it->second));
      FUZZ_CHECK(c.rows >= 0 && c.cols >= 0);
    }
  }
}

void FuzzOne(FuzzedDataProvider& in) {
  Job job = MakeJob(in);
  const int world = job.world;
  Dump(job);

  // The handshake's wire form carries every description unchanged.
  for (const RankDesc& d : job.ranks) {
    const std::string bytes = SerializeRankDesc(d);
    absl::StatusOr<RankDesc> back = ParseRankDesc(bytes, "rank");
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(SerializeRankDesc(*back) == bytes);
  }
  // So do its parts (SplitHandshake): every rank's description put back
  // together from them on any rank, from the parts it holds and those its
  // senders hold, is the one it described.
  {
    std::vector<HandshakeParts> parts;
    std::vector<HandshakeHeader> headers;
    std::vector<std::string> owns;
    for (const RankDesc& d : job.ranks) {
      parts.push_back(SplitHandshake("options", d));
      headers.push_back(parts.back().header);
      owns.push_back(parts.back().own);
    }
    const HandshakeDirectory dir(headers, owns);
    const int me = world - 1;
    std::vector<std::string> bytes(dir.parts());
    for (size_t part = 0; part < dir.parts(); ++part) {
      const int s = dir.Sender(part, me);
      for (const auto& [p, local] : dir.Held(s < 0 ? me : s)) {
        if (p != part) continue;
        const HandshakeParts& h = parts[s < 0 ? me : s];
        bytes[part] = local == 0 ? h.shared : h.groups[local - 1];
      }
      FUZZ_CHECK(KeyOf(bytes[part]) == dir.key(part));
    }
    absl::StatusOr<std::vector<RankDesc>> back = dir.Assemble(bytes, "options", me);
    FUZZ_CHECK(back.ok());
    for (int r = 0; r < world; ++r) {
      FUZZ_CHECK(SerializeRankDesc((*back)[r]) == SerializeRankDesc(job.ranks[r]));
    }
  }

  // The model of every rank's pieces, and whether the job is valid.
  bool simulate = true;
  for (const RankDesc& r : job.ranks) {
    for (const RankParamDesc& p : r.params) {
      const int64_t n = Numel(p.global_shape);
      simulate = simulate && n >= 0 && n <= kModelLimit;
    }
  }
  std::vector<std::vector<ModelPiece>> model(world);
  bool model_ok = true;
  for (const RankDesc& r : job.ranks) {
    std::vector<int> sizes, coords;
    for (const auto& g : r.groups) {
      sizes.push_back(static_cast<int>(g.size()));
      coords.push_back(static_cast<int>(std::find(g.begin(), g.end(), r.world_rank) - g.begin()));
    }
    for (const RankParamDesc& p : r.params) {
      model[r.world_rank].push_back(Model(p.layout, sizes, coords, simulate));
      model_ok = model_ok && model[r.world_rank].back().valid;
      // PieceShape (what the registry checks first) agrees with the model, at any size.
      absl::StatusOr<Piece> shape = PieceShape(p.layout, sizes, coords, "fuzz");
      FUZZ_CHECK(shape.ok() == model[r.world_rank].back().valid);
      if (shape.ok()) {
        FUZZ_CHECK(shape->shape == model[r.world_rank].back().shape);
        FUZZ_CHECK(shape->canonical == model[r.world_rank].back().canonical);
        FUZZ_CHECK(shape->runs.empty());
      }
      if (!simulate || !model[r.world_rank].back().valid) continue;
      // ComputePiece agrees with the model, element by element.
      absl::StatusOr<Piece> piece = ComputePiece(p.layout, sizes, coords, "fuzz");
      FUZZ_CHECK(piece.ok());
      FUZZ_CHECK(piece->shape == model[r.world_rank].back().shape);
      FUZZ_CHECK(piece->numel == static_cast<int64_t>(model[r.world_rank].back().idx.size()));
      FUZZ_CHECK(piece->canonical == model[r.world_rank].back().canonical);
      FUZZ_CHECK(Expand(*piece) == model[r.world_rank].back().idx);
    }
  }

  // Every rank builds the plan from the same descriptions.
  std::vector<Plan> plans;
  absl::Status first;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<Plan> plan = BuildPlan(job.ranks, r, job.options);
    if (r == 0) first = plan.status();
    FUZZ_CHECK(plan.ok() == first.ok());
    if (!plan.ok()) {
      FUZZ_CHECK(plan.status().message() == first.message());
      continue;
    }
    if (r > 0) FUZZ_CHECK(plan->digest == plans[0].digest);
    plans.push_back(*std::move(plan));
  }
  if (!model_ok) {
    FUZZ_CHECK(!first.ok());  // a layout the model refuses is refused
    return;
  }
  const JobFacts facts = FactsOf(job);
  if (facts.over_cap || facts.custom_owner_missing) {
    FUZZ_CHECK(!first.ok());
    return;
  }
  if (!first.ok()) return;
  CheckJobWide(job, facts, plans);
  if (std::getenv("MUON_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "accepted job: %zu custom, %lld ZeRO-2 matrices, %lld empty matrices\n",
                 plans[0].custom.size(), static_cast<long long>(plans[0].zero2_matrices),
                 static_cast<long long>(plans[0].empty_matrices));
  }
  if (!simulate) return;

  // Accepted: the canonical copies tile every parameter once, the copies lie inside.
  const Plan& plan = plans[0];
  std::map<std::string, std::vector<std::pair<int, const ModelPiece*>>> holders;
  std::map<std::string, const RankParamDesc*> desc;
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < job.ranks[r].params.size(); ++i) {
      const RankParamDesc& p = job.ranks[r].params[i];
      if (p.zero2 || p.custom_owner >= 0) continue;
      holders[p.name].push_back({r, &model[r][i]});
      desc[p.name] = &p;
    }
  }
  FUZZ_CHECK(plan.params.size() == holders.size());
  for (const PlanParam& pp : plan.params) {
    FUZZ_CHECK(holders.count(pp.name) == 1);
    const int64_t numel = Numel(desc[pp.name]->global_shape);
    FUZZ_CHECK(pp.batch * pp.rows * pp.cols == numel);
    std::vector<int> held(numel, 0);
    FUZZ_CHECK(pp.holders.size() == holders[pp.name].size());
    for (size_t h = 0; h < pp.holders.size(); ++h) {
      FUZZ_CHECK(pp.holders[h].rank == holders[pp.name][h].first);
      const ModelPiece& m = *holders[pp.name][h].second;
      for (int64_t g : m.idx) {
        FUZZ_CHECK(g >= 0 && g < numel);
        if (m.canonical) ++held[g];
      }
    }
    for (int64_t g = 0; g < numel; ++g) FUZZ_CHECK(held[g] == 1);
  }
  CheckAccepted(job, plans, model);
  if (std::getenv("MUON_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "accepted: %zu params, %zu units, %d rounds\n", plan.params.size(),
                 plan.units.size(), plan.rounds);
  }
}

}  // namespace
}  // namespace muon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  muon::FuzzOne(in);
  return 0;
}
