#include "muon/engine/optimizer.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/device/cuda_loader.h"
#include "muon/engine/checkpoint.h"

namespace muon {
namespace {

// Settings every rank must share, compared in the handshake.
std::string Fingerprint(const Options& o) {
  std::string f = absl::StrCat("assignment=", static_cast<int>(o.dist.assignment),
                               " prefetch=", o.dist.prefetch_count,
                               " async=", o.dist.async_parallelism,
                               " round_bytes=", o.dist.round_bytes, " ns_steps=", o.ns.steps,
                               " ns_dtype=", static_cast<int>(o.ns.dtype), " eps=", o.ns.eps,
                               " momentum_fp32=", o.momentum_fp32, " coefficients=");
  for (const auto& c : o.ns.coefficients) absl::StrAppend(&f, c[0], ",", c[1], ",", c[2], ";");
  return f;
}

// A handshake message: this rank's fingerprint, then its description.
std::string Frame(const std::string& fingerprint, const std::string& desc) {
  std::string out;
  const uint32_t n = static_cast<uint32_t>(fingerprint.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += fingerprint;
  out += desc;
  return out;
}

template <typename Fn>
absl::Status Allocating(const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of host memory for ", what));
  }
  return absl::OkStatus();
}

}  // namespace

Optimizer::Optimizer(const Options& options) : options_(options), device_(MakeHostDevice()) {}

Optimizer::~Optimizer() = default;

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const Options& options) {
  MUON_RETURN_IF_ERROR(ValidateOptions(options));
  auto opt = std::unique_ptr<Optimizer>(new Optimizer(options));
  MUON_ASSIGN_OR_RETURN(opt->world_, Comm::Create(SelfCommTable(), "the single-process world"));
  return opt;
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

absl::StatusOr<int> Optimizer::SetWorld(std::shared_ptr<Comm> world) {
  if (distributed_) {
    return absl::FailedPreconditionError("world: it is already set; set it once");
  }
  if (!params_.empty()) {
    return absl::FailedPreconditionError(
        "world: set it before registering parameters (their layouts refer to it)");
  }
  world_ = world;
  distributed_ = true;
  groups_.push_back(std::move(world));
  return static_cast<int>(groups_.size()) - 1;
}

absl::StatusOr<int> Optimizer::AddGroup(std::shared_ptr<Comm> group) {
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

absl::StatusOr<int> Optimizer::GroupSize(int group) const {
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is not known (", num_groups(), " groups are)"));
  }
  return groups_[group]->size();
}

absl::Status Optimizer::AddParam(Param p) {
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
  return absl::OkStatus();
}

absl::Status Optimizer::PlaceParam(Param* p) {
  const std::string where = DeviceString(p->value.device);
  if (params_.empty() && where != device_->name()) {
    // The first parameter picks the device (a later failure leaves the host).
    absl::StatusOr<std::shared_ptr<Device>> d = OpenCudaDevice(p->value.device.device_id);
    if (!d.ok()) {
      return absl::Status(d.status().code(), absl::StrCat("param '", p->name, "': is a ", where,
                                                          " tensor, but ", d.status().message()));
    }
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

absl::StatusOr<int64_t> Optimizer::RegisterCustomParam(const DLTensor* value, const DLTensor* grad,
                                                       const std::string& name, int64_t rows,
                                                       int64_t cols,
                                                       std::shared_ptr<CustomPath> path) {
  const int64_t id = static_cast<int64_t>(params_.size());
  if (!distributed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': the custom path needs a world communicator (muon_set_world)"));
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param ", id, ": a name is required on the custom path"));
  }
  if (planned_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': registration is closed after the first step"));
  }
  for (const Param& q : params_) {
    if (q.name == name) {
      return absl::AlreadyExistsError(
          absl::StrCat("param '", name, "': a parameter with this name is registered"));
    }
  }
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': global_rows and global_cols must be >= 1 (got ", rows, " x ", cols,
        ")"));
  }
  if (!path || !path->assign || !path->gather || !path->redistribute) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': assign_fn, gather_fn and redistribute_fn are all required"));
  }
  const std::vector<int64_t> global = {rows, cols};
  MUON_ASSIGN_OR_RETURN(Param p, MakeParam(value, grad, name, 0, options_.momentum_fp32, &global));
  if (p.numel() > rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param '", name, "': the local tensor has ", p.numel(), " elements, more than the ",
        rows, " x ", cols, " matrix"));
  }
  p.layout.global_shape = global;
  p.custom = std::move(path);
  MUON_RETURN_IF_ERROR(PlaceParam(&p));
  MUON_RETURN_IF_ERROR(AddParam(std::move(p)));
  return id;
}

