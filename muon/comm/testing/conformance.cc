#include "muon/comm/testing/conformance.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "muon/comm/codes.h"
#include "muon/comm/testing/pattern.h"

namespace muon {
namespace {

constexpr unsigned char kUntouched = 0xEE;
constexpr unsigned char kSendGap = 0x11;
constexpr size_t kLarge = (size_t{1} << 20) + 13;  // over 1 MiB, an odd size

using Bytes = std::vector<unsigned char>;
using pattern::Byte;
using pattern::Mix;

// ---- The reference arithmetic of reduce_scatter ----------------------------
// Written here on purpose rather than taken from the library (muon/common,
// muon/comm/ordered_sum), so that the suite does not share a rounding bug
// with the adapters it checks. Elements travel as their bit patterns.

struct ElementType {
  int32_t code;  // MUON_DTYPE_*
  const char* name;
  size_t size;
  double unit_roundoff;
  double min_step;  // the spacing of the smallest (subnormal) numbers, where it matters
};

constexpr ElementType kFloat32{MUON_DTYPE_FLOAT32, "float32", 4, 0x1p-24, 0.0};
constexpr ElementType kBfloat16{MUON_DTYPE_BFLOAT16, "bfloat16", 2, 0x1p-8, 0.0};
constexpr ElementType kFloat16{MUON_DTYPE_FLOAT16, "float16", 2, 0x1p-11, 0x1p-24};

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float32 to float16, round to nearest even (finite inputs).
uint32_t ToHalf(float f) {
  const uint32_t sign = (BitsOf(f) >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7C00u;  // rounds to infinity
  if (a < 0x1p-14f) {
    // Zero or subnormal: a whole number of 2^-24 (exact scaling; nearbyint
    // rounds half to even). 1024 is the smallest normal, encoded alike.
    return sign | static_cast<uint32_t>(std::nearbyint(a * 0x1p24f));
  }
  const uint32_t u = BitsOf(a);
  uint32_t h = (u >> 13) - ((127u - 15u) << 10);  // exponent rebiased, 10 mantissa bits
  const uint32_t rest = u & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry bumps the exponent
  return sign | h;
}

float FromHalf(uint32_t h) {
  const float sign = (h & 0x8000u) != 0 ? -1.0f : 1.0f;
  const int exponent = static_cast<int>((h >> 10) & 0x1Fu);
  const int mantissa = static_cast<int>(h & 0x3FFu);
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) return mantissa != 0 ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}

uint32_t Encode(const ElementType& t, float f) {
  if (t.code == MUON_DTYPE_FLOAT32) return BitsOf(f);
  if (t.code == MUON_DTYPE_FLOAT16) return ToHalf(f);
  const uint32_t u = BitsOf(f);  // bfloat16: the top half, rounded to nearest even
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

float Decode(const ElementType& t, uint32_t bits) {
  if (t.code == MUON_DTYPE_FLOAT32) return FloatOf(bits);
  if (t.code == MUON_DTYPE_FLOAT16) return FromHalf(bits);
  return FloatOf(bits << 16);
}

void Store(const ElementType& t, unsigned char* at, uint32_t bits) {
  if (t.size == 4) {
    std::memcpy(at, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(at, &h, 2);
  }
}

uint32_t Load(const ElementType& t, const unsigned char* at) {
  if (t.size == 4) {
    uint32_t u;
    std::memcpy(&u, at, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, at, 2);
  return h;
}

// Element i of block b that rank `from` of n contributes (bits of `t`).
// Elements 0 and 1 are probes: 1, the type's half unit in the last place at
// 1 (2^-24 for float32) and 2^-24s (scaled by 2^(b % 4)), so placed that
// adding in rank order loses the small ones to ties (rounded to even) where
// adding them together first (reverse order) or in double precision does
// not; element 0 puts the 1 on rank 0, element 1 on rank n-1. The others are
// random, of random sign and of exponents far apart, so that fp32 rounds
// the partial sums.
uint32_t ElementBits(const ElementType& t, int from, int b, size_t i, int n) {
  if (i < 2) {
    const int one = i == 0 ? 0 : n - 1;
    const int half_ulp = i == 0 ? 1 : n - 2;
    const float h = t.code == MUON_DTYPE_FLOAT32    ? 0x1p-24f
                    : t.code == MUON_DTYPE_BFLOAT16 ? 0x1p-8f
                                                    : 0x1p-11f;
    const float v = from == one ? 1.0f : from == half_ulp ? h : 0x1p-24f;
    return Encode(t, std::ldexp(v, b % 4));
  }
  const uint32_t m = Mix(from, b, 7, static_cast<uint32_t>(i));
  const uint32_t e = Mix(from, b, 8, static_cast<uint32_t>(i));
  const bool half = t.code == MUON_DTYPE_FLOAT16;  // exponents -14..11: sums stay finite
  const int exponent = half ? -14 + static_cast<int>(e % 26) : -30 + static_cast<int>(e % 61);
  const float magnitude = std::ldexp(1.0f + static_cast<float>(m & 0x7FFFFFu) * 0x1p-23f, exponent);
  return Encode(t, (e >> 16) & 1u ? -magnitude : magnitude);
}

std::string Hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", static_cast<unsigned>(v));
  return text;
}

// ---- The checks ---------------------------------------------------------------

class Checker {
 public:
  Checker(const muon_comm_t& t, const ConformanceOptions& o) : t_(t), o_(o) {}

  std::vector<std::string> failures, skipped;

  bool Fields() {
    if (t_.struct_size < sizeof(muon_comm_t)) Fail("fields", "struct_size is too small");
    if (t_.size < 1 || t_.rank < 0 || t_.rank >= t_.size) Fail("fields", "rank outside [0, size)");
    if (t_.all_gather == nullptr || t_.all_to_all_v == nullptr || t_.reduce_scatter == nullptr) {
      Fail("fields", "a required collective is NULL");
    }
    if (!failures.empty()) return false;
    me_ = t_.rank;
    n_ = t_.size;
    std::vector<int32_t> ranks(n_, -1);
    const int32_t mine = me_;
    if (Called(t_.all_gather(t_.ctx, &mine, ranks.data(), sizeof mine, o_.stream),
               "fields (all_gather of the ranks)")) {
      for (int r = 0; r < n_; ++r) {
        if (ranks[r] != r) {
          Fail("fields", "position " + std::to_string(r) + " holds rank " +
                             std::to_string(ranks[r]) + " (ranks repeated or out of place)");
        }
      }
    }
    return true;
  }

  void AllGather() {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, kLarge}) {
      if (bytes == kLarge && !o_.large) continue;
      const std::string check = "all_gather of " + std::to_string(bytes) + " bytes";
      Bytes send(bytes + 1, kSendGap), recv(n_ * bytes + 1, kUntouched);
      for (size_t k = 0; k < bytes; ++k) send[k] = Byte(me_, 0, 1, k + bytes);
      const Bytes sent = send;
      if (!Called(t_.all_gather(t_.ctx, send.data(), recv.data(), bytes, o_.stream), check)) {
        continue;
      }
      ExpectBytes(check + " (send buffer)", send, sent);
      ExpectBlocks(check, recv, bytes, [&](int r, size_t k) { return Byte(r, 0, 1, k + bytes); });
    }
    // In place: this rank's block already sits in the receive buffer.
    for (size_t bytes : {size_t{0}, size_t{33}}) {
      const std::string check = "all_gather in place of " + std::to_string(bytes) + " bytes";
      Bytes recv(n_ * bytes + 1, kUntouched);
      for (size_t k = 0; k < bytes; ++k) recv[me_ * bytes + k] = Byte(me_, 0, 2, k);
      if (Called(t_.all_gather(t_.ctx, recv.data() + me_ * bytes, recv.data(), bytes, o_.stream),
                 check)) {
        ExpectBlocks(check, recv, bytes, [](int r, size_t k) { return Byte(r, 0, 2, k); });
      }
    }
  }

  void AllToAllV() {
    AllToAllVOf("no traffic", Layout::kNone);
    AllToAllVOf("ragged, gaps, rank order", Layout::kGaps);
    AllToAllVOf("ragged, gaps, reverse order", Layout::kReversed);
    AllToAllVOf("ragged, packed", Layout::kPacked);
  }

  void Broadcast() {
    if (t_.broadcast == nullptr) {
      skipped.push_back("broadcast (NULL)");
      return;
    }
    for (int root = 0; root < n_; ++root) BroadcastOf(root, 1000 + root);
    if (o_.large) BroadcastOf(n_ - 1, kLarge);
    BroadcastOf(0, 0);
  }

  void ReduceScatter() {
    for (const ElementType& t : {kFloat32, kBfloat16, kFloat16}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{2053}}) ReduceScatterOf(t, count);
    }
  }

