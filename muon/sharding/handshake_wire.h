// The handshake's byte encoding (handshake.cc), in host byte order (every
// rank of a job shares it): a writer and a reader of fixed-size values,
// strings and int64 lists, and the parameter tables and member lists as
// they travel.
#ifndef MUON_SHARDING_HANDSHAKE_WIRE_H_
#define MUON_SHARDING_HANDSHAKE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "muon/sharding/plan.h"

namespace muon {
namespace wire {

// Appends values to a byte string, which Take hands over.
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

// Reads values from `b` (which outlives it) in order; a read past its end
// reads nothing and returns false.
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

// A parameter table. `ranges`: with each FlatRange's start and length (the one
// field differing between ranks of one table; the compact handshake sends them apart).
void PutParams(Out& o, const std::vector<RankParamDesc>& params, bool ranges);
// Appends the table read from `in` to *params; false when it does not parse.
bool GetParams(In& in, std::vector<RankParamDesc>* params, bool ranges);

// A group's member list (world ranks, in group-rank order).
void PutMembers(Out& o, const std::vector<int>& g);
bool GetMembers(In& in, std::vector<int>* g);

}  // namespace wire
}  // namespace muon

#endif  // MUON_SHARDING_HANDSHAKE_WIRE_H_
