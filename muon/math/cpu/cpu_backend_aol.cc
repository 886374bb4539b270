// CpuBackend's AOL pre-scaling (cpu/aol.h) of a whole matrix in its
// workspace, in fp32 or bf16 (a split matrix's block scales at its first
// gram: OrthogonalizeBlock).
#include "muon/math/cpu/aol.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cpu/cpu_kernels.h"

namespace muon {

float* CpuBackend::AolPrescale(const NsConfig& config, const NsProgram& program, int64_t rows,
                               int64_t cols, float* x) {
  // After the program's X' (m x n) and gram (m x m): what every path copies
  // its first gram from before it writes anything there.
  float* gram = work_ + program.x_elems + program.gram_elems;
  // bf16 starts from the bf16 input (as torch's bf16 Newton-Schulz, and as a
  // bf16 slot holds it); fp16 from the fp32 values (whose range fp16 may
  // not hold), as its Frobenius division does.
  if (config.dtype == NsDtype::kBF16) cpu::RoundToBf16(x, program.x_elems);
  products_.Gram(program, x, gram);
  cpu::AolScale(x, rows, cols, rows > cols, config.eps, RoundType(config), gram,
                aol_scales_.data());
  return gram;
}

float* CpuBackend::AolPrescaleBf16(const NsConfig& config, const NsProgram& program,
                                   int64_t rows, int64_t cols, uint16_t* x) {
  const int64_t elems = program.x_elems;
  float* copy = work_ + elems + 2 * program.gram_elems;  // after AolPrescale's gram
  cpu::FromBf16(x, elems, copy);
  float* gram = AolPrescale(config, program, rows, cols, copy);
  cpu::ToBf16(copy, elems, x);  // exact: AolPrescale rounded to bf16
  return gram;
}

}  // namespace muon
