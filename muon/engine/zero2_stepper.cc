#include "muon/engine/zero2_stepper.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/engine/local_update.h"

namespace muon {

absl::StatusOr<std::unique_ptr<Zero2Stepper>> Zero2Stepper::Create(
    const std::vector<std::shared_ptr<Comm>>& groups,
    const std::vector<std::vector<int>>& members, int64_t matrices_total,
    const StepContext& ctx) {
  std::unique_ptr<Zero2Stepper> s(new Zero2Stepper(groups, ctx));
  std::vector<Param>& params = *ctx.params;
  s->stats_.matrices_total = matrices_total;
  int64_t largest = 0, widest = 0;
  s->MakeBlocks(members, &largest, &widest);
  // Before any param changes: a state restored before this setup from a blob
  // that held none of an owned param's momentum is refused.
  for (const Block& blk : s->blocks_) {
    const int me = groups[blk.group]->rank();
    const int mine = me < static_cast<int>(blk.params.size()) ? blk.params[me] : -1;
    if (mine >= 0 && params[mine].momentum_elsewhere) {
      return absl::FailedPreconditionError(absl::StrCat(
          "param '", params[mine].name, "': the state blob loaded before the first step holds "
          "none of its momentum, but this rank owns it (ZeRO-2): load every rank's blob with "
          "muon_load_states"));
    }
  }
  for (Param& p : params) p.momentum_elsewhere = false;
  s->moment_first_.assign(params.size(), -1);
  for (const Block& blk : s->blocks_) {
    const int me = groups[blk.group]->rank();
    for (size_t c = 0; c < blk.params.size(); ++c) {
      if (blk.params[c] < 0) continue;
      if (static_cast<int>(c) == me) {
        MUON_RETURN_IF_ERROR(s->TakeOwned(blk.params[c]));
      } else {
        Param& p = params[blk.params[c]];
        p.holds_state = false;  // its momentum lives on the owner: 1/N of the state here
        p.momentum.Reset();
      }
    }
  }
  try {
    s->send_.resize(static_cast<size_t>(widest) * 4);
    s->recv_.resize(static_cast<size_t>(widest) * 4);
    s->average_.resize(static_cast<size_t>(largest));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of host memory for the ZeRO-2 buffers");
  }
  return s;
}

void Zero2Stepper::MakeBlocks(const std::vector<std::vector<int>>& members, int64_t* largest,
                              int64_t* widest) {
  std::vector<Param>& params = *ctx_.params;
  // Group instances in one order every rank agrees on: by member list.
  // Each group's parameters, found in one pass.
  std::vector<std::vector<int>> of_group(groups_.size());
  std::vector<int> order;
  for (size_t i = 0; i < params.size(); ++i) {
    const int g = params[i].zero2_group;
    if (g < 0) continue;
    if (of_group[g].empty()) order.push_back(g);
    of_group[g].push_back(static_cast<int>(i));
  }
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return members[a] < members[b]; });
  for (int g : order) {
    const int n = groups_[g]->size();
    std::vector<int>& mine = of_group[g];
    std::sort(mine.begin(), mine.end(),
              [&](int a, int b) { return params[a].name < params[b].name; });
    // Same shape and dtype together, in order of first appearance.
    std::vector<std::vector<int>> buckets;
    absl::flat_hash_map<std::pair<std::vector<int64_t>, DType>, size_t> bucket_of;
    for (int i : mine) {
      auto [it, added] =
          bucket_of.try_emplace({params[i].value.shape, params[i].value.dtype}, buckets.size());
      if (added) buckets.emplace_back();
      buckets[it->second].push_back(i);
    }
    int64_t k = 0;  // block-cyclic owner counter, running across buckets
    for (const auto& b : buckets) {
      for (size_t start = 0; start < b.size(); start += n) {
        Block blk;
        blk.group = g;
        blk.dtype = params[b[0]].value.dtype;
        blk.elems = params[b[0]].numel();
        blk.params.assign(n, -1);
        for (size_t j = start; j < std::min(b.size(), start + n); ++j) {
          blk.params[k++ % n] = b[j];
        }
        const int first = *std::max_element(blk.params.begin(), blk.params.end());
        const std::string what = absl::StrCat("ZeRO-2 block of param '", params[first].name, "'");
        blk.averaging = absl::StrCat("averaging gradients of the ", what);
        blk.sharing = absl::StrCat("sharing the new values of the ", what);
        *largest = std::max(*largest, blk.elems);
        *widest = std::max(*widest, blk.elems * n);
        blocks_.push_back(std::move(blk));
      }
    }
  }
}

absl::Status Zero2Stepper::TakeOwned(int param) {
  Param& p = (*ctx_.params)[param];
  if (p.split.none()) {
    MUON_RETURN_IF_ERROR(ctx_.device->math().Reserve(ctx_.options->ns, p.batch, p.rows, p.cols));
  } else if (!ctx_.device->is_host()) {
    return absl::UnimplementedError(absl::StrCat(
        "param '", p.name, "': split_sizes (blocks orthogonalized apart) runs on the CPU "
        "backend only so far"));
  } else {
    factors_.resize(ctx_.params->size());
    factors_[static_cast<size_t>(param)] =
        BlockLrRatios(ctx_.options->adjust_lr, p.split, p.rows, p.cols);
    MUON_RETURN_IF_ERROR(split_blocks_.Reserve(
        ctx_.device->math(), MemorySourceOf(ctx_.device.get()), ctx_.options->ns, p.split,
        p.batch, p.rows, p.cols, DType::kF32));
  }
  if (ctx_.moments != nullptr) {  // NorMuon: ids of one param's matrices run on
    moment_first_[static_cast<size_t>(param)] = ctx_.moments->Add(p.name, 0, p.moment_count());
    for (int64_t k = 1; k < p.batch; ++k) ctx_.moments->Add(p.name, k, p.moment_count());
    moment_ptrs_.resize(std::max<size_t>(moment_ptrs_.size(), p.batch));
  }
  stats_.matrices_owned += MatrixShape{p.batch, p.rows, p.cols}.with_elements();
  return absl::OkStatus();
}