absl::Status Optimizer::RunCustom(void* stream) {
  for (const CustomUnit& c : plan_.custom) {
    if (c.local < 0) continue;
    Param& p = params_[c.local];
    const std::string who = absl::StrCat("param '", p.name, "'");
    const float* full = nullptr;
    int64_t rows = -1, cols = -1;
    const bool owner = c.owner == world_->rank();
    absl::Status st = p.custom->gather(updates_[c.local].as<float>(), p.numel(), c.owner, &full, &rows,
                                       &cols, stream);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat(who, ": gather_fn failed: ", st.message()));
    }
    if (owner) {
      if (full == nullptr || rows != c.rows || cols != c.cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": gather_fn returned a ", rows, " x ", cols, " matrix",
            full == nullptr ? " with no data" : "", "; the parameter is registered as ", c.rows,
            " x ", c.cols));
      }
      std::copy(full, full + rows * cols, custom_slot_.begin());
      MUON_RETURN_IF_ERROR(
          device_->math().Orthogonalize(options_.ns, {custom_slot_.data(), 1, c.rows, c.cols}));
      stats_.matrices_orthogonalized += 1;
      stats_.ns_flops += c.flops;
    }
    st = p.custom->redistribute(owner ? custom_slot_.data() : nullptr, c.rows, c.cols, c.owner,
                                updates_[c.local].as<float>(), p.numel(), stream);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat(who, ": redistribute_fn failed: ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Optimizer::RegisterParam(const DLTensor* value, const DLTensor* grad,
                                                 const std::string& name, int view,
                                                 const DistSpec* dist) {
  const int64_t id = static_cast<int64_t>(params_.size());
  if (distributed_ && name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "param ", id, ": a name is required with a world communicator (it identifies the "
        "parameter across ranks)"));
  }
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
  const std::string who = absl::StrCat("param '", param_name, "'");
  if (dist != nullptr && !dist->placements.empty() && !distributed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": placements need a world communicator; call muon_set_world first"));
  }
  MUON_ASSIGN_OR_RETURN(Param p, MakeParam(value, grad, std::move(param_name), view,
                                           options_.momentum_fp32,
                                           dist ? &dist->global_shape : nullptr));
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
    MUON_ASSIGN_OR_RETURN(p.piece, ComputePiece(p.layout, sizes, coords, who));
    if (p.piece.numel != p.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the local tensor has ", p.numel(), " elements (shape ",
          ShapeString(p.value.shape), ") but its layout gives this rank ", p.piece.numel,
          " (shape ", ShapeString(p.piece.shape), ")"));
    }
  }
  MUON_RETURN_IF_ERROR(PlaceParam(&p));
  MUON_RETURN_IF_ERROR(AddParam(std::move(p)));
  return id;
}

