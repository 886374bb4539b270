#include "muon/device/testing/strict_gpu.h"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/common/dtype.h"
#include "muon/device/gpu_device.h"
#include "muon/math/cpu/cpu_backend.h"

namespace muon {
namespace {

std::atomic<int> g_fail_momentum{-1};

// Per device ordinal: the element-wise launches issued (multi-tensor: one
// per step each).
constexpr int kMaxOrdinals = 64;
std::atomic<int64_t> g_momentum_launches[kMaxOrdinals];
std::atomic<int64_t> g_apply_launches[kMaxOrdinals];
std::atomic<int64_t> g_count_launches[kMaxOrdinals];

void CountLaunch(std::atomic<int64_t>* counters, int ordinal) {
  if (ordinal >= 0 && ordinal < kMaxOrdinals) counters[ordinal].fetch_add(1);
}

// The math of a GPU backend as the runtime sees it: device pointers only,
// everything stream-ordered, nothing waited for.
class StrictMath final : public MathBackend {
 public:
  StrictMath(std::shared_ptr<StrictCpuRuntime> rt, int ordinal)
      : rt_(std::move(rt)), ordinal_(ordinal) {}

  // The CPU backend's workspace in the device's memory (run on it only as
  // stream work, with the arena open).
  void SetMemorySource(MemorySource source) override { cpu_.SetMemorySource(std::move(source)); }

  absl::Status SetStream(void* stream) override {
    if (rt_->DeviceOfStream(stream) < 0) {
      return absl::InvalidArgumentError("binding the math: not a stream of the runtime");
    }
    stream_ = stream;
    return absl::OkStatus();
  }

  absl::Status Momentum(const MomentumStep& step, absl::Span<const MomentumArgs> tensors) override {
    int expected = ordinal_;
    if (g_fail_momentum.compare_exchange_strong(expected, -1)) {
      return absl::InternalError(
          absl::StrCat("the momentum kernel (injected failure on strict-cpu device ", ordinal_, ")"));
    }
    absl::Status st = rt_->CheckDeviceMemory(step.scalars, sizeof(StepScalars),
                                             "the momentum update: hyper-parameters");
    if (st.ok() && step.nonfinite != nullptr) {
      st = rt_->CheckDeviceMemory(step.nonfinite, 8, "the momentum update: non-finite counter");
    }
    for (const MomentumArgs& args : tensors) {
      const size_t n = static_cast<size_t>(args.n);
      if (st.ok()) {
        st = rt_->CheckDeviceMemory(args.grad, n * SizeOf(args.grad_dtype),
                                    "the momentum update: gradient");
      }
      if (st.ok()) {
        st = rt_->CheckDeviceMemory(args.buf, n * SizeOf(args.buf_dtype),
                                    "the momentum update: momentum buffer");
      }
      if (st.ok()) {
        st = rt_->CheckDeviceMemory(args.out, n * SizeOf(args.out_dtype),
                                    "the momentum update: output");
      }
    }
    if (!st.ok()) return st;
    CountLaunch(g_momentum_launches, ordinal_);
    std::vector<MomentumArgs> copy(tensors.begin(), tensors.end());  // as kernel arguments are
    return Run([this, step, copy] { return cpu_.Momentum(step, copy); });
  }

  absl::Status Apply(const ApplyStep& step, absl::Span<const ApplyArgs> tensors) override {
    absl::Status st = rt_->CheckDeviceMemory(step.scalars, sizeof(StepScalars),
                                             "the parameter update: hyper-parameters");
    if (st.ok() && step.gate != nullptr) {
      st = rt_->CheckDeviceMemory(step.gate, 4, "the parameter update: gate");
    }
    for (const ApplyArgs& args : tensors) {
      const size_t n = static_cast<size_t>(args.n);
      if (st.ok()) {
        st = rt_->CheckDeviceMemory(args.param, n * SizeOf(args.param_dtype),
                                    "the parameter update: parameter");
      }
      if (st.ok()) {
        st = rt_->CheckDeviceMemory(args.update, n * SizeOf(args.update_dtype),
                                    "the parameter update: update");
      }
    }
    if (!st.ok()) return st;
    CountLaunch(g_apply_launches, ordinal_);
    std::vector<ApplyArgs> copy(tensors.begin(), tensors.end());
    return Run([this, step, copy] { return cpu_.Apply(step, copy); });
  }

