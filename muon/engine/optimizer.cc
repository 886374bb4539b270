#include "muon/engine/optimizer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/engine/checkpoint.h"
#include "muon/math/cpu/cpu_backend.h"

namespace muon {
namespace {

// Upper bound of one working batch (fp32 elements): same-shape parameters are
// batched together until this size; a larger parameter goes alone.
constexpr int64_t kMaxBatchElements = int64_t{64} << 20;  // 256 MiB

}  // namespace

Optimizer::Optimizer(const Options& options)
    : options_(options), backend_(std::make_unique<CpuBackend>()) {}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const Options& options) {
  MUON_RETURN_IF_ERROR(ValidateOptions(options));
  return std::unique_ptr<Optimizer>(new Optimizer(options));
}

absl::Status Optimizer::SetLr(double lr) {
  MUON_RETURN_IF_ERROR(ValidateLr(lr));
  options_.lr = lr;
  return absl::OkStatus();
}

absl::Status Optimizer::SetWeightDecay(double weight_decay) {
  MUON_RETURN_IF_ERROR(ValidateWeightDecay(weight_decay));
  options_.weight_decay = weight_decay;
  return absl::OkStatus();
}

absl::Status Optimizer::SetMomentum(double momentum) {
  MUON_RETURN_IF_ERROR(ValidateMomentum(momentum));
  options_.momentum = momentum;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Optimizer::RegisterParam(const DLTensor* value, const DLTensor* grad,
                                                 const std::string& name, int view) {
  const int64_t id = static_cast<int64_t>(params_.size());
  std::string param_name = name.empty() ? absl::StrCat("param", id) : name;
  if (planned_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", param_name, "': registration is closed after the first step; register "
        "every parameter before calling muon_step"));
  }
  for (const Param& p : params_) {
    if (p.name == param_name) {
      return absl::AlreadyExistsError(
          absl::StrCat("param '", param_name, "': a parameter with this name is registered"));
    }
  }
  MUON_ASSIGN_OR_RETURN(Param p, MakeParam(value, grad, std::move(param_name), view,
                                           options_.momentum_fp32));
  // Overlapping storage would be updated twice (or a grad overwritten by the
  // step): refuse it, naming both tensors.
  auto overlaps = [](const TensorView& a, const TensorView& b) {
    const char* a0 = static_cast<const char*>(a.data);
    const char* b0 = static_cast<const char*>(b.data);
    return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
  };
  if (overlaps(p.value, p.grad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("param '", p.name, "': param and grad share storage"));
  }
  for (const Param& q : params_) {
    for (const TensorView* mine : {&p.value, &p.grad}) {
      for (const TensorView* theirs : {&q.value, &q.grad}) {
        if (overlaps(*mine, *theirs)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "param '", p.name, "': its ", mine == &p.value ? "param" : "grad",
              " storage overlaps the ", theirs == &q.value ? "param" : "grad",
              " of param '", q.name, "'"));
        }
      }
    }
  }
  try {
    params_.push_back(std::move(p));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("muon_register_param: out of host memory");
  }
  return id;
}

absl::Status Optimizer::BuildPlan() {
  // Group matrices by shape, in order of first registration, so the plan
  // (and with it the floating-point work) is the same on every run.
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> by_shape;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    auto key = std::make_pair(p.rows, p.cols);
    if (by_shape.find(key) == by_shape.end()) shapes.push_back(key);
    by_shape[key].push_back(i);
  }
  std::vector<Chunk> chunks;
  int64_t largest = 0;
  for (const auto& shape : shapes) {
    Chunk cur;
    cur.rows = shape.first;
    cur.cols = shape.second;
    const int64_t per_matrix = cur.rows * cur.cols;
    for (size_t i : by_shape[shape]) {
      const int64_t m = params_[i].batch;
      if (!cur.params.empty() && (cur.matrices + m) * per_matrix > kMaxBatchElements) {
        chunks.push_back(cur);
        cur.params.clear();
        cur.matrices = 0;
      }
      cur.params.push_back(i);
      cur.matrices += m;
    }
    chunks.push_back(cur);
  }
  for (const Chunk& c : chunks) largest = std::max(largest, c.matrices * c.rows * c.cols);
  try {
    batch_.resize(static_cast<size_t>(largest));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("muon_step: out of host memory for the ", largest, "-element working batch"));
  }
  auto* cpu = static_cast<CpuBackend*>(backend_.get());
  for (const Chunk& c : chunks) MUON_RETURN_IF_ERROR(cpu->Reserve(c.rows, c.cols));
  chunks_ = std::move(chunks);
  planned_ = true;
  return absl::OkStatus();
}

