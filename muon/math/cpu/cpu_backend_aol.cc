// CpuBackend's AOL pre-scaling (cpu/aol.h) in its workspace: of a whole
// matrix in fp32 or bf16, and of one member's block of a split matrix.
#include <algorithm>
#include <new>

#include "muon/common/status.h"
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

absl::Status CpuBackend::AolPrescaleBlock(const NsConfig& config, const MatrixBlock& block,
                                          const NsProgram& program, float* const* buffers,
                                          const MemberSums& sums, int threads) {
  // The whole's W W^T, this block's share summed over the members, gives the
  // scales; scaled, it is the first iteration's gram.
  if (aol_scales_.size() < static_cast<size_t>(block.m)) {
    try {
      aol_scales_.resize(static_cast<size_t>(block.m));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("AOL's scales: out of host memory");
    }
  }
  float* const gram = buffers[static_cast<int>(NsBuffer::kGram)];
  {
    const cpu::CoreSlots slots(threads);
    RunGemm(program.iteration[0], config.ForIteration(0), buffers, ew::kF32);
  }
  MUON_RETURN_IF_ERROR(sums.f32(gram, program.gram_elems));
  const cpu::CoreSlots slots(threads);
  // Row-major, the block is m x width (W's rows) or, tall, width x m.
  cpu::AolScale(block.data, block.tall ? block.width : block.m, block.tall ? block.m : block.width,
                block.tall, config.eps, RoundType(config), gram, aol_scales_.data());
  return absl::OkStatus();
}

}  // namespace muon
