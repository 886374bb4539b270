// One bf16 product (bf16 operands, fp32 sums), each way this machine can
// multiply it, side by side in one run: libmuon's AMX kernel, libmuon's
// AVX512-BF16 kernel, oneDNN's bf16 GEMM (dnnl_gemm_bf16bf16f32: the oneDNN
// linked here, Debian's; ONEDNN_MAX_CPU_ISA caps it), and OpenBLAS's fp32
// SGEMM on the same values widened (what the emulated bf16 path multiplies
// with; OPENBLAS_CORETYPE picks its kernel). Prints the minimum of --reps
// calls (after one untimed call) in ms and GFLOP/s; a way the CPU cannot run
// is printed as such. torch's own bf16 product (its bundled oneDNN 3.x) is
// timed by bench/cpu_bench.py --products on the same shapes.
//
//   OMP_NUM_THREADS=1 bazel run -c opt //bench:bf16_gemm_bench -- --reps=10
#include <cblas.h>
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

#include "muon/common/half.h"
#include "muon/math/cpu/bf16_gemm.h"
#include "muon/math/cpu/cpu_features.h"
#include "oneapi/dnnl/dnnl.h"

namespace {

using muon::cpu::Bf16Kernel;

struct Shape {
  int64_t m, n, k;
  bool symmetric;  // out = L L^T (only the upper part computed by libmuon's kernels)
  const char* what;
};

double Seconds(const std::function<void()>& f, int reps) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
  }
  const int threads = omp_get_max_threads();
  openblas_set_num_threads(threads);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* onednn_isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::printf("CPU: %s, features %s; %d threads; OPENBLAS_CORETYPE=%s ONEDNN_MAX_CPU_ISA=%s\n\n",
              muon::cpu::CpuVendor().c_str(),
              muon::cpu::FeatureNames(muon::cpu::Features()).c_str(), threads,
              coretype ? coretype : "(unset)", onednn_isa ? onednn_isa : "(unset)");
  const Shape shapes[] = {
      {1024, 1024, 1024, false, "1024^3"},
      {2048, 2048, 2048, false, "2048^3"},
      {1024, 1024, 4096, false, "1024 x 1024 x 4096 (W' = A X, wide)"},
      {1024, 1024, 4096, true, "X X^T, X 1024 x 4096 (symmetric)"},
      {2048, 2048, 2048, true, "A A, 2048 (symmetric)"},
  };
  std::printf("| product | libmuon AMX | libmuon AVX512-BF16 | oneDNN bf16 GEMM | OpenBLAS fp32 SGEMM |\n");
  std::printf("|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Shape& s : shapes) {
    std::vector<uint16_t> left(s.m * s.k), right(s.k * s.n), out(s.m * s.n);
    std::vector<float> left_f(left.size()), right_f(right.size()), out_f(out.size());
    for (size_t i = 0; i < left.size(); ++i) {
      left[i] = muon::ew::FloatToBf16Bits(normal(rng));
      left_f[i] = muon::ew::Bf16BitsToFloat(left[i]);
    }
    for (size_t i = 0; i < right.size(); ++i) {
      right[i] = muon::ew::FloatToBf16Bits(normal(rng));
      right_f[i] = muon::ew::Bf16BitsToFloat(right[i]);
    }
    // Symmetric: right is left transposed (read as such, no copy).
    muon::cpu::Bf16Product p;
    p.rows = s.m;
    p.cols = s.n;
    p.k = s.k;
    p.left = {left.data(), s.k, false};
    p.right = s.symmetric ? muon::cpu::Bf16Operand{left.data(), s.k, true}
                          : muon::cpu::Bf16Operand{right.data(), s.n, false};
    p.out = out.data();
    p.ld_out = s.n;
    p.symmetric = s.symmetric;
    std::vector<char> ws_storage(muon::cpu::Bf16WorkspaceBytes(p, threads) + 64);
    void* ws = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws_storage.data()) + 63) & ~uintptr_t{63});
    const double flops = 2.0 * s.m * s.n * s.k;
    std::string cells[4];
    int c = 0;
    for (Bf16Kernel kernel : {Bf16Kernel::kAmx, Bf16Kernel::kAvx512Bf16}) {
      if (!muon::cpu::Bf16KernelRuns(kernel)) {
        cells[c++] = "(not on this CPU)";
        continue;
      }
      const double t = Seconds([&] { muon::cpu::Bf16Multiply(kernel, p, ws, threads); }, reps);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f ms, %.0f GFLOP/s", t * 1e3, flops / t / 1e9);
      cells[c++] = buf;
    }
    {
      const char transb = s.symmetric ? 'T' : 'N';
      const auto* b = reinterpret_cast<const dnnl_bfloat16_t*>(s.symmetric ? left.data() : right.data());
      // Row-major out = L R: column-major out^T = R^T L^T.
      dnnl_status_t st = dnnl_success;
      const double t = Seconds(
          [&] {
            st = dnnl_gemm_bf16bf16f32(transb, 'N', s.n, s.m, s.k, 1.0f, b, s.symmetric ? s.k : s.n,
                                       reinterpret_cast<const dnnl_bfloat16_t*>(left.data()), s.k,
                                       0.0f, out_f.data(), s.n);
          },
          reps);
      char buf[64];
      if (st != dnnl_success) {
        std::snprintf(buf, sizeof buf, "(failed: status %d)", static_cast<int>(st));
      } else {
        std::snprintf(buf, sizeof buf, "%.2f ms, %.0f GFLOP/s", t * 1e3, flops / t / 1e9);
      }
      cells[c++] = buf;
    }
    {
      const double t = Seconds(
          [&] {
            if (s.symmetric) {
              cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, s.m, s.k, 1.0f, left_f.data(),
                          s.k, 0.0f, out_f.data(), s.n);
            } else {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f,
                          left_f.data(), s.k, right_f.data(), s.n, 0.0f, out_f.data(), s.n);
            }
          },
          reps);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f ms, %.0f GFLOP/s%s", t * 1e3, flops / t / 1e9,
                    s.symmetric ? " (SSYRK)" : "");
      cells[c++] = buf;
    }
    std::printf("| %s | %s | %s | %s | %s |\n", s.what, cells[0].c_str(), cells[1].c_str(),
                cells[2].c_str(), cells[3].c_str());
  }
  std::printf("\nGFLOP/s count 2 m n k for every product (a symmetric one's work is about half"
              " that where only its upper part is computed).\n");
  return 0;
}
