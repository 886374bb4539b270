// What the GPU backend's tests share: a backend or a skip (a failure under
// MUON_REQUIRE_GPU=1), device copies of host vectors, the relative error.
#ifndef MUON_MATH_CUDA_CUDA_TEST_UTIL_H_
#define MUON_MATH_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/cuda/cuda_backend.h"

namespace muon {
namespace cuda_test {

inline std::unique_ptr<CudaBackend> MakeOrSkip(std::string* why) {
  auto b = CudaBackend::Create();
  if (!b.ok()) {
    *why = std::string(b.status().message());
    return nullptr;
  }
  return std::move(b).value();
}

// Skips where no GPU is, unless MUON_REQUIRE_GPU=1 (tests/gpu/run_on_gpu.sh):
// then that is a failure, so that a run where nothing ran is never green.
inline bool GpuRequired() {
  const char* v = std::getenv("MUON_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

#define REQUIRE_GPU(var)                                                         \
  std::string why_;                                                              \
  auto var = ::muon::cuda_test::MakeOrSkip(&why_);                               \
  if (var == nullptr && ::muon::cuda_test::GpuRequired()) {                      \
    FAIL() << "MUON_REQUIRE_GPU=1: " << why_;                                    \
  }                                                                              \
  if (var == nullptr) GTEST_SKIP() << "no GPU to test on: " << why_;

template <typename T>
struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Get() const {
    std::vector<T> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  ~Device() { cudaFree(p); }
};

inline double MaxRel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(double(b[i])));
    e = std::max(e, std::fabs(double(a[i]) - b[i]));
  }
  return e / m;
}

}  // namespace cuda_test
}  // namespace muon

#endif  // MUON_MATH_CUDA_CUDA_TEST_UTIL_H_
