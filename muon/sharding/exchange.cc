#include "muon/sharding/exchange.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

// A span's bytes on the wire, padded to 4: every span starts 4-byte aligned
// in a send or receive buffer, so a float32 span after a bfloat16 one of odd
// length is still read and written as floats (on GPUs a misaligned float
// access faults).
template <typename SpanT>
size_t WireBytes(const SpanT& s) {
  return (static_cast<size_t>(s.length) * SizeOf(s.wire) + 3) & ~size_t{3};
}

template <typename SpanT>
size_t Bytes(const std::vector<SpanT>& spans) {
  size_t n = 0;
  for (const auto& s : spans) n += WireBytes(s);
  return n;
}

template <typename SpanT>
void SpanLayout(const std::vector<std::vector<SpanT>>& per_peer, std::vector<size_t>* bytes,
            std::vector<size_t>* offsets) {
  bytes->resize(per_peer.size());
  offsets->resize(per_peer.size());
  size_t at = 0;
  for (size_t p = 0; p < per_peer.size(); ++p) {
    (*offsets)[p] = at;
    (*bytes)[p] = Bytes(per_peer[p]);
    at += (*bytes)[p];
  }
}

size_t Total(const std::vector<size_t>& v) {
  size_t n = 0;
  for (size_t x : v) n += x;
  return n;
}

// The parts of `runs` outside `cover` (global runs sorted by offset, not
// overlapping), keeping each part's local position.
std::vector<LocatedRun> Subtract(const std::vector<LocatedRun>& runs, const std::vector<Run>& cover) {
  if (cover.empty()) return runs;
  std::vector<LocatedRun> out;
  for (const LocatedRun& lr : runs) {
    int64_t at = lr.run.offset;
    const int64_t end = lr.run.offset + lr.run.length;
    auto it = std::upper_bound(cover.begin(), cover.end(), at,
                               [](int64_t v, const Run& c) { return v < c.offset; });
    if (it != cover.begin()) --it;
    for (; it != cover.end() && it->offset < end && at < end; ++it) {
      const int64_t c0 = it->offset, c1 = it->offset + it->length;
      if (c1 <= at) continue;
      if (c0 > at) out.push_back({lr.local + (at - lr.run.offset), {at, c0 - at}});
      at = std::max(at, c1);
    }
    if (at < end) out.push_back({lr.local + (at - lr.run.offset), {at, end - at}});
  }
  return out;
}

// A stretch of a unit's matrix in global element order that lies contiguous
// in its owner's slot: [begin, end) of the parameter's elements, at `slot`
// (elements from the unit's slot offset).
struct Segment {
  int64_t begin, end, slot;
};

// A unit's segments, in increasing global order: the whole matrix, or a
// tall matrix's block of rows, one segment each; a wide matrix's block of
// columns, one per row.
std::vector<Segment> SegmentsOf(const Unit& u, const PlanParam& pp) {
  const int64_t per = pp.rows * pp.cols, begin = u.index * per;
  if (u.parts <= 1) return {{begin, begin + per, 0}};
  if (pp.rows > pp.cols) {
    return {{begin + u.first * pp.cols, begin + (u.first + u.width) * pp.cols, 0}};
  }
  std::vector<Segment> rows;
  rows.reserve(static_cast<size_t>(pp.rows));
  for (int64_t i = 0; i < pp.rows; ++i) {
    const int64_t at = begin + i * pp.cols + u.first;
    rows.push_back({at, at + u.width, i * u.width});
  }
  return rows;
}

