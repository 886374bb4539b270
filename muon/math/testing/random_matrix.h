// Test inputs: n values drawn from N(0, 1) by std::mt19937 seeded with
// `seed`, the same values on every platform's libstdc++ run.
#ifndef MUON_MATH_TESTING_RANDOM_MATRIX_H_
#define MUON_MATH_TESTING_RANDOM_MATRIX_H_

#include <cstdint>
#include <random>
#include <vector>

namespace muon {

inline std::vector<float> RandomNormal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace muon

#endif  // MUON_MATH_TESTING_RANDOM_MATRIX_H_
