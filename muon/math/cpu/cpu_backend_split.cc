// CpuBackend's part of a split matrix (MathBackend::OrthogonalizeBlock and
// NorMuonBlock): one member's block through the block program, summing with
// the other members where the whole matrix is needed. Each member computes
// on this rank's core slots and holds none while it waits in a sum (a sum
// waits on other ranks, which may need those cores).
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/cpu/aol.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/cpu/gram_ns.h"
#include "muon/math/normuon.h"
#include "muon/math/split_ns.h"

namespace muon {

absl::Status CpuBackend::OrthogonalizeBlock(const NsConfig& config, const MatrixBlock& block,
                                            const MemberSums& sums) {
  MUON_RETURN_IF_ERROR(CheckSplitBlock(block));
  const NsProgram program = PlanNewtonSchulzBlock(block.m, block.width, block.tall);
  const int64_t elems = program.x_elems, gram_elems = program.gram_elems;
  const bool gram_ns = config.algorithm == NsAlgorithm::kGram && block.m != block.n;
  MUON_RETURN_IF_ERROR(ReserveFloats(gram_ns ? cpu::GramWorkFloats(program)
                                             : static_cast<size_t>(elems + 2 * gram_elems)));
  const int threads = cpu::ThreadsPerRankHere();
  cpu::UseThreads(threads, cpu::NativeThreadsHere());
  // Every member chooses the fp32 products' engine here, as a whole matrix's
  // Newton-Schulz does (not left to whatever this backend ran last).
  MUON_RETURN_IF_ERROR(products_.Choose(threads));
  const bool bf16 = config.dtype == NsDtype::kBF16;
  const int round = RoundType(config);
  std::optional<cpu::CoreSlots> slots(std::in_place, threads);
  if (bf16) cpu::RoundToBf16(block.data, elems);
  if (config.aol) {  // scaled at the first gram instead of divided by the norm
    MUON_RETURN_IF_ERROR(ReserveAolScales(static_cast<size_t>(block.m)));
  } else {
    // The whole's norm: this block's squares (of its bf16 values when bf16),
    // summed over the members; then divided and rounded as Normalize does.
    double squares = cpu::SumSquares(block.data, elems);
    slots.reset();
    MUON_RETURN_IF_ERROR(sums.f64(&squares, 1));
    slots.emplace(threads);
    DivideRounded(config.dtype, block.data, elems, DivisorOfSum(config, squares));
  }
  if (gram_ns) {
    auto sum_gram = [&](float* r, int64_t n) {
      slots.reset();
      absl::Status summed = sums.f32(r, n);
      slots.emplace(threads);
      return summed;
    };
    const cpu::GramSum sum(sum_gram);  // refers to it: no allocation per step
    return cpu::GramNewtonSchulz(config, program, block.data, work_, round, &sum);
  }
  float* buffers[4] = {block.data, work_, work_ + elems, work_ + elems + gram_elems};
  float* const gram = buffers[static_cast<int>(NsBuffer::kGram)];
  const NsGemm& gram_product = program.iteration[0];
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    RunGemm(gram_product, abc, buffers, ew::kF32);  // unrounded: summed first
    slots.reset();
    MUON_RETURN_IF_ERROR(sums.f32(gram, gram_elems));
    slots.emplace(threads);
    if (it == 0 && config.aol) {
      // AOL (cpu/aol.h): the whole's W W^T gives the scales, and scaled it is
      // this first gram. Row-major, the block is m x width or, tall, width x m.
      cpu::AolScale(block.data, block.tall ? block.width : block.m,
                    block.tall ? block.m : block.width, block.tall, config.eps, round, gram,
                    aol_scales_.data());
    } else {
      cpu::RoundToType(round, gram, gram_elems);
    }
    const NsIterationProducts products = ProductsFor(program, abc);  // the gram ran above
    for (auto g = products.begin() + 1; g != products.end(); ++g) {
      RunGemm(**g, abc, buffers, round);
    }
    std::swap(buffers[static_cast<int>(NsBuffer::kX)], buffers[static_cast<int>(NsBuffer::kXNext)]);
  }
  const float* x = buffers[static_cast<int>(NsBuffer::kX)];
  if (x != block.data) std::copy(x, x + elems, block.data);
  return absl::OkStatus();
}

