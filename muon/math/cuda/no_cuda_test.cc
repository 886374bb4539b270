// Stands in for the GPU backend test in builds without the CUDA toolkit.
#include "gtest/gtest.h"

TEST(CudaBackend, NotBuilt) {
  GTEST_SKIP() << "built without the CUDA toolkit (CUDA_PATH or /usr/local/cuda not found, or "
                  "MUON_CPU_ONLY=1): the GPU backend is not compiled";
}
