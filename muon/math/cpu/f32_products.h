// The CPU backend's fp32 matrix products, on the engine
// cpu::ChooseFp32Engine picks (cpu_features.h): libmuon's AVX-512 kernel
// (f32_gemm.h), or OpenBLAS (SGEMM, SSYRK, SSYMM). They serve the fp32
// Newton-Schulz (Gram, Polynomial, TimesW: the three products of an
// iteration) and the emulated bf16 and fp16 programs (Run: one NsGemm, its
// result rounded by the caller). Buffers are column-major, as CBLAS reads
// them.
//
// Either engine's results do not depend on the thread count (OpenBLAS's
// calls run in fixed tiles: blas_tiles.h). The engines
// differ in the order of the fp32 sums (and the kernel fuses beta C into
// its epilogue), so their results differ by fp32 rounding, never more.
//
// One instance per backend (per rank); not thread-safe. Products run on the
// threads Choose was given.
#ifndef MUON_MATH_CPU_F32_PRODUCTS_H_
#define MUON_MATH_CPU_F32_PRODUCTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "muon/math/backend.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/cpu/f32_gemm.h"
#include "muon/math/cpu/growing_block.h"
#include "muon/math/ns_program.h"

namespace muon {

class Fp32Products {
 public:
  // Working memory from `source` (kept by the caller, outliving this).
  explicit Fp32Products(const MemorySource* source)
      : workspace_(source, "the fp32 products' packed operands") {}

  // Picks the engine (Features(), MUON_CPU_FP32) and the
  // threads products run on. Fails, naming the setting, when MUON_CPU_FP32
  // names no engine this CPU runs; the engine is then OpenBLAS.
  absl::Status Choose(int threads);
  cpu::Fp32Engine engine() const { return engine_; }
  // The products run so far, on either engine (Polynomial with c = 0 runs
  // none).
  int64_t products_run() const { return products_run_; }

  // Sizes the kernel's working memory for the products of `program` so that
  // they allocate nothing; nothing on OpenBLAS. Fails with ResourceExhausted
  // when memory is short.
  absl::Status Reserve(const NsProgram& program);

  // One product of a program: D = alpha op(A) op(B) + beta C (C read only
  // when beta != 0; it may be D itself). A symmetric product (Y Y^T, Y =
  // op(A)) leaves both triangles of D.
  void Run(const NsGemm& g, float alpha, float beta, const float* a, const float* b,
           const float* c, float* d);
  // gram (m x m, both triangles) = W W^T of the program's X as stored.
  void Gram(const NsProgram& program, const float* x, float* gram);
  // poly = c gram gram + b gram + a I (m x m), gram symmetric (both
  // triangles); at least the upper triangle, all of it where TimesW reads it.
  void Polynomial(int64_t m, const float* gram, float a, float b, float c, float* poly);
  // out = poly W in the program's orientation (X' as stored), poly from
  // Polynomial.
  void TimesW(const NsProgram& program, const float* poly, const float* x, float* out);

 private:
  // Runs `p` on the kernel; false (nothing done) when its working memory
  // cannot be had: the caller runs OpenBLAS instead.
  bool Kernel(const cpu::F32Product& p);

  GrowingBlock workspace_;
  cpu::Fp32Engine engine_ = cpu::Fp32Engine::kOpenBlas;
  int threads_ = 1;
  int64_t products_run_ = 0;
};

}  // namespace muon

#endif  // MUON_MATH_CPU_F32_PRODUCTS_H_
