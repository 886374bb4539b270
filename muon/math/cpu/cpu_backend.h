// The CPU backend: elementwise updates in plain loops, Newton-Schulz through
// CBLAS (OpenBLAS) running the program of muon/math/ns_program.h in fp32. bf16
// runs on native bf16 products (libmuon's AMX or AVX512-BF16 kernel,
// muon/math/cpu/native_bf16.h) where the CPU has either (cpu_features.h
// chooses), else emulated: fp32 products with every stored intermediate
// rounded to bf16. Both accumulate in fp32 and round each product once, as
// torch's bf16 path does.
#ifndef MUON_MATH_CPU_CPU_BACKEND_H_
#define MUON_MATH_CPU_CPU_BACKEND_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "muon/math/backend.h"
#include "muon/math/cpu/cpu_features.h"
#include "muon/math/cpu/cpu_threads.h"
#include "muon/math/cpu/native_bf16.h"
#include "muon/math/cpu/f32_products.h"
#include "muon/math/cpu/parallel.h"
#include "muon/math/elementwise.h"
#include "muon/math/ns_program.h"

namespace muon {

class CpuBackend final : public MathBackend {
 public:
  absl::Status Momentum(const MomentumStep& step, absl::Span<const MomentumArgs> tensors) override;
  absl::Status Apply(const ApplyStep& step, absl::Span<const ApplyArgs> tensors) override;
  absl::Status StoreBytes(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyRuns(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t width, size_t height) override;
  absl::Status ScaleRounded(const MatrixBatch& batch, float factor, NsDtype precision) override;
  void SetMemorySource(MemorySource source) override { source_ = std::move(source); }
  void JoinWorld(int world_rank) override { share_.Join(world_rank); }
  ~CpuBackend() override;
  absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) override;
  absl::Status NorMuon(const NorMuonStep& step, const MatrixBatch& batch,
                       float* const* moments) override;
  // The block's program (muon/math/split_ns.h) on the steps below, each on
  // this rank's core slots, none held while the members sum (a sum waits on
  // other ranks).
  absl::Status OrthogonalizeBlock(const NsConfig& config, const MatrixBlock& block,
                                  const MemberSums& sums) override;
  absl::Status NorMuonBlock(const NorMuonStep& step, const MatrixBlock& block, float* moments,
                            const MemberSums& sums) override;
  // The steps of a member's block (muon/math/split_ns.h), each on this
  // rank's core slots.
  absl::Status RowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                          int64_t out_rows, int64_t row0) override;
  absl::Status NormDivisor(const NsConfig& config, const double* squares,
                           float* divisor) override;
  absl::Status NorMuonDivisors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                               double eps, float* moments, float* divisors) override;
  absl::Status DivideRows(NsDtype dtype, float* x, int64_t rows, int64_t cols,
                          const float* divisors) override;
  absl::Status RunProduct(const NsGemm& g, const NsCoefficients& abc, float* const* buffers,
                          NsDtype round) override;
  absl::Status SumInOrder(bool f64, const void* parts, int64_t count, int64_t len,
                          void* out) override;
  absl::Status AddIdentity(const float* z, int64_t m, float a, NsDtype round, float* q) override;
  absl::Status AolScale(const NsConfig& config, float* x, int64_t rows, int64_t cols, bool tall,
                        float* gram, double* scales) override;
  // (cpu_backend_split.cc has both.)
  absl::Status VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                           int32_t* flag) override;
  absl::Status CountNonFinite(DType dtype, const void* data, int64_t n,
                              int64_t* counter) override;

  // Reserves the workspace for matrices up to rows x cols so that later calls
  // allocate nothing. Fails with ResourceExhausted when memory is short.
  absl::Status Reserve(int64_t rows, int64_t cols);
  // The same for `floats` floats of workspace.
  absl::Status ReserveFloats(size_t floats);
  // The CPU orthogonalizes one matrix at a time: the count does not matter.
  // With native bf16 products, their primitives for this shape are built too.
  absl::Status Reserve(const NsConfig& config, int64_t count, int64_t rows, int64_t cols) override;
  // kBF16 for bf16 Newton-Schulz on libmuon's kernels (they read bf16
  // matrices as they are, and write their bf16 result into them), else kF32.
  DType SlotDtype(const NsConfig& config) override;

  // The bf16 products run natively (muon/math/cpu/native_bf16.h) where the CPU
  // can (chosen on first use by cpu::ChooseBf16EngineHere(): the CPU's
  // features, the mask, the environment), else emulated; `allow` false keeps
  // them emulated. Call before the first Orthogonalize. A setting that asks
  // for an engine this CPU cannot run fails the first bf16 Orthogonalize.
  void AllowNativeBf16(bool allow) { allow_native_bf16_ = allow; }
  // Whether bf16 Newton-Schulz runs on native bf16 products.
  bool NativeBf16();
  // The engine bf16 Newton-Schulz runs on: "amx", "avx512_bf16", "onednn" or
  // "emulated".
  const char* Bf16EngineName();
  // The engine of the fp32 products (f32_products.h) as the last
  // Orthogonalize or Reserve chose it: "avx512" or "openblas".
  const char* Fp32EngineName() const { return cpu::Fp32EngineName(products_.engine()); }
  // The matrix products Newton-Schulz has run so far, fp32 and native bf16
  // (a cubic iteration's polynomial, c = 0, runs none). A test counts them.
  int64_t ProductsRun() const { return products_.products_run() + native_products_; }

 private:
  static void Normalize(const NsConfig& config, float* x, int64_t elems);
  // x[0, elems) / d, rounded to `dtype`'s precision (bf16 in the division,
  // fp16 after it): the normalization's and NorMuon's rows' division.
  static void DivideRounded(NsDtype dtype, float* x, int64_t elems, float d);
  // What Normalize divides by (x rounded to bf16 in place first when the
  // dtype is bf16).
  static float NormalizingDivisor(const NsConfig& config, float* x, int64_t elems);
  // The same from the sum of x's squares (of x rounded to bf16 when bf16).
  static float DivisorOfSum(const NsConfig& config, double sum_of_squares);
  // Each path below takes `first_gram`, AOL's (AolPrescale), or nullptr: it
  // copies it into its gram buffer before writing anything, and its first
  // iteration runs no gram product.
  absl::Status OrthogonalizeNativeBf16(const NsConfig& config, const NsProgram& program,
                                       float* u, const float* first_gram);
  // The same on a bf16 matrix, in place (the SlotDtype kBF16 path).
  absl::Status OrthogonalizeBf16(const NsConfig& config, const NsProgram& program, uint16_t* u,
                                 const float* first_gram);
  // The sum of squares of the matrix ns_chunks_ splits (one range): each
  // chunk's `sum` on the rank's threads, the chunks' sums added in order, so
  // the result does not depend on the threads (a matrix of one chunk, 64 Ki
  // elements or fewer, is cpu::SumSquares's order exactly).
  double ChunkedSumOfSquares(int threads, absl::FunctionRef<double(const cpu::Chunk&)> sum);
  // The program's iterations on the native products, X and X' swapping;
  // with `gram_ready` the first iteration's gram is in its buffer already.
  absl::Status RunNativeIterations(const NsConfig& config, const NsProgram& program,
                                   uint16_t** buffers, bool gram_ready);
  // One matrix through the program (muon/math/ns_program.h) in place: fp32
  // products rounded to bf16 after each (the emulated bf16).
  void OrthogonalizeOne(const NsConfig& config, const NsProgram& program, float* u,
                        const float* first_gram);
  // The same in fp32 (Fp32Products' Gram, Polynomial, TimesW): one triangle
  // of the symmetric products computed, the polynomial with b * gram and
  // a * I folded in so that the update is one product without copies, and
  // the last iteration's result written into u itself.
  void OrthogonalizeFp32(const NsConfig& config, const NsProgram& program, float* u,
                         const float* first_gram);
  // AOL's pre-scaling (cpu/aol.h) of x in place: W W^T on the fp32 products,
  // then the scales. Returns the first iteration's gram, in the workspace
  // after the program's X' and gram (where the poly goes: no path writes
  // there before it copies the gram out).
  float* AolPrescale(const NsConfig& config, const NsProgram& program, int64_t rows,
                     int64_t cols, float* x);
  // The same on a bf16 matrix, through an fp32 copy in the workspace.
  float* AolPrescaleBf16(const NsConfig& config, const NsProgram& program, int64_t rows,
                         int64_t cols, uint16_t* x);
  // (cpu_backend_aol.cc has both.)
  // aol_scales_ for m rows, kept from call to call.
  absl::Status ReserveAolScales(size_t m);
  void ReleaseWork();
  // One product of the program on the fp32 products' engine; D is then
  // rounded to `round` (an ew:: type).
  void RunGemm(const NsGemm& g, const NsCoefficients& abc, float* const* buffers,
                      int round);
  // The ew:: type the config's products round to (kF32: none).
  static int RoundType(const NsConfig& config);

  // Workspace, reused across calls: x_next (m x n), gram and poly (m x m) of
  // the largest matrix so far, one block (from `source_` when set); x is the
  // matrix being orthogonalized itself.
  cpu::RankShare share_;  // the division of the process's cores (JoinWorld)
  MemorySource source_;
  bool allow_native_bf16_ = true;
  bool native_probed_ = false;
  absl::Status native_status_;  // the engine's choice, when it failed
  std::unique_ptr<NativeBf16Gemm> native_bf16_;
  Fp32Products products_{&source_};  // the fp32 ones (f32_products.h)
  float* work_ = nullptr;
  size_t work_floats_ = 0;
  int64_t native_products_ = 0;    // ProductsRun's native bf16 share
  std::vector<double> aol_scales_;  // AolPrescale's, sized by Reserve
  // Element-wise work split for the rank's threads (kept: no allocation per
  // step): Momentum's and Apply's, and Orthogonalize's.
  std::vector<cpu::Chunk> chunks_, ns_chunks_;
  std::vector<double> partial_sums_;  // ChunkedSumOfSquares's, one per chunk
  // NorMuon's per-row sums of squares and divisors, sized to the tallest matrix.
  std::vector<double> normuon_sums_;
  std::vector<float> normuon_divisors_;
  // A whole matrix's Gram R, summed over no members.
  const MemberSums no_sums_{[](double*, int64_t) { return absl::OkStatus(); },
                            [](float*, int64_t) { return absl::OkStatus(); }};
  std::vector<cpu::Chunk> normuon_chunks_;
};

// torch's lerp (muon/math/elementwise.h).
inline float TorchLerp(float self, float end, float w) { return ew::TorchLerp(self, end, w); }

}  // namespace muon

#endif  // MUON_MATH_CPU_CPU_BACKEND_H_