  void Barrier() {
    if (t_.barrier == nullptr) {
      skipped.push_back("barrier (NULL)");
      return;
    }
    Called(t_.barrier(t_.ctx, o_.stream), "barrier");
  }

  // Invalid arguments fail on every rank, and the table works afterwards.
  void Errors() {
    unsigned char send[64] = {}, recv[64] = {};
    for (int32_t dtype : {3, 7, -1}) {
      if (t_.reduce_scatter(t_.ctx, send, recv, 1, dtype, o_.stream) == MUON_OK) {
        Fail("errors", "reduce_scatter accepted dtype " + std::to_string(dtype));
      }
    }
    if (t_.broadcast != nullptr) {
      for (int root : {-1, n_}) {
        if (t_.broadcast(t_.ctx, send, 4, root, o_.stream) == MUON_OK) {
          Fail("errors", "broadcast accepted root " + std::to_string(root));
        }
      }
    } else {
      skipped.push_back("errors: broadcast roots outside the group (NULL broadcast)");
    }
    Bytes out(n_ * 4 + 1, kUntouched);
    for (size_t k = 0; k < 4; ++k) send[k] = Byte(me_, 0, 6, k);
    if (Called(t_.all_gather(t_.ctx, send, out.data(), 4, o_.stream), "errors (usable after)")) {
      ExpectBlocks("errors (usable after)", out, 4, [](int r, size_t k) { return Byte(r, 0, 6, k); });
    }
  }

