#include "muon/engine/registry.h"

#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/device/cuda_loader.h"
#include "muon/device/host_device.h"

namespace muon {
namespace {

// Whether two tensors share a byte of storage.
bool Overlap(const TensorView& a, const TensorView& b) {
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

Registry::Registry(std::shared_ptr<Comm> self)
    : device_(MakeHostDevice()), world_(std::move(self)) {}

absl::StatusOr<int> Registry::SetWorld(std::shared_ptr<Comm> world) {
  if (distributed_) {
    return absl::FailedPreconditionError("world: it is already set; set it once");
  }
  if (!params_.empty()) {
    return absl::FailedPreconditionError(
        "world: set it before registering parameters (their layouts refer to it)");
  }
  world_ = world;
  distributed_ = true;
  if (world->size() > 1) device_->math().JoinWorld(world->rank());
  groups_.push_back(std::move(world));
  return static_cast<int>(groups_.size()) - 1;
}

absl::StatusOr<int> Registry::AddGroup(std::shared_ptr<Comm> group) {
  if (!distributed_) {
    return absl::FailedPreconditionError(
        "group: set the world communicator (muon_set_world) before adding groups");
  }
  if (!params_.empty()) {
    return absl::FailedPreconditionError(
        "group: add every group before registering parameters");
  }
  if (group->size() > world_->size()) {
    return absl::InvalidArgumentError(absl::StrCat(group->name(), ": has ", group->size(),
                                                   " ranks, more than the world's ",
                                                   world_->size()));
  }
  groups_.push_back(std::move(group));
  return static_cast<int>(groups_.size()) - 1;
}

absl::StatusOr<int> Registry::GroupSize(int group) const {
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is not known (", num_groups(), " groups are)"));
  }
  return groups_[group]->size();
}

absl::Status Registry::CheckName(const std::string& name) const {
  if (names_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("param '", name, "': a parameter with this name is registered"));
  }
  return absl::OkStatus();
}

absl::Status Registry::Add(Param p) {
  // Overlapping storage would be updated twice (or a grad overwritten by the
  // step): refuse it, naming both tensors. Of several registered tensors
  // that overlap, the one of the earliest parameter is named (its value
  // before its grad), the param's value checked before its grad.
  if (Overlap(p.value, p.grad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("param '", p.name, "': param and grad share storage"));
  }
  if (storage_stale_) {
    // A rebinding could not record itself (out of memory): index again.
    try {
      storage_.Clear();
      for (size_t i = 0; i < params_.size(); ++i) {
        storage_.Insert(params_[i].value, {static_cast<int64_t>(i), false});
        storage_.Insert(params_[i].grad, {static_cast<int64_t>(i), true});
      }
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("muon_register_param: out of host memory");
    }
    storage_stale_ = false;
  }
  const StorageIndex::Entry by_value = storage_.FirstOverlap(p.value);
  const StorageIndex::Entry by_grad = storage_.FirstOverlap(p.grad);
  if (by_value.param >= 0 || by_grad.param >= 0) {
    const bool mine_is_value =
        by_value.param >= 0 && (by_grad.param < 0 || by_value.param <= by_grad.param);
    const StorageIndex::Entry& theirs = mine_is_value ? by_value : by_grad;
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p.name, "': its ", mine_is_value ? "param" : "grad", " storage overlaps the ",
        theirs.grad ? "grad" : "param", " of param '", params_[theirs.param].name, "'"));
  }
  const int64_t id = static_cast<int64_t>(params_.size());
  try {
    names_.insert(p.name);
    params_.push_back(std::move(p));
    storage_.Insert(params_.back().value, {id, false});
    storage_.Insert(params_.back().grad, {id, true});
  } catch (const std::bad_alloc&) {
    // Nothing left behind: the name and the parameter go again.
    if (static_cast<int64_t>(params_.size()) > id) {
      storage_.Erase(params_.back().value, {id, false});
      storage_.Erase(params_.back().grad, {id, true});
      names_.erase(params_.back().name);
      params_.pop_back();
    } else {
      names_.erase(p.name);
    }
    return absl::ResourceExhaustedError("muon_register_param: out of host memory");
  }
  return absl::OkStatus();
}

void Registry::Bind(int64_t id, TensorView value, TensorView grad) {
  Param& p = params_[static_cast<size_t>(id)];
  if (!closed_ && !storage_stale_) {
    try {
      storage_.Erase(p.value, {id, false});
      storage_.Erase(p.grad, {id, true});
      storage_.Insert(value, {id, false});
      storage_.Insert(grad, {id, true});
    } catch (const std::bad_alloc&) {
      storage_stale_ = true;  // the next registration indexes again
    }
  }
  p.value = std::move(value);
  p.grad = std::move(grad);
}

void Registry::Close() {
  closed_ = true;
  absl::flat_hash_set<std::string>().swap(names_);
  storage_.Clear();
}