// Slot positions of owned matrices: grouped by shape within each round,
// then the owned parts of split matrices, into each round's table (its
// batches, blocks, slot size, owned count and flops). Returns each unit's
// slot (-1: not owned here).
std::vector<int64_t> PlaceOwned(const Plan& plan, int my_rank, std::vector<RoundTable>* tables) {
  std::vector<int64_t> slot_of(plan.units.size(), -1);
  // A split parameter's matrices batch apart (the key's third entry).
  using Key = std::tuple<int64_t, int64_t, int>;
  std::vector<std::map<Key, std::vector<int>>> by_shape(plan.rounds);
  std::vector<std::vector<Key>> shape_order(plan.rounds);
  std::vector<std::vector<int>> parts(plan.rounds);
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    if (u.owner != my_rank) continue;
    if (u.parts > 1) {
      parts[u.round].push_back(static_cast<int>(i));
      continue;
    }
    const PlanParam& pp = plan.params[u.param];
    const Key key{pp.rows, pp.cols, pp.split.none() ? -1 : u.param};
    auto& m = by_shape[u.round];
    if (m.find(key) == m.end()) shape_order[u.round].push_back(key);
    m[key].push_back(static_cast<int>(i));
  }
  for (int r = 0; r < plan.rounds; ++r) {
    RoundTable& t = (*tables)[r];
    for (const auto& key : shape_order[r]) {
      const auto [rows, cols, split_param] = key;
      ShapeBatch b{rows, cols, t.slot_floats, 0, {}, split_param};
      for (int i : by_shape[r][key]) {
        b.units.push_back(i);
        slot_of[i] = t.slot_floats;
        t.slot_floats += rows * cols;
        ++b.count;
        ++t.owned;
        t.flops += plan.units[i].flops;
      }
      t.batches.push_back(b);
    }
    for (int i : parts[r]) {
      const Unit& u = plan.units[i];
      const PlanParam& pp = plan.params[u.param];
      const int64_t m = std::min(pp.rows, pp.cols);
      slot_of[i] = t.slot_floats;
      t.blocks.push_back({i, t.slot_floats, m, u.width, pp.rows > pp.cols});
      t.slot_floats += m * u.width;
      t.flops += u.flops;
    }
  }
  return slot_of;
}

// One unit as this rank takes part in it, for its spans in its round's table.
struct UnitSpans {
  const Unit& u;
  const PlanParam& pp;
  int my_rank;
  int my_holder;  // this rank's entry among pp's holders, or -1
  bool owner;     // this rank orthogonalizes it
  int64_t slot;   // its slot, when owned
  const std::vector<Segment>& segments;
  std::vector<BlockCursor>& cursors;  // each holder's blocks

  // The gather into the owner's slot: the owner fills what it holds from its
  // own piece (a copy to itself, no traffic); the canonical holders send
  // only the rest. Returns whether this rank sends any of it.
  bool AddGather(RoundTable& t) const {
    const DType state = static_cast<DType>(pp.state_dtype);
    bool sends_any = false;
    int owner_holder = -1;
    for (int h : u.receivers) {
      if (pp.holders[h].rank == u.owner) owner_holder = h;
    }
    for (const Segment& seg : segments) {
      std::vector<std::pair<int, std::vector<LocatedRun>>> sends;
      std::vector<Run> cover;
      if (owner_holder >= 0) {
        sends.push_back({owner_holder, cursors[owner_holder].Intersect(seg.begin, seg.end)});
        for (const LocatedRun& lr : sends.back().second) cover.push_back(lr.run);
        std::sort(cover.begin(), cover.end(),
                  [](const Run& a, const Run& b) { return a.offset < b.offset; });
      }
      for (int h : u.senders) {
        if (h == owner_holder || (!owner && h != my_holder)) continue;
        sends.push_back({h, Subtract(cursors[h].Intersect(seg.begin, seg.end), cover)});
      }
      for (const auto& [h, runs] : sends) {
        const int from = pp.holders[h].rank;
        for (const LocatedRun& lr : runs) {
          if (from == my_rank) {
            t.gather_send[u.owner].push_back({pp.local, lr.local, lr.run.length, state});
            sends_any = true;
          }
          if (owner) {
            t.gather_recv[from].push_back(
                {slot + seg.slot + lr.run.offset - seg.begin, lr.run.length, state});
          }
        }
      }
    }
    return sends_any;
  }

