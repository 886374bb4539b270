#include "muon/math/ns_program.h"

#include <algorithm>

namespace muon {

namespace {

// The program for W (m x n: short_side x long_side) stored as a tall matrix
// stores it (W, ld m) or as a wide one does (W^T, ld n); for a block of W, n
// may be less than m.
NsProgram PlanOriented(int64_t count, int64_t short_side, int64_t long_side, bool tall) {
  NsProgram p;
  p.count = count;
  p.tall = tall;
  p.m = short_side;
  p.n = long_side;
  p.x_elems = p.m * p.n;
  p.gram_elems = p.m * p.m;
  const int64_t m = p.m, n = p.n;
  // x as stored: W (m x n, ld m) when tall, W^T (n x m, ld n) when wide.
  const int64_t ld_x = p.tall ? m : n;
  const NsOperand x{NsBuffer::kX, ld_x, p.x_elems};
  const NsOperand x_next{NsBuffer::kXNext, ld_x, p.x_elems};
  const NsOperand gram{NsBuffer::kGram, m, p.gram_elems};
  const NsOperand poly{NsBuffer::kPoly, m, p.gram_elems};

  NsGemm& g = p.iteration[0];  // gram = W W^T
  g.name = "gram";
  g.m = m;
  g.n = m;
  g.k = n;
  g.trans_a = !p.tall;  // W = (W^T)^T
  g.trans_b = p.tall;   // W^T
  g.a = x;
  g.b = x;
  g.c = gram;
  g.d = gram;
  g.alpha = NsScalar::kOne;
  g.beta = NsScalar::kZero;
  g.symmetric = true;

  NsGemm& q = p.iteration[1];  // poly = b * gram + c * gram gram
  q.name = "polynomial";
  q.m = m;
  q.n = m;
  q.k = m;
  q.a = gram;
  q.b = gram;
  q.c = gram;
  q.d = poly;
  q.alpha = NsScalar::kC;
  q.beta = NsScalar::kB;
  q.symmetric = true;  // gram gram = gram gram^T

  NsGemm& u = p.iteration[2];  // W' = a W + poly W  (W'^T = a W^T + W^T poly)
  u.name = "update";
  u.m = p.tall ? m : n;
  u.n = p.tall ? n : m;
  u.k = m;
  u.a = p.tall ? poly : x;
  u.b = p.tall ? x : poly;
  u.c = x;
  u.d = x_next;
  u.alpha = NsScalar::kOne;
  u.beta = NsScalar::kA;

  NsGemm& cu = p.cubic_update;  // W' = a W + b gram W
  cu = u;
  cu.name = "cubic update";
  cu.a = p.tall ? gram : x;
  cu.b = p.tall ? x : gram;
  cu.alpha = NsScalar::kB;
  return p;
}

}  // namespace

NsProgram PlanNewtonSchulz(int64_t count, int64_t rows, int64_t cols) {
  return PlanOriented(count, std::min(rows, cols), std::max(rows, cols), rows > cols);
}

NsProgram PlanNewtonSchulzBlock(int64_t m, int64_t width, bool tall) {
  return PlanOriented(1, m, width, tall);
}

NsIterationProducts ProductsFor(const NsProgram& program, const NsCoefficients& abc) {
  NsIterationProducts out;
  if (abc[2] == 0.0) {
    out.gemm = {&program.iteration[0], &program.cubic_update, nullptr};
    out.count = 2;
  } else {
    out.gemm = {&program.iteration[0], &program.iteration[1], &program.iteration[2]};
    out.count = 3;
  }
  return out;
}

std::vector<MemberSum> BlockSums(const NsConfig& config, int64_t m, int64_t n) {
  std::vector<MemberSum> out;
  const MemberSum norm{true, 1}, gram{false, m * m};
  if (UsesGramNewtonSchulz(config, m, n)) {
    out.push_back(norm);
    for (int i = 0; i < config.steps; ++i) {
      if (i == 0 || config.RestartsAt(i)) out.push_back(gram);
    }
    return out;
  }
  if (!config.aol) out.push_back(norm);
  out.insert(out.end(), static_cast<size_t>(std::max(config.steps, 0)), gram);
  return out;
}

float NsScalarValue(NsScalar s, const NsCoefficients& abc) {
  switch (s) {
    case NsScalar::kZero:
      return 0.0f;
    case NsScalar::kOne:
      return 1.0f;
    case NsScalar::kA:
      return static_cast<float>(abc[0]);
    case NsScalar::kB:
      return static_cast<float>(abc[1]);
    case NsScalar::kC:
      return static_cast<float>(abc[2]);
  }
  return 0.0f;
}

}  // namespace muon
