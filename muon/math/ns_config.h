// What one Newton-Schulz orthogonalization computes: the iteration count, the
// (a, b, c) coefficients of each iteration, the norm clamp and the dtype.
#ifndef MUON_MATH_NS_CONFIG_H_
#define MUON_MATH_NS_CONFIG_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace muon {

enum class NsDtype { kBF16 = 0, kFP32 = 1, kFP16 = 2 };

// How the iterations are computed. kGram (Gram Newton-Schulz, as Dao-AILab's
// gram-newton-schulz computes it): for W (m x n, m < n, the wide
// orientation) the iterations run on R = W W^T (m x m), accumulating the
// polynomial Q that W is multiplied by at the end, X = Q W; at each restart
// iteration W = Q W and R are formed afresh. The same polynomial as the
// standard iteration, in m x m products but for three m x n ones; a square
// matrix runs the standard iteration.
enum class NsAlgorithm { kStandard = 0, kGram = 1 };

using NsCoefficients = std::array<double, 3>;  // (a, b, c)

struct NsConfig {
  int steps = 5;
  // Row i holds iteration i's coefficients; iterations past the end reuse the
  // last row. Never empty once validated.
  std::vector<NsCoefficients> coefficients = {{3.4445, -4.7750, 2.0315}};
  double eps = 1e-7;
  NsDtype dtype = NsDtype::kBF16;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  // kGram: bit i set restarts at iteration i (bit 0: iteration 0 starts
  // afresh anyway). gram-newton-schulz's default: iteration 2.
  uint64_t gram_restarts = uint64_t{1} << 2;
  // AOL pre-scaling (muon/math/cpu/aol.h) instead of the division by the
  // Frobenius norm; the "aol" schedule's (kStandard only).
  bool aol = false;
  bool RestartsAt(int i) const { return i > 0 && i < 64 && (gram_restarts >> i & 1) != 0; }

  const NsCoefficients& ForIteration(int i) const {
    return coefficients[static_cast<size_t>(i) < coefficients.size() ? i
                                                                     : coefficients.size() - 1];
  }
};

// The Polar Express coefficients for degree-5 polynomials (the published
// table, with its 1.01 safety factor applied to every row but the last).
std::vector<NsCoefficients> PolarExpressCoefficients();

// The built-in schedules besides Polar Express, as Emerging-Optimizers
// (NVIDIA-NeMo) ships them: 4-decimal values, the cubic ones to 7.
enum class NsSchedule {
  kCans,        // Chebyshev-accelerated (arXiv 2506.10935): 5 rows, the last repeats
  kDeepSeekV4,  // DeepSeek-V4: 8 x (3.4445, -4.7750, 2.0315), 2 x (2, -1.5, 0.5)
  kCubic5,      // relaxed cubic (c = 0): 5 rows; an iteration runs one product less
  kAol,         // flash-newton-schulz's fit for AOL-pre-scaled input: 4 rows
};
std::vector<NsCoefficients> ScheduleCoefficients(NsSchedule schedule);
// The iteration count a schedule is made for (DeepSeek-V4: 10, cubic5: 5),
// or 0 when it runs at any count (CANS: its last row repeats).
int ScheduleSteps(NsSchedule schedule);

// How many of the config's iterations are cubic (c == 0): those run two
// products (W' = a W + b (W W^T) W) instead of three.
int CubicIterations(const NsConfig& config);

// FLOPs of one Newton-Schulz orthogonalization of a rows x cols matrix with
// `steps` iterations, counting 4 m^2 n + 2 m^3 per iteration (m <= n), of
// which `cubic_steps` (c == 0: no polynomial product) count 4 m^2 n.
double NewtonSchulzFlops(int64_t rows, int64_t cols, int steps, int cubic_steps = 0);
// The FLOPs of one member of a split Newton-Schulz (OrthogonalizeBlock) with
// a block `width` wide of a matrix whose short side is m: 4 m^2 width + 2 m^3
// per iteration (every member computes the m x m polynomial), 4 m^2 width
// per cubic one.
double NewtonSchulzBlockFlops(int64_t m, int64_t width, int steps, int cubic_steps = 0);
// The FLOPs of one orthogonalization under `config`: the standard
// iteration's above, or Gram Newton-Schulz's (m <= n): 2 m^2 n for each R
// formed (once, and at each restart), 2 m^2 n for each X = Q W (at each
// restart and at the end), and per iteration 2 m^3 for Z (none when cubic),
// 2 m^3 for Q (not at the first or a restart) and 4 m^3 for R (not before
// a restart or after the last). A square matrix runs the standard one. AOL's
// pre-scaling adds nothing: its W W^T is the first iteration's gram.
double NewtonSchulzFlops(const NsConfig& config, int64_t rows, int64_t cols);
// Whether Gram Newton-Schulz runs under `config` on a rows x cols matrix (or
// a wide orientation's m x n): kGram on one that is not square; a square one
// runs the standard iteration.
bool UsesGramNewtonSchulz(const NsConfig& config, int64_t rows, int64_t cols);
// The same for one member of a split Newton-Schulz whose block is `width`
// of the whole's n columns (m x n, m <= n): the m^2 n terms at its width,
// the m x m ones whole (every member computes them).
double NewtonSchulzBlockFlops(const NsConfig& config, int64_t m, int64_t width, int64_t n);

// Checks steps in [0, 100), eps > 0 and finite, a non-empty finite table.
absl::Status ValidateNsConfig(const NsConfig& config);

}  // namespace muon

#endif  // MUON_MATH_NS_CONFIG_H_
