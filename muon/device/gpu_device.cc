#include "muon/device/gpu_device.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/common/dtype.h"

namespace muon {
namespace {

// Makes `ordinal` the calling thread's current device for a scope and puts
// the previous one back.
class OnDevice {
 public:
  OnDevice(GpuRuntime& rt, int ordinal) : rt_(rt) {
    absl::StatusOr<int> now = rt.GetDevice();
    if (!now.ok()) {
      status_ = now.status();
    } else if (*now != ordinal) {
      previous_ = *now;
      status_ = rt.SetDevice(ordinal);
    }
  }
  ~OnDevice() {
    if (previous_ >= 0 && status_.ok()) (void)rt_.SetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  GpuRuntime& rt_;
  int previous_ = -1;
  absl::Status status_;
};

#define MUON_ON_DEVICE(rt, ordinal, what)                                                   \
  OnDevice on_device_(rt, ordinal);                                                         \
  if (!on_device_.status().ok()) {                                                          \
    return absl::Status(on_device_.status().code(),                                         \
                        absl::StrCat(what, ": selecting the GPU: ", on_device_.status().message())); \
  }

// Its descriptors are the device's memory (Allocate): it must not outlive
// the device that prepared it.
class GpuProgram final : public CopyProgram {
 public:
  explicit GpuProgram(Device* device) : device_(device) {}
  ~GpuProgram() override { device_->Free(chunks_); }
  int64_t elements() const override { return elements_; }

  Device* device_;
  GpuCopyChunk* chunks_ = nullptr;  // device array
  int64_t count_ = 0;
  int64_t elements_ = 0;
};

// The math, called with the GPU current, whichever thread calls (a helper
// thread starts on device 0).
class GuardedMath final : public MathBackend {
 public:
  GuardedMath(std::shared_ptr<GpuRuntime> rt, int ordinal, std::unique_ptr<MathBackend> math)
      : rt_(std::move(rt)), ordinal_(ordinal), math_(std::move(math)) {}
  absl::Status SetStream(void* stream) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "binding the math to the stream");
    return math_->SetStream(stream);
  }
  void SetMemorySource(MemorySource source) override {
    if (math_ != nullptr) math_->SetMemorySource(std::move(source));
  }
  // Destroys the backend (its memory goes back to the device).
  void Release() {
    OnDevice on(*rt_, ordinal_);
    math_.reset();
  }
  absl::Status Momentum(const MomentumStep& step, absl::Span<const MomentumArgs> tensors) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "the momentum update");
    return math_->Momentum(step, tensors);
  }
  absl::Status Apply(const ApplyStep& step, absl::Span<const ApplyArgs> tensors) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "the parameter update");
    return math_->Apply(step, tensors);
  }
  absl::Status StoreBytes(void* dst, const void* src, size_t bytes) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "storing bytes on the GPU");
    return math_->StoreBytes(dst, src, bytes);
  }
  absl::Status CopyRuns(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t width, size_t height) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "copying split blocks");
    return math_->CopyRuns(dst, dst_pitch, src, src_pitch, width, height);
  }
  absl::Status ScaleRounded(const MatrixBatch& batch, float factor, NsDtype precision) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "scaling split blocks");
    return math_->ScaleRounded(batch, factor, precision);
  }
  DType SlotDtype(const NsConfig& config) override {
    return math_ != nullptr ? math_->SlotDtype(config) : DType::kF32;
  }
  absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "Newton-Schulz");
    return math_->Orthogonalize(config, batch);
  }
  absl::Status NorMuon(const NorMuonStep& step, const MatrixBatch& batch,
                       float* const* moments) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "NorMuon");
    return math_->NorMuon(step, batch, moments);
  }
  absl::Status RowSquares(const float* x, int64_t rows, int64_t cols, double* out,
                          int64_t out_rows, int64_t row0) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "a split block's squares");
    return math_->RowSquares(x, rows, cols, out, out_rows, row0);
  }
  absl::Status NormDivisor(const NsConfig& config, const double* squares,
                           float* divisor) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "a split block's norm");
    return math_->NormDivisor(config, squares, divisor);
  }
  absl::Status NorMuonDivisors(const double* row_sq, int64_t rows, int64_t cols, double beta2,
                               double eps, float* moments, float* divisors) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "NorMuon's divisors");
    return math_->NorMuonDivisors(row_sq, rows, cols, beta2, eps, moments, divisors);
  }
  absl::Status DivideRows(NsDtype dtype, float* x, int64_t rows, int64_t cols,
                          const float* divisors) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "dividing a split block's rows");
    return math_->DivideRows(dtype, x, rows, cols, divisors);
  }
  absl::Status RunProduct(const NsGemm& g, const NsCoefficients& abc, float* const* buffers,
                          NsDtype round) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "a split block's product");
    return math_->RunProduct(g, abc, buffers, round);
  }
  absl::Status SumInOrder(bool f64, const void* parts, int64_t count, int64_t len,
                          void* out) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "summing the members' parts");
    return math_->SumInOrder(f64, parts, count, len, out);
  }
  absl::Status AddIdentity(const float* z, int64_t m, float a, NsDtype round, float* q) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "Gram Newton-Schulz's Q of a split block");
    return math_->AddIdentity(z, m, a, round, q);
  }
  absl::Status AolScale(const NsConfig& config, float* x, int64_t rows, int64_t cols, bool tall,
                        float* gram, double* scales) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "AOL's scaling of a split block");
    return math_->AolScale(config, x, rows, cols, tall, gram, scales);
  }
  absl::Status Supports(const NsConfig& config) const override {
    return math_->Supports(config);
  }
  absl::Status CountNonFinite(DType dtype, const void* data, int64_t n,
                              int64_t* counter) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "counting non-finite gradients");
    return math_->CountNonFinite(dtype, data, n, counter);
  }
  absl::Status CountNonFiniteAll(absl::Span<const CountArgs> tensors, int64_t* counter) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "counting non-finite gradients");
    return math_->CountNonFiniteAll(tensors, counter);
  }
  absl::Status VerdictGate(const void* verdicts, int64_t n, uint32_t magic,
                           int32_t* flag) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "the step's go-ahead");
    return math_->VerdictGate(verdicts, n, magic, flag);
  }
  absl::Status Reserve(const NsConfig& config, int64_t count, int64_t rows,
                       int64_t cols) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "reserving the Newton-Schulz workspace");
    return math_->Reserve(config, count, rows, cols);
  }

 private:
  std::shared_ptr<GpuRuntime> rt_;
  int ordinal_;
  std::unique_ptr<MathBackend> math_;
};

