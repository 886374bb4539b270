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

// Gram Newton-Schulz (GramNewtonSchulzOn). `program`'s products serve as
// templates; every m x m product is one RunProduct on buffers other than
// its D, rounded to the dtype after. All are general products, Q and R
// read whole: reading them from one triangle (SYMM), as the CPU backend
// once did, let bf16's round-off asymmetry compound without restarts
// (0.11-0.13 from the float64 result against 0.02-0.035: split_ns_test's
// GramMatchesTheWholeMatrix).
class GramBlock {
 public:
  GramBlock(MathBackend& backend, const NsConfig& config, const NsProgram& program, float* x,
            const MemberSums& sums, const SplitWork& work)
      : be_(backend), config_(config), program_(program), sums_(sums), x_(x),
        x_next_(work.x_next), r_(work.gram), z_(work.poly), q_(work.q), t_(work.t) {
    square_ = program.iteration[1];  // m x m x m, ld m
    square_.symmetric = false;
    square_.alpha = NsScalar::kOne;
    square_.a.buffer = NsBuffer::kX;
    square_.b.buffer = NsBuffer::kXNext;
    square_.c.buffer = NsBuffer::kGram;
    square_.d.buffer = NsBuffer::kPoly;
    apply_ = program.iteration[2];  // X' = poly X in the block's layout, no a X
    apply_.beta = NsScalar::kZero;
  }

  absl::Status Run(float* data) {
    if (config_.steps > 0) MUON_RETURN_IF_ERROR(FormR());
    for (int i = 0; i < config_.steps; ++i) {
      const NsCoefficients& abc = config_.ForIteration(i);
      const float a = static_cast<float>(abc[0]), b = static_cast<float>(abc[1]);
      const bool restart = config_.RestartsAt(i);
      if (restart) {
        MUON_RETURN_IF_ERROR(ApplyQ());
        MUON_RETURN_IF_ERROR(FormR());
      }
      // Z = b R + c R R (one symmetric product), or b R when cubic.
      if (abc[2] != 0.0) {
        float* on[4] = {x_, x_next_, r_, z_};
        MUON_RETURN_IF_ERROR(be_.RunProduct(program_.iteration[1], abc, on, config_.dtype));
      } else {
        const size_t bytes = static_cast<size_t>(program_.gram_elems) * sizeof(float);
        MUON_RETURN_IF_ERROR(be_.CopyRuns(z_, bytes, r_, bytes, bytes, 1));
        MUON_RETURN_IF_ERROR(
            be_.ScaleRounded({z_, 1, 1, program_.gram_elems, DType::kF32}, b, config_.dtype));
      }
      if (i == 0 || restart) {  // Q = Z + a I
        MUON_RETURN_IF_ERROR(be_.AddIdentity(z_, program_.m, a, config_.dtype, q_));
      } else {  // Q = Q Z + a Q
        MUON_RETURN_IF_ERROR(Square(q_, z_, q_, t_, abc));
        std::swap(q_, t_);
      }
      if (i + 1 < config_.steps && !config_.RestartsAt(i + 1)) {
        // R = (a I + Z) R (a I + Z): T = R Z + a R, then R = Z T + a T.
        MUON_RETURN_IF_ERROR(Square(r_, z_, r_, t_, abc));
        MUON_RETURN_IF_ERROR(Square(z_, t_, t_, r_, abc));
      }
    }
    if (config_.steps > 0) MUON_RETURN_IF_ERROR(ApplyQ());
    if (x_ == data) return absl::OkStatus();
    const size_t bytes = static_cast<size_t>(program_.x_elems) * sizeof(float);
    return be_.CopyRuns(data, bytes, x_, bytes, bytes, 1);
  }

 private:
  // R = X X^T: this block's share, summed over the members, then rounded.
  absl::Status FormR() {
    float* on[4] = {x_, x_next_, r_, z_};
    MUON_RETURN_IF_ERROR(be_.RunProduct(program_.iteration[0], {}, on, NsDtype::kFP32));
    MUON_RETURN_IF_ERROR(sums_.f32(r_, program_.gram_elems));
    if (config_.dtype == NsDtype::kFP32) return absl::OkStatus();
    return be_.ScaleRounded({r_, 1, 1, program_.gram_elems, DType::kF32}, 1.0f, config_.dtype);
  }
  // X = Q X (the update's product with Q for the polynomial and no a X).
  absl::Status ApplyQ() {
    float* on[4] = {x_, x_next_, r_, q_};
    MUON_RETURN_IF_ERROR(be_.RunProduct(apply_, {}, on, config_.dtype));
    std::swap(x_, x_next_);
    return absl::OkStatus();
  }
  // d = a_op b_op + a c (m x m), d other than the three.
  absl::Status Square(float* a_op, float* b_op, float* c, float* d, const NsCoefficients& abc) {
    NsGemm g = square_;
    g.beta = NsScalar::kA;
    float* on[4] = {a_op, b_op, c, d};
    return be_.RunProduct(g, abc, on, config_.dtype);
  }