  absl::Status StoreBytes(void* dst, const void* src, size_t bytes) override {
    if (bytes > kMaxStoreBytes) return absl::InternalError("StoreBytes: too many bytes");
    absl::Status st = rt_->CheckDeviceMemory(dst, bytes, "storing bytes on the device");
    if (!st.ok()) return st;
    std::array<unsigned char, kMaxStoreBytes> value{};
    std::memcpy(value.data(), src, bytes);  // taken now, as a kernel argument is
    return Run([this, dst, value, bytes] { return cpu_.StoreBytes(dst, value.data(), bytes); });
  }

  // As cudaMemcpy2DAsync between device buffers: every byte a run touches
  // must lie in device memory (the first run to the last byte of the last).
  absl::Status CopyRuns(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t width, size_t height) override {
    if (height == 0 || width == 0) return absl::OkStatus();
    if (width > dst_pitch || width > src_pitch) {
      return absl::InvalidArgumentError("copying runs: a run is wider than its pitch");
    }
    absl::Status st = rt_->CheckDeviceMemory(src, (height - 1) * src_pitch + width,
                                             "copying runs: the source");
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(dst, (height - 1) * dst_pitch + width,
                                  "copying runs: the destination");
    }
    if (!st.ok()) return st;
    return Run([this, dst, dst_pitch, src, src_pitch, width, height] {
      return cpu_.CopyRuns(dst, dst_pitch, src, src_pitch, width, height);
    });
  }

  absl::Status ScaleRounded(const MatrixBatch& batch, float factor, NsDtype precision) override {
    const size_t bytes =
        static_cast<size_t>(batch.count * batch.rows * batch.cols) * SizeOf(batch.dtype);
    absl::Status st = rt_->CheckDeviceMemory(batch.data, bytes, "scaling split blocks");
    if (!st.ok()) return st;
    return Run(
        [this, batch, factor, precision] { return cpu_.ScaleRounded(batch, factor, precision); });
  }

  absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) override {
    const size_t bytes = static_cast<size_t>(batch.count * batch.rows * batch.cols) * SizeOf(batch.dtype);
    absl::Status st = rt_->CheckDeviceMemory(batch.data, bytes, "Newton-Schulz: the matrices");
    if (!st.ok()) return st;
    return Run([this, config, batch] { return cpu_.Orthogonalize(config, batch); });
  }

  // NorMuon as the CUDA backend runs it: stream work on device memory (the
  // matrices and each stepped matrix's moments).
  absl::Status NorMuon(const NorMuonStep& step, const MatrixBatch& batch,
                       float* const* moments) override {
    const size_t bytes = static_cast<size_t>(batch.count * batch.rows * batch.cols) * SizeOf(batch.dtype);
    absl::Status st = rt_->CheckDeviceMemory(batch.data, bytes, "NorMuon: the matrices");
    std::vector<float*> kept(moments, moments + batch.count);  // taken now, as kernel arguments
    for (float* m : kept) {
      if (st.ok() && m != nullptr) {
        st = rt_->CheckDeviceMemory(m, static_cast<size_t>(batch.rows) * sizeof(float),
                                    "NorMuon: the moments");
      }
    }
    if (!st.ok()) return st;
    return Run([this, step, batch, kept] { return cpu_.NorMuon(step, batch, kept.data()); });
  }

