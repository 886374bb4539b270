#include "muon/comm/testing/conformance.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi/codes.h"
#include "muon/comm/testing/pattern.h"

namespace muon {
namespace {

constexpr unsigned char kUntouched = 0xEE;

using pattern::Byte;
using pattern::Mix;

// The element types of reduce_scatter, converted here without the library's
// own dtype code: bf16 by round to nearest even on the bits, fp16 by the
// compiler's _Float16 (also round to nearest even), so that a rounding bug
// shared by the adapters and the core cannot pass.
enum class Elem { kF32, kBF16, kF16 };

const char* ElemName(Elem e) {
  return e == Elem::kF32 ? "float32" : e == Elem::kBF16 ? "bfloat16" : "float16";
}

size_t ElemSize(Elem e) { return e == Elem::kF32 ? 4 : 2; }

int32_t ElemCode(Elem e) {
  return e == Elem::kF32 ? MUON_DTYPE_FLOAT32 : e == Elem::kBF16 ? MUON_DTYPE_BFLOAT16
                                                                 : MUON_DTYPE_FLOAT16;
}

uint16_t Bf16Of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // finite values only
}

float FloatOfBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void Store(Elem e, unsigned char* base, size_t i, float v) {
  if (e == Elem::kF32) {
    std::memcpy(base + 4 * i, &v, 4);
  } else if (e == Elem::kBF16) {
    const uint16_t h = Bf16Of(v);
    std::memcpy(base + 2 * i, &h, 2);
  } else {
    const _Float16 h = static_cast<_Float16>(v);
    std::memcpy(base + 2 * i, &h, 2);
  }
}

float Load(Elem e, const unsigned char* base, size_t i) {
  if (e == Elem::kF32) {
    float v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, base + 2 * i, 2);
  if (e == Elem::kBF16) return FloatOfBf16(h);
  _Float16 f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
}

float Round(Elem e, float v) {
  unsigned char b[4];
  Store(e, b, 0, v);
  return Load(e, b, 0);
}

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
        if (ranks[r] != r) Fail("fields", "position " + std::to_string(r) + " holds rank " +
                                              std::to_string(ranks[r]));
      }
    }
    return true;
  }

  void AllGather() {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, (size_t{1} << 20) + 13}) {
      const std::string check = "all_gather of " + std::to_string(bytes) + " bytes";
      std::vector<unsigned char> send(bytes + 1), recv(n_ * bytes + 1, kUntouched);
      for (size_t k = 0; k < bytes; ++k) send[k] = Byte(me_, 0, 1, k + bytes);
      if (!Called(t_.all_gather(t_.ctx, send.data(), recv.data(), bytes, o_.stream), check)) {
        continue;
      }
      ExpectBlocks(check, recv, bytes, [&](int r, size_t k) { return Byte(r, 0, 1, k + bytes); });
    }
    // In place: this rank's block already sits in the receive buffer.
    const size_t bytes = 33;
    std::vector<unsigned char> recv(n_ * bytes + 1, kUntouched);
    for (size_t k = 0; k < bytes; ++k) recv[me_ * bytes + k] = Byte(me_, 0, 2, k);
    if (Called(t_.all_gather(t_.ctx, recv.data() + me_ * bytes, recv.data(), bytes, o_.stream),
               "all_gather in place")) {
      ExpectBlocks("all_gather in place", recv, bytes, [](int r, size_t k) { return Byte(r, 0, 2, k); });
    }
  }

  void AllToAllV() {
    for (bool ragged : {false, true}) {
      const std::string check = ragged ? "all_to_all_v, ragged" : "all_to_all_v, no traffic";
      auto count = [&](int from, int to) -> size_t {
        return ragged ? (from * 7 + to * 3 + 1) % 5 * 11 : 0;
      };
      std::vector<size_t> sb(n_), so(n_), rb(n_), ro(n_);
      size_t send_end = 0, recv_end = 0;
      for (int p = 0; p < n_; ++p) {
        so[p] = send_end;
        sb[p] = count(me_, p);
        send_end += sb[p] + 3;  // gaps between the blocks
        ro[p] = recv_end;
        rb[p] = count(p, me_);
        recv_end += rb[p] + 5;
      }
      std::vector<unsigned char> send(send_end + 1, 0x11), recv(recv_end + 1, kUntouched);
      for (int p = 0; p < n_; ++p) {
        for (size_t k = 0; k < sb[p]; ++k) send[so[p] + k] = Byte(me_, p, 3, k);
      }
      if (!Called(t_.all_to_all_v(t_.ctx, send.data(), sb.data(), so.data(), recv.data(),
                                  rb.data(), ro.data(), o_.stream),
                  check)) {
        continue;
      }
      std::vector<unsigned char> want(recv.size(), kUntouched);
      for (int p = 0; p < n_; ++p) {
        for (size_t k = 0; k < rb[p]; ++k) want[ro[p] + k] = Byte(p, me_, 3, k);
      }
      ExpectBytes(check, recv, want);
    }
  }

  void Broadcast() {
    if (t_.broadcast == nullptr) {
      skipped.push_back("broadcast (NULL)");
      return;
    }
    for (int root = 0; root < n_; ++root) {
      const std::string check = "broadcast from root " + std::to_string(root);
      const size_t bytes = 1000 + root;
      std::vector<unsigned char> buf(bytes + 1, kUntouched), want(bytes + 1, kUntouched);
      for (size_t k = 0; k < bytes; ++k) want[k] = Byte(root, 0, 4, k);
      if (me_ == root) buf = want;
      if (Called(t_.broadcast(t_.ctx, buf.data(), bytes, root, o_.stream), check)) {
        ExpectBytes(check, buf, want);
      }
    }
    unsigned char byte = kUntouched;
    if (Called(t_.broadcast(t_.ctx, &byte, 0, 0, o_.stream), "broadcast of 0 bytes") &&
        byte != kUntouched) {
      Fail("broadcast of 0 bytes", "wrote a byte");
    }
  }

  void ReduceScatter() {
    for (Elem dtype : {Elem::kF32, Elem::kBF16, Elem::kF16}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{2053}}) {
        ReduceScatterOf(dtype, count);
      }
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
    unsigned char send[8] = {}, recv[8] = {};
    if (t_.reduce_scatter(t_.ctx, send, recv, 1, 7, o_.stream) == MUON_OK) {
      Fail("errors", "reduce_scatter accepted dtype 7");
    }
    if (t_.broadcast != nullptr) {
      for (int root : {-1, n_}) {
        if (t_.broadcast(t_.ctx, send, 4, root, o_.stream) == MUON_OK) {
          Fail("errors", "broadcast accepted root " + std::to_string(root));
        }
      }
    }
    std::vector<unsigned char> out(n_ * 4 + 1, kUntouched);
    for (size_t k = 0; k < 4; ++k) send[k] = Byte(me_, 0, 6, k);
    if (Called(t_.all_gather(t_.ctx, send, out.data(), 4, o_.stream), "errors (usable after)")) {
      ExpectBlocks("errors (usable after)", out, 4, [](int r, size_t k) { return Byte(r, 0, 6, k); });
    }
  }

 private:
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
  void ExpectBlocks(const std::string& check, const std::vector<unsigned char>& recv, size_t bytes,
                    Want want) {
    std::vector<unsigned char> expected(recv.size(), kUntouched);
    for (int r = 0; r < n_; ++r) {
      for (size_t k = 0; k < bytes; ++k) expected[r * bytes + k] = want(r, k);
    }
    ExpectBytes(check, recv, expected);
  }

  void ExpectBytes(const std::string& check, const std::vector<unsigned char>& got,
                   const std::vector<unsigned char>& want) {
    for (size_t k = 0; k < got.size(); ++k) {
      if (got[k] != want[k]) {
        Fail(check, "byte " + std::to_string(k) + " is " + std::to_string(got[k]) +
                        ", expected " + std::to_string(want[k]));
        return;
      }
    }
  }

  // Element i of block b that rank `from` contributes, as stored in `dtype`.
  static float Element(Elem dtype, int from, int b, size_t i) {
    const float v = static_cast<float>(static_cast<int>(Mix(from, b, 7, i) % 2001) - 1000) / 64.0f;
    return Round(dtype, v * (1.0f + 1.0f / 3.0f));
  }

  void ReduceScatterOf(Elem dtype, size_t count) {
    const std::string check = std::string("reduce_scatter of ") + std::to_string(count) + " " +
                              ElemName(dtype);
    const size_t elem = ElemSize(dtype);
    std::vector<unsigned char> send(n_ * count * elem + 1), recv(count * elem + 1, kUntouched);
    for (int b = 0; b < n_; ++b) {
      for (size_t i = 0; i < count; ++i) {
        Store(dtype, send.data(), b * count + i, Element(dtype, me_, b, i));
      }
    }
    if (!Called(t_.reduce_scatter(t_.ctx, send.data(), recv.data(), count, ElemCode(dtype),
                                  o_.stream),
                check)) {
      return;
    }
    if (recv[count * elem] != kUntouched) Fail(check, "wrote past the block");
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      double magnitude = 0.0;
      for (int r = 0; r < n_; ++r) {
        sum += Element(dtype, r, me_, i);
        magnitude += std::fabs(Element(dtype, r, me_, i));
      }
      const float want = Round(dtype, sum);
      const float got = Load(dtype, recv.data(), i);
      const double tolerance = (dtype == Elem::kF32 ? 1e-6 : 1e-2) * magnitude;
      const bool ok = o_.exact_sums ? std::memcmp(&got, &want, 4) == 0
                                    : std::fabs(double(got) - double(want)) <= tolerance;
      if (!ok) {
        Fail(check, "element " + std::to_string(i) + " is " + std::to_string(got) +
                        ", the rank-order sum " + std::to_string(want));
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
