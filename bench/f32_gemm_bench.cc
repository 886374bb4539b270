// The three fp32 products of one Newton-Schulz iteration (the gram W W^T,
// the polynomial c A A + b A + a I, the update P W), as the CPU backend runs
// them (muon/math/cpu/f32_products.h), on each fp32 engine side by side in
// one run: libmuon's AVX-512 kernel and OpenBLAS in fixed tiles
// (OPENBLAS_CORETYPE picks its kernel). Prints the minimum of --reps calls
// (after one untimed call) in ms and GFLOP/s counting the work done: m^2 n
// for the gram and m^3 for the polynomial (symmetric: one triangle), 2 m^2 n
// for the update; and the fraction of --peak (GFLOP/s per thread, measured
// with a loop of independent FMAs, when given). numpy's products on the same
// shapes: bench/cpu_bench.py.
//
//   OMP_NUM_THREADS=1 bazel run -c opt //bench:f32_gemm_bench -- --reps=5
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "muon/math/backend.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/cpu/f32_products.h"
#include "muon/math/ns_program.h"

namespace {

double Seconds(const std::function<void()>& f, int reps) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    f();
    const auto elapsed = std::chrono::steady_clock::now() - t;
    best = std::min(best, std::chrono::duration<double>(elapsed).count());
  }
  return best;
}

muon::MemorySource Heap() {
  muon::MemorySource source;
  source.allocate = [](size_t bytes, const std::string&) -> absl::StatusOr<void*> {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  };
  source.free = [](void* p) { std::free(p); };
  return source;
}

struct Cell {
  double ms, gflops;
};

// The three products of `program` on `engine` ("avx512" or "openblas").
std::vector<Cell> Measure(const muon::NsProgram& program, const char* engine, int threads,
                          int reps) {
  setenv("MUON_CPU_FP32", engine, 1);
  const muon::MemorySource source = Heap();
  muon::Fp32Products products(&source);
  if (!products.Choose(threads).ok() || !products.Reserve(program).ok()) return {};
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.03f);
  std::vector<float> x(program.x_elems), out(program.x_elems), gram(program.gram_elems),
      poly(program.gram_elems);
  for (float& v : x) v = normal(rng);
  products.Gram(program, x.data(), gram.data());
  const double m = static_cast<double>(program.m), n = static_cast<double>(program.n);
  const double work[3] = {m * m * n, m * m * m, 2 * m * m * n};
  const std::function<void()> runs[3] = {
      [&] { products.Gram(program, x.data(), gram.data()); },
      [&] { products.Polynomial(program.m, gram.data(), 3.4445f, -4.775f, 2.0315f, poly.data()); },
      [&] { products.TimesW(program, poly.data(), x.data(), out.data()); }};
  std::vector<Cell> cells;
  for (int i = 0; i < 3; ++i) {
    const double t = Seconds(runs[i], reps);
    cells.push_back({t * 1e3, work[i] / t / 1e9});
  }
  return cells;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  double peak = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--peak=", 7) == 0) peak = std::atof(argv[i] + 7);
  }
  const int threads = omp_get_max_threads();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("CPU: %s, features %s; %d threads; OPENBLAS_CORETYPE=%s\n\n",
              muon::cpu::CpuVendor().c_str(),
              muon::cpu::FeatureNames(muon::cpu::Features()).c_str(), threads,
              coretype ? coretype : "(unset)");
  std::printf("| W | product | libmuon AVX-512 kernel | OpenBLAS (tiles) | kernel / OpenBLAS |\n"
              "|---|---|---|---|---|\n");
  const int64_t shapes[][2] = {{256, 256}, {1024, 1024}, {2048, 2048}, {1024, 4096}, {4096, 1024}};
  const char* names[3] = {"gram", "polynomial", "update"};
  for (const auto& shape : shapes) {
    const muon::NsProgram program = muon::PlanNewtonSchulz(1, shape[0], shape[1]);
    const std::vector<Cell> kernel = Measure(program, "avx512", threads, reps);
    const std::vector<Cell> blas = Measure(program, "openblas", threads, reps);
    for (int i = 0; i < 3; ++i) {
      char k[96] = "(not on this CPU)", b[96] = "(failed)", ratio[32] = "";
      if (!kernel.empty()) {
        std::snprintf(k, sizeof k, "%.2f ms, %.0f GFLOP/s", kernel[i].ms, kernel[i].gflops);
        if (peak > 0) {
          std::snprintf(k + std::strlen(k), sizeof k - std::strlen(k), " (%.0f%%)",
                        100 * kernel[i].gflops / (peak * threads));
        }
      }
      if (!blas.empty()) {
        std::snprintf(b, sizeof b, "%.2f ms, %.0f GFLOP/s", blas[i].ms, blas[i].gflops);
      }
      if (!kernel.empty() && !blas.empty()) {
        std::snprintf(ratio, sizeof ratio, "%.2fx", blas[i].ms / kernel[i].ms);
      }
      std::printf("| %lldx%lld | %s | %s | %s | %s |\n", static_cast<long long>(shape[0]),
                  static_cast<long long>(shape[1]), names[i], k, b, ratio);
    }
  }
  return 0;
}