 private:
  enum class Layout { kNone, kGaps, kReversed, kPacked };

  void Fail(const std::string& check, const std::string& what) {
    failures.push_back(check + ": " + what);
  }

  bool Called(muon_status_t st, const std::string& check) {
    if (st == MUON_OK) return true;
    Fail(check, std::string("returned ") + CStatusName(st));
    return false;
  }

  // recv holds n blocks of `bytes`, block r's byte k being want(r, k), then
  // one untouched byte.
  template <typename Want>
  void ExpectBlocks(const std::string& check, const Bytes& recv, size_t bytes, Want want) {
    Bytes expected(recv.size(), kUntouched);
    for (int r = 0; r < n_; ++r) {
      for (size_t k = 0; k < bytes; ++k) expected[r * bytes + k] = want(r, k);
    }
    ExpectBytes(check, recv, expected);
  }

  void ExpectBytes(const std::string& check, const Bytes& got, const Bytes& want) {
    for (size_t k = 0; k < got.size(); ++k) {
      if (got[k] != want[k]) {
        Fail(check, "byte " + std::to_string(k) + " is " + std::to_string(got[k]) +
                        ", expected " + std::to_string(want[k]));
        return;
      }
    }
  }

  // Bytes rank `from` sends to rank `to`: none for about a third of the
  // pairs (never the self block), otherwise 1 to 61, different per pair.
  static size_t Count(int from, int to, Layout layout) {
    if (layout == Layout::kNone || (from + 2 * to) % 3 == 1) return 0;
    return 1 + Mix(from, to, 3, static_cast<uint32_t>(layout)) % 61;
  }