  MathBackend& be_;
  const NsConfig& config_;
  const NsProgram& program_;
  const MemberSums& sums_;
  float *x_, *x_next_, *r_, *z_, *q_, *t_;
  NsGemm square_, apply_;
};

}  // namespace

size_t SplitWorkBytes(const NsConfig& config, int64_t m, int64_t width, int64_t n,
                      int64_t rows) {
  const size_t per_row = static_cast<size_t>(std::max<int64_t>(rows, 1));
  const size_t x = static_cast<size_t>(m * width), gram = static_cast<size_t>(m * m);
  const size_t grams = UsesGramNewtonSchulz(config, m, n) ? 4 : 2;
  return (per_row + static_cast<size_t>(m)) * sizeof(double) +
         RoundUp8(per_row * sizeof(float)) + (x + grams * gram) * sizeof(float);
}

SplitWork SplitWorkAt(void* base, const NsConfig& config, int64_t m, int64_t width, int64_t n,
                      int64_t rows) {
  const size_t per_row = static_cast<size_t>(std::max<int64_t>(rows, 1));
  auto* bytes = static_cast<unsigned char*>(base);
  SplitWork w;
  w.squares = reinterpret_cast<double*>(bytes);
  bytes += per_row * sizeof(double);
  w.scales = reinterpret_cast<double*>(bytes);
  bytes += static_cast<size_t>(m) * sizeof(double);
  w.divisors = reinterpret_cast<float*>(bytes);
  bytes += RoundUp8(per_row * sizeof(float));
  w.x_next = reinterpret_cast<float*>(bytes);
  w.gram = w.x_next + m * width;
  w.poly = w.gram + m * m;
  if (UsesGramNewtonSchulz(config, m, n)) {
    w.q = w.poly + m * m;
    w.t = w.q + m * m;
  }
  return w;
}

absl::Status GramNewtonSchulzOn(MathBackend& backend, const NsConfig& config,
                                const NsProgram& program, float* x, const MemberSums& sums,
                                const SplitWork& work) {
  if (work.x_next == nullptr || work.gram == nullptr || work.poly == nullptr ||
      work.q == nullptr || work.t == nullptr) {
    return absl::InternalError("Gram Newton-Schulz's workspace was not laid out for it");
  }
  return GramBlock(backend, config, program, x, sums, work).Run(x);
}

absl::Status OrthogonalizeBlockOn(MathBackend& backend, const NsConfig& config,
                                  const MatrixBlock& block, const MemberSums& sums,
                                  const SplitWork& work) {
  MUON_RETURN_IF_ERROR(CheckSplitBlock(block));
  const NsProgram program = PlanNewtonSchulzBlock(block.m, block.width, block.tall);
  const int64_t elems = program.x_elems, gram_elems = program.gram_elems;
  const MatrixBatch whole{block.data, 1, 1, elems, DType::kF32};
  if (config.dtype == NsDtype::kBF16) {
    MUON_RETURN_IF_ERROR(backend.ScaleRounded(whole, 1.0f, NsDtype::kBF16));
  }
  if (!config.aol) {  // AOL scales at the first gram instead of dividing by the norm
    // The whole's norm: this block's squares (of its bf16 values when bf16),
    // summed over the members, then divided and rounded as the whole's
    // normalization does.
    MUON_RETURN_IF_ERROR(backend.RowSquares(block.data, 1, elems, work.squares, 1, 0));
    MUON_RETURN_IF_ERROR(sums.f64(work.squares, 1));
    MUON_RETURN_IF_ERROR(backend.NormDivisor(config, work.squares, work.divisors));
    MUON_RETURN_IF_ERROR(backend.DivideRows(config.dtype, block.data, 1, elems, work.divisors));
  }
  if (UsesGramNewtonSchulz(config, block.m, block.n)) {
    return GramNewtonSchulzOn(backend, config, program, block.data, sums, work);
  }
  float* buffers[4] = {block.data, work.x_next, work.gram, work.poly};
  const NsGemm& gram_product = program.iteration[0];
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    // The gram unrounded: the members' shares are summed first.
    MUON_RETURN_IF_ERROR(backend.RunProduct(gram_product, abc, buffers, NsDtype::kFP32));
    MUON_RETURN_IF_ERROR(sums.f32(work.gram, gram_elems));
    if (it == 0 && config.aol) {
      // AOL (cpu/aol.h): the whole's W W^T gives the scales, and scaled it is
      // this first gram. Row-major, the block is m x width or, tall, width x m.
      MUON_RETURN_IF_ERROR(backend.AolScale(config, block.data,
                                            block.tall ? block.width : block.m,
                                            block.tall ? block.m : block.width, block.tall,
                                            work.gram, work.scales));
    } else if (config.dtype != NsDtype::kFP32) {
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