absl::Status Optimizer::Setup(void* stream) {
  // A local problem found before the handshake is reported after it, so that
  // every rank reaches the same collectives.
  absl::Status local_error;
  // Group memberships, as world ranks.
  RankDesc me;
  me.world_rank = world_->rank();
  for (auto& g : groups_) {
    std::vector<int32_t> members(g->size());
    const int32_t mine = world_->rank();
    MUON_RETURN_IF_ERROR(
        g->AllGather(&mine, members.data(), sizeof mine, stream, "setup: group membership"));
    me.groups.emplace_back(members.begin(), members.end());
  }
  group_members_ = me.groups;
  for (const Param& p : params_) {
    RankParamDesc d;
    d.name = p.name;
    d.param_dtype = static_cast<uint8_t>(p.value.dtype);
    d.state_dtype = static_cast<uint8_t>(p.state_dtype);
    d.view = static_cast<uint8_t>(p.view);
    d.global_shape = p.global_shape;
    d.layout = p.layout;
    d.zero2 = p.zero2_group >= 0 ? 1 : 0;
    if (p.custom) {
      const int owner = p.custom->assign(world_->size());
      if (owner < 0 || owner >= world_->size()) {
        // Reported after the handshake, so no rank is left waiting.
        const std::string detail = TakeCallbackError();
        if (local_error.ok()) {
          local_error = absl::InvalidArgumentError(absl::StrCat(
              "param '", p.name, "': assign_fn returned ", owner, "; it must be a world rank in [0, ",
              world_->size(), ")", detail.empty() ? "" : ": ", detail));
        }
        d.custom_owner = 0;
      } else {
        d.custom_owner = owner;
      }
    }
    me.params.push_back(std::move(d));
  }
  // Handshake: every rank's description, padded to the longest.
  const std::string mine = Frame(Fingerprint(options_), SerializeRankDesc(me));
  const int n = world_->size();
  std::vector<uint64_t> sizes(n);
  const uint64_t my_size = mine.size();
  MUON_RETURN_IF_ERROR(
      world_->AllGather(&my_size, sizes.data(), sizeof my_size, stream, "setup: handshake"));
  const uint64_t longest = *std::max_element(sizes.begin(), sizes.end());
  std::string padded = mine;
  padded.resize(longest);
  std::string all(longest * n, '\0');
  MUON_RETURN_IF_ERROR(
      world_->AllGather(padded.data(), &all[0], longest, stream, "setup: handshake"));

  // Every rank now holds the same data and reaches the same verdict; a rank
  // that fails alone (a custom assignment) still joins the digest exchange.
  absl::Status built = [&]() -> absl::Status {
    if (!local_error.ok()) return local_error;
    std::vector<RankDesc> ranks;
    const std::string my_fp = Fingerprint(options_);
    for (int r = 0; r < n; ++r) {
      const std::string msg = all.substr(r * longest, sizes[r]);
      uint32_t fl = 0;
      if (msg.size() < 4) return absl::InternalError("setup: malformed handshake message");
      std::memcpy(&fl, msg.data(), 4);
      const std::string fp = msg.substr(4, fl);
      if (fp != my_fp) {
        return absl::InvalidArgumentError(absl::StrCat(
            "setup: rank ", r, " runs with different optimizer options (", fp, ") than rank ",
            world_->rank(), " (", my_fp, "); every rank must use the same options"));
      }
      MUON_ASSIGN_OR_RETURN(RankDesc d,
                            ParseRankDesc(msg.substr(4 + fl), absl::StrCat("rank ", r)));
      ranks.push_back(std::move(d));
    }
    PlanOptions po;
    po.assignment = options_.dist.assignment;
    po.custom = options_.dist.custom_assign;
    po.async_parallelism = options_.dist.async_parallelism;
    po.round_bytes = options_.dist.round_bytes;
    po.ns_steps = options_.ns.steps;
    MUON_ASSIGN_OR_RETURN(plan_, BuildPlan(ranks, world_->rank(), po));
    return absl::OkStatus();
  }();
  struct Verdict {
    uint64_t digest;
    uint64_t failed;
  } my_verdict{built.ok() ? plan_.digest : 0, built.ok() ? 0u : 1u};
  std::vector<Verdict> verdicts(n);
  MUON_RETURN_IF_ERROR(world_->AllGather(&my_verdict, verdicts.data(), sizeof my_verdict, stream,
                                         "setup: plan check"));
  if (!built.ok()) return built;
  for (int r = 0; r < n; ++r) {
    if (verdicts[r].failed) {
      return absl::InvalidArgumentError(
          absl::StrCat("setup: rank ", r, " could not build the plan (see its error)"));
    }
    if (verdicts[r].digest != plan_.digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "setup: rank ", r, " computed a different plan than rank ", world_->rank(),
          " (a custom assignment must give the same owners on every rank)"));
    }
  }

  // Tables and every buffer the step needs, allocated once.
  const DType ns_wire = options_.ns.dtype == NsDtype::kBF16 ? DType::kBF16 : DType::kF32;
  tables_ = BuildRoundTables(plan_, world_->rank(), n, ns_wire);
  // The tables hold every span this rank moves; the job-wide pieces (one run
  // per row of every rank's piece) are not needed any more.
  for (PlanParam& pp : plan_.params) {
    for (Holder& h : pp.holders) std::vector<Run>().swap(h.piece.runs);
  }
  int64_t most_slots = 0;
  for (const RoundTable& t : tables_) most_slots = std::max(most_slots, t.slot_floats);
  const size_t ring = std::min(static_cast<size_t>(options_.dist.prefetch_count) + 1,
                               std::max<size_t>(tables_.size(), 1));
  // Every buffer of the step, on the device, once (a setup that failed
  // earlier may have made some).
  updates_.clear();
  slots_.clear();
  bound_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    MUON_ASSIGN_OR_RETURN(
        DeviceBuffer b,
        DeviceBuffer::Make(device_, static_cast<size_t>(params_[i].numel()) * sizeof(float),
                           absl::StrCat("the update buffer of param '", params_[i].name, "'")));
    updates_.push_back(std::move(b));
  }
  for (size_t k = 0; k < ring; ++k) {
    MUON_ASSIGN_OR_RETURN(DeviceBuffer b,
                          DeviceBuffer::Make(device_, static_cast<size_t>(most_slots) * sizeof(float),
                                             "the working buffer of owned matrices"));
    slots_.push_back(std::move(b));
  }
  const size_t exchange_bytes = MaxExchangeBytes(tables_);
  MUON_ASSIGN_OR_RETURN(send_, DeviceBuffer::Make(device_, exchange_bytes, "the send buffer"));
  MUON_ASSIGN_OR_RETURN(recv_, DeviceBuffer::Make(device_, exchange_bytes, "the receive buffer"));
  std::vector<float*> updates(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) updates[i] = updates_[i].as<float>();
  for (size_t r = 0; r < tables_.size(); ++r) {
    MUON_ASSIGN_OR_RETURN(BoundExchange b,
                          BindExchange(tables_[r], *device_, updates, slots_[r % ring].as<float>(),
                                       send_.as<unsigned char>(), recv_.as<unsigned char>(),
                                       world_->size() == 1));
    bound_.push_back(std::move(b));
  }
  int64_t custom_most = 0;
  for (const CustomUnit& c : plan_.custom) {
    if (c.owner == world_->rank()) custom_most = std::max(custom_most, c.rows * c.cols);
  }
  MUON_RETURN_IF_ERROR(Allocating("the custom-path matrix", [&] {
    custom_slot_.resize(static_cast<size_t>(custom_most));
  }));
  MathBackend& math = device_->math();
  for (const CustomUnit& c : plan_.custom) {
    if (c.owner == world_->rank()) MUON_RETURN_IF_ERROR(math.Reserve(options_.ns, 1, c.rows, c.cols));
  }
  for (const RoundTable& t : tables_) {
    for (const ShapeBatch& b : t.batches) {
      MUON_RETURN_IF_ERROR(math.Reserve(options_.ns, b.count, b.rows, b.cols));
    }
  }
  MUON_RETURN_IF_ERROR(BuildZero2());
  stats_.matrices_total =
      static_cast<int64_t>(plan_.units.size() + plan_.custom.size()) + plan_.zero2_matrices;
  stats_.matrices_owned = 0;
  for (const Unit& u : plan_.units) stats_.matrices_owned += u.owner == world_->rank();
  for (const CustomUnit& c : plan_.custom) stats_.matrices_owned += c.owner == world_->rank();
  for (const Zero2Block& blk : zero2_blocks_) {
    const int mine = blk.params[groups_[blk.group]->rank()];
    if (mine >= 0) stats_.matrices_owned += params_[mine].batch;
  }
  planned_ = true;
  return absl::OkStatus();
}