  // The scatter of the result: every holder (each copy) receives its
  // elements. Returns whether this rank receives any of it.
  bool AddScatter(bool i_receive, DType ns_wire, RoundTable& t) const {
    bool receives_any = false;
    for (int h : u.receivers) {
      const Holder& holder = pp.holders[h];
      if (!owner && !(i_receive && holder.rank == my_rank)) continue;
      for (const Segment& seg : segments) {
        for (const LocatedRun& lr : cursors[h].Intersect(seg.begin, seg.end)) {
          if (owner) {
            t.scatter_send[holder.rank].push_back(
                {slot + seg.slot + lr.run.offset - seg.begin, lr.run.length, ns_wire});
          }
          if (holder.rank == my_rank) {
            t.scatter_recv[u.owner].push_back({pp.local, lr.local, lr.run.length, ns_wire});
            receives_any = true;
          }
        }
      }
    }
    return receives_any;
  }
};

// Each round's label for errors: the round and its first parameter.
void LabelRounds(const Plan& plan, std::vector<RoundTable>* tables) {
  std::vector<int> first(plan.rounds, -1), count(plan.rounds, 0);
  for (const Unit& u : plan.units) {
    if (first[u.round] < 0) first[u.round] = u.param;
    ++count[u.round];
  }
  for (int r = 0; r < plan.rounds; ++r) {
    (*tables)[r].label =
        absl::StrCat("round ", r, " (param '", plan.params[first[r]].name, "'",
                     count[r] > 1 ? absl::StrCat(" and ", count[r] - 1, " more matrices") : "",
                     ")");
  }
}

}  // namespace

std::vector<RoundTable> BuildRoundTables(const Plan& plan, int my_rank, int world,
                                         DType ns_wire) {
  std::vector<RoundTable> tables(plan.rounds);
  for (RoundTable& t : tables) {
    t.gather_send.resize(world);
    t.gather_recv.resize(world);
    t.scatter_send.resize(world);
    t.scatter_recv.resize(world);
  }
  const std::vector<int64_t> slot_of = PlaceOwned(plan, my_rank, &tables);
  // This rank's entry among each parameter's holders (found from my_rank, so
  // any rank's copy of the plan serves).
  std::vector<int> mine(plan.params.size(), -1);
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const auto& holders = plan.params[p].holders;
    for (size_t h = 0; h < holders.size(); ++h) {
      if (holders[h].rank == my_rank) mine[p] = static_cast<int>(h);
    }
  }
  // Each holder's blocks, walked once over a parameter's matrices (units
  // come by parameter, then matrix; a cursor asked for an earlier range, as
  // the parts of a wide matrix ask for its rows again, starts over).
  std::vector<BlockCursor> cursors;
  int cursors_of = -1;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    const PlanParam& pp = plan.params[u.param];
    const int my_holder = mine[u.param];
    const bool owner = u.owner == my_rank;
    const bool i_send =
        my_holder >= 0 && std::find(u.senders.begin(), u.senders.end(), my_holder) != u.senders.end();
    const bool i_receive = my_holder >= 0 && std::find(u.receivers.begin(), u.receivers.end(),
                                                       my_holder) != u.receivers.end();
    if (!owner && !i_send && !i_receive) continue;  // nothing of this unit moves here
    const std::vector<Segment> segments = SegmentsOf(u, pp);
    if (cursors_of != u.param) {
      cursors.clear();
      for (const Holder& h : pp.holders) cursors.emplace_back(pp.Blocks(h));
      cursors_of = u.param;
    }
    const UnitSpans spans{u, pp, my_rank, my_holder, owner, slot_of[i], segments, cursors};
    RoundTable& t = tables[u.round];
    bool involved = owner;
    if (owner || i_send) involved |= spans.AddGather(t);
    involved |= spans.AddScatter(i_receive, ns_wire, t);
    if (involved) t.units.push_back(static_cast<int>(i));
  }
  LabelRounds(plan, &tables);
  return tables;
}

