#include "muon/dist/exchange.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

template <typename SpanT>
size_t Bytes(const std::vector<SpanT>& spans) {
  size_t n = 0;
  for (const auto& s : spans) n += static_cast<size_t>(s.length) * SizeOf(s.wire);
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

void Pack(const float* src, int64_t n, DType wire, unsigned char* dst) {
  for (int64_t i = 0; i < n; ++i) StoreFromFloat(wire, dst, i, src[i]);
}

void Unpack(const unsigned char* src, int64_t n, DType wire, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = LoadAsFloat(wire, src, i);
}

absl::Status Exchange(Comm& comm, const std::vector<size_t>& sb, const std::vector<size_t>& so,
                      const std::vector<size_t>& rb, const std::vector<size_t>& ro,
                      std::vector<unsigned char>* send, std::vector<unsigned char>* recv,
                      void* stream, const std::string& op) {
  return comm.AllToAllV(send->data(), sb, so, recv->data(), rb, ro, stream, op);
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
  // Slot positions of owned matrices: grouped by shape within each round.
  std::vector<int64_t> slot_of(plan.units.size(), -1);
  {
    std::vector<std::map<std::pair<int64_t, int64_t>, std::vector<int>>> by_shape(plan.rounds);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> shape_order(plan.rounds);
    for (size_t i = 0; i < plan.units.size(); ++i) {
      const Unit& u = plan.units[i];
      if (u.owner != my_rank) continue;
      const PlanParam& pp = plan.params[u.param];
      auto key = std::make_pair(pp.rows, pp.cols);
      auto& m = by_shape[u.round];
      if (m.find(key) == m.end()) shape_order[u.round].push_back(key);
      m[key].push_back(static_cast<int>(i));
    }
    for (int r = 0; r < plan.rounds; ++r) {
      RoundTable& t = tables[r];
      for (const auto& key : shape_order[r]) {
        ShapeBatch b{key.first, key.second, t.slot_floats, 0};
        for (int i : by_shape[r][key]) {
          slot_of[i] = t.slot_floats;
          t.slot_floats += key.first * key.second;
          ++b.count;
          ++t.owned;
          t.flops += plan.units[i].flops;
        }
        t.batches.push_back(b);
      }
    }
  }
  // This rank's entry among each parameter's holders (found from my_rank, so
  // any rank's copy of the plan serves).
  std::vector<int> mine(plan.params.size(), -1);
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const auto& holders = plan.params[p].holders;
    for (size_t h = 0; h < holders.size(); ++h) {
      if (holders[h].rank == my_rank) mine[p] = static_cast<int>(h);
    }
  }
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    const PlanParam& pp = plan.params[u.param];
    const int my_holder = mine[u.param];
    const int64_t per = pp.rows * pp.cols;
    const int64_t begin = u.index * per, end = begin + per;
    const DType state = static_cast<DType>(pp.state_dtype);
    RoundTable& t = tables[u.round];
    const bool owner = u.owner == my_rank;
    bool involved = owner;
    const bool i_send =
        my_holder >= 0 && std::find(u.senders.begin(), u.senders.end(), my_holder) != u.senders.end();
    const bool i_receive = my_holder >= 0 && std::find(u.receivers.begin(), u.receivers.end(),
                                                       my_holder) != u.receivers.end();
    if (owner || i_send) {
      // The owner fills what it holds from its own piece (a copy to itself,
      // no traffic); the canonical holders send only the rest.
      int owner_holder = -1;
      for (int h : u.receivers) {
        if (pp.holders[h].rank == u.owner) owner_holder = h;
      }
      std::vector<std::pair<int, std::vector<LocatedRun>>> sends;
      std::vector<Run> cover;
      if (owner_holder >= 0) {
        sends.push_back({owner_holder, Intersect(pp.holders[owner_holder].piece.runs, begin, end)});
        for (const LocatedRun& lr : sends.back().second) cover.push_back(lr.run);
        std::sort(cover.begin(), cover.end(),
                  [](const Run& a, const Run& b) { return a.offset < b.offset; });
      }
      for (int h : u.senders) {
        if (h == owner_holder || (!owner && h != my_holder)) continue;
        sends.push_back({h, Subtract(Intersect(pp.holders[h].piece.runs, begin, end), cover)});
      }
      for (const auto& [h, runs] : sends) {
        const int from = pp.holders[h].rank;
        for (const LocatedRun& lr : runs) {
          if (from == my_rank) {
            t.gather_send[u.owner].push_back({pp.local, lr.local, lr.run.length, state});
            involved = true;
          }
          if (owner) {
            t.gather_recv[from].push_back(
                {slot_of[i] + lr.run.offset - begin, lr.run.length, state});
          }
        }
      }
    }
    // Every holder (each copy) receives its elements of the result.
    for (int h : u.receivers) {
      const Holder& holder = pp.holders[h];
      if (!owner && !(i_receive && holder.rank == my_rank)) continue;
      for (const LocatedRun& lr : Intersect(holder.piece.runs, begin, end)) {
        if (owner) {
          t.scatter_send[holder.rank].push_back(
              {slot_of[i] + lr.run.offset - begin, lr.run.length, ns_wire});
        }
        if (holder.rank == my_rank) {
          t.scatter_recv[u.owner].push_back({pp.local, lr.local, lr.run.length, ns_wire});
          involved = true;
        }
      }
    }
    if (involved) t.units.push_back(static_cast<int>(i));
  }
  // Errors name the round and its first parameter.
  std::vector<int> first(plan.rounds, -1), count(plan.rounds, 0);
  for (const Unit& u : plan.units) {
    if (first[u.round] < 0) first[u.round] = u.param;
    ++count[u.round];
  }
  for (int r = 0; r < plan.rounds; ++r) {
    tables[r].label = absl::StrCat("round ", r, " (param '", plan.params[first[r]].name, "'",
                                   count[r] > 1 ? absl::StrCat(" and ", count[r] - 1, " more matrices") : "",
                                   ")");
  }
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

