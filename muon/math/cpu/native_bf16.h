// Native bf16 matrix products for the CPU backend's bf16 Newton-Schulz: bf16
// operands, fp32 accumulation, one rounding of alpha * A B + beta * C to bf16,
// which is what the emulated path computes with fp32 GEMMs and rounding, up to
// the order of the fp32 sums. Three engines (cpu_features.h chooses): libmuon's
// own kernels (bf16_gemm.h) on AMX tiles or on AVX512-BF16, and oneDNN's
// matmul on request only (MUON_CPU_BF16=onednn): oneDNN 2.x multiplies a
// 1024^3 product 1.4x slower than the AMX kernel (BENCHMARKS.md).
//
// One instance per backend (per rank); not thread-safe. Products run on the
// calling thread's OpenMP threads (omp_get_max_threads()).
#ifndef MUON_MATH_CPU_NATIVE_BF16_H_
#define MUON_MATH_CPU_NATIVE_BF16_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muon/math/backend.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/ns_program.h"

namespace muon {

class NativeBf16Gemm {
 public:
  using Engine = cpu::Bf16Engine;
  // The products on `engine`, or nullptr when it is kEmulated, when this CPU
  // (cpu::Features(), the mask included) cannot run it, or when oneDNN
  // cannot start. Working memory (oneDNN's scratchpad, the kernels' packed
  // operands) comes from `source` (operator new when it is empty).
  static std::unique_ptr<NativeBf16Gemm> Create(MemorySource source, Engine engine);
  Engine engine() const;
  // "amx", "avx512_bf16" or "onednn": the engine this instance runs.
  const char* EngineName() const;
  // Whether a product's result is the same for every thread count: libmuon's
  // kernels' (each output block sums in one order), not oneDNN's.
  bool ResultsIndependentOfThreads() const;
  // Whether the wide program (a tall matrix transposed first) runs faster
  // than the tall one: oneDNN's yes, libmuon's kernels' no.
  bool PrefersWide() const;
  ~NativeBf16Gemm();

  // Runs one product of a Newton-Schulz program (count 1) on bf16 buffers
  // (`buffers` indexed by NsBuffer): D = alpha op(A) op(B) + beta C, D
  // rounded to bf16. D starts as C when beta is not zero (copied here). The
  // gram and poly buffers must hold symmetric matrices (both triangles): they
  // are read untransposed whatever the product says. A symmetric product
  // (g.symmetric) at least 768 wide multiplies only the blocks of D on and
  // above the diagonal (about 512 wide) and mirrors the others: 25% fewer
  // products at 1024, 37% at 2048, 44% at 4096; D is then exactly symmetric.
  absl::Status Run(const NsGemm& g, float alpha, float beta, uint16_t* const* buffers);
  // Builds what Run(g, alpha, beta, ...) needs (the primitive, the
  // scratchpad) so that it allocates nothing.
  absl::Status Prepare(const NsGemm& g, float alpha, float beta);

  struct Key;
  struct Entry;

 private:
  struct Impl;
  static Key WholeKey(const NsGemm& g, float alpha, float beta);
  static int64_t SymmetricBlock(const NsGemm& g);
  static Key BlockKey(const NsGemm& g, int64_t rows, int64_t cols, float alpha, float beta);
  absl::StatusOr<Entry*> Find(const NsGemm& g, const Key& key);
  absl::Status RunKernel(const NsGemm& g, float alpha, float beta, uint16_t* const* buffers);
  // D = alpha op(A) op(B) + beta D for the geometry `key`, at these addresses.
  absl::Status Execute(const NsGemm& g, const Key& key, const uint16_t* a, const uint16_t* b,
                       uint16_t* d);
  explicit NativeBf16Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace muon

#endif  // MUON_MATH_CPU_NATIVE_BF16_H_