absl::Status Optimizer::Step() {
  if (params_.empty()) {
    return absl::FailedPreconditionError(
        "muon_step: no parameters are registered; call muon_register_param first");
  }
  // Everything that can fail (allocation) happens here, before any tensor is
  // written, so a failed step changes nothing.
  if (!planned_) MUON_RETURN_IF_ERROR(BuildPlan());

  const double decay = 1.0 - options_.lr * options_.weight_decay;
  for (const Chunk& c : chunks_) {
    const int64_t per_matrix = c.rows * c.cols;
    int64_t offset = 0;
    for (size_t i : c.params) {
      Param& p = params_[i];
      MomentumArgs m;
      m.grad_dtype = p.grad.dtype;
      m.grad = p.grad.data;
      m.buf_dtype = p.state_dtype;
      m.buf = p.momentum_data();
      m.n = p.numel();
      m.momentum = options_.momentum;
      m.nesterov = options_.nesterov;
      m.out = batch_.data() + offset;
      MUON_RETURN_IF_ERROR(backend_->Momentum(m));
      offset += p.numel();
    }
    MUON_RETURN_IF_ERROR(
        backend_->Orthogonalize(options_.ns, {batch_.data(), c.matrices, c.rows, c.cols}));
    offset = 0;
    for (size_t i : c.params) {
      Param& p = params_[i];
      ApplyArgs a;
      a.param_dtype = p.value.dtype;
      a.param = p.value.data;
      a.n = p.numel();
      a.update = batch_.data() + offset;
      a.decay = decay;
      a.lr_adjusted = AdjustedLr(options_.lr, options_.adjust_lr, p.rows, p.cols);
      MUON_RETURN_IF_ERROR(backend_->Apply(a));
      offset += p.batch * per_matrix;
    }
  }
  ++step_count_;
  return absl::OkStatus();
}

absl::StatusOr<const Param*> Optimizer::GetParam(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(params_.size())) {
    return absl::NotFoundError(absl::StrCat("param_id ", id, " is not registered (",
                                            params_.size(), " parameters are)"));
  }
  return &params_[static_cast<size_t>(id)];
}

absl::Status Optimizer::CheckStateTensor(int64_t id, const DLTensor* t, const char* what,
                                         Param** param) const {
  MUON_ASSIGN_OR_RETURN(const Param* p, GetParam(id));
  const std::string who = absl::StrCat(what, " for param '", p->name, "'");
  MUON_ASSIGN_OR_RETURN(TensorView v, ViewCpuTensor(t, who));
  if (v.shape != p->value.shape) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", ShapeString(v.shape),
                                                   " differs from the parameter's ",
                                                   ShapeString(p->value.shape)));
  }
  if (v.dtype != p->state_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": dtype ", DTypeName(v.dtype),
                                                   " differs from the state dtype ",
                                                   DTypeName(p->state_dtype)));
  }
  *param = const_cast<Param*>(p);
  return absl::OkStatus();
}

absl::Status Optimizer::CopyStateOut(int64_t id, const DLTensor* dst) const {
  Param* p = nullptr;
  MUON_RETURN_IF_ERROR(CheckStateTensor(id, dst, "state tensor", &p));
  auto v = ViewCpuTensor(dst, "state tensor");
  if (!p->momentum.empty()) std::memcpy(v->data, p->momentum.data(), p->momentum.size());
  return absl::OkStatus();
}

absl::Status Optimizer::CopyStateIn(int64_t id, const DLTensor* src) {
  Param* p = nullptr;
  MUON_RETURN_IF_ERROR(CheckStateTensor(id, src, "state tensor", &p));
  auto v = ViewCpuTensor(src, "state tensor");
  if (!p->momentum.empty()) std::memcpy(p->momentum.data(), v->data, p->momentum.size());
  return absl::OkStatus();
}

size_t Optimizer::StateBlobSize() const { return muon::StateBlobSize(params_); }

void Optimizer::SaveState(unsigned char* out) const { WriteStateBlob(params_, step_count_, out); }

absl::Status Optimizer::LoadState(const unsigned char* data, size_t size) {
  MUON_ASSIGN_OR_RETURN(ParsedState parsed, ParseStateBlob(params_, data, size));
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.momentum.empty()) std::memcpy(p.momentum.data(), parsed.momentum[i], p.momentum.size());
  }
  step_count_ = parsed.step_count;
  return absl::OkStatus();
}

}  // namespace muon
