// The matrix products of one Newton-Schulz iteration, described once for every
// backend: cuBLASLt runs this description on GPUs, CBLAS on the CPU.
//
// A batch holds `count` row-major rows x cols matrices, one after the other.
// BLAS is column-major, and a row-major R x C matrix is, in the same memory,
// the column-major C x R matrix: its transpose. So no backend transposes
// anything. Muon works on the wide orientation W (m x n, m = min(rows, cols)):
//   tall (rows > cols): the memory is W itself, column-major, ld m;
//   wide (rows <= cols): the memory is W^T (n x m, column-major, ld n).
// One iteration, as torch's addmm calls (torch.optim.Muon):
//   gram  = W W^T                     (symmetric, m x m)
//   poly  = b * gram + c * gram gram  (symmetric)
//   W'    = a * W + poly W            (for W^T: a * W^T + W^T poly)
// A cubic iteration (c == 0) runs two: gram, then W' = a * W + b * gram W
// (Emerging-Optimizers' cubic path), one m^2 n product less than three.
// Every product with a C term is out of place (D != C): the buffers are x, x_next (m x n
// each) and gram, poly (m x m each); after an iteration x and x_next swap.
#ifndef MUON_MATH_NS_PROGRAM_H_
#define MUON_MATH_NS_PROGRAM_H_

#include <array>
#include <cstdint>
#include <vector>

#include "muon/math/ns_config.h"

namespace muon {

enum class NsBuffer : uint8_t { kX, kXNext, kGram, kPoly };
enum class NsScalar : uint8_t { kZero, kOne, kA, kB, kC };

// A column-major operand: matrix i of the batch starts at buffer + i * stride.
struct NsOperand {
  NsBuffer buffer = NsBuffer::kX;
  int64_t ld = 0;
  int64_t stride = 0;
};

// D (m x n) = alpha * op(A) op(B) + beta * C, batched over the program's
// count; C has D's shape, leading dimension and stride, and is a buffer other
// than D whenever beta is not zero (with beta zero, C is not read).
struct NsGemm {
  const char* name = "";  // "gram", "polynomial", "update": for errors
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  NsOperand a, b, c, d;
  NsScalar alpha = NsScalar::kOne;
  NsScalar beta = NsScalar::kZero;
  // op(A) op(B) equals Y Y^T for Y = op(A) (op(B) is Y^T itself, or Y is
  // symmetric): D is symmetric, and a symmetric rank-k update (SYRK) may
  // compute one triangle instead of the product.
  bool symmetric = false;
};

struct NsProgram {
  int64_t count = 0;
  int64_t m = 0, n = 0;  // the wide orientation: m <= n
  bool tall = false;     // rows > cols: the memory is W, not W^T
  int64_t x_elems = 0;     // m * n per matrix (x and x_next)
  int64_t gram_elems = 0;  // m * m per matrix (gram and poly)
  std::array<NsGemm, 3> iteration;  // gram, polynomial, update
  NsGemm cubic_update;              // W' = a W + b gram W: a cubic iteration's second
};

// The products one iteration with coefficients `abc` runs, in order: the
// three of `iteration`, or, when c is 0, iteration[0] and cubic_update.
// A range: for (const NsGemm* g : ProductsFor(program, abc)).
struct NsIterationProducts {
  std::array<const NsGemm*, 3> gemm{};
  int count = 0;
  const NsGemm* const* begin() const { return gemm.data(); }
  const NsGemm* const* end() const { return gemm.data() + count; }
};
NsIterationProducts ProductsFor(const NsProgram& program, const NsCoefficients& abc);

// The program for `count` row-major rows x cols matrices (all positive).
NsProgram PlanNewtonSchulz(int64_t count, int64_t rows, int64_t cols);

// The program for one block of a matrix whose Newton-Schulz runs on several
// ranks (split Newton-Schulz): columns [j0, j0 + width) of the whole's wide
// orientation W (m x n), stored as the whole matrix stores W, packed: W_b (m
// x width, ld m) when `tall`, W_b^T (width x m, ld width) otherwise; in
// row-major terms, rows [j0, j0 + width) of a tall matrix or columns [j0, j0 +
// width) of a wide one. width may be less than m. Its gram product is this
// block's share of W W^T (the whole's is the sum over the blocks); given the
// whole's polynomial, its update is the block of W'.
NsProgram PlanNewtonSchulzBlock(int64_t m, int64_t width, bool tall);

// One sum a split Newton-Schulz takes over its members: `count` doubles
// (f64) or floats, element-wise.
struct MemberSum {
  bool f64 = false;
  int64_t count = 0;
  bool operator==(const MemberSum& o) const { return f64 == o.f64 && count == o.count; }
};

// The sums one member's block of an m x n wide orientation takes under
// `config`, in order (MathBackend::OrthogonalizeBlock makes exactly these;
// a member that stops early, or never starts, makes the rest with zeros, so
// that the members' collectives pair up):
//   standard: the norm's squares (f64, 1), then each iteration's gram (f32,
//     m^2); with AOL no norm: the first gram gives the scales;
//   Gram (m < n; a square matrix runs the standard one): the norm's, then R
//     (f32, m^2) before the first iteration and at each restart.
std::vector<MemberSum> BlockSums(const NsConfig& config, int64_t m, int64_t n);

// The value of `s` in an iteration with coefficients (a, b, c), as the fp32
// every GEMM of the program takes.
float NsScalarValue(NsScalar s, const NsCoefficients& abc);

}  // namespace muon

#endif  // MUON_MATH_NS_PROGRAM_H_
