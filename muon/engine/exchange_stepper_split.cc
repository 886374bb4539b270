// ExchangeStepper's matrices split over ranks (MUON_ASSIGNMENT_SPLIT): each
// round's members, this rank's part, and the sums the members take in the
// backend's memory (device memory on a GPU, where the sums' collectives run
// on the communication lane, ordered against the math by stream points).
#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/engine/exchange_stepper.h"
#include "muon/math/split_ns.h"

namespace muon {

absl::Status ExchangeStepper::PlanSplits(const Plan& plan) {
  const int me = world_.rank();
  splits_.assign(tables_.size(), SplitRound());
  for (size_t r = 0; r < splits_.size(); ++r) {
    splits_[r].op = absl::StrCat("summing the split matrices of round ", r);
  }
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    if (u.parts <= 1) continue;
    SplitRound& r = splits_[static_cast<size_t>(u.round)];
    const PlanParam& pp = plan.params[u.param];
    const int64_t m = std::min(pp.rows, pp.cols), n = std::max(pp.rows, pp.cols);
    {  // the same plan on every rank: every rank refuses alike
      const absl::Status st = ctx_.device->math().Supports(ctx_.options->ns);
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("'", pp.name, "' (split over ranks): ",
                                                    st.message()));
      }
    }
    std::vector<MemberSum> sums = BlockSums(ctx_.options->ns, m, n);
    if (ctx_.moments != nullptr) sums.push_back({true, pp.rows});  // NorMuonBlock's
    if (u.part == 0) {
      r.members.emplace_back();
      r.names.push_back(pp.name);
      r.calls = std::max(r.calls, static_cast<int>(sums.size()));
    }
    r.members.back().push_back(u.owner);
    if (u.owner != me) continue;
    if (r.mine >= 0) {  // the same plan on every rank: every rank fails here alike
      return absl::InvalidArgumentError(absl::StrCat(
          "round ", u.round, " gives rank ", me, " parts of two split matrices ('",
          r.names[static_cast<size_t>(r.mine)], "' and '", plan.params[u.param].name,
          "'): a rank takes one part per round"));
    }
    r.mine = static_cast<int>(r.members.size()) - 1;
    r.place = u.part;
    for (const BlockSlot& b : tables_[static_cast<size_t>(u.round)].blocks) {
      if (b.unit == static_cast<int>(i)) r.block = b;
    }
    r.first = u.first;
    r.n = n;
    r.rows = pp.rows;
    // NorMuon's moments of the whole's rows: every member keeps them all
    // (NorMuonBlock updates them alike), saved and restored as an owner's;
    // the first member gives them to a host putting the owners' together.
    if (ctx_.moments != nullptr) {
      r.moments = ctx_.moments->Add(pp.name, u.index, pp.rows, /*primary=*/u.part == 0);
    }
    // A sum's rows: a chunk of at most count / parts + 1 values per member.
    for (const MemberSum& sum : sums) {
      sum_bytes_ = std::max(sum_bytes_, static_cast<size_t>(sum.count + u.parts) *
                                            (sum.f64 ? sizeof(double) : sizeof(float)));
    }
    split_work_bytes_ = std::max(
        split_work_bytes_, SplitWorkBytes(ctx_.options->ns, r.block.m, r.block.width, n, pp.rows));
    r.sums = std::move(sums);
  }
  const size_t world = static_cast<size_t>(world_.size());
  for (auto* v : {&sum_send_bytes_, &sum_send_offsets_, &sum_recv_bytes_, &sum_recv_offsets_}) {
    v->assign(world, 0);
  }
  return absl::OkStatus();
}

absl::Status ExchangeStepper::MakeSplitBuffers() {
  const std::shared_ptr<Device>& device = ctx_.device;
  if (sum_bytes_ != 0) {
    for (DeviceBuffer* b : {&sum_send_, &sum_recv_, &sum_zeros_}) {
      MUON_ASSIGN_OR_RETURN(*b, DeviceBuffer::Make(device, sum_bytes_,
                                                   "the sums of the split matrices' members"));
    }
  }
  if (split_work_bytes_ != 0 && !device->is_host()) {  // the CPU backend has its own
    MUON_ASSIGN_OR_RETURN(split_work_, DeviceBuffer::Make(device, split_work_bytes_,
                                                          "a split matrix's block workspace"));
  }
  return absl::OkStatus();
}