absl::Status Optimizer::Orthogonalize(const RoundTable& t, float* slots) {
  for (const ShapeBatch& b : t.batches) {
    MUON_RETURN_IF_ERROR(
        device_->math().Orthogonalize(options_.ns, {slots + b.offset, b.count, b.rows, b.cols}));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::RunRounds(void* stream) {
  const int rounds = static_cast<int>(tables_.size());
  const int ring = static_cast<int>(slots_.size());
  const int prefetch = std::min(options_.dist.prefetch_count, std::max(0, rounds - 1));
  auto slot = [&](int r) { return slots_[r % ring].as<float>(); };

  // The exchanges in the one order every rank issues them: gathers run up to
  // `prefetch` rounds ahead of the math; round r's scatter follows its math.
  std::vector<std::pair<bool, int>> ops;  // (is_scatter, round)
  for (int r = 0; r <= std::min(prefetch, rounds - 1); ++r) ops.push_back({false, r});
  for (int r = 0; r < rounds; ++r) {
    ops.push_back({true, r});
    if (r + prefetch + 1 < rounds) ops.push_back({false, r + prefetch + 1});
  }
  auto run_op = [&](const std::pair<bool, int>& op) {
    const BoundExchange& b = bound_[op.second];
    return RunExchange(b, op.first ? b.scatter : b.gather, *world_, *device_,
                       send_.as<unsigned char>(), recv_.as<unsigned char>(), stream);
  };

  if (prefetch == 0) {
    for (const auto& op : ops) {
      if (op.first) MUON_RETURN_IF_ERROR(Orthogonalize(tables_[op.second], slot(op.second)));
      MUON_RETURN_IF_ERROR(run_op(op));
    }
    return absl::OkStatus();
  }

  // One helper thread issues every collective (never two at once on the
  // world) while this thread computes.
  std::mutex mu;
  std::condition_variable cv;
  int gathered = 0, computed = 0;
  absl::Status comm_error, math_error;
  bool stop = false;
  std::thread comm([&] {
    for (const auto& op : ops) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (op.first) cv.wait(lock, [&] { return computed > op.second || stop; });
        if (stop) return;
      }
      absl::Status st;
      try {  // nothing may escape a thread: it would end the host process
        st = run_op(op);
      } catch (const std::exception& e) {
        st = absl::InternalError(absl::StrCat("exchange thread: ", e.what()));
      } catch (...) {
        st = absl::InternalError("exchange thread: unexpected exception");
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok()) {
        comm_error = st;
        stop = true;
        cv.notify_all();
        return;
      }
      if (!op.first) {
        gathered = op.second + 1;
        cv.notify_all();
      }
    }
  });
  for (int r = 0; r < rounds; ++r) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return gathered > r || stop; });
      if (stop) break;
    }
    absl::Status st = Orthogonalize(tables_[r], slot(r));
    std::lock_guard<std::mutex> lock(mu);
    if (!st.ok()) {
      math_error = st;
      stop = true;
    } else {
      computed = r + 1;
    }
    cv.notify_all();
    if (stop) break;
  }
  comm.join();
  if (!comm_error.ok()) return comm_error;
  return math_error;
}