class GpuDevice final : public Device {
 public:
  GpuDevice(std::shared_ptr<GpuRuntime> rt, int ordinal, std::unique_ptr<MathBackend> math)
      : rt_(rt), ordinal_(ordinal), math_(rt, ordinal, std::move(math)) {
    math_.SetMemorySource(MemorySourceOf(this));
  }
  // A communication lane of `parent`, on `stream` (owned).
  GpuDevice(GpuDevice* parent, GpuStream stream)
      : rt_(parent->rt_), ordinal_(parent->ordinal_), math_(rt_, ordinal_, nullptr),
        parent_(parent), stream_(stream), used_(true) {}

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool is_host() const override { return false; }
  MathBackend& math() override { return parent_ != nullptr ? parent_->math() : math_; }

  absl::StatusOr<Lane> CommLane() override {
    if (parent_ != nullptr) return absl::InternalError("a lane has no lane of its own");
    if (lane_ == nullptr) {
      MUON_ON_DEVICE(*rt_, ordinal_, "creating the communication stream");
      absl::StatusOr<GpuStream> s = rt_->StreamCreate();
      if (!s.ok()) return s.status();
      lane_ = std::make_unique<GpuDevice>(this, *s);
    }
    return Lane{lane_.get(), lane_->stream_};
  }