absl::Status ExchangeStepper::ToLane() {
  if (lane_.device == nullptr) return absl::OkStatus();
  MUON_RETURN_IF_ERROR(ctx_.device->Signal(sum_point()));
  return lane_.device->AwaitSignal(*ctx_.device, sum_point());
}

absl::Status ExchangeStepper::FromLane() {
  if (lane_.device == nullptr) return absl::OkStatus();
  MUON_RETURN_IF_ERROR(lane_.device->Signal(sum_point()));
  return ctx_.device->AwaitSignal(*lane_.device, sum_point());
}

template <typename T>
absl::Status ExchangeStepper::Sum(int round, T* values, int64_t count) {
  const SplitRound& s = splits_[static_cast<size_t>(round)];
  for (auto* v : {&sum_send_bytes_, &sum_send_offsets_, &sum_recv_bytes_, &sum_recv_offsets_}) {
    std::fill(v->begin(), v->end(), 0);
  }
  Device& device = *ctx_.device;
  void* stream = lane_.device != nullptr ? lane_.stream : step_stream_;
  unsigned char* send = sum_send_.as<unsigned char>();
  unsigned char* recv = sum_recv_.as<unsigned char>();
  const std::string& op = s.op;
  auto all_to_all = [&](const void* from, void* to) {
    return world_.AllToAllV(from, sum_send_bytes_, sum_send_offsets_, to, sum_recv_bytes_,
                            sum_recv_offsets_, stream, op);
  };
  if (s.mine < 0) {  // no part: two collectives without bytes, both issued whatever happens
    const absl::Status st = all_to_all(send, recv);
    const absl::Status second = all_to_all(send, recv);
    return st.ok() ? second : st;
  }
  const std::vector<int>& members = s.members[static_cast<size_t>(s.mine)];
  const int64_t g = static_cast<int64_t>(members.size()), j = s.place;
  absl::Status st;
  if (values == nullptr) {  // a member that failed: zeros (made on this path only)
    values = sum_zeros_.as<T>();
    st = device.ZeroAsync(values, static_cast<size_t>(count) * sizeof(T));
  }
  auto begin = [&](int64_t i) { return i * (count / g) + std::min(i, count % g); };
  auto length = [&](int64_t i) { return count / g + (i < count % g ? 1 : 0); };
  auto peer = [&](int64_t i) { return static_cast<size_t>(members[static_cast<size_t>(i)]); };
  const size_t len = static_cast<size_t>(length(j)) * sizeof(T);
  // Reduce-scatter: chunk i of `values` to member i; chunk j of every other
  // member i into row i of `recv` (row j: this member's own).
  for (int64_t i = 0; i < g; ++i) {
    if (i == j) continue;
    sum_send_offsets_[peer(i)] = static_cast<size_t>(begin(i)) * sizeof(T);
    sum_send_bytes_[peer(i)] = static_cast<size_t>(length(i)) * sizeof(T);
    sum_recv_offsets_[peer(i)] = static_cast<size_t>(i) * len;
    sum_recv_bytes_[peer(i)] = len;
  }
  if (st.ok()) st = ToLane();
  const absl::Status scattered = all_to_all(values, recv);  // issued whatever happened
  if (st.ok()) st = scattered;
  if (st.ok()) st = FromLane();
  // Chunk j, the members' rows added in member order (every member's chunk
  // the same way, so every member ends with the same bits).
  T* own = values + begin(j);
  if (st.ok()) st = device.CopyBytes(recv + static_cast<size_t>(j) * len, own, len);
  if (st.ok()) {
    st = device.math().SumInOrder(sizeof(T) == sizeof(double), recv, g, length(j), own);
  }
  // All-gather: chunk j to every other member (a copy each in `send`); chunk
  // i from member i into `values`.
  size_t sent = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (i == j) continue;
    sum_send_offsets_[peer(i)] = sent;
    sum_send_bytes_[peer(i)] = len;
    if (st.ok()) st = device.CopyBytes(send + sent, own, len);
    sent += len;
    sum_recv_offsets_[peer(i)] = static_cast<size_t>(begin(i)) * sizeof(T);
    sum_recv_bytes_[peer(i)] = static_cast<size_t>(length(i)) * sizeof(T);
  }
  if (st.ok()) st = ToLane();
  const absl::Status gathered = all_to_all(send, values);
  if (st.ok()) st = gathered;
  if (st.ok()) st = FromLane();
  return st;
}

