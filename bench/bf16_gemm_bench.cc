// The three products of one Newton-Schulz iteration (the gram X X^T, the
// polynomial A A, the update), each way this machine can multiply them, side
// by side in one run: libmuon's AMX kernel, libmuon's AVX512-BF16 kernel,
// oneDNN's matmul (the oneDNN linked here, Debian's 2.6, as libmuon runs it
// with MUON_CPU_BF16=onednn; ONEDNN_MAX_CPU_ISA caps it), and OpenBLAS's fp32
// products on the same values (what the emulated bf16 path multiplies with:
// SSYRK for the symmetric ones, SGEMM; OPENBLAS_CORETYPE picks its kernel).
// Prints the minimum of --reps calls (after one untimed call) in ms and
// GFLOP/s counting 2 m n k; an engine the CPU cannot run is printed as such.
// torch's own bf16 products (its bundled oneDNN 3.x) on the same shapes:
// bench/cpu_bench.py --products.
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
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/cpu/native_bf16.h"
#include "muon/math/ns_program.h"

namespace {

using muon::NsGemm;
using Engine = muon::cpu::Bf16Engine;

double Seconds(const std::function<bool()>& f, int reps) {
  if (!f()) return -1;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}

std::string Cell(double t, double flops) {
  if (t < 0) return "(failed)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f ms, %.0f GFLOP/s", t * 1e3, flops / t / 1e9);
  return buf;
}

// The product on fp32 buffers, as the emulated path runs it (column-major).
void OpenBlas(const NsGemm& g, float* const* b) {
  const float* a = b[static_cast<int>(g.a.buffer)];
  const float* bb = b[static_cast<int>(g.b.buffer)];
  float* d = b[static_cast<int>(g.d.buffer)];
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  if (g.symmetric) {
    cblas_ssyrk(CblasColMajor, CblasUpper, g.trans_a ? CblasTrans : CblasNoTrans, m, k, 1.0f, a,
                static_cast<int>(g.a.ld), 0.0f, d, static_cast<int>(g.d.ld));
  } else {
    cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, static_cast<int>(g.a.ld),
                bb, static_cast<int>(g.b.ld), 0.0f, d, static_cast<int>(g.d.ld));
  }
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
  std::printf("| matrix | product (m x n x k) | libmuon AMX | libmuon AVX512-BF16 | oneDNN 2.6 matmul | "
              "OpenBLAS fp32 |\n|---|---|---|---|---|---|\n");
  const int64_t shapes[][2] = {{1024, 1024}, {2048, 2048}, {1024, 4096}};
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 0.03f);
  for (const auto& shape : shapes) {
    const muon::NsProgram program = muon::PlanNewtonSchulz(1, shape[0], shape[1]);
    std::vector<std::vector<uint16_t>> bufs = {
        std::vector<uint16_t>(program.x_elems), std::vector<uint16_t>(program.x_elems),
        std::vector<uint16_t>(program.gram_elems), std::vector<uint16_t>(program.gram_elems)};
    std::vector<std::vector<float>> fbufs(4);
    for (int b = 0; b < 4; ++b) {
      for (auto& v : bufs[b]) v = muon::ew::FloatToBf16Bits(normal(rng));
      if (b >= 2) {  // gram and poly symmetric
        for (int64_t j = 0; j < program.m; ++j) {
          for (int64_t i = 0; i < j; ++i) bufs[b][i * program.m + j] = bufs[b][j * program.m + i];
        }
      }
      fbufs[b].resize(bufs[b].size());
      for (size_t i = 0; i < bufs[b].size(); ++i) fbufs[b][i] = muon::ew::Bf16BitsToFloat(bufs[b][i]);
    }
    uint16_t* ptrs[4] = {bufs[0].data(), bufs[1].data(), bufs[2].data(), bufs[3].data()};
    float* fptrs[4] = {fbufs[0].data(), fbufs[1].data(), fbufs[2].data(), fbufs[3].data()};
    for (const NsGemm& g : program.iteration) {
      const double flops = 2.0 * g.m * g.n * g.k;
      std::string cells[4];
      int c = 0;
      for (Engine e : {Engine::kAmx, Engine::kAvx512Bf16, Engine::kOneDnn}) {
        auto gemm = muon::NativeBf16Gemm::Create({}, e);
        if (gemm == nullptr) {
          cells[c++] = "(not on this CPU)";
          continue;
        }
        const float alpha = 1.0f, beta = g.beta == muon::NsScalar::kZero ? 0.0f : 0.5f;
        if (!gemm->Prepare(g, alpha, beta).ok()) {
          cells[c++] = "(failed)";
          continue;
        }
        cells[c++] = Cell(Seconds([&] { return gemm->Run(g, alpha, beta, ptrs).ok(); }, reps), flops);
      }
      cells[c++] = Cell(Seconds([&] { OpenBlas(g, fptrs); return true; }, reps), flops) +
                   (g.symmetric ? " (SSYRK)" : "");
      std::printf("| %lldx%lld | %s %lld x %lld x %lld | %s | %s | %s | %s |\n",
                  static_cast<long long>(shape[0]), static_cast<long long>(shape[1]), g.name,
                  static_cast<long long>(g.m), static_cast<long long>(g.n),
                  static_cast<long long>(g.k), cells[0].c_str(), cells[1].c_str(),
                  cells[2].c_str(), cells[3].c_str());
    }
  }
  std::printf("\nGFLOP/s count 2 m n k for every product; the symmetric ones (gram, polynomial)"
              " compute about half of that where only their upper part is computed.\n");
  return 0;
}