absl::Status Optimizer::RebindParam(int64_t id, const DLTensor* value, const DLTensor* grad) {
  MUON_ASSIGN_OR_RETURN(const Param* found, GetParam(id));
  Param& p = params_[static_cast<size_t>(id)];
  (void)found;
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
  if (grad == nullptr) {
    if (distributed_) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": a gradient is required with a world (every rank steps every parameter); "
          "bind a zero gradient instead"));
    }
    p.value = v;
    p.active = false;
    return absl::OkStatus();
  }
  MUON_ASSIGN_OR_RETURN(TensorView g, view_like(grad, p.grad, absl::StrCat("grad of ", who)));
  p.value = v;
  p.grad = g;
  p.active = true;
  return absl::OkStatus();
}

absl::Status Optimizer::MomentumOf(size_t i, DType grad_dtype, const void* grad) {
  Param& p = params_[i];
  MomentumArgs m;
  m.grad_dtype = grad_dtype;
  m.grad = grad;
  m.buf_dtype = p.state_dtype;
  m.buf = p.momentum.data();
  m.n = p.numel();
  m.momentum = options_.momentum;
  m.nesterov = options_.nesterov;
  m.out = updates_[i].as<float>();
  return device_->math().Momentum(m);
}

absl::Status Optimizer::ApplyTo(size_t i, double decay) {
  Param& p = params_[i];
  ApplyArgs a;
  a.param_dtype = p.value.dtype;
  a.param = p.value.data;
  a.n = p.numel();
  a.update = updates_[i].as<float>();
  a.decay = decay;
  a.lr_adjusted = AdjustedLr(options_.lr, options_.adjust_lr, p.rows, p.cols);
  return device_->math().Apply(a);
}

