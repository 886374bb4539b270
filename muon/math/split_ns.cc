#include "muon/math/split_ns.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/ns_program.h"

namespace muon {

absl::Status CheckSplitBlock(const MatrixBlock& block) {
  if (block.data == nullptr || block.m <= 0 || block.width <= 0 || block.first < 0 ||
      block.first > block.n - block.width) {
    return absl::InvalidArgumentError(
        absl::StrCat("a split Newton-Schulz block of ", block.m, " x ", block.width,
                     " at column ", block.first, " of ", block.n));
  }
  return absl::OkStatus();
}

namespace {

size_t RoundUp8(size_t bytes) { return (bytes + 7) / 8 * 8; }

}  // namespace

size_t SplitWorkBytes(int64_t m, int64_t width, int64_t rows) {
  const size_t per_row = static_cast<size_t>(std::max<int64_t>(rows, 1));
  const size_t x = static_cast<size_t>(m * width), gram = static_cast<size_t>(m * m);
  return per_row * sizeof(double) + RoundUp8(per_row * sizeof(float)) +
         (x + 2 * gram) * sizeof(float);
}

SplitWork SplitWorkAt(void* base, int64_t m, int64_t width, int64_t rows) {
  const size_t per_row = static_cast<size_t>(std::max<int64_t>(rows, 1));
  auto* bytes = static_cast<unsigned char*>(base);
  SplitWork w;
  w.squares = reinterpret_cast<double*>(bytes);
  bytes += per_row * sizeof(double);
  w.divisors = reinterpret_cast<float*>(bytes);
  bytes += RoundUp8(per_row * sizeof(float));
  w.x_next = reinterpret_cast<float*>(bytes);
  w.gram = w.x_next + m * width;
  w.poly = w.gram + m * m;
  return w;
}

absl::Status SplitStepsSupport(const NsConfig& config, int64_t m, int64_t n) {
  if (config.aol) {
    return absl::UnimplementedError(
        "ns_coefficients AOL on a matrix split over ranks (MUON_ASSIGNMENT_SPLIT) runs on the "
        "CPU backend only so far");
  }
  if (config.algorithm == NsAlgorithm::kGram && m != n) {
    return absl::UnimplementedError(
        "ns_algorithm gram on a matrix split over ranks (MUON_ASSIGNMENT_SPLIT) runs on the CPU "
        "backend only so far");
  }
  return absl::OkStatus();
}

absl::Status OrthogonalizeBlockOn(MathBackend& backend, const NsConfig& config,
                                  const MatrixBlock& block, const MemberSums& sums,
                                  const SplitWork& work) {
  MUON_RETURN_IF_ERROR(CheckSplitBlock(block));
  MUON_RETURN_IF_ERROR(SplitStepsSupport(config, block.m, block.n));
  const NsProgram program = PlanNewtonSchulzBlock(block.m, block.width, block.tall);
  const int64_t elems = program.x_elems, gram_elems = program.gram_elems;
  const MatrixBatch whole{block.data, 1, 1, elems, DType::kF32};
  // The whole's norm: this block's squares (of its bf16 values when bf16),
  // summed over the members, then divided and rounded as the whole's
  // normalization does.
  if (config.dtype == NsDtype::kBF16) {
    MUON_RETURN_IF_ERROR(backend.ScaleRounded(whole, 1.0f, NsDtype::kBF16));
  }
  MUON_RETURN_IF_ERROR(backend.RowSquares(block.data, 1, elems, work.squares, 1, 0));
  MUON_RETURN_IF_ERROR(sums.f64(work.squares, 1));
  MUON_RETURN_IF_ERROR(backend.NormDivisor(config, work.squares, work.divisors));
  MUON_RETURN_IF_ERROR(backend.DivideRows(config.dtype, block.data, 1, elems, work.divisors));
  float* buffers[4] = {block.data, work.x_next, work.gram, work.poly};
  const NsGemm& gram_product = program.iteration[0];
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    // The gram unrounded: the members' shares are summed first.
    MUON_RETURN_IF_ERROR(backend.RunProduct(gram_product, abc, buffers, NsDtype::kFP32));
    MUON_RETURN_IF_ERROR(sums.f32(work.gram, gram_elems));
    if (config.dtype != NsDtype::kFP32) {
      MUON_RETURN_IF_ERROR(
          backend.ScaleRounded({work.gram, 1, 1, gram_elems, DType::kF32}, 1.0f, config.dtype));
    }
    const NsIterationProducts products = ProductsFor(program, abc);  // the gram ran above
    for (auto g = products.begin() + 1; g != products.end(); ++g) {
      MUON_RETURN_IF_ERROR(backend.RunProduct(**g, abc, buffers, config.dtype));
    }
    std::swap(buffers[static_cast<int>(NsBuffer::kX)], buffers[static_cast<int>(NsBuffer::kXNext)]);
  }
  const float* x = buffers[static_cast<int>(NsBuffer::kX)];
  if (x == block.data) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(elems) * sizeof(float);
  return backend.CopyRuns(block.data, bytes, x, bytes, bytes, 1);
}

absl::Status NorMuonBlockOn(MathBackend& backend, const NorMuonStep& step,
                            const MatrixBlock& block, float* moments, const MemberSums& sums,
                            const SplitWork& work) {
  MUON_RETURN_IF_ERROR(CheckSplitBlock(block));
  // Row-major, the block is `width` whole rows of a tall matrix (rows
  // [first, first + width) of n), or every one of a wide matrix's m rows,
  // `width` long.
  const int64_t rows = block.tall ? block.n : block.m;
  const int64_t cols = block.tall ? block.m : block.n;
  const int64_t local_rows = block.tall ? block.width : block.m;
  const int64_t local_cols = block.tall ? block.m : block.width;
  const int64_t row0 = block.tall ? block.first : 0;
  MUON_RETURN_IF_ERROR(
      backend.RowSquares(block.data, local_rows, local_cols, work.squares, rows, row0));
  // A row's squares over the members (a tall block's rows are whole: the
  // others add zeros to them, exactly).
  MUON_RETURN_IF_ERROR(sums.f64(work.squares, rows));
  MUON_RETURN_IF_ERROR(backend.NorMuonDivisors(work.squares, rows, cols, step.beta2, step.eps,
                                               moments, work.divisors));
  return backend.DivideRows(step.ns_dtype, block.data, local_rows, local_cols,
                            work.divisors + row0);
}

}  // namespace muon