absl::Status ExchangeStepper::RunSplit(int round, bool skip) {
  const SplitRound& s = splits_[static_cast<size_t>(round)];
  const bool part = s.mine >= 0;
  size_t issued = 0;
  absl::Status st;
  if (part && !skip) {
    void* slots = slots_[static_cast<size_t>(round) % slots_.size()].data();
    const MatrixBlock block{static_cast<float*>(slots) + s.block.offset, s.block.m,
                            s.block.width, s.block.tall, s.first, s.n};
    // Each sum the backend asks for must be the schedule's next: one that is
    // not is refused before it reaches the wire, and the schedule's own are
    // made below, so that the members' collectives still pair up.
    auto scheduled = [&](bool f64, int64_t count) -> absl::Status {
      if (issued >= s.sums.size() || !(s.sums[issued] == MemberSum{f64, count})) {
        return absl::InternalError(absl::StrCat(
            "the backend asked for sum ", issued + 1, " (", count, f64 ? " doubles" : " floats",
            ") where the members' schedule has ",
            issued < s.sums.size() ? absl::StrCat(s.sums[issued].count,
                                                  s.sums[issued].f64 ? " doubles" : " floats")
                                   : std::string("no more")));
      }
      ++issued;
      return absl::OkStatus();
    };
    auto sum = [&](auto* v, int64_t n) -> absl::Status {
      MUON_RETURN_IF_ERROR(scheduled(sizeof(*v) == sizeof(double), n));
      return Sum(round, v, n);
    };
    // Each captures one reference: held inside the std::function, no
    // allocation per step.
    MemberSums hook;
    hook.f64 = [&sum](double* v, int64_t n) { return sum(v, n); };
    hook.f32 = [&sum](float* v, int64_t n) { return sum(v, n); };
    const Options& o = *ctx_.options;
    const NorMuonStep normuon{o.normuon_beta2, o.normuon_eps, o.ns.dtype};
    MathBackend& math = ctx_.device->math();
    float* moments = s.moments >= 0 ? ctx_.moments->data(s.moments) : nullptr;
    if (ctx_.device->is_host()) {  // the same program, on the CPU backend's own memory
      st = math.OrthogonalizeBlock(o.ns, block, hook);
      if (st.ok() && moments != nullptr) st = math.NorMuonBlock(normuon, block, moments, hook);
    } else {  // its steps, on the block's workspace in device memory
      const SplitWork work =
          SplitWorkAt(split_work_.data(), o.ns, s.block.m, s.block.width, s.n, s.rows);
      st = OrthogonalizeBlockOn(math, o.ns, block, hook, work);
      if (st.ok() && moments != nullptr) {
        st = NorMuonBlockOn(math, normuon, block, moments, hook, work);
      }
    }
    if (st.ok() && issued != s.sums.size()) {
      st = absl::InternalError(absl::StrCat("the backend made ", issued, " of the ",
                                            s.sums.size(), " sums its members' schedule has"));
    }
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("split matrix '",
                                                s.names[static_cast<size_t>(s.mine)], "': ",
                                                st.message()));
    }
  }
  // The sums the members expect from a rank that did not compute (or
  // stopped), then those of the round's other split matrices (no bytes).
  for (size_t k = issued; k < static_cast<size_t>(s.calls); ++k) {
    absl::Status sum;
    if (k < s.sums.size() && s.sums[k].f64) {
      sum = Sum<double>(round, nullptr, s.sums[k].count);
    } else {
      sum = Sum<float>(round, nullptr, k < s.sums.size() ? s.sums[k].count : 0);
    }
    if (st.ok()) st = sum;
  }
  return st;
}

}  // namespace muon
