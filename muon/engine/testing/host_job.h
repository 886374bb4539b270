// Test helpers for the steppers: one rank's parameters of a job, in host
// memory, as the registry would hold them (tensors, pieces, momentum), with
// the StepContext a stepper borrows.
#ifndef MUON_ENGINE_TESTING_HOST_JOB_H_
#define MUON_ENGINE_TESTING_HOST_JOB_H_

#include <dlpack/dlpack.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/device/device.h"
#include "muon/device/host_device.h"
#include "muon/engine/local_update.h"
#include "muon/engine/options.h"
#include "muon/engine/param.h"
#include "muon/engine/stepper.h"
#include "muon/math/testing/reference_ns.h"
#include "muon/sharding/layout.h"

namespace muon {
namespace testjob {

// A deterministic value for element i of `name` (a different stream per salt).
inline float ValueOf(const std::string& name, int64_t i, int salt = 0) {
  uint32_t h = 2166136261u + static_cast<uint32_t>(salt) * 7919u;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  h = (h ^ static_cast<uint32_t>(i)) * 16777619u;
  h ^= h >> 15;
  return static_cast<float>(h % 2001) / 1000.0f - 1.0f;
}

// One rank's parameters in host memory, and their update buffers.
class HostJob {
 public:
  HostJob() : device_(MakeHostDevice()) {}

  // Registers `name` (fp32): its global shape and view, this rank's piece
  // (from `layout`, group sizes and this rank's coordinates; no layout: the
  // whole tensor). Values and grads start from ValueOf (salts 1 and 2).
  Param& Add(const std::string& name, const std::vector<int64_t>& global, int view,
             const Layout* layout = nullptr, const std::vector<int>& sizes = {},
             const std::vector<int>& coords = {}) {
    Piece piece;
    if (layout != nullptr) {
      absl::StatusOr<Piece> p = ComputePiece(*layout, sizes, coords, name);
      EXPECT_TRUE(p.ok()) << p.status();
      piece = *p;
    }
    storage_.emplace_back();
    Storage& s = storage_.back();
    s.shape = layout != nullptr ? piece.shape : global;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    s.value.resize(n);
    s.grad.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      s.value[i] = ValueOf(name, i, 1);
      s.grad[i] = ValueOf(name, i, 2);
    }
    s.v = Tensor(s.value.data(), &s.shape);
    s.g = Tensor(s.grad.data(), &s.shape);
    absl::StatusOr<Param> p = MakeParam(&s.v, &s.g, name, view, false, &global);
    EXPECT_TRUE(p.ok()) << p.status();
    Param param = *std::move(p);
    if (layout != nullptr) {
      param.layout = *layout;
      param.piece = piece;
    } else {
      param.layout.global_shape = global;
      param.piece.shape = global;
      param.piece.numel = n;
      if (n > 0) param.piece.runs.push_back({0, n});
    }
    param.momentum = *DeviceBuffer::Make(device_, param.momentum_bytes(), "momentum");
    params_.push_back(std::move(param));
    updates_.push_back(*DeviceBuffer::Make(device_, n * sizeof(float), "update"));
    return params_.back();
  }

  // The scalars are the options' as they are now (the optimizer writes them
  // before each step).
  StepContext Context(const Options* options) {
    StepContext c;
    c.device = device_;
    c.options = options;
    scalars_ = ScalarsOf(*options);
    c.scalars = &scalars_;
    c.params = &params_;
    views_.clear();
    for (const DeviceBuffer& b : updates_) views_.push_back({b.data(), DType::kF32});
    c.updates = &views_;
    return c;
  }

  std::vector<Param>& params() { return params_; }
  // Where the job's memory lives (an allocator is set before the first Add).
  const std::shared_ptr<Device>& device() const { return device_; }
  float* update(size_t i) { return updates_[i].as<float>(); }
  std::vector<float>& value(size_t i) { return storage_[i].value; }
  std::vector<float>& grad(size_t i) { return storage_[i].grad; }

 private:
  StepScalars scalars_;
  std::vector<LocalBuffer> views_;  // the updates as StepContext sees them
  struct Storage {
    std::vector<int64_t> shape;
    std::vector<float> value, grad;
    DLTensor v{}, g{};
  };
  static DLTensor Tensor(float* data, std::vector<int64_t>* shape) {
    DLTensor t{};
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape->size());
    t.dtype = ToDLDataType(DType::kF32);
    t.shape = shape->data();
    return t;
  }

  std::shared_ptr<Device> device_;
  std::deque<Storage> storage_;  // stable addresses for the borrowed tensors
  std::vector<Param> params_;
  std::vector<DeviceBuffer> updates_;
};

// Newton-Schulz of the rows x cols matrix whose element k is at(k), in double
// (muon/math/testing), as floats.
template <typename At>
std::vector<double> ReferenceOf(int64_t rows, int64_t cols, const NsConfig& ns, At at) {
  std::vector<double> u(static_cast<size_t>(rows * cols));
  for (int64_t k = 0; k < rows * cols; ++k) u[k] = at(k);
  return ReferenceNewtonSchulz(u, rows, cols, ns);
}

}  // namespace testjob
}  // namespace muon

#endif  // MUON_ENGINE_TESTING_HOST_JOB_H_