  absl::Status ReserveSignals(int count) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "creating the stream's events");
    while (static_cast<int>(signals_.size()) < count) {
      absl::StatusOr<GpuEvent> e = rt_->EventCreate();
      if (!e.ok()) return e.status();
      signals_.push_back(*e);
    }
    return absl::OkStatus();
  }
  absl::Status Signal(int k) override {
    if (k < 0 || k >= static_cast<int>(signals_.size())) {
      return absl::InternalError(absl::StrCat("stream signal ", k, " was not reserved"));
    }
    MUON_ON_DEVICE(*rt_, ordinal_, "recording a stream point");
    return rt_->EventRecord(signals_[static_cast<size_t>(k)], stream_);
  }
  absl::Status AwaitSignal(Device& from, int k) override {
    auto& other = static_cast<GpuDevice&>(from);
    if (k < 0 || k >= static_cast<int>(other.signals_.size())) {
      return absl::InternalError(absl::StrCat("stream signal ", k, " was not reserved"));
    }
    MUON_ON_DEVICE(*rt_, ordinal_, "ordering one stream after another");
    return rt_->StreamWaitEvent(stream_, other.signals_[static_cast<size_t>(k)]);
  }

  absl::Status SetStream(void* stream) override {
    if (parent_ != nullptr) return absl::InternalError("a lane's stream is its own");
    if (stream != stream_ && ended_ && !IsCapturing(stream)) {
      // Another stream than the last call's: it waits for where that call
      // ended (an event, no host wait; see device.h).
      MUON_ON_DEVICE(*rt_, ordinal_, "ordering the new stream after the last");
      absl::Status st = rt_->StreamWaitEvent(stream, switch_);
      if (!st.ok()) return st;
    }
    stream_ = stream;
    used_ = true;
    set_in_call_ = true;
    return math_.SetStream(stream);
  }

  void EndCall() override {
    // Only a stream this call set (an earlier call's the host may have destroyed).
    const bool set = set_in_call_;
    set_in_call_ = false;
    if (parent_ != nullptr || !set || IsCapturing(stream_)) return;
    OnDevice on(*rt_, ordinal_);
    if (switch_ == nullptr) {
      absl::StatusOr<GpuEvent> e = rt_->EventCreate();
      if (!e.ok()) return;  // (nothing marked: the next stream has nothing to wait for)
      switch_ = *e;
    }
    ended_ = rt_->EventRecord(switch_, stream_).ok();
  }

  bool IsCapturing(GpuStream stream) {
    absl::StatusOr<bool> c = rt_->IsCapturing(stream);
    return c.ok() && *c;
  }

  absl::StatusOr<int> Bind() override {
    absl::StatusOr<int> now = rt_->GetDevice();
    if (!now.ok()) return now.status();
    if (*now != ordinal_) {
      absl::Status st = rt_->SetDevice(ordinal_);
      if (!st.ok()) return st;
    }
    return *now;
  }
  void Unbind(int previous) override {
    if (previous >= 0 && previous != ordinal_) (void)rt_->SetDevice(previous);
  }

  absl::StatusOr<std::unique_ptr<CopyProgram>> Prepare(const std::vector<CopyOp>& ops) override {
    std::vector<GpuCopyChunk> chunks;
    auto program = std::make_unique<GpuProgram>(this);
    for (const CopyOp& op : ops) {
      program->elements_ += op.n;
      const size_t src_size = SizeOf(op.src_type), dst_size = SizeOf(op.dst_type);
      for (int64_t at = 0; at < op.n; at += kGpuChunkElems) {
        GpuCopyChunk c;
        c.src = static_cast<const char*>(op.src) + at * src_size;
        c.dst = static_cast<char*>(op.dst) + at * dst_size;
        c.n = static_cast<int32_t>(std::min<int64_t>(kGpuChunkElems, op.n - at));
        c.src_type = static_cast<uint8_t>(op.src_type);
        c.dst_type = static_cast<uint8_t>(op.dst_type);
        c.via = static_cast<uint8_t>(op.via);
        c.pad = 0;
        chunks.push_back(c);
      }
    }
    program->count_ = static_cast<int64_t>(chunks.size());
    if (chunks.empty()) return std::unique_ptr<CopyProgram>(std::move(program));
    const size_t bytes = chunks.size() * sizeof(GpuCopyChunk);
    absl::StatusOr<void*> mem = Allocate(bytes, "the exchange's copy descriptors");
    if (!mem.ok()) return mem.status();
    program->chunks_ = static_cast<GpuCopyChunk*>(*mem);
    // `chunks` is read when the stream reaches the copy: wait for it here.
    absl::Status st = FromHost(program->chunks_, chunks.data(), bytes);
    if (!st.ok()) return st;
    return std::unique_ptr<CopyProgram>(std::move(program));
  }

  absl::Status Run(const CopyProgram& program) override {
    const auto& p = static_cast<const GpuProgram&>(program);
    if (p.count_ == 0) return absl::OkStatus();
    MUON_ON_DEVICE(*rt_, ordinal_, "the exchange copy kernel");
    return rt_->LaunchCopyChunks(p.chunks_, p.count_, stream_, "the exchange copy kernel");
  }

  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "copying optimizer state to the host");
    absl::Status st = rt_->MemcpyAsync(host, device, bytes, CopyKind::kDeviceToHost, stream_,
                                       "copying optimizer state to the host");
    if (st.ok()) st = rt_->StreamSynchronize(stream_, "copying optimizer state to the host");
    return st;
  }

  absl::Status FromHost(void* device, const void* host, size_t bytes) override {
    MUON_ON_DEVICE(*rt_, ordinal_, "copying optimizer state to the GPU");
    absl::Status st = rt_->MemcpyAsync(device, host, bytes, CopyKind::kHostToDevice, stream_,
                                       "copying optimizer state to the GPU");
    // `host` may go away when this returns: the copy must have run.
    if (st.ok()) st = rt_->StreamSynchronize(stream_, "copying optimizer state to the GPU");
    return st;
  }

  absl::Status CopyBytes(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MUON_ON_DEVICE(*rt_, ordinal_, "copying on the GPU");
    return rt_->MemcpyAsync(dst, src, bytes, CopyKind::kDeviceToDevice, stream_,
                            "copying on the GPU");
  }

  absl::Status FromHostAsync(void* device, const void* host, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MUON_ON_DEVICE(*rt_, ordinal_, "copying to the GPU");
    return rt_->MemcpyAsync(device, host, bytes, CopyKind::kHostToDevice, stream_,
                            "copying to the GPU");
  }
  absl::Status ToHostAsync(void* host, const void* device, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MUON_ON_DEVICE(*rt_, ordinal_, "copying to the host");
    return rt_->MemcpyAsync(host, device, bytes, CopyKind::kDeviceToHost, stream_,
                            "copying to the host");
  }
  absl::Status ZeroAsync(void* device, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    MUON_ON_DEVICE(*rt_, ordinal_, "zeroing on the GPU");
    return rt_->MemsetAsync(device, 0, bytes, stream_, "zeroing on the GPU");
  }
  bool Capturing() override { return IsCapturing(stream_); }
  absl::StatusOr<void*> AllocateStaging(size_t bytes, const std::string& what) override {
    MUON_ON_DEVICE(*rt_, ordinal_, absl::StrCat("allocating ", what));
    return rt_->HostAlloc(bytes, absl::StrCat("allocating ", what, " (", bytes,
                                              " bytes of page-locked host memory)"));
  }
  void FreeStaging(void* ptr) override { rt_->HostFree(ptr); }
  absl::Status Mark() override {
    MUON_ON_DEVICE(*rt_, ordinal_, "marking the stream");
    if (mark_ == nullptr) {
      absl::StatusOr<GpuEvent> e = rt_->EventCreate();
      if (!e.ok()) return e.status();
      mark_ = *e;
    }
    return rt_->EventRecord(mark_, stream_);
  }
  absl::Status WaitMark() override {
    if (mark_ == nullptr) return absl::OkStatus();
    MUON_ON_DEVICE(*rt_, ordinal_, "waiting for the stream's mark");
    return rt_->EventSynchronize(mark_, "waiting for the last step's verdicts");
  }

  ~GpuDevice() override {
    lane_.reset();
    math_.Release();  // its workspace goes back while this device still is
    OnDevice on(*rt_, ordinal_);
    if (mark_ != nullptr) rt_->EventDestroy(mark_);
    if (switch_ != nullptr) rt_->EventDestroy(switch_);
    for (GpuEvent e : signals_) rt_->EventDestroy(e);
    if (parent_ != nullptr) rt_->StreamDestroy(stream_);  // its work completes first
  }

 protected:
  absl::StatusOr<void*> AllocateOwn(size_t bytes, const std::string& what) override {
    MUON_ON_DEVICE(*rt_, ordinal_, absl::StrCat("allocating ", what));
    absl::StatusOr<void*> p =
        rt_->Malloc(bytes, absl::StrCat("allocating ", what, " (", bytes, " bytes on ", name(), ")"));
    if (!p.ok()) return p.status();
    absl::Status st = ZeroNew(*p, bytes, what);
    if (!st.ok()) {
      rt_->Free(*p);
      return st;
    }
    return p;
  }
  void FreeOwn(void* ptr) override {
    OnDevice on(*rt_, ordinal_);
    rt_->Free(ptr);
  }
  // Zeroed on the step's stream before anything else uses it; setup only.
  absl::Status ZeroNew(void* ptr, size_t bytes, const std::string& what) override {
    MUON_ON_DEVICE(*rt_, ordinal_, absl::StrCat("zeroing ", what));
    absl::Status st = rt_->MemsetAsync(ptr, 0, bytes, stream_, absl::StrCat("zeroing ", what));
    if (st.ok()) st = rt_->StreamSynchronize(stream_, absl::StrCat("zeroing ", what));
    return st;
  }
  int32_t dl_device_type() const override { return 2; }  // kDLCUDA
  int32_t dl_device_id() const override { return ordinal_; }
  void* current_stream() const override { return stream_; }

 private:
  std::shared_ptr<GpuRuntime> rt_;
  int ordinal_;
  GuardedMath math_;
  GpuDevice* parent_ = nullptr;       // set on a lane
  std::unique_ptr<GpuDevice> lane_;   // the communication lane, once made
  std::vector<GpuEvent> signals_;     // Signal's points
  void* stream_ = nullptr;
  bool used_ = false;           // a stream was set (work may be on it)
  GpuEvent mark_ = nullptr;
  GpuEvent switch_ = nullptr;   // where the last call ended (EndCall)
  bool ended_ = false;          // switch_ is recorded
  bool set_in_call_ = false;    // SetStream since the last EndCall
};

}  // namespace

std::unique_ptr<Device> MakeGpuDevice(std::shared_ptr<GpuRuntime> runtime, int ordinal,
                                      std::unique_ptr<MathBackend> math) {
  return std::make_unique<GpuDevice>(std::move(runtime), ordinal, std::move(math));
}

}  // namespace muon