  void AllToAllVOf(const std::string& what, Layout layout) {
    const std::string check = "all_to_all_v, " + what;
    const int round = 10 + static_cast<int>(layout);
    std::vector<size_t> sb(n_), so(n_), rb(n_), ro(n_);
    const bool packed = layout == Layout::kPacked;
    size_t send_end = packed ? 0 : 2, recv_end = packed ? 0 : 3;  // gaps before the first block
    for (int k = 0; k < n_; ++k) {
      const int p = layout == Layout::kReversed ? n_ - 1 - k : k;
      sb[p] = Count(me_, p, layout);
      so[p] = send_end;
      send_end += sb[p] + (packed ? 0 : 3 + p);  // gaps between the blocks
      rb[p] = Count(p, me_, layout);
      ro[p] = recv_end;
      recv_end += rb[p] + (packed ? 0 : 5);
    }
    Bytes send(send_end + 1, kSendGap), recv(recv_end + 1, kUntouched);
    for (int p = 0; p < n_; ++p) {
      for (size_t k = 0; k < sb[p]; ++k) send[so[p] + k] = Byte(me_, p, round, k);
    }
    const Bytes sent = send;
    if (!Called(t_.all_to_all_v(t_.ctx, send.data(), sb.data(), so.data(), recv.data(), rb.data(),
                                ro.data(), o_.stream),
                check)) {
      return;
    }
    ExpectBytes(check + " (send buffer)", send, sent);
    Bytes want(recv.size(), kUntouched);
    for (int p = 0; p < n_; ++p) {
      for (size_t k = 0; k < rb[p]; ++k) want[ro[p] + k] = Byte(p, me_, round, k);
    }
    ExpectBytes(check, recv, want);
  }

  void BroadcastOf(int root, size_t bytes) {
    const std::string check =
        "broadcast of " + std::to_string(bytes) + " bytes from root " + std::to_string(root);
    Bytes want(bytes + 1, kUntouched);
    for (size_t k = 0; k < bytes; ++k) want[k] = Byte(root, 0, 4, k + bytes);
    Bytes buf(bytes + 1, kUntouched);
    if (me_ == root) buf = want;
    if (Called(t_.broadcast(t_.ctx, buf.data(), bytes, root, o_.stream), check)) {
      ExpectBytes(check, buf, want);
    }
  }

  void ReduceScatterOf(const ElementType& t, size_t count) {
    const std::string check =
        "reduce_scatter of " + std::to_string(count) + " " + t.name;
    Bytes send(n_ * count * t.size + 1, kSendGap), recv(count * t.size + 1, kUntouched);
    for (int b = 0; b < n_; ++b) {
      for (size_t i = 0; i < count; ++i) {
        Store(t, &send[(b * count + i) * t.size], ElementBits(t, me_, b, i, n_));
      }
    }
    const Bytes sent = send;
    if (!Called(t_.reduce_scatter(t_.ctx, send.data(), recv.data(), count, t.code, o_.stream),
                check)) {
      return;
    }
    ExpectBytes(check + " (send buffer)", send, sent);
    if (recv[count * t.size] != kUntouched) Fail(check, "wrote past the block");
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;  // rank order, fp32
      double magnitude = 0.0;
      for (int r = 0; r < n_; ++r) {
        const float x = Decode(t, ElementBits(t, r, me_, i, n_));
        sum += x;
        magnitude += std::fabs(x);
      }
      const uint32_t want = Encode(t, sum);  // rounded once
      const uint32_t got = Load(t, &recv[i * t.size]);
      bool ok = got == want;
      if (!ok && !o_.exact_sums) {
        const double tolerance = 2.0 * n_ * t.unit_roundoff * magnitude + t.min_step;
        ok = std::fabs(double(Decode(t, got)) - double(Decode(t, want))) <= tolerance;
      }
      if (!ok) {
        Fail(check, "element " + std::to_string(i) + " is " + std::to_string(Decode(t, got)) +
                        " (" + Hex(got) + "), the rank-order sum rounded once is " +
                        std::to_string(Decode(t, want)) + " (" + Hex(want) + ")" +
                        (o_.exact_sums ? "" : ", beyond the tolerance"));
        return;
      }
    }
  }

  const muon_comm_t& t_;
  const ConformanceOptions& o_;
  int me_ = 0, n_ = 1;
};

}  // namespace

std::vector<std::string> RunConformance(const muon_comm_t& table,
                                        const ConformanceOptions& options,
                                        std::vector<std::string>* skipped) {
  Checker c(table, options);
  if (c.Fields()) {
    c.AllGather();
    c.AllToAllV();
    c.Broadcast();
    c.ReduceScatter();
    c.Barrier();
    c.Errors();
  }
  if (skipped != nullptr) *skipped = c.skipped;
  return c.failures;
}

}  // namespace muon