absl::Status Registry::CheckGradHoldsUpdate(const Param& p) const {
  if (!UpdateInGrad(p)) return absl::OkStatus();
  const DType g = p.grad.dtype;
  // The momentum output has the momentum buffer's precision and the
  // Newton-Schulz output bf16's (or fp32's): fp32 gradients hold both; bf16
  // ones when both are bf16; fp16 ones cannot hold bf16 values exactly.
  if (g == DType::kF32 || (g == DType::kBF16 && p.state_dtype == DType::kBF16 && ns_bf16_)) {
    return absl::OkStatus();
  }
  const char* why = g == DType::kF16 ? "a float16 gradient cannot hold bfloat16 or float32 values"
                    : !ns_bf16_      ? "a bfloat16 gradient cannot hold the Newton-Schulz output "
                                       "of ns_dtype FP32 or FP16"
                                     : "a bfloat16 gradient cannot hold the float32 momentum "
                                       "(momentum_fp32)";
  return absl::InvalidArgumentError(absl::StrCat(
      "param '", p.name, "': update_in_grad keeps the update in the gradient's memory, but ", why,
      " exactly; use float32 gradients or turn update_in_grad off"));
}

absl::Status Registry::SetAllocator(const Device::Allocator& allocator) {
  MUON_RETURN_IF_ERROR(device_->SetAllocator(allocator));
  allocator_ = allocator;
  return absl::OkStatus();
}

absl::Status Registry::Place(Param* p) {
  const std::string where = DeviceString(p->value.device);
  if (params_.empty() && where != device_->name()) {
    // The first parameter picks the device (a later failure leaves the host).
    absl::StatusOr<std::shared_ptr<Device>> d = OpenCudaDevice(p->value.device.device_id);
    if (!d.ok()) {
      return absl::Status(d.status().code(), absl::StrCat("param '", p->name, "': is a ", where,
                                                          " tensor, but ", d.status().message()));
    }
    MUON_RETURN_IF_ERROR((*d)->SetAllocator(allocator_));
    device_ = std::move(d).value();
  }
  if (where != device_->name()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", p->name, "': is on ", where, " but the parameters registered before it are on ",
        device_->name(), "; one optimizer steps the parameters of one device"));
  }
  if (!device_->is_host() && (p->custom || p->zero2_group >= 0)) {
    return absl::UnimplementedError(absl::StrCat(
        "param '", p->name, "': ", p->custom ? "the custom path" : "MUON_REPLICATED_ZERO2",
        " takes host tensors only in this version; register ", where,
        " tensors with placements"));
  }
  absl::StatusOr<DeviceBuffer> m = DeviceBuffer::Make(
      device_, p->momentum_bytes(), absl::StrCat("the momentum buffer of param '", p->name, "'"));
  if (!m.ok()) return m.status();
  p->momentum = std::move(m).value();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Registry::RegisterCustom(const DLTensor* value, const DLTensor* grad,
                                                 const std::string& name, int64_t rows,
                                                 int64_t cols, std::shared_ptr<CustomPath> path,
                                                 bool momentum_fp32,
                                                 const BlockSplit& split) {
  const int64_t id = static_cast<int64_t>(params_.size());
  if (!distributed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': the custom path needs a world communicator (muon_set_world)"));
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param ", id, ": a name is required on the custom path"));
  }
  if (closed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': registration is closed after the first step"));
  }
  MUON_RETURN_IF_ERROR(CheckName(name));
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': global_rows and global_cols must be >= 1 (got ", rows, " x ", cols,
        ")"));
  }
  if (!path || !path->assign || !path->gather || !path->redistribute) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': assign_fn, gather_fn and redistribute_fn are all required"));
  }
  // The owner holds the whole matrix, and its Newton-Schulz workspace, in
  // memory it allocates at the first step: what a declaration can ask for
  // is bounded here (the allocation itself goes through the device, and the
  // host's allocator, at setup).
  if (rows > kMaxCustomElements / cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': a ", rows, " x ", cols, " custom-path matrix has more than the ",
        kMaxCustomElements, " elements its owner can hold (an fp32 copy and the Newton-Schulz "
        "workspace, 16 bytes per element, counted in 64 bits)"));
  }
  const std::vector<int64_t> global = {rows, cols};
  MUON_ASSIGN_OR_RETURN(Param p, MakeParam(value, grad, name, 0, momentum_fp32, &global));
  MUON_RETURN_IF_ERROR(CheckBlockSplit(split, rows, cols, absl::StrCat("param '", name, "'")));
  p.split = split;
  if (p.numel() > rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': the local tensor has ", p.numel(), " elements, more than the ",
        rows, " x ", cols, " matrix it is a piece of"));
  }
  p.layout.global_shape = global;
  p.custom = std::move(path);
  MUON_RETURN_IF_ERROR(CheckGradHoldsUpdate(p));
  MUON_RETURN_IF_ERROR(Place(&p));
  MUON_RETURN_IF_ERROR(Add(std::move(p)));
  return id;
}