size_t MaxExchangeBytes(const std::vector<RoundTable>& tables) {
  size_t m = 0;
  std::vector<size_t> b, o;
  for (const RoundTable& t : tables) {
    SpanLayout(t.gather_send, &b, &o);
    m = std::max(m, Total(b));
    SpanLayout(t.gather_recv, &b, &o);
    m = std::max(m, Total(b));
    SpanLayout(t.scatter_send, &b, &o);
    m = std::max(m, Total(b));
    SpanLayout(t.scatter_recv, &b, &o);
    m = std::max(m, Total(b));
  }
  return m;
}

namespace {

// Copies from spans of `base` (a param's update storage, or the fp32 slots)
// into the wire bytes of one direction's send buffer, peer after peer.
template <typename SpanT, typename BaseFn>
std::vector<CopyOp> PackOps(const std::vector<std::vector<SpanT>>& per_peer,
                            const std::vector<size_t>& offsets, unsigned char* send, BaseFn base) {
  std::vector<CopyOp> ops;
  for (size_t p = 0; p < per_peer.size(); ++p) {
    unsigned char* at = send + offsets[p];
    for (const SpanT& s : per_peer[p]) {
      const LocalBuffer b = base(s);
      ops.push_back({ElementAt(b.data, b.dtype, s.pos), at, s.length, b.dtype, s.wire, DType::kF32});
      at += WireBytes(s);
    }
  }
  return ops;
}

template <typename SpanT, typename BaseFn>
std::vector<CopyOp> UnpackOps(const std::vector<std::vector<SpanT>>& per_peer,
                              const std::vector<size_t>& offsets, const unsigned char* recv,
                              BaseFn base) {
  std::vector<CopyOp> ops;
  for (size_t p = 0; p < per_peer.size(); ++p) {
    const unsigned char* at = recv + offsets[p];
    for (const SpanT& s : per_peer[p]) {
      const LocalBuffer b = base(s);
      ops.push_back({at, ElementAt(b.data, b.dtype, s.pos), s.length, s.wire, b.dtype, DType::kF32});
      at += WireBytes(s);
    }
  }
  return ops;
}

// A world of one rank: each pack op and the unpack op that reads the same
// wire bytes become one copy from the source to the destination, rounded to
// the wire dtype on the way (what the two did through the send buffer).
// Empty when the two lists do not pair up op by op.
std::vector<CopyOp> Direct(const std::vector<CopyOp>& pack, const std::vector<CopyOp>& unpack) {
  std::vector<CopyOp> direct;
  if (pack.size() != unpack.size()) return direct;
  for (size_t i = 0; i < pack.size(); ++i) {
    const CopyOp& p = pack[i];
    const CopyOp& u = unpack[i];
    if (p.dst != u.src || p.n != u.n || p.dst_type != u.src_type) return {};
    direct.push_back({p.src, u.dst, p.n, p.src_type, u.dst_type, p.dst_type});
  }
  return direct;
}

absl::StatusOr<BoundExchange::Direction> BindDirection(
    Device& device, std::vector<CopyOp> pack, std::vector<CopyOp> unpack, bool single_rank,
    std::vector<size_t> sb, std::vector<size_t> so, std::vector<size_t> rb,
    std::vector<size_t> ro, std::string label) {
  BoundExchange::Direction d;
  if (single_rank) {
    std::vector<CopyOp> direct = Direct(pack, unpack);
    if (!direct.empty()) {
      pack = std::move(direct);
      unpack.clear();
    }
  }
  absl::StatusOr<std::unique_ptr<CopyProgram>> p = device.Prepare(pack);
  if (!p.ok()) return p.status();
  d.pack = std::move(*p);
  p = device.Prepare(unpack);
  if (!p.ok()) return p.status();
  d.unpack = std::move(*p);
  d.send_bytes = std::move(sb);
  d.send_offsets = std::move(so);
  d.recv_bytes = std::move(rb);
  d.recv_offsets = std::move(ro);
  d.label = std::move(label);
  return d;
}

}  // namespace