absl::Status Optimizer::BuildZero2() {
  zero2_blocks_.clear();  // a setup that failed earlier may have built some
  // Group instances in one order every rank agrees on: by member list.
  std::vector<int> groups;
  for (const Param& p : params_) {
    if (p.zero2_group >= 0 &&
        std::find(groups.begin(), groups.end(), p.zero2_group) == groups.end()) {
      groups.push_back(p.zero2_group);
    }
  }
  std::sort(groups.begin(), groups.end(), [&](int a, int b) {
    return group_members_[a] < group_members_[b];
  });
  int64_t largest = 0, widest = 0;
  for (int g : groups) {
    const int n = groups_[g]->size();
    std::vector<int> mine;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].zero2_group == g) mine.push_back(static_cast<int>(i));
    }
    std::sort(mine.begin(), mine.end(),
              [&](int a, int b) { return params_[a].name < params_[b].name; });
    // Same shape and dtype together, in order of first appearance.
    std::vector<std::vector<int>> buckets;
    for (int i : mine) {
      bool placed = false;
      for (auto& b : buckets) {
        const Param& q = params_[b[0]];
        if (q.value.shape == params_[i].value.shape && q.value.dtype == params_[i].value.dtype) {
          b.push_back(i);
          placed = true;
          break;
        }
      }
      if (!placed) buckets.push_back({i});
    }
    int64_t k = 0;  // block-cyclic owner counter, running across buckets
    for (const auto& b : buckets) {
      for (size_t start = 0; start < b.size(); start += n) {
        Zero2Block blk;
        blk.group = g;
        blk.dtype = params_[b[0]].value.dtype;
        blk.elems = params_[b[0]].numel();
        blk.params.assign(n, -1);
        for (size_t j = start; j < std::min(b.size(), start + n); ++j) {
          blk.params[k++ % n] = b[j];
        }
        largest = std::max(largest, blk.elems);
        widest = std::max(widest, blk.elems * n);
        zero2_blocks_.push_back(std::move(blk));
      }
    }
  }
  for (const Zero2Block& blk : zero2_blocks_) {
    const int me = groups_[blk.group]->rank();
    for (size_t c = 0; c < blk.params.size(); ++c) {
      if (blk.params[c] < 0) continue;
      Param& p = params_[blk.params[c]];
      if (static_cast<int>(c) == me) {
        MUON_RETURN_IF_ERROR(device_->math().Reserve(options_.ns, p.batch, p.rows, p.cols));
      } else {
        p.holds_state = false;  // its momentum lives on the owner: 1/N of the state here
        p.momentum.Reset();
      }
    }
  }
  return Allocating("the ZeRO-2 buffers", [&] {
    zero2_send_.resize(static_cast<size_t>(widest) * 4);
    zero2_recv_.resize(static_cast<size_t>(widest) * 4);
    zero2_avg_.resize(static_cast<size_t>(largest));
  });
}

