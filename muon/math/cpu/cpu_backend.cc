#include "muon/math/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/half.h"
#include "muon/common/status.h"
#include "muon/math/cpu/aol.h"
#include "muon/math/cpu/gram_ns.h"
#include "muon/math/split_ns.h"
#include "muon/math/normuon.h"
#include "muon/math/cpu/cpu_kernels.h"
#include "muon/math/cpu/onednn_library.h"
#include "muon/math/ns_program.h"

namespace muon {
namespace {

template <typename Fn>
absl::Status Guarded(const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of host memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::Momentum(const MomentumStep& step,
                                  absl::Span<const MomentumArgs> tensors) {
  const float w_buf = ew::MomentumWeightOfBuf(step.scalars->momentum);
  const float w_out = ew::MomentumWeightOfOut(step.scalars->momentum);
  std::atomic<int64_t> nonfinite{0};
  cpu::SplitIntoChunks(tensors.size(), [&](size_t i) { return tensors[i].n; }, &chunks_);
  cpu::RunChunks(chunks_, cpu::ThreadsPerRankHere(), [&](const cpu::Chunk& c) {
    const MomentumArgs& t = tensors[c.item];
    MomentumArgs a = t;
    a.grad = ElementAt(t.grad, t.grad_dtype, c.begin);
    a.buf = ElementAt(t.buf, t.buf_dtype, c.begin);
    a.out = ElementAt(t.out, t.out_dtype, c.begin);
    a.n = c.end - c.begin;
    const int64_t bad = cpu::Momentum(a, w_buf, w_out, step.nesterov);
    if (bad != 0) nonfinite.fetch_add(bad, std::memory_order_relaxed);
  });
  if (step.nonfinite != nullptr) *step.nonfinite += nonfinite.load();
  return absl::OkStatus();
}

absl::Status CpuBackend::Apply(const ApplyStep& step, absl::Span<const ApplyArgs> tensors) {
  if (step.gate != nullptr && *step.gate != 0) return absl::OkStatus();  // the job said no
  const float decay = ew::DecayFactor(step.scalars->lr, step.scalars->weight_decay);
  cpu::SplitIntoChunks(tensors.size(), [&](size_t i) { return tensors[i].n; }, &chunks_);
  cpu::RunChunks(chunks_, cpu::ThreadsPerRankHere(), [&](const cpu::Chunk& c) {
    const ApplyArgs& t = tensors[c.item];
    ApplyArgs a = t;
    a.param = ElementAt(t.param, t.param_dtype, c.begin);
    a.update = ElementAt(t.update, t.update_dtype, c.begin);
    a.n = c.end - c.begin;
    const float own = t.weight_decay_scale == 1.0
                          ? decay
                          : ew::DecayFactor(step.scalars->lr,
                                            step.scalars->weight_decay * t.weight_decay_scale);
    cpu::Apply(a, own, ew::UpdateAlpha(step.scalars->lr, t.lr_ratio));
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::StoreBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > kMaxStoreBytes) {
    return absl::InternalError(absl::StrCat("StoreBytes of ", bytes, " bytes (at most ",
                                            kMaxStoreBytes, ")"));
  }
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyRuns(void* dst, size_t dst_pitch, const void* src,
                                  size_t src_pitch, size_t width, size_t height) {
  if (width > dst_pitch || width > src_pitch) {
    return absl::InternalError(absl::StrCat("CopyRuns: runs of ", width,
                                            " bytes, wider than the pitches ", dst_pitch,
                                            " and ", src_pitch));
  }
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < height; ++i) std::memcpy(d + i * dst_pitch, s + i * src_pitch, width);
  return absl::OkStatus();
}

absl::Status CpuBackend::ScaleRounded(const MatrixBatch& batch, float factor, NsDtype precision) {
  const int type = static_cast<int>(batch.dtype);
  const int to = precision == NsDtype::kBF16   ? ew::kBF16
                 : precision == NsDtype::kFP16 ? ew::kF16
                                               : ew::kF32;
  const int64_t n = batch.count * batch.rows * batch.cols;
  for (int64_t e = 0; e < n; ++e) {
    ew::Store(type, batch.data, e, ew::RoundTo(to, ew::Load(type, batch.data, e) * factor));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CountNonFinite(DType dtype, const void* data, int64_t n,
                                        int64_t* counter) {
  *counter += muon::CountNonFinite(dtype, data, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                                     int32_t* flag) {
  const auto* v = static_cast<const unsigned char*>(verdicts);
  uint64_t digest0 = 0;
  if (n > 0) std::memcpy(&digest0, v + 8, 8);
  int32_t bad = 0;
  for (int64_t r = 0; r < n; ++r) {
    uint32_t m;
    int32_t code;
    uint64_t digest;
    std::memcpy(&m, v + 16 * r, 4);
    std::memcpy(&code, v + 16 * r + 4, 4);
    std::memcpy(&digest, v + 16 * r + 8, 8);
    if (m != magic || code != 0 || digest != digest0) bad = 1;
  }
  *flag = bad;
  return absl::OkStatus();
}

CpuBackend::~CpuBackend() { ReleaseWork(); }

void CpuBackend::ReleaseWork() {
  if (work_ == nullptr) return;
  if (source_.free) {
    source_.free(work_);
  } else {
    delete[] work_;
  }
  work_ = nullptr;
  work_floats_ = 0;
}

absl::Status CpuBackend::Reserve(int64_t rows, int64_t cols) {
  const size_t m = static_cast<size_t>(std::min(rows, cols));
  const size_t n = static_cast<size_t>(std::max(rows, cols));
  return ReserveFloats(m * n + 2 * m * m);  // X', gram, poly (X is the matrix)
}

absl::Status CpuBackend::ReserveFloats(size_t want) {
  if (want > work_floats_) {
    ReleaseWork();
    if (source_.allocate) {
      absl::StatusOr<void*> p = source_.allocate(want * sizeof(float), "the Newton-Schulz workspace");
      if (!p.ok()) return p.status();
      work_ = static_cast<float*>(*p);
    } else {
      MUON_RETURN_IF_ERROR(Guarded("Newton-Schulz workspace", [&] { work_ = new float[want]; }));
    }
    work_floats_ = want;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ReserveAolScales(size_t m) {
  return Guarded("AOL's scales", [&] {
    if (aol_scales_.size() < m) aol_scales_.resize(m);
  });
}

absl::Status CpuBackend::Reserve(const NsConfig& config, int64_t /*count*/, int64_t rows,
                                 int64_t cols) {
  MUON_RETURN_IF_ERROR(Reserve(rows, cols));
  if (config.aol) {  // W W^T (AolPrescale's), then an fp32 copy of a bf16 matrix
    const size_t m = static_cast<size_t>(std::min(rows, cols));
    const size_t elems = static_cast<size_t>(rows * cols);
    MUON_RETURN_IF_ERROR(ReserveFloats(2 * elems + 2 * m * m));
    MUON_RETURN_IF_ERROR(ReserveAolScales(m));
  }
  if (UsesGramNewtonSchulz(config, rows, cols)) {
    MUON_RETURN_IF_ERROR(ReserveFloats(cpu::GramWorkFloats(PlanNewtonSchulz(1, rows, cols))));
    cpu::UseThreads(cpu::ThreadsPerRankHere(), cpu::NativeThreadsHere());
    return absl::OkStatus();
  }
  if (config.dtype == NsDtype::kBF16) {
    NativeBf16();
    if (!native_status_.ok()) {  // a setting that names no engine this CPU runs
      native_probed_ = false;    // asked again at the next call: the host may fix it
      return native_status_;
    }
  }
  // This rank's share of the cores, before the native products size their
  // working memory for them (and before every product: Orthogonalize comes
  // through here). The AMX kernel's results do not depend on its threads, so
  // it takes the rank's share; oneDNN's may, so it keeps the count that does
  // not follow the ranks (cpu_threads.h).
  const bool native = config.dtype == NsDtype::kBF16 && NativeBf16();
  const int threads = cpu::ThreadsPerRankHere();
  cpu::UseThreads(threads, native && native_bf16_->ResultsIndependentOfThreads()
                               ? threads
                               : cpu::NativeThreadsHere());
  // The fp32 products' engine (their results do not follow the threads).
  MUON_RETURN_IF_ERROR(products_.Choose(threads));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  // AOL's pre-scaling runs its W W^T on the fp32 products whatever the dtype.
  if (!native || config.aol) MUON_RETURN_IF_ERROR(products_.Reserve(PlanNewtonSchulz(1, rows, cols)));
  if (!native) return absl::OkStatus();
  // The program that runs (a tall matrix transposed to the wide program where
  // the engine prefers it) and every iteration's scalars.
  const bool transpose = rows > cols && native_bf16_->PrefersWide();
  const NsProgram runs = transpose ? PlanNewtonSchulz(1, cols, rows) : PlanNewtonSchulz(1, rows, cols);
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    for (const NsGemm* g : ProductsFor(runs, abc)) {
      MUON_RETURN_IF_ERROR(
          native_bf16_->Prepare(*g, NsScalarValue(g->alpha, abc), NsScalarValue(g->beta, abc)));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Orthogonalize(const NsConfig& config, const MatrixBatch& batch) {
  if (batch.count == 0 || batch.rows == 0 || batch.cols == 0) return absl::OkStatus();
  MUON_RETURN_IF_ERROR(Reserve(config, batch.count, batch.rows, batch.cols));
  // One matrix at a time (BLAS threads within each product), each on this
  // rank's core slots.
  const NsProgram program = PlanNewtonSchulz(1, batch.rows, batch.cols);
  const int threads = cpu::ThreadsPerRankHere();
  if (batch.dtype == DType::kBF16) {
    if (SlotDtype(config) != DType::kBF16) {
      return absl::InternalError("bf16 matrices given to a CPU backend that takes fp32 ones");
    }
    for (int64_t k = 0; k < batch.count; ++k) {
      const cpu::CoreSlots slots(threads);
      uint16_t* x = static_cast<uint16_t*>(batch.data) + k * program.x_elems;
      const float* first_gram =
          config.aol ? AolPrescaleBf16(config, program, batch.rows, batch.cols, x) : nullptr;
      MUON_RETURN_IF_ERROR(OrthogonalizeBf16(config, program, x, first_gram));
    }
    return absl::OkStatus();
  }
  const bool gram = UsesGramNewtonSchulz(config, batch.rows, batch.cols);
  const bool native = !gram && config.dtype == NsDtype::kBF16 && NativeBf16();
  for (int64_t k = 0; k < batch.count; ++k) {
    const cpu::CoreSlots slots(threads);
    float* u = static_cast<float*>(batch.data) + k * program.x_elems;
    // AOL (not with Gram: ns_config.cc refuses it) hands the first gram on.
    const float* first_gram =
        config.aol ? AolPrescale(config, program, batch.rows, batch.cols, u) : nullptr;
    if (gram) {
      Normalize(config, u, program.x_elems);
      // split_ns.h's program on this backend's steps (their core slots nest
      // in this matrix's), R summed over no members.
      SplitWork work;
      work.x_next = work_;
      work.gram = work_ + program.x_elems;
      work.poly = work.gram + program.gram_elems;
      work.q = work.poly + program.gram_elems;
      work.t = work.q + program.gram_elems;
      MUON_RETURN_IF_ERROR(GramNewtonSchulzOn(*this, config, program, u, no_sums_, work));
    } else if (native) {
      MUON_RETURN_IF_ERROR(OrthogonalizeNativeBf16(config, program, u, first_gram));
    } else if (config.dtype != NsDtype::kFP32) {
      OrthogonalizeOne(config, program, u, first_gram);
    } else {
      OrthogonalizeFp32(config, program, u, first_gram);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::NorMuon(const NorMuonStep& step, const MatrixBatch& batch,
                                 float* const* moments) {
  if (batch.dtype != DType::kF32 && batch.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("NorMuon takes fp32 or bf16 matrices, not ", DTypeName(batch.dtype)));
  }
  if (batch.count == 0 || batch.rows <= 0 || batch.cols <= 0) return absl::OkStatus();
  const int64_t rows = batch.rows, cols = batch.cols;
  normuon_sums_.resize(static_cast<size_t>(rows));
  normuon_divisors_.resize(static_cast<size_t>(rows));
  const bool bf16 = batch.dtype == DType::kBF16;
  const int threads = cpu::ThreadsPerRankHere();
  for (int64_t k = 0; k < batch.count; ++k) {
    if (moments[k] == nullptr) continue;  // not stepped: left as it is
    auto* f32 = static_cast<float*>(batch.data) + k * rows * cols;
    auto* b16 = static_cast<uint16_t*>(batch.data) + k * rows * cols;
    // Row by row on the rank's threads (a row is one chunk: its sum in one
    // fixed order whatever the threads), sequentially for rows of more.
    auto rows_do = [&](auto&& fn) {
      if (cols > cpu::kChunkElements) {
        for (int64_t i = 0; i < rows; ++i) fn(i);
        return;
      }
      cpu::SplitIntoChunks(static_cast<size_t>(rows), [&](size_t) { return cols; },
                           &normuon_chunks_);
      cpu::RunChunks(normuon_chunks_, threads,
                     [&](const cpu::Chunk& c) { fn(static_cast<int64_t>(c.item)); });
    };
    rows_do([&](int64_t i) {
      normuon_sums_[static_cast<size_t>(i)] =
          bf16 ? cpu::SumSquaresBf16(b16 + i * cols, cols) : cpu::SumSquares(f32 + i * cols, cols);
    });
    NorMuonRowDivisors(normuon_sums_.data(), rows, cols, step.beta2, step.eps, moments[k],
                       normuon_divisors_.data());
    rows_do([&](int64_t i) {
      const float d = normuon_divisors_[static_cast<size_t>(i)];
      if (bf16) {
        cpu::DivideBf16(b16 + i * cols, cols, d, b16 + i * cols);
      } else {
        DivideRounded(step.ns_dtype, f32 + i * cols, cols, d);
      }
    });
  }
  return absl::OkStatus();
}

bool CpuBackend::NativeBf16() {
  if (!native_probed_) {
    native_probed_ = true;
    native_status_ = cpu::FeatureSettingStatus();
    absl::StatusOr<cpu::Bf16Engine> engine = cpu::ChooseBf16EngineHere();
    if (native_status_.ok()) native_status_ = engine.status();
    if (allow_native_bf16_ && native_status_.ok()) {
      native_bf16_ = NativeBf16Gemm::Create(source_, *engine);
      if (native_bf16_ == nullptr && *engine == cpu::Bf16Engine::kOneDnn &&
          !LoadOneDnn().ok()) {
        native_status_ = LoadOneDnn().status();  // names the library and the fix
      } else if (native_bf16_ == nullptr && *engine != cpu::Bf16Engine::kEmulated) {
        native_status_ = absl::FailedPreconditionError(
            absl::StrCat("the bf16 products on ", cpu::Bf16EngineName(*engine),
                         " could not start on this CPU (features: ",
                         cpu::FeatureNames(cpu::Features()),
                         "); unset MUON_CPU_BF16 to let libmuon choose"));
      }
    }
  }
  return native_bf16_ != nullptr;
}

const char* CpuBackend::Bf16EngineName() {
  return NativeBf16() ? native_bf16_->EngineName() : cpu::Bf16EngineName(cpu::Bf16Engine::kEmulated);
}

void CpuBackend::RunGemm(const NsGemm& g, const NsCoefficients& abc, float* const* buffers,
                         int round) {
  float* d = buffers[static_cast<int>(g.d.buffer)];
  products_.Run(g, NsScalarValue(g.alpha, abc), NsScalarValue(g.beta, abc),
                buffers[static_cast<int>(g.a.buffer)], buffers[static_cast<int>(g.b.buffer)],
                buffers[static_cast<int>(g.c.buffer)], d);
  cpu::RoundToType(round, d, g.d.ld * g.n);
}

// X <- X / max(||X||_F, eps), in the compute dtype's precision.
// fp16 (whose range bf16's and fp32's values can pass) normalizes in fp32,
// then rounds, as gram-newton-schulz does; bf16 rounds first, as torch.
void CpuBackend::Normalize(const NsConfig& config, float* x, int64_t elems) {
  const float norm = NormalizingDivisor(config, x, elems);
  DivideRounded(config.dtype, x, elems, norm);
}

void CpuBackend::DivideRounded(NsDtype dtype, float* x, int64_t elems, float d) {
  cpu::Divide(x, elems, d, dtype == NsDtype::kBF16);
  if (dtype == NsDtype::kFP16) cpu::RoundToF16(x, elems);
}

int CpuBackend::RoundType(const NsConfig& config) {
  switch (config.dtype) {
    case NsDtype::kBF16: return ew::kBF16;
    case NsDtype::kFP16: return ew::kF16;
    default: return ew::kF32;
  }
}

float CpuBackend::NormalizingDivisor(const NsConfig& config, float* x, int64_t elems) {
  const bool bf16 = config.dtype == NsDtype::kBF16;
  if (bf16) cpu::RoundToBf16(x, elems);
  return DivisorOfSum(config, cpu::SumSquares(x, elems));
}

float CpuBackend::DivisorOfSum(const NsConfig& config, double sum_of_squares) {
  if (config.aol) return 1.0f;  // pre-scaled instead (AolPrescale): x / 1 is x
  const bool bf16 = config.dtype == NsDtype::kBF16;
  float norm = static_cast<float>(std::sqrt(sum_of_squares));
  if (bf16) norm = RoundToBf16(norm);
  norm = std::max(norm, static_cast<float>(config.eps));
  if (bf16) norm = RoundToBf16(norm);
  return norm;
}

absl::Status CpuBackend::OrthogonalizeNativeBf16(const NsConfig& config,
                                                 const NsProgram& program, float* u,
                                                 const float* first_gram) {
  const int64_t elems = program.x_elems, gram = program.gram_elems;
  // bf16 x, x_next, gram, poly: half the floats of the workspace's layout.
  auto* ws = reinterpret_cast<uint16_t*>(work_);
  uint16_t* buffers[4] = {ws, ws + elems, ws + 2 * elems, ws + 2 * elems + gram};
  if (first_gram != nullptr) cpu::ToBf16(first_gram, gram, buffers[2]);  // exact: bf16 values
  // x = u / norm in bf16: exact in bf16 from here on (u itself is not
  // divided: its memory takes the result at the end).
  // With oneDNN a tall matrix runs as its transpose, the wide program: oneDNN
  // multiplies the wide layout's operands 2x faster than the tall one's,
  // which would read X transposed in the gram product; the transposes cost
  // one pass. The AMX kernel packs either layout as fast: no transposes.
  const int64_t m = program.m, n = program.n;
  const bool transpose = program.tall && native_bf16_->PrefersWide();
  const NsProgram& runs = transpose ? PlanNewtonSchulz(1, m, n) : program;
  // The element-wise passes and the sum of squares over the whole matrix on
  // the rank's threads, chunk by chunk.
  const int threads = cpu::ThreadsPerRankHere();
  cpu::SplitIntoChunks(1, [&](size_t) { return elems; }, &ns_chunks_);
  if (transpose) {
    cpu::Divide(u, elems, NormalizingDivisor(config, u, elems), true);
    cpu::TransposeToBf16(u, n, m, buffers[0]);  // u: n x m row-major, x: m x n
  } else {
    // u read twice, rounded to bf16 on the fly (not written back).
    const float norm = DivisorOfSum(config, ChunkedSumOfSquares(threads, [&](const cpu::Chunk& c) {
                                      return cpu::SumSquaresAsBf16(u + c.begin, c.end - c.begin);
                                    }));
    uint16_t* x0 = buffers[0];
    cpu::RunChunks(ns_chunks_, threads, [&](const cpu::Chunk& c) {
      cpu::DivideToBf16(u + c.begin, c.end - c.begin, norm, x0 + c.begin);
    });
  }
  MUON_RETURN_IF_ERROR(RunNativeIterations(config, runs, buffers, first_gram != nullptr));
  const uint16_t* x = buffers[static_cast<int>(NsBuffer::kX)];
  if (transpose) {
    cpu::TransposeFromBf16(x, m, n, u);
  } else {
    cpu::RunChunks(ns_chunks_, threads, [&](const cpu::Chunk& c) {
      cpu::FromBf16(x + c.begin, c.end - c.begin, u + c.begin);
    });
  }
  return absl::OkStatus();
}

double CpuBackend::ChunkedSumOfSquares(int threads,
                                       absl::FunctionRef<double(const cpu::Chunk&)> sum) {
  partial_sums_.assign(ns_chunks_.size(), 0.0);
  cpu::RunChunks(ns_chunks_, threads, [&](const cpu::Chunk& c) {
    partial_sums_[static_cast<size_t>(c.begin / cpu::kChunkElements)] = sum(c);
  });
  double total = 0.0;
  for (double s : partial_sums_) total += s;
  return total;
}

absl::Status CpuBackend::RunNativeIterations(const NsConfig& config, const NsProgram& program,
                                             uint16_t** buffers, bool gram_ready) {
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    const NsIterationProducts products = ProductsFor(program, abc);
    // The gram comes first; AOL's first one is in place already.
    for (auto g = products.begin() + (it == 0 && gram_ready ? 1 : 0); g != products.end(); ++g) {
      MUON_RETURN_IF_ERROR(native_bf16_->Run(**g, NsScalarValue((*g)->alpha, abc),
                                             NsScalarValue((*g)->beta, abc), buffers));
      ++native_products_;
    }
    std::swap(buffers[static_cast<int>(NsBuffer::kX)], buffers[static_cast<int>(NsBuffer::kXNext)]);
  }
  return absl::OkStatus();
}

DType CpuBackend::SlotDtype(const NsConfig& config) {
  return config.dtype == NsDtype::kBF16 && config.algorithm == NsAlgorithm::kStandard &&
                 NativeBf16() && !native_bf16_->PrefersWide()
             ? DType::kBF16
             : DType::kF32;
}

absl::Status CpuBackend::OrthogonalizeBf16(const NsConfig& config, const NsProgram& program,
                                           uint16_t* u, const float* first_gram) {
  const int64_t elems = program.x_elems, gram = program.gram_elems;
  auto* ws = reinterpret_cast<uint16_t*>(work_);
  // X alternates between u and the workspace; starting in the workspace when
  // the iterations are odd leaves the result in u (no copy either way).
  const bool odd = config.steps % 2 == 1;
  uint16_t* buffers[4] = {odd ? ws : u, odd ? u : ws, ws + 2 * elems, ws + 2 * elems + gram};
  if (first_gram != nullptr) cpu::ToBf16(first_gram, gram, buffers[2]);  // exact: bf16 values
  // u holds bf16 values: what the fp32 path rounds to first.
  const int threads = cpu::ThreadsPerRankHere();
  cpu::SplitIntoChunks(1, [&](size_t) { return elems; }, &ns_chunks_);
  const float norm = DivisorOfSum(config, ChunkedSumOfSquares(threads, [&](const cpu::Chunk& c) {
                                    return cpu::SumSquaresBf16(u + c.begin, c.end - c.begin);
                                  }));
  uint16_t* x0 = buffers[static_cast<int>(NsBuffer::kX)];
  cpu::RunChunks(ns_chunks_, threads, [&](const cpu::Chunk& c) {
    cpu::DivideBf16(u + c.begin, c.end - c.begin, norm, x0 + c.begin);
  });
  return RunNativeIterations(config, program, buffers, first_gram != nullptr);
}

void CpuBackend::OrthogonalizeFp32(const NsConfig& config, const NsProgram& program, float* u,
                                   const float* first_gram) {
  const int64_t elems = program.x_elems;
  float* gram = work_ + elems;
  float* poly = gram + program.gram_elems;
  if (first_gram != nullptr) std::copy(first_gram, first_gram + program.gram_elems, gram);
  // X alternates between u and the workspace; starting in the workspace when
  // the iterations are odd leaves the result in u.
  float* x = u;
  float* x_next = work_;
  const float norm = NormalizingDivisor(config, u, elems);
  if (config.steps % 2 == 1) {
    cpu::DivideInto(u, elems, norm, work_);
    std::swap(x, x_next);
  } else {
    cpu::Divide(u, elems, norm, false);
  }
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    const float a = static_cast<float>(abc[0]), b = static_cast<float>(abc[1]),
                c = static_cast<float>(abc[2]);
    // gram = W W^T; poly = c gram gram + b gram + a I (a cubic iteration,
    // c == 0, skips the product): b gram and a X folded into the one
    // product of the update, W' = poly W.
    if (it > 0 || first_gram == nullptr) products_.Gram(program, x, gram);
    products_.Polynomial(program.m, gram, a, b, c, poly);
    products_.TimesW(program, poly, x, x_next);
    std::swap(x, x_next);
  }
}

void CpuBackend::OrthogonalizeOne(const NsConfig& config, const NsProgram& program, float* u,
                                  const float* first_gram) {
  const int round = RoundType(config);
  const int64_t elems = program.x_elems;
  // X is the matrix itself (it is the caller's working copy), X' the
  // workspace: one m x n buffer less than a copy would take.
  float* buffers[4] = {u, work_, work_ + elems, work_ + elems + program.gram_elems};
  if (first_gram != nullptr) std::copy(first_gram, first_gram + program.gram_elems, buffers[2]);
  float* x = u;
  Normalize(config, x, elems);

  // No transpose: the program reads either orientation as stored.
  for (int it = 0; it < config.steps; ++it) {
    const NsCoefficients& abc = config.ForIteration(it);
    const NsIterationProducts products = ProductsFor(program, abc);
    for (auto g = products.begin() + (it == 0 && first_gram != nullptr ? 1 : 0);
         g != products.end(); ++g) {
      RunGemm(**g, abc, buffers, round);
    }
    std::swap(buffers[static_cast<int>(NsBuffer::kX)], buffers[static_cast<int>(NsBuffer::kXNext)]);
  }
  x = buffers[static_cast<int>(NsBuffer::kX)];
  if (x != u) std::copy(x, x + elems, u);
}

}  // namespace muon