absl::StatusOr<BoundExchange> BindExchange(const RoundTable& t, Device& device,
                                           const std::vector<LocalBuffer>& updates,
                                           LocalBuffer slots,
                                           unsigned char* send, unsigned char* recv,
                                           bool single_rank, size_t scatter_trailer) {
  // A world of one rank exchanges with itself: no collective is called, and
  // each piece is copied once, straight to where the unpack would put it
  // (Direct), or else the unpack reads the packed bytes where they are.
  const unsigned char* incoming = single_rank ? send : recv;
  auto update_of = [&](const LocalSpan& s) { return updates[s.param]; };
  auto slot_of = [&](const SlotSpan&) { return slots; };
  BoundExchange b;
  b.single_rank = single_rank;
  std::vector<size_t> sb, so, rb, ro;
  SpanLayout(t.gather_send, &sb, &so);
  SpanLayout(t.gather_recv, &rb, &ro);
  if (single_rank) ro = so;
  absl::StatusOr<BoundExchange::Direction> d = BindDirection(
      device, PackOps(t.gather_send, so, send, update_of),
      UnpackOps(t.gather_recv, ro, incoming, slot_of), single_rank, sb, so, rb, ro,
      absl::StrCat("gathering ", t.label));
  if (!d.ok()) return d.status();
  b.gather = std::move(*d);
  SpanLayout(t.scatter_send, &sb, &so);
  SpanLayout(t.scatter_recv, &rb, &ro);
  if (single_rank) ro = so;
  std::vector<size_t> st, rt;  // each peer's trailer, right after its pieces
  if (scatter_trailer > 0 && !single_rank) {
    for (size_t p = 0; p < sb.size(); ++p) {
      so[p] += p * scatter_trailer;
      st.push_back(so[p] + sb[p]);
      sb[p] += scatter_trailer;
    }
    for (size_t p = 0; p < rb.size(); ++p) {
      ro[p] += p * scatter_trailer;
      rt.push_back(ro[p] + rb[p]);
      rb[p] += scatter_trailer;
    }
  }
  d = BindDirection(device, PackOps(t.scatter_send, so, send, slot_of),
                    UnpackOps(t.scatter_recv, ro, incoming, update_of), single_rank, sb, so, rb,
                    ro,
                    absl::StrCat("scattering ", t.label));
  if (!d.ok()) return d.status();
  b.scatter = std::move(*d);
  if (!st.empty()) {
    b.scatter.trailer = scatter_trailer;
    b.scatter.send_trailers = std::move(st);
    b.scatter.recv_trailers = std::move(rt);
  }
  return b;
}

absl::Status RunExchange(const BoundExchange& b, const BoundExchange::Direction& d, Comm& comm,
                         Device& device, unsigned char* send, unsigned char* recv, void* stream,
                         const unsigned char* trailer_out, unsigned char* trailers_in,
                         bool trailer_out_on_device) {
  // The collective is issued even when packing failed, so that the other
  // ranks' calls pair up (the failure is returned, and agreed on after).
  absl::Status st = device.Run(*d.pack);
  if (!st.ok()) st = absl::Status(st.code(), absl::StrCat(d.label, ": ", st.message()));
  for (size_t at : d.send_trailers) {
    absl::Status w = trailer_out_on_device ? device.CopyBytes(send + at, trailer_out, d.trailer)
                                           : device.FromHostAsync(send + at, trailer_out, d.trailer);
    if (st.ok() && !w.ok()) st = w;
  }
  if (!b.single_rank) {
    absl::Status moved = comm.AllToAllV(send, d.send_bytes, d.send_offsets, recv, d.recv_bytes,
                                        d.recv_offsets, stream, d.label);
    if (st.ok()) st = moved;
  }
  for (size_t p = 0; p < d.recv_trailers.size(); ++p) {
    unsigned char* to = trailers_in + p * d.trailer;
    const unsigned char* from = recv + d.recv_trailers[p];
    absl::Status r = device.is_host() ? device.ToHost(to, from, d.trailer)
                                      : device.CopyBytes(to, from, d.trailer);
    if (st.ok() && !r.ok()) st = r;
  }
  if (!st.ok()) return st;
  st = device.Run(*d.unpack);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(d.label, ": ", st.message()));
  return absl::OkStatus();
}

}  // namespace muon