absl::Status Optimizer::RunZero2(void* stream) {
  const double decay = 1.0 - options_.lr * options_.weight_decay;
  for (const Zero2Block& blk : zero2_blocks_) {
    Comm& g = *groups_[blk.group];
    const int n = g.size(), me = g.rank();
    const size_t bytes = static_cast<size_t>(blk.elems) * SizeOf(blk.dtype);
    const int first = *std::max_element(blk.params.begin(), blk.params.end());
    const std::string what =
        absl::StrCat("ZeRO-2 block of param '", params_[first].name, "'");
    // Gradients, block c for the owner at coord c, summed onto it.
    for (int c = 0; c < n; ++c) {
      unsigned char* dst = zero2_send_.data() + c * bytes;
      if (blk.params[c] >= 0) {
        std::memcpy(dst, params_[blk.params[c]].grad.data, bytes);
      } else {
        std::memset(dst, 0, bytes);
      }
    }
    const muon_dtype_t dt = blk.dtype == DType::kF32    ? MUON_DTYPE_FLOAT32
                            : blk.dtype == DType::kBF16 ? MUON_DTYPE_BFLOAT16
                                                        : MUON_DTYPE_FLOAT16;
    MUON_RETURN_IF_ERROR(g.ReduceScatter(zero2_send_.data(), zero2_recv_.data(),
                                         static_cast<size_t>(blk.elems), dt, stream,
                                         absl::StrCat("averaging gradients of the ", what)));
    if (blk.params[me] >= 0) {
      Param& p = params_[blk.params[me]];
      const size_t i = static_cast<size_t>(blk.params[me]);
      for (int64_t e = 0; e < blk.elems; ++e) {
        zero2_avg_[e] =
            RoundTo(blk.dtype, LoadAsFloat(blk.dtype, zero2_recv_.data(), e) / static_cast<float>(n));
      }
      // The average, already rounded to the grad dtype, enters as fp32.
      MUON_RETURN_IF_ERROR(MomentumOf(i, DType::kF32, zero2_avg_.data()));
      MUON_RETURN_IF_ERROR(device_->math().Orthogonalize(
          options_.ns, {updates_[i].as<float>(), p.batch, p.rows, p.cols}));
      MUON_RETURN_IF_ERROR(ApplyTo(i, decay));
      stats_.matrices_orthogonalized += p.batch;
      stats_.ns_flops += p.batch * NewtonSchulzFlops(p.rows, p.cols, options_.ns.steps);
    }
    // The owners' new values to every replica.
    unsigned char* mine = zero2_send_.data();
    if (blk.params[me] >= 0) {
      std::memcpy(mine, params_[blk.params[me]].value.data, bytes);
    } else {
      std::memset(mine, 0, bytes);
    }
    MUON_RETURN_IF_ERROR(g.AllGather(mine, zero2_recv_.data(), bytes, stream,
                                     absl::StrCat("sharing the new values of the ", what)));
    for (int c = 0; c < n; ++c) {
      if (c == me || blk.params[c] < 0) continue;
      std::memcpy(params_[blk.params[c]].value.data, zero2_recv_.data() + c * bytes, bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status Optimizer::Step(void* stream) {
  if (!poisoned_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refused because an earlier step failed mid-way (", poisoned_,
        "); parameters and state may be half-updated: restore both from a checkpoint "
        "(muon_load_state or muon_set_state) before stepping again"));
  }
  if (params_.empty() && !distributed_) {
    return absl::FailedPreconditionError(
        "no parameters are registered; call muon_register_param first");
  }
  MUON_RETURN_IF_ERROR(device_->SetStream(stream));
  // Setup fails before any tensor is written.
  if (!planned_) MUON_RETURN_IF_ERROR(Setup(stream));
  if (plan_.units.empty() && plan_.custom.empty() && zero2_blocks_.empty()) {
    return absl::FailedPreconditionError(
        "no parameters are registered on any rank; call muon_register_param first");
  }

  const double decay = 1.0 - options_.lr * options_.weight_decay;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (p.zero2_group >= 0 || !p.active) continue;  // zero2: stepped by its owner later
    MUON_RETURN_IF_ERROR(MomentumOf(i, p.grad.dtype, p.grad.data));
  }
  // From here on state has changed: a failure poisons the optimizer.
  for (auto& g : groups_) g->ResetCounters();
  world_->ResetCounters();
  stats_.matrices_orthogonalized = 0;
  stats_.ns_flops = 0;
  absl::Status st = RunRounds(stream);
  if (st.ok()) st = RunCustom(stream);
  if (st.ok()) st = RunZero2(stream);
  if (!st.ok()) {
    poisoned_ = std::string(st.message());
    return st;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (p.zero2_group >= 0 || !p.active) continue;  // zero2: applied by RunZero2
    MUON_RETURN_IF_ERROR(ApplyTo(i, decay));
  }
  ++step_count_;
  stats_.steps = step_count_;
  stats_.bytes_sent = stats_.bytes_received = stats_.collectives = 0;
  std::vector<const Comm*> counted;
  auto count = [&](const Comm* c) {
    if (std::find(counted.begin(), counted.end(), c) != counted.end()) return;
    counted.push_back(c);
    stats_.bytes_sent += c->counters().bytes_sent;
    stats_.bytes_received += c->counters().bytes_received;
    stats_.collectives += c->counters().collectives;
  };
  count(world_.get());
  for (const auto& g : groups_) count(g.get());
  stats_.rounds = static_cast<int64_t>(tables_.size());
  for (const RoundTable& t : tables_) {
    stats_.matrices_orthogonalized += t.owned;
    stats_.ns_flops += t.flops;
  }
  return absl::OkStatus();
}

absl::StatusOr<const Param*> Optimizer::GetParam(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(params_.size())) {
    return absl::NotFoundError(absl::StrCat("param_id ", id, " is not registered (",
                                            params_.size(), " parameters are)"));
  }
  return &params_[static_cast<size_t>(id)];
}

absl::Status Optimizer::CheckStateTensor(int64_t id, const DLTensor* t, Param** param) const {
  MUON_ASSIGN_OR_RETURN(const Param* p, GetParam(id));
  if (!p->holds_state) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", p->name, "': its momentum lives on its ZeRO-2 owner, another rank of its "
        "data-parallel group; read or write it there"));
  }
  const std::string who = absl::StrCat("state tensor for param '", p->name, "'");
  MUON_ASSIGN_OR_RETURN(TensorView v, ViewTensor(t, who));
  if (!v.on_host() && DeviceString(v.device) != device_->name()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": is on ", DeviceString(v.device),
                                                   "; pass host memory or a tensor on ",
                                                   device_->name()));
  }
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
  MUON_RETURN_IF_ERROR(CheckStateTensor(id, dst, &p));
  auto v = ViewTensor(dst, "state tensor");
  if (p->momentum.empty()) return absl::OkStatus();
  return v->on_host() ? device_->ToHost(v->data, p->momentum.data(), p->momentum.size())
                      : device_->CopyBytes(v->data, p->momentum.data(), p->momentum.size());
}

