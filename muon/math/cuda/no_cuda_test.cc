// Stands in for the GPU backend test in builds without the CUDA toolkit.
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

TEST(CudaBackend, NotBuilt) {
  // MUON_REQUIRE_GPU=1 (tests/gpu/run_on_gpu.sh): a skip is a failure.
  const char* require = std::getenv("MUON_REQUIRE_GPU");
  if (require != nullptr && std::strcmp(require, "1") == 0) {
    FAIL() << "MUON_REQUIRE_GPU=1, but this build has no GPU backend";
  }
  GTEST_SKIP() << "built without the CUDA toolkit (CUDA_PATH or /usr/local/cuda not found, or "
                  "MUON_CPU_ONLY=1): the GPU backend is not compiled";
}
