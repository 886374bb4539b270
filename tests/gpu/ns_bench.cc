// Times libmuon's CUDA Newton-Schulz (CudaBackend::Orthogonalize: cast,
// norm, 5 iterations of strided-batched cuBLAS GEMMs, cast back) on batches
// of same-shape matrices. Used by bench_gpu.py, which times torch in the same
// run and prints the table.
//
//   ns_bench [--fp32] [--gram] [--tiles T] [--iters N] COUNTxROWSxCOLS ...
// (--gram: Gram Newton-Schulz, restarting at iteration 2, its default;
// --tiles: CudaBackend::SetSymmetricTiles(T), 1 for whole products)
// prints one line per argument: "ns COUNT ROWS COLS MS" (mean ms per call).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "muon/math/cuda/cuda_backend.h"

namespace {

int Fail(const char* what, const char* detail) {
  std::fprintf(stderr, "ns_bench: %s: %s\n", what, detail);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  muon::NsConfig config;  // torch's defaults: 5 steps, bf16
  int iters = 10;
  int tiles = 0;
  std::vector<const char*> specs;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fp32") == 0) {
      config.dtype = muon::NsDtype::kFP32;
    } else if (std::strcmp(argv[i], "--gram") == 0) {
      config.algorithm = muon::NsAlgorithm::kGram;
    } else if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) {
      tiles = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      specs.push_back(argv[i]);
    }
  }
  auto backend = muon::CudaBackend::Create();
  if (!backend.ok()) return Fail("no GPU", std::string(backend.status().message()).c_str());
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (auto st = (*backend)->SetStream(stream); !st.ok()) return Fail("stream", st.ToString().c_str());
  (*backend)->SetSymmetricTiles(tiles);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (const char* spec : specs) {
    long long count = 0, rows = 0, cols = 0;
    if (std::sscanf(spec, "%lldx%lldx%lld", &count, &rows, &cols) != 3) {
      return Fail("bad spec (want COUNTxROWSxCOLS)", spec);
    }
    const size_t n = static_cast<size_t>(count * rows * cols);
    std::vector<float> host(static_cast<size_t>(rows * cols));
    for (float& v : host) v = normal(rng);
    float* data = nullptr;
    if (cudaMalloc(&data, n * sizeof(float)) != cudaSuccess) return Fail("cudaMalloc", spec);
    for (long long k = 0; k < count; ++k) {  // the same random matrix, count times
      cudaMemcpy(data + k * rows * cols, host.data(), host.size() * sizeof(float),
                 cudaMemcpyHostToDevice);
    }
    const muon::MatrixBatch batch{data, count, rows, cols};
    if (auto st = (*backend)->Reserve(config, count, rows, cols); !st.ok()) {
      return Fail("reserve", st.ToString().c_str());
    }
    for (int w = 0; w < 3; ++w) {
      if (auto st = (*backend)->Orthogonalize(config, batch); !st.ok()) {
        return Fail("orthogonalize", st.ToString().c_str());
      }
    }
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, stream);
    for (int it = 0; it < iters; ++it) (void)(*backend)->Orthogonalize(config, batch);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return Fail("CUDA", cudaGetErrorString(e));
    std::printf("ns %lld %lld %lld %.4f\n", count, rows, cols, ms / iters);
    std::fflush(stdout);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(data);
  }
  return 0;
}