absl::Status CpuBackend::NorMuonBlock(const NorMuonStep& step, const MatrixBlock& block,
                                      float* moments, const MemberSums& sums) {
  // The program split_ns.h runs on any backend's steps (this backend's take
  // its core slots, and none is held while the members sum), on the whole's
  // rows' squares and divisors kept from call to call.
  MUON_RETURN_IF_ERROR(CheckSplitBlock(block));
  const size_t rows = static_cast<size_t>(block.tall ? block.n : block.m);
  normuon_sums_.resize(rows);
  normuon_divisors_.resize(rows);
  SplitWork work;
  work.squares = normuon_sums_.data();
  work.divisors = normuon_divisors_.data();
  return NorMuonBlockOn(*this, step, block, moments, sums, work);
}

absl::Status CpuBackend::RowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                                    int64_t out_rows, int64_t row0) {
  if (rows < 0 || cols < 0 || row0 < 0 || row0 + rows > out_rows) {
    return absl::InvalidArgumentError(absl::StrCat("the squares of ", rows, " rows at row ", row0,
                                                   " of ", out_rows));
  }
  const cpu::CoreSlots slots(cpu::ThreadsPerRankHere());
  std::fill(out, out + out_rows, 0.0);
  for (int64_t i = 0; i < rows; ++i) out[row0 + i] = cpu::SumSquares(x + i * cols, cols);
  return absl::OkStatus();
}

absl::Status CpuBackend::NormDivisor(const NsConfig& config, const double* squares,
                                     float* divisor) {
  *divisor = DivisorOfSum(config, *squares);
  return absl::OkStatus();
}

absl::Status CpuBackend::NorMuonDivisors(const double* row_sq, int64_t rows, int64_t cols,
                                         double beta2, double eps, float* moments,
                                         float* divisors) {
  NorMuonRowDivisors(row_sq, rows, cols, beta2, eps, moments, divisors);
  return absl::OkStatus();
}

absl::Status CpuBackend::DivideRows(NsDtype dtype, float* x, int64_t rows, int64_t cols,
                                    const float* divisors) {
  const cpu::CoreSlots slots(cpu::ThreadsPerRankHere());
  for (int64_t i = 0; i < rows; ++i) DivideRounded(dtype, x + i * cols, cols, divisors[i]);
  return absl::OkStatus();
}

absl::Status CpuBackend::RunProduct(const NsGemm& g, const NsCoefficients& abc,
                                    float* const* buffers, NsDtype round) {
  const int threads = cpu::ThreadsPerRankHere();
  cpu::UseThreads(threads, cpu::NativeThreadsHere());
  MUON_RETURN_IF_ERROR(products_.Choose(threads));  // as OrthogonalizeBlock chooses
  const cpu::CoreSlots slots(threads);
  RunGemm(g, abc, buffers,
          round == NsDtype::kBF16 ? ew::kBF16 : round == NsDtype::kFP16 ? ew::kF16 : ew::kF32);
  return absl::OkStatus();
}

absl::Status CpuBackend::SumInOrder(bool f64, const void* parts, int64_t count, int64_t len,
                                    void* out) {
  auto add = [&](auto* p, auto* o) {
    for (int64_t e = 0; e < len; ++e) {
      auto total = p[e];
      for (int64_t i = 1; i < count; ++i) total += p[i * len + e];
      o[e] = total;
    }
  };
  if (f64) {
    add(static_cast<const double*>(parts), static_cast<double*>(out));
  } else {
    add(static_cast<const float*>(parts), static_cast<float*>(out));
  }
  return absl::OkStatus();
}

}  // namespace muon