absl::Status Zero2Stepper::StepOwned(const Block& blk, int param) {
  Param& p = (*ctx_.params)[param];
  float* update = ctx_.update(param);
  const int n = groups_[blk.group]->size();
  for (int64_t e = 0; e < blk.elems; ++e) {
    average_[e] =
        RoundTo(blk.dtype, LoadAsFloat(blk.dtype, recv_.data(), e) / static_cast<float>(n));
  }
  MathBackend& math = ctx_.device->math();
  const Options& options = *ctx_.options;
  // The average, already rounded to the grad dtype, enters as fp32.
  MUON_RETURN_IF_ERROR(
      math.Momentum(MomentumStepOf(options, ctx_.scalars, &stats_.nonfinite),
                    {MomentumOf(p, DType::kF32, average_.data(), {update, DType::kF32})}));
  const int first = moment_first_[static_cast<size_t>(param)];  // NorMuon's, or -1
  for (int64_t k = 0; first >= 0 && k < p.batch; ++k) {
    moment_ptrs_[k] = ctx_.moments->data(first + k);
  }
  const NorMuonStep normuon{options.normuon_beta2, options.normuon_eps, options.ns.dtype};
  const MatrixBatch matrices{update, p.batch, p.rows, p.cols};
  if (!p.split.none()) {
    MUON_RETURN_IF_ERROR(split_blocks_.Run(math, options.ns, p.split,
                                           factors_[static_cast<size_t>(param)],
                                           first >= 0 ? &normuon : nullptr, moment_ptrs_.data(),
                                           matrices));
  } else {
    MUON_RETURN_IF_ERROR(math.Orthogonalize(options.ns, matrices));
    if (first >= 0) MUON_RETURN_IF_ERROR(math.NorMuon(normuon, matrices, moment_ptrs_.data()));
  }
  MUON_RETURN_IF_ERROR(
      math.Apply({ctx_.scalars, nullptr}, {ApplyOf(options, p, {update, DType::kF32})}));
  stats_.orthogonalized += MatrixShape{p.batch, p.rows, p.cols}.with_elements();
  stats_.ns_flops += p.batch * SplitNewtonSchulzFlops(options.ns, p.split, p.rows, p.cols);
  return absl::OkStatus();
}

absl::Status Zero2Stepper::RunBlock(const Block& blk, void* stream, bool failed) {
  std::vector<Param>& params = *ctx_.params;
  Comm& g = *groups_[blk.group];
  const int n = g.size(), me = g.rank();
  const size_t bytes = static_cast<size_t>(blk.elems) * SizeOf(blk.dtype);
  // Gradients, block c for the owner at coord c, summed onto it. (Empty
  // tensors may have NULL data, and then no copy may be made of them.)
  for (int c = 0; c < n && bytes > 0; ++c) {
    unsigned char* dst = send_.data() + c * bytes;
    if (blk.params[c] >= 0) {
      std::memcpy(dst, params[blk.params[c]].grad.data, bytes);
    } else {
      std::memset(dst, 0, bytes);
    }
  }
  // Both collectives are issued whatever failed (see stepper.h); a failed
  // rank neither steps its owned param nor takes the others' new values.
  absl::Status st = g.ReduceScatter(send_.data(), recv_.data(), static_cast<size_t>(blk.elems),
                                    blk.dtype, stream, blk.averaging);
  if (st.ok() && !failed && blk.params[me] >= 0) st = StepOwned(blk, blk.params[me]);
  // The owners' new values to every replica.
  unsigned char* mine = send_.data();
  if (bytes > 0 && blk.params[me] >= 0) {
    std::memcpy(mine, params[blk.params[me]].value.data, bytes);
  } else if (bytes > 0) {
    std::memset(mine, 0, bytes);
  }
  absl::Status shared = g.AllGather(mine, recv_.data(), bytes, stream, blk.sharing);
  if (st.ok()) st = shared;
  if (!st.ok() || failed) return st;
  for (int c = 0; c < n && bytes > 0; ++c) {
    if (c == me || blk.params[c] < 0) continue;
    std::memcpy(params[blk.params[c]].value.data, recv_.data() + c * bytes, bytes);
  }
  return absl::OkStatus();
}

absl::Status Zero2Stepper::Run(void* stream, bool failed) {
  stats_.orthogonalized = 0;
  stats_.ns_flops = 0;
  stats_.nonfinite = 0;
  absl::Status first;
  for (const Block& blk : blocks_) {
    absl::Status st = RunBlock(blk, stream, failed || !first.ok());
    if (first.ok()) first = st;
  }
  return first;
}

}  // namespace muon