absl::StatusOr<int64_t> Registry::Register(const DLTensor* value, const DLTensor* grad,
                                           const std::string& name, int view,
                                           const DistSpec* dist, bool momentum_fp32,
                                           const BlockSplit& split) {
  const int64_t id = static_cast<int64_t>(params_.size());
  if (distributed_ && name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param ", id, ": a name is required with a world communicator (it identifies the "
        "parameter across ranks)"));
  }
  std::string param_name = name.empty() ? absl::StrCat("param", id) : name;
  if (closed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", param_name, "': registration is closed after the first step; register "
        "every parameter before calling muon_step"));
  }
  MUON_RETURN_IF_ERROR(CheckName(param_name));
  const std::string who = absl::StrCat("param '", param_name, "'");
  if (dist != nullptr && !dist->placements.empty() && !distributed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": placements need a world communicator; call muon_set_world first"));
  }
  MUON_ASSIGN_OR_RETURN(Param p, MakeParam(value, grad, std::move(param_name), view,
                                           momentum_fp32, dist ? &dist->global_shape : nullptr));
  MUON_RETURN_IF_ERROR(CheckBlockSplit(split, p.rows, p.cols, who));
  p.split = split;
  if (dist != nullptr && dist->zero2) {
    if (dist->placements.size() != 1 || dist->placements[0].kind != PlacementKind::kReplicate) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": MUON_REPLICATED_ZERO2 needs exactly one placement, a REPLICATE over the "
          "data-parallel group (the whole matrix on every rank of it)"));
    }
    p.zero2_group = dist->placements[0].group;
  }
  if (dist != nullptr) {
    p.layout.global_shape = dist->global_shape;
    p.layout.placements = dist->placements;
    std::vector<int> sizes, coords;
    for (const auto& g : groups_) {
      sizes.push_back(g->size());
      coords.push_back(g->rank());
    }
    // The shape first: a wrong global shape must not cost what it says.
    MUON_ASSIGN_OR_RETURN(const Piece shape, PieceShape(p.layout, sizes, coords, who));
    if (shape.numel != p.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the local tensor has ", p.numel(), " elements (shape ",
          ShapeString(p.value.shape), ") but its layout gives this rank ", shape.numel,
          " (shape ", ShapeString(shape.shape), ")"));
    }
    MUON_ASSIGN_OR_RETURN(p.piece, ComputePiece(p.layout, sizes, coords, who));
  }
  MUON_RETURN_IF_ERROR(CheckGradHoldsUpdate(p));
  MUON_RETURN_IF_ERROR(Place(&p));
  MUON_RETURN_IF_ERROR(Add(std::move(p)));
  return id;
}

absl::Status Registry::Rebind(int64_t id, const DLTensor* value, const DLTensor* grad) {
  MUON_RETURN_IF_ERROR(Get(id).status());
  Param& p = params_[static_cast<size_t>(id)];
  const std::string who = absl::StrCat("param '", p.name, "'");
  // A new tensor must match the registered one: device, dtype and shape.
  auto view_like = [&](const DLTensor* t, const TensorView& registered,
                       const std::string& what) -> absl::StatusOr<TensorView> {
    MUON_ASSIGN_OR_RETURN(TensorView v, ViewTensor(t, what));
    if (DeviceString(v.device) != device_->name()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the new tensor is on ",
                                                     DeviceString(v.device),
                                                     ", the optimizer's on ", device_->name()));
    }
    if (v.shape != registered.shape || v.dtype != registered.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the new tensor is ", DTypeName(v.dtype), " ", ShapeString(v.shape),
          ", the registered one ", DTypeName(registered.dtype), " ",
          ShapeString(registered.shape)));
    }
    return v;
  };
  MUON_ASSIGN_OR_RETURN(TensorView v, view_like(value, p.value, who));
  const absl::Status bound_to_grad = absl::FailedPreconditionError(absl::StrCat(
      who, ": with update_in_grad the exchange is bound to the gradient's memory at the first "
      "step; rebind it to the same gradient storage (or turn update_in_grad off)"));
  const bool grad_fixed = closed_ && UpdateInGrad(p);
  if (UpdateInGrad(p) && grad == nullptr) {
    // The exchange would still move the update through that memory.
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": with update_in_grad a parameter cannot be left without a gradient (its update "
        "lives there); bind a zero gradient instead"));
  }
  if (grad == nullptr) {
    if (distributed_) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": a gradient is required with a world (every rank steps every parameter); "
          "bind a zero gradient instead"));
    }
    Bind(id, std::move(v), p.grad);
    p.active = false;
    return absl::OkStatus();
  }
  MUON_ASSIGN_OR_RETURN(TensorView g, view_like(grad, p.grad, absl::StrCat("grad of ", who)));
  if (grad_fixed && g.data != p.grad.data) return bound_to_grad;
  // As at registration. (Other parameters' bindings are not compared: a host
  // rebinding one parameter after another may reuse storage another one is
  // about to leave.)
  if (Overlap(v, g)) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": param and grad share storage"));
  }
  Bind(id, std::move(v), std::move(g));
  p.active = true;
  return absl::OkStatus();
}

absl::StatusOr<const Param*> Registry::Get(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(params_.size())) {
    return absl::NotFoundError(absl::StrCat("param_id ", id, " is not registered (",
                                            params_.size(), " parameters are)"));
  }
  return &params_[static_cast<size_t>(id)];
}

}  // namespace muon