absl::Status Optimizer::CopyStateIn(int64_t id, const DLTensor* src) {
  Param* p = nullptr;
  MUON_RETURN_IF_ERROR(CheckStateTensor(id, src, &p));
  auto v = ViewTensor(src, "state tensor");
  if (!p->momentum.empty()) {
    MUON_RETURN_IF_ERROR(
        v->on_host() ? device_->FromHost(p->momentum.data(), v->data, p->momentum.size())
                     : device_->CopyBytes(p->momentum.data(), v->data, p->momentum.size()));
  }
  poisoned_.clear();
  return absl::OkStatus();
}

size_t Optimizer::StateBlobSize() const { return muon::StateBlobSize(params_); }

absl::Status Optimizer::SaveState(unsigned char* out) const {
  std::vector<const void*> momentum(params_.size());
  std::vector<std::vector<unsigned char>> staged;  // host copies of device momentum
  if (!device_->is_host()) {
    MUON_RETURN_IF_ERROR(Allocating("staging the state", [&] { staged.resize(params_.size()); }));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const DeviceBuffer& m = params_[i].momentum;
    momentum[i] = m.data();
    if (device_->is_host() || m.empty()) continue;
    MUON_RETURN_IF_ERROR(Allocating("staging the state", [&] { staged[i].resize(m.size()); }));
    MUON_RETURN_IF_ERROR(device_->ToHost(staged[i].data(), m.data(), m.size()));
    momentum[i] = staged[i].data();
  }
  WriteStateBlob(params_, step_count_, momentum, out);
  return absl::OkStatus();
}

absl::Status Optimizer::LoadState(const unsigned char* data, size_t size) {
  MUON_ASSIGN_OR_RETURN(ParsedState parsed, ParseStateBlob(params_, data, size));
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.momentum.empty()) {
      MUON_RETURN_IF_ERROR(device_->FromHost(p.momentum.data(), parsed.momentum[i], p.momentum.size()));
    }
  }
  step_count_ = parsed.step_count;
  poisoned_.clear();
  return absl::OkStatus();
}

}  // namespace muon
