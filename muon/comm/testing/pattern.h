// Test data for communicator tests: bytes that depend on the sender, the
// receiver, a round and the position, so that any mix-up shows.
#ifndef MUON_COMM_TESTING_PATTERN_H_
#define MUON_COMM_TESTING_PATTERN_H_

#include <cstddef>
#include <cstdint>

namespace muon {
namespace pattern {

inline uint32_t Mix(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  uint32_t h = 2166136261u;
  for (uint32_t v : {a, b, c, d}) {
    h = (h ^ v) * 16777619u;
    h ^= h >> 13;
  }
  return h;
}

// Byte k of what rank `from` sends to `to` in round (or check) `round`.
inline unsigned char Byte(int from, int to, int round, size_t k) {
  return static_cast<unsigned char>(Mix(from, to, round, static_cast<uint32_t>(k)) & 0xff);
}

// Bytes `from` sends to `to` in round `round` of an all_to_all_v (often 0).
inline size_t PairBytes(int from, int to, int round) {
  const uint32_t h = Mix(from + 100, to + 200, round, 7);
  return h % 3 == 0 ? 0 : h % 41;
}

}  // namespace pattern
}  // namespace muon

#endif  // MUON_COMM_TESTING_PATTERN_H_
