#include "muon/device/testing/strict_gpu.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/dtype.h"
#include "muon/device/gpu_device.h"
#include "muon/math/cpu/cpu_backend.h"

namespace muon {
namespace {

// The math of a GPU backend as the runtime sees it: device pointers only,
// everything stream-ordered, nothing waited for.
class StrictMath final : public MathBackend {
 public:
  explicit StrictMath(std::shared_ptr<StrictCpuRuntime> rt) : rt_(std::move(rt)) {}

  absl::Status SetStream(void* stream) override {
    if (rt_->DeviceOfStream(stream) < 0) {
      return absl::InvalidArgumentError("binding the math: not a stream of the runtime");
    }
    stream_ = stream;
    return absl::OkStatus();
  }

  absl::Status Momentum(const MomentumArgs& args) override {
    const size_t n = static_cast<size_t>(args.n);
    absl::Status st = rt_->CheckDeviceMemory(args.grad, n * SizeOf(args.grad_dtype),
                                             "the momentum update: gradient");
    if (st.ok()) {
      st = rt_->CheckDeviceMemory(args.buf, n * SizeOf(args.buf_dtype),
                                  "the momentum update: momentum buffer");
    }
    if (st.ok()) st = rt_->CheckDeviceMemory(args.out, n * 4, "the momentum update: output");
    if (!st.ok()) return st;
    if (args.nonfinite != nullptr) *args.nonfinite = -1;  // as the CUDA backend: not counted
    MomentumArgs a = args;
    a.nonfinite = nullptr;
    return Run([this, a] { return cpu_.Momentum(a); });
  }

  absl::Status Apply(const ApplyArgs& args) override {
    const size_t n = static_cast<size_t>(args.n);
    absl::Status st = rt_->CheckDeviceMemory(args.param, n * SizeOf(args.param_dtype),
                                             "the parameter update: parameter");
    if (st.ok()) st = rt_->CheckDeviceMemory(args.update, n * 4, "the parameter update: update");
    if (!st.ok()) return st;
    return Run([this, args] { return cpu_.Apply(args); });
  }

  absl::Status Orthogonalize(const NsConfig& config, const MatrixBatch& batch) override {
    const size_t bytes = static_cast<size_t>(batch.count * batch.rows * batch.cols) * 4;
    absl::Status st = rt_->CheckDeviceMemory(batch.data, bytes, "Newton-Schulz: the matrices");
    if (!st.ok()) return st;
    return Run([this, config, batch] { return cpu_.Orthogonalize(config, batch); });
  }

  absl::Status Reserve(const NsConfig& config, int64_t count, int64_t rows,
                       int64_t cols) override {
    std::lock_guard<std::mutex> lock(mu_);
    return cpu_.Reserve(config, count, rows, cols);
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
  void* stream_ = nullptr;
  std::mutex mu_;
  CpuBackend cpu_;
};

}  // namespace

std::unique_ptr<Device> MakeStrictGpuDevice(std::shared_ptr<StrictCpuRuntime> runtime,
                                            int ordinal) {
  auto math = std::make_unique<StrictMath>(runtime);
  return MakeGpuDevice(std::move(runtime), ordinal, std::move(math));
}

}  // namespace muon