absl::Status RunGather(const RoundTable& t, Comm& comm, const std::vector<float*>& updates,
                       float* slots, std::vector<unsigned char>* send,
                       std::vector<unsigned char>* recv, void* stream) {
  std::vector<size_t> sb, so, rb, ro;
  SpanLayout(t.gather_send, &sb, &so);
  SpanLayout(t.gather_recv, &rb, &ro);
  for (size_t p = 0; p < t.gather_send.size(); ++p) {
    unsigned char* at = send->data() + so[p];
    for (const LocalSpan& s : t.gather_send[p]) {
      Pack(updates[s.param] + s.pos, s.length, s.wire, at);
      at += s.length * SizeOf(s.wire);
    }
  }
  absl::Status st = Exchange(comm, sb, so, rb, ro, send, recv, stream,
                             absl::StrCat("gathering ", t.label));
  if (!st.ok()) return st;
  for (size_t p = 0; p < t.gather_recv.size(); ++p) {
    const unsigned char* at = recv->data() + ro[p];
    for (const SlotSpan& s : t.gather_recv[p]) {
      Unpack(at, s.length, s.wire, slots + s.pos);
      at += s.length * SizeOf(s.wire);
    }
  }
  return absl::OkStatus();
}

absl::Status RunScatter(const RoundTable& t, Comm& comm, const std::vector<float*>& updates,
                        const float* slots, std::vector<unsigned char>* send,
                        std::vector<unsigned char>* recv, void* stream) {
  std::vector<size_t> sb, so, rb, ro;
  SpanLayout(t.scatter_send, &sb, &so);
  SpanLayout(t.scatter_recv, &rb, &ro);
  for (size_t p = 0; p < t.scatter_send.size(); ++p) {
    unsigned char* at = send->data() + so[p];
    for (const SlotSpan& s : t.scatter_send[p]) {
      Pack(slots + s.pos, s.length, s.wire, at);
      at += s.length * SizeOf(s.wire);
    }
  }
  absl::Status st = Exchange(comm, sb, so, rb, ro, send, recv, stream,
                             absl::StrCat("scattering ", t.label));
  if (!st.ok()) return st;
  for (size_t p = 0; p < t.scatter_recv.size(); ++p) {
    const unsigned char* at = recv->data() + ro[p];
    for (const LocalSpan& s : t.scatter_recv[p]) {
      Unpack(at, s.length, s.wire, updates[s.param] + s.pos);
      at += s.length * SizeOf(s.wire);
    }
  }
  return absl::OkStatus();
}

}  // namespace muon