  // Split Newton-Schulz's steps (muon/math/split_ns.h) as a GPU backend
  // runs them: device memory only, stream work.
  absl::Status RowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                          int64_t out_rows, int64_t row0) override {
    absl::Status st = rt_->CheckDeviceMemory(x, static_cast<size_t>(rows * cols) * 4,
                                             "a split block's squares: the block");
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(out, static_cast<size_t>(out_rows) * 8,
                                  "a split block's squares: the sums");
    }
    if (!st.ok()) return st;
    return Run([=] { return cpu_.RowSquares(x, rows, cols, out, out_rows, row0); });
  }
  absl::Status NormDivisor(const NsConfig& config, const double* squares,
                           float* divisor) override {
    absl::Status st = rt_->CheckDeviceMemory(squares, 8, "a split block's norm: the squares");
    if (st.ok()) st = rt_->CheckDeviceMemory(divisor, 4, "a split block's norm: the divisor");
    if (!st.ok()) return st;
    return Run([this, config, squares, divisor] {
      return cpu_.NormDivisor(config, squares, divisor);
    });
  }
  absl::Status NorMuonDivisors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                               double eps, float* moments, float* divisors) override {
    const size_t n = static_cast<size_t>(rows);
    absl::Status st = rt_->CheckDeviceMemory(row_sq, n * 8, "NorMuon's divisors: the squares");
    if (st.ok()) st = rt_->CheckDeviceMemory(moments, n * 4, "NorMuon's divisors: the moments");
    if (st.ok()) st = rt_->CheckDeviceMemory(divisors, n * 4, "NorMuon's divisors: the divisors");
    if (!st.ok()) return st;
    return Run([=] {
      return cpu_.NorMuonDivisors(row_sq, rows, cols, beta2, eps, moments, divisors);
    });
  }
  absl::Status DivideRows(NsDtype dtype, float* x, int64_t rows, int64_t cols,
                          const float* divisors) override {
    absl::Status st = rt_->CheckDeviceMemory(x, static_cast<size_t>(rows * cols) * 4,
                                             "dividing rows: the matrix");
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(divisors, static_cast<size_t>(rows) * 4,
                                  "dividing rows: the divisors");
    }
    if (!st.ok()) return st;
    return Run([=] { return cpu_.DivideRows(dtype, x, rows, cols, divisors); });
  }
  // Every operand's extent (its columns at its leading dimension) in device
  // memory, as cuBLASLt reads and writes them.
  absl::Status RunProduct(const NsGemm& g, const NsCoefficients& abc, float* const* buffers,
                          NsDtype round) override {
    const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
    const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
    const struct {
      const NsOperand* o;
      int64_t rows, cols;
      const char* what;
    } operands[] = {{&g.a, a_rows, a_cols, "a program product: A"},
                    {&g.b, b_rows, b_cols, "a program product: B"},
                    {&g.c, g.m, g.n, "a program product: C"},
                    {&g.d, g.m, g.n, "a program product: D"}};
    for (const auto& op : operands) {
      const size_t elems = static_cast<size_t>((op.cols - 1) * op.o->ld + op.rows);
      absl::Status st = rt_->CheckDeviceMemory(buffers[static_cast<int>(op.o->buffer)],
                                               elems * 4, op.what);
      if (!st.ok()) return st;
    }
    std::array<float*, 4> kept{buffers[0], buffers[1], buffers[2], buffers[3]};
    return Run([this, g, abc, kept, round] { return cpu_.RunProduct(g, abc, kept.data(), round); });
  }
  absl::Status SumInOrder(bool f64, const void* parts, int64_t count, int64_t len,
                          void* out) override {
    const size_t elem = f64 ? 8 : 4;
    absl::Status st = rt_->CheckDeviceMemory(parts, static_cast<size_t>(count * len) * elem,
                                             "summing the members' parts: the parts");
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(out, static_cast<size_t>(len) * elem,
                                  "summing the members' parts: the sum");
    }
    if (!st.ok()) return st;
    return Run([=] { return cpu_.SumInOrder(f64, parts, count, len, out); });
  }

  absl::Status AddIdentity(const float* z, int64_t m, float a, NsDtype round, float* q) override {
    const size_t bytes = static_cast<size_t>(m * m) * 4;
    absl::Status st = rt_->CheckDeviceMemory(z, bytes, "Gram Newton-Schulz's Q: Z");
    if (st.ok()) st = rt_->CheckDeviceMemory(q, bytes, "Gram Newton-Schulz's Q: Q");
    if (!st.ok()) return st;
    return Run([=] { return cpu_.AddIdentity(z, m, a, round, q); });
  }
  absl::Status AolScale(const NsConfig& config, float* x, int64_t rows, int64_t cols, bool tall,
                        float* gram, double* scales) override {
    const int64_t m = tall ? cols : rows;
    absl::Status st = rt_->CheckDeviceMemory(x, static_cast<size_t>(rows * cols) * 4,
                                             "AOL's scaling: the block");
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(gram, static_cast<size_t>(m * m) * 4, "AOL's scaling: the gram");
    }
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(scales, static_cast<size_t>(m) * 8, "AOL's scaling: the scales");
    }
    if (!st.ok()) return st;
    return Run([=] { return cpu_.AolScale(config, x, rows, cols, tall, gram, scales); });
  }

  absl::Status CountNonFinite(DType dtype, const void* data, int64_t n,
                              int64_t* counter) override {
    absl::Status st = rt_->CheckDeviceMemory(data, static_cast<size_t>(n) * SizeOf(dtype),
                                             "counting non-finite gradients: data");
    if (st.ok()) st = rt_->CheckDeviceMemory(counter, 8, "counting non-finite gradients: counter");
    if (!st.ok()) return st;
    CountLaunch(g_count_launches, ordinal_);
    return Run([this, dtype, data, n, counter] { return cpu_.CountNonFinite(dtype, data, n, counter); });
  }
  // One launch for every tensor (as the CUDA backend's multi-tensor kernel).
  absl::Status CountNonFiniteAll(absl::Span<const CountArgs> tensors, int64_t* counter) override {
    absl::Status st = rt_->CheckDeviceMemory(counter, 8, "counting non-finite gradients: counter");
    for (const CountArgs& t : tensors) {
      if (st.ok() && t.n > 0) {
        st = rt_->CheckDeviceMemory(t.data, static_cast<size_t>(t.n) * SizeOf(t.dtype),
                                    "counting non-finite gradients: data");
      }
    }
    if (!st.ok()) return st;
    CountLaunch(g_count_launches, ordinal_);
    std::vector<CountArgs> copy(tensors.begin(), tensors.end());
    return Run([this, copy, counter] { return cpu_.CountNonFiniteAll(copy, counter); });
  }
  absl::Status VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                           int32_t* flag) override {
    absl::Status st = rt_->CheckDeviceMemory(verdicts, static_cast<size_t>(n) * 16,
                                             "the step's go-ahead: verdicts");
    if (st.ok()) st = rt_->CheckDeviceMemory(flag, 4, "the step's go-ahead: flag");
    if (!st.ok()) return st;
    return Run([this, verdicts, n, magic, flag] { return cpu_.VerdictGate(verdicts, n, magic, flag); });
  }

  // On the host thread, not as stream work, and without mu_: growing the
  // workspace frees the old one through the runtime, which (as cudaFree)
  // first runs this device's pending work, whose math takes mu_.
  absl::Status Reserve(const NsConfig& config, int64_t count, int64_t rows,
                       int64_t cols) override {
    if (absl::Status st = Supports(config); !st.ok()) return st;
    return cpu_.Reserve(config, count, rows, cols);
  }
  // What the CUDA backend refuses for good, refused alike: fp16 AOL. (Its
  // AOL before a GPU has proven it is a gate of that backend's, not
  // mirrored: the strict GPU runs AOL, so that CI proves the engine's part.)
  absl::Status Supports(const NsConfig& config) const override {
    if (config.aol && config.dtype == NsDtype::kFP16) {
      return absl::UnimplementedError(
          "ns_coefficients AOL with ns_dtype fp16 runs on the CPU backend only");
    }
    return cpu_.Supports(config);
  }

 private:
  template <typename Fn>
  absl::Status Run(Fn fn) {
    return rt_->Enqueue(stream_, [this, fn] {
      std::lock_guard<std::mutex> lock(mu_);  // streams of one device may run on two threads
      return fn();
    });
  }

  std::shared_ptr<StrictCpuRuntime> rt_;
  int ordinal_;
  void* stream_ = nullptr;
  std::mutex mu_;
  CpuBackend cpu_;
};

}  // namespace

std::unique_ptr<Device> MakeStrictGpuDevice(std::shared_ptr<StrictCpuRuntime> runtime,
                                            int ordinal) {
  auto math = std::make_unique<StrictMath>(runtime, ordinal);
  return MakeGpuDevice(std::move(runtime), ordinal, std::move(math));
}

void FailNextMomentum(int ordinal) { g_fail_momentum.store(ordinal); }

StrictLaunches LaunchesOn(int ordinal) {
  StrictLaunches l;
  if (ordinal >= 0 && ordinal < kMaxOrdinals) {
    l.momentum = g_momentum_launches[ordinal].load();
    l.apply = g_apply_launches[ordinal].load();
    l.count = g_count_launches[ordinal].load();
  }
  return l;
}

}  // namespace muon
