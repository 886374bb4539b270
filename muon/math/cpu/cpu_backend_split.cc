// CpuBackend's part of a split matrix (MathBackend::OrthogonalizeBlock and
// NorMuonBlock): one member's block through the block program, summing with
// the other members where the whole matrix is needed: muon/math/split_ns.h's
// program on this backend's steps, below. Each step computes on this rank's
// core slots, and a member holds none while it waits in a sum (a sum waits
// on other ranks, which may need those cores).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/math/cpu/aol.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/normuon.h"
#include "muon/math/split_ns.h"

namespace muon {
namespace {

// The ew:: type a step rounds to.
int EwType(NsDtype round) {
  return round == NsDtype::kBF16 ? ew::kBF16 : round == NsDtype::kFP16 ? ew::kF16 : ew::kF32;
}

}  // namespace

absl::Status CpuBackend::OrthogonalizeBlock(const NsConfig& config, const MatrixBlock& block,
                                            const MemberSums& sums) {
  // The program split_ns.h runs on any backend's steps (this backend's take
  // its core slots, and none is held while the members sum), on a workspace
  // kept from call to call.
  MUON_RETURN_IF_ERROR(CheckSplitBlock(block));
  const size_t bytes = SplitWorkBytes(config, block.m, block.width, block.n, 1);
  MUON_RETURN_IF_ERROR(ReserveFloats((bytes + sizeof(float) - 1) / sizeof(float)));
  const SplitWork work = SplitWorkAt(work_, config, block.m, block.width, block.n, 1);
  return OrthogonalizeBlockOn(*this, config, block, sums, work);
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
          EwType(round));
  return absl::OkStatus();
}

absl::Status CpuBackend::AddIdentity(const float* z, int64_t m, float a, NsDtype round,
                                     float* q) {
  const int64_t mm = m * m;
  if (q != z) std::copy(z, z + mm, q);
  for (int64_t j = 0; j < m; ++j) q[j * m + j] += a;
  cpu::RoundToType(EwType(round),
                   q, mm);
  return absl::OkStatus();
}

absl::Status CpuBackend::AolScale(const NsConfig& config, float* x, int64_t rows, int64_t cols,
                                  bool tall, float* gram, double* scales) {
  const cpu::CoreSlots slots(cpu::ThreadsPerRankHere());
  cpu::AolScale(x, rows, cols, tall, config.eps, RoundType(config), gram, scales);
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
