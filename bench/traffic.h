// The lower bound of the exchange's traffic, computed from the layouts
// without the library, and the bytes a plan's round tables actually move:
// shared by assignment_bench and setup_bench.
#ifndef BENCH_TRAFFIC_H_
#define BENCH_TRAFFIC_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "muon/common/dtype.h"

namespace bench {

constexpr int kStateBytes = 4;  // fp32 momentum, gathered to the owner
constexpr int kNsBytes = 2;     // bf16 Newton-Schulz output, scattered back

// The rectangle of a global matrix a rank holds (empty where it holds none),
// and whether it is the copy that is sent.
struct Rect {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  bool canonical = true;
  int64_t Area() const { return std::max<int64_t>(0, r1 - r0) * std::max<int64_t>(0, c1 - c0); }
};

inline int64_t Overlap(const Rect& a, const Rect& b) {
  const int64_t rows = std::min(a.r1, b.r1) - std::max(a.r0, b.r0);
  const int64_t cols = std::min(a.c1, b.c1) - std::max(a.c0, b.c0);
  return rows > 0 && cols > 0 ? rows * cols : 0;
}

// Keeps chunk k of n (torch.chunk) of the rect's rows.
inline void ChunkRows(Rect* x, int k, int n) {
  const int64_t d = x->r1 - x->r0;
  const int64_t chunk = (d + n - 1) / n;
  const int64_t a = std::min(d, k * chunk), b = std::min(d, a + chunk);
  x->r1 = x->r0 + b;
  x->r0 = x->r0 + a;
}

// The payload bytes of one direction's spans to or from other ranks (a
// rank's own elements do not move).
template <typename SpanT>
int64_t PeerBytes(const std::vector<std::vector<SpanT>>& per_peer, int me) {
  int64_t n = 0;
  for (size_t p = 0; p < per_peer.size(); ++p) {
    if (static_cast<int>(p) == me) continue;
    for (const SpanT& s : per_peer[p]) n += s.length * static_cast<int64_t>(muon::SizeOf(s.wire));
  }
  return n;
}

}  // namespace bench

#endif  // BENCH_TRAFFIC_H_
