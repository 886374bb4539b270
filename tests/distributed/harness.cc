#include "tests/distributed/harness.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

namespace muon_test {

int Mesh::size() const {
  int n = 1;
  for (int d : dims) n *= d;
  return n;
}

std::vector<int> Mesh::Coords(int rank) const {
  std::vector<int> c(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    c[d] = rank % dims[d];
    rank /= dims[d];
  }
  return c;
}

std::vector<int32_t> Mesh::Group(int rank, int d) const {
  std::vector<int> c = Coords(rank);
  std::vector<int32_t> out;
  for (int k = 0; k < dims[d]; ++k) {
    c[d] = k;
    int r = 0, stride = 1;
    for (size_t e = 0; e < dims.size(); ++e) {
      r += c[e] * stride;
      stride *= dims[e];
    }
    out.push_back(r);
  }
  return out;
}

int64_t FlatCut(int r, int n, int64_t m) {
  // Weights 3, 0, 2, 5, 1, 4, 0, 3, ... (cumulative share of m).
  auto w = [](int k) { return (k * 7 + 3) % 6; };
  int64_t total = 0, upto = 0;
  for (int k = 0; k < n; ++k) {
    total += w(k);
    if (k < r) upto += w(k);
  }
  if (r >= n) return m;
  return total == 0 ? (r == 0 ? 0 : m) : m * upto / total;
}

std::vector<int64_t> LocalIndices(const TParam& p, const Mesh& mesh, int rank) {
  std::vector<int64_t> shape = p.shape;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<int64_t> idx(numel);
  for (int64_t i = 0; i < numel; ++i) idx[i] = i;
  const std::vector<int> coords = mesh.Coords(rank);
  for (const TPlacement& pl : p.placements) {
    const int n = pl.mesh_dim < 0 ? mesh.size() : mesh.dims[pl.mesh_dim];
    const int r = pl.mesh_dim < 0 ? rank : coords[pl.mesh_dim];
    if (pl.kind == MUON_PLACEMENT_REPLICATE) continue;
    if (pl.kind == MUON_PLACEMENT_FLAT_RANGE) {
      const int64_t m = static_cast<int64_t>(idx.size());
      const int64_t a = FlatCut(r, n, m), b = FlatCut(r + 1, n, m);
      idx = std::vector<int64_t>(idx.begin() + a, idx.begin() + b);
      shape = {b - a};
      continue;
    }
    if (pl.dim < 0 || static_cast<size_t>(pl.dim) >= shape.size()) {
      return {};  // an invalid layout (misuse tests): the library must refuse it
    }
    const int64_t d = shape[pl.dim];
    int64_t a = 0, b = 0;
    if (pl.split == MUON_SPLIT_EVEN) {
      if (d % n != 0) return {};  // invalid (misuse tests)
      a = r * (d / n);
      b = a + d / n;
    } else if (pl.split == MUON_SPLIT_CHUNK) {
      const int64_t c = (d + n - 1) / n;
      a = std::min(d, r * c);
      b = std::min(d, a + c);
    } else {
      for (int k = 0; k < r; ++k) a += pl.sizes[k];
      b = a + pl.sizes[r];
    }
    // Keep, in row-major order, the elements whose coordinate along dim is in [a, b).
    int64_t inner = 1;
    for (size_t k = pl.dim + 1; k < shape.size(); ++k) inner *= shape[k];
    std::vector<int64_t> kept;
    for (size_t i = 0; i < idx.size(); ++i) {
      const int64_t coord = (static_cast<int64_t>(i) / inner) % d;
      if (coord >= a && coord < b) kept.push_back(idx[i]);
    }
    idx.swap(kept);
    shape[pl.dim] = b - a;
  }
  return idx;
}

float InitValue(const std::string& name, int64_t i) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return 0.05f * std::sin(static_cast<float>((h % 1000) + i) * 0.37f);
}

float GradValue(const std::string& name, int64_t i, int step) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  const float x = static_cast<float>((h % 997) + i * 13 + step * 101);
  return std::sin(x * 0.61f) + 0.3f * std::cos(x * 1.7f + static_cast<float>(step));
}

DLTensor Tensor1D(float* data, int64_t* n) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = n;
  return t;
}

namespace {

DLTensor TensorND(float* data, std::vector<int64_t>* shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape->size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape->data();
  return t;
}

void Options(const RunConfig& cfg, muon_options_t* o) {
  muon_options_init(o, sizeof *o);
  o->lr = 0.02;
  o->weight_decay = 0.1;
  o->ns_dtype = cfg.ns_dtype;
  o->assignment = cfg.assignment;
  o->prefetch_count = cfg.prefetch_count;
  o->async_parallelism = cfg.async_parallelism;
  o->round_bytes = cfg.round_bytes;
  o->assign_fn = cfg.assign_fn;
  if (cfg.variant) cfg.variant(o);
}

struct FailingComm {
  muon_comm_t inner;
  CallCounter* counter;
};

// `recv`, `recv_size`: what the call received (all_gather), for corrupt_on.
muon_status_t Counted(FailingComm* f, int kind, muon_status_t st, void* recv = nullptr,
                      size_t recv_size = 0) {
  CallCounter& c = *f->counter;
  if (c.kind >= 0 && c.kind != kind) return st;
  if (st != MUON_OK) return st;
  const int call = c.calls++;
  if (call == c.corrupt_on && c.corrupt_at < recv_size) {
    static_cast<unsigned char*>(recv)[c.corrupt_at] ^= c.corrupt_mask;
  }
  if (call == c.fail_on) {
    muon_set_callback_error("injected link failure");
    return static_cast<muon_status_t>(c.fail_status);
  }
  return st;
}

muon_status_t FailingA2a(void* ctx, const void* send, const size_t* sb, const size_t* so,
                         void* recv, const size_t* rb, const size_t* ro, void* stream) {
  auto* f = static_cast<FailingComm*>(ctx);
  return Counted(f, 1, f->inner.all_to_all_v(f->inner.ctx, send, sb, so, recv, rb, ro, stream));
}
muon_status_t FailingAllGather(void* ctx, const void* s, void* r, size_t b, void* st) {
  auto* f = static_cast<FailingComm*>(ctx);
  const size_t size = static_cast<size_t>(f->inner.size) * b;
  return Counted(f, 0, f->inner.all_gather(f->inner.ctx, s, r, b, st), r, size);
}
muon_status_t PassBroadcast(void* ctx, void* buf, size_t b, int32_t root, void* st) {
  auto* f = static_cast<FailingComm*>(ctx);
  return f->inner.broadcast(f->inner.ctx, buf, b, root, st);
}
muon_status_t FailingReduceScatter(void* ctx, const void* s, void* r, size_t c, int32_t d,
                                   void* st) {
  auto* f = static_cast<FailingComm*>(ctx);
  return Counted(f, 2, f->inner.reduce_scatter(f->inner.ctx, s, r, c, d, st));
}
muon_status_t PassBarrier(void* ctx, void* st) {
  auto* f = static_cast<FailingComm*>(ctx);
  return f->inner.barrier(f->inner.ctx, st);
}
void ReleaseFailing(void* ctx) {
  auto* f = static_cast<FailingComm*>(ctx);
  if (f->inner.release) f->inner.release(f->inner.ctx);
  delete f;
}

}  // namespace

muon_comm_t WrapFailing(const muon_comm_t& inner, CallCounter* counter) {
  muon_comm_t t = inner;
  t.ctx = new FailingComm{inner, counter};
  t.all_gather = FailingAllGather;
  t.all_to_all_v = FailingA2a;
  t.broadcast = inner.broadcast ? PassBroadcast : nullptr;
  t.reduce_scatter = FailingReduceScatter;
  t.barrier = inner.barrier ? PassBarrier : nullptr;
  t.release = ReleaseFailing;
  return t;
}

namespace {

std::string LastError(const char* what, muon_status_t st) {
  return std::string(what) + ": " + muon_status_string(st) + ": " + muon_last_error_message();
}

}  // namespace

std::vector<std::vector<float>> RunReference(const std::vector<TParam>& model,
                                             const RunConfig& cfg) {
  muon_options_t o;
  Options(cfg, &o);
  o.assignment = MUON_ASSIGNMENT_BALANCED;
  o.assign_fn = nullptr;
  muon_optimizer_t* opt = nullptr;
  if (muon_create(&o, &opt) != MUON_OK) return {};
  std::vector<std::vector<float>> values(model.size()), grads(model.size());
  std::vector<std::vector<int64_t>> shapes(model.size());
  for (size_t k = 0; k < model.size(); ++k) {
    const TParam& p = model[k];
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    values[k].resize(numel);
    grads[k].resize(numel);
    for (int64_t i = 0; i < numel; ++i) values[k][i] = InitValue(p.name, i);
    shapes[k] = p.shape;
    DLTensor v = TensorND(values[k].data(), &shapes[k]);
    DLTensor g = TensorND(grads[k].data(), &shapes[k]);
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = p.name.c_str();
    po.matrix_view = p.view;
    po.lr_scale = p.lr_scale;
    po.weight_decay_scale = p.weight_decay_scale;
    po.split_dim = p.split_dim;
    po.num_split_sizes = static_cast<int32_t>(p.split_sizes.size());
    po.split_sizes = p.split_sizes.data();
    int64_t id;
    if (muon_register_param(opt, &v, &g, &po, &id) != MUON_OK) {
      muon_destroy(opt);
      return {};
    }
  }
  for (int s = 0; s < cfg.steps; ++s) {
    for (size_t k = 0; k < model.size(); ++k) {
      for (size_t i = 0; i < grads[k].size(); ++i) {
        grads[k][i] = GradValue(model[k].name, static_cast<int64_t>(i), s);
      }
    }
    if (muon_step(opt, nullptr) != MUON_OK) {
      muon_destroy(opt);
      return {};
    }
  }
  if (cfg.after_steps && cfg.after_steps(0, opt) != MUON_OK) {
    muon_destroy(opt);
    return {};
  }
  muon_destroy(opt);
  return values;
}

std::vector<RankResult> RunDistributed(const std::vector<TParam>& model, const Mesh& mesh,
                                       const RunConfig& cfg) {
  const int n = mesh.size();
  muon_inprocess_world_t* world = nullptr;
  std::vector<RankResult> results(n);
  if (muon_inprocess_world_create(n, &world) != MUON_OK) {
    results[0].error = LastError("world", MUON_INTERNAL);
    return results;
  }
  auto run_rank = [&](int rank) {
    RankResult& res = results[rank];
    muon_options_t o;
    Options(cfg, &o);
    int my_rank = rank;
    o.assign_state = &my_rank;
    if (cfg.mutate_options) cfg.mutate_options(rank, &o);
    muon_optimizer_t* opt = nullptr;
    muon_status_t st = muon_create(&o, &opt);
    if (st != MUON_OK) {
      res.error = LastError("create", st);
      return;
    }
    muon_comm_t comm;
    int32_t world_id = -1;
    // Counting (and failing) collectives: a clean run counts them per step.
    CallCounter counter;
    const bool injecting = cfg.fail_exchange_call >= 0 || cfg.fail_call >= 0;
    const bool corrupting = cfg.corrupt_call >= 0;
    if (cfg.fail_exchange_call >= 0) {
      counter.fail_on = cfg.fail_exchange_call;
      counter.kind = 1;
    } else if (cfg.fail_call >= 0 && (cfg.fail_rank < 0 || cfg.fail_rank == rank)) {
      counter.fail_on = cfg.fail_call;
      counter.fail_status = cfg.fail_status;
    }
    if (cfg.corrupt_call >= 0 && cfg.corrupt_rank == rank) {
      counter.corrupt_on = cfg.corrupt_call;
      counter.corrupt_at = cfg.corrupt_byte;
      counter.corrupt_mask = cfg.corrupt_mask;
    }
    auto wrap = [&](muon_comm_t* t) {
      if (cfg.count_calls || injecting || corrupting) *t = WrapFailing(*t, &counter);
    };
    st = muon_inprocess_comm(world, nullptr, 0, rank, &comm);
    if (st == MUON_OK) wrap(&comm);
    auto optional = [&](muon_comm_t* t) {
      if (!cfg.without_optional_collectives) return;
      t->broadcast = nullptr;
      t->barrier = nullptr;
    };
    optional(&comm);
    if (st == MUON_OK) st = muon_set_world(opt, &comm, &world_id);
    std::vector<int32_t> group_ids;
    for (size_t d = 0; st == MUON_OK && d < mesh.dims.size(); ++d) {
      std::vector<int32_t> members = mesh.Group(rank, static_cast<int>(d));
      int32_t id = -1;
      st = muon_inprocess_comm(world, members.data(), static_cast<int32_t>(members.size()), rank,
                               &comm);
      if (st == MUON_OK && cfg.fail_exchange_call < 0) wrap(&comm);
      optional(&comm);
      if (st == MUON_OK) st = muon_add_group(opt, &comm, &id);
      group_ids.push_back(id);
    }
    if (st != MUON_OK) {
      res.error = LastError("groups", st);
      muon_destroy(opt);
      return;
    }
    std::vector<std::vector<float>> grads;
    std::vector<size_t> which;  // model index of each registered param
    std::vector<TParam> mine = model;
    std::vector<std::pair<int64_t, int64_t>> flat_override(model.size(), {-1, -1});
    if (cfg.mutate) {
      for (size_t k = 0; k < mine.size(); ++k) {
        cfg.mutate(rank, &mine[k], &flat_override[k].first, &flat_override[k].second);
      }
    }
    for (size_t k = 0; k < model.size(); ++k) {
      const TParam& p = mine[k];
      if (p.registered_on && !p.registered_on(rank)) continue;
      std::vector<int64_t> idx = LocalIndices(p, mesh, rank);
      if (flat_override[k].first >= 0) {
        // A deliberately wrong flat range: the local tensor follows it.
        TParam prefix = p;
        while (!prefix.placements.empty() &&
               prefix.placements.back().kind == MUON_PLACEMENT_FLAT_RANGE) {
          prefix.placements.pop_back();
        }
        std::vector<int64_t> all = LocalIndices(prefix, mesh, rank);
        const int64_t a = flat_override[k].first, len = flat_override[k].second;
        idx.assign(all.begin() + std::min<int64_t>(a, all.size()),
                   all.begin() + std::min<int64_t>(a + len, all.size()));
      }
      res.indices.push_back(idx);
      res.names.push_back(p.name);
      res.params.emplace_back(idx.size());
      grads.emplace_back(idx.size());
      which.push_back(k);
    }
    std::vector<int64_t> counts(res.params.size());
    std::vector<std::vector<muon_placement_t>> placements(res.params.size());
    for (size_t j = 0; j < res.params.size(); ++j) {
      const TParam& p = mine[which[j]];
      for (size_t i = 0; i < res.indices[j].size(); ++i) {
        res.params[j][i] = cfg.resume_values != nullptr
                               ? cfg.resume_values->at(p.name)[res.indices[j][i]]
                               : InitValue(p.name, res.indices[j][i]);
      }
      counts[j] = static_cast<int64_t>(res.indices[j].size());
      for (const TPlacement& tp : p.placements) {
        muon_placement_t pl{};
        pl.kind = tp.kind;
        pl.group = tp.mesh_dim < 0 ? world_id : group_ids[tp.mesh_dim];
        pl.dim = tp.dim;
        pl.split = tp.split;
        pl.sizes = tp.sizes.empty() ? nullptr : tp.sizes.data();
        placements[j].push_back(pl);
      }
    }
    // Flat ranges: this rank's range of the tensor the placement splits.
    for (size_t j = 0; j < res.params.size(); ++j) {
      const TParam& p = mine[which[j]];
      TParam prefix = p;
      prefix.placements.clear();
      for (size_t q = 0; q < p.placements.size(); ++q) {
        if (p.placements[q].kind == MUON_PLACEMENT_FLAT_RANGE) {
          const int64_t m = static_cast<int64_t>(LocalIndices(prefix, mesh, rank).size());
          const int gn = p.placements[q].mesh_dim < 0 ? n : mesh.dims[p.placements[q].mesh_dim];
          const int gr = p.placements[q].mesh_dim < 0 ? rank
                                                      : mesh.Coords(rank)[p.placements[q].mesh_dim];
          placements[j][q].start = FlatCut(gr, gn, m);
          placements[j][q].length = FlatCut(gr + 1, gn, m) - placements[j][q].start;
          if (flat_override[which[j]].first >= 0 && q + 1 == p.placements.size()) {
            placements[j][q].start = flat_override[which[j]].first;
            placements[j][q].length = flat_override[which[j]].second;
          }
        }
        prefix.placements.push_back(p.placements[q]);
      }
    }
    for (size_t j = 0; j < res.params.size() && st == MUON_OK; ++j) {
      const TParam& p = mine[which[j]];
      DLTensor v = Tensor1D(res.params[j].data(), &counts[j]);
      DLTensor g = Tensor1D(grads[j].data(), &counts[j]);
      muon_param_options_t po;
      muon_param_options_init(&po, sizeof po);
      po.name = p.name.c_str();
      po.matrix_view = p.view;
      po.replicated_mode = p.replicated_mode;
      po.lr_scale = p.lr_scale;
      po.weight_decay_scale = p.weight_decay_scale;
      po.split_dim = p.split_dim;
      po.num_split_sizes = static_cast<int32_t>(p.split_sizes.size());
      po.split_sizes = p.split_sizes.data();
      po.global_ndim = static_cast<int32_t>(p.shape.size());
      po.global_shape = p.shape.data();
      po.num_placements = static_cast<int32_t>(placements[j].size());
      po.placements = placements[j].data();
      int64_t id;
      st = muon_register_param(opt, &v, &g, &po, &id);
      if (st != MUON_OK) res.error = LastError("register", st);
    }
    if (st == MUON_OK && cfg.resume_from != nullptr) {  // before the first step
      std::vector<const void*> blobs;
      std::vector<size_t> sizes;
      for (const auto& b : *cfg.resume_from) {
        blobs.push_back(b.data());
        sizes.push_back(b.size());
      }
      st = cfg.resume_own_blob
               ? muon_load_state(opt, blobs[rank], sizes[rank])
               : muon_load_states(opt, blobs.data(), sizes.data(), blobs.size());
      if (st != MUON_OK) res.error = LastError("load", st);
    }
    std::vector<unsigned char> blob;
    std::vector<std::vector<float>> saved, saved_state;
    for (int s = cfg.first_step; s < cfg.first_step + cfg.steps &&
                                 (st == MUON_OK || cfg.keep_stepping);
         ++s) {
      for (size_t j = 0; j < grads.size(); ++j) {
        for (size_t i = 0; i < grads[j].size(); ++i) {
          grads[j][i] = GradValue(res.names[j], res.indices[j][i], s);
        }
      }
      res.calls_before_step.push_back(counter.calls);
      if (injecting) {  // a checkpoint before each step (the first: a setup fault)
        size_t size = 0;
        muon_save_state(opt, nullptr, 0, &size);
        blob.resize(size);
        muon_save_state(opt, blob.data(), size, &size);
        saved = res.params;
        saved_state = res.params;  // the momentum, param by param (float32 here)
        for (size_t j = 0; j < saved_state.size(); ++j) {
          DLTensor m = Tensor1D(saved_state[j].data(), &counts[j]);
          muon_get_state(opt, static_cast<int64_t>(j), &m);
        }
      }
      st = muon_step(opt, nullptr);
      res.step_errors.push_back(st == MUON_OK ? "" : LastError("step", st));
      if (st != MUON_OK && res.failed_step < 0) {
        res.error = res.step_errors.back();
        res.failed_step = s;
      }
    }
    res.calls_before_step.push_back(counter.calls);
    if (st != MUON_OK && injecting && !blob.empty() && !cfg.keep_stepping) {
      muon_status_t again = muon_step(opt, nullptr);
      res.refused = LastError("step again", again);
      res.again_ok = again == MUON_OK;
      for (size_t j = 0; j < saved.size(); ++j) {  // in place: the library holds the pointers
        std::copy(saved[j].begin(), saved[j].end(), res.params[j].begin());
      }
      if (cfg.restore_with_set_state) {
        bool ok = true;
        for (size_t j = 0; j < saved_state.size(); ++j) {
          if (j + 1 == saved_state.size() && j > 0) {
            muon_status_t early = muon_step(opt, nullptr);
            res.refused_when_partly_restored = LastError("step partly restored", early);
          }
          DLTensor m = Tensor1D(saved_state[j].data(), &counts[j]);
          ok = ok && muon_set_state(opt, static_cast<int64_t>(j), &m) == MUON_OK;
        }
        res.recovered = ok && muon_step(opt, nullptr) == MUON_OK;
      } else {
        muon_status_t loaded = muon_load_state(opt, blob.data(), blob.size());
        if (loaded != MUON_OK) res.recovery_error = LastError("load", loaded);
        muon_status_t stepped = loaded == MUON_OK ? muon_step(opt, nullptr) : loaded;
        if (loaded == MUON_OK && stepped != MUON_OK) {
          res.recovery_error = LastError("step after loading", stepped);
        }
        res.recovered = stepped == MUON_OK;
      }
    }
    if (cfg.after_steps && st == MUON_OK && res.error.empty()) {
      st = cfg.after_steps(rank, opt);
      if (st != MUON_OK) res.error = LastError("after_steps", st);
    }
    if (cfg.save_at_end && st == MUON_OK) {
      size_t size = 0;
      muon_save_state(opt, nullptr, 0, &size);
      res.blob.resize(size);
      st = muon_save_state(opt, res.blob.data(), size, &size);
      if (st != MUON_OK) res.error = LastError("save", st);
    }
    muon_stats_init(&res.stats, sizeof res.stats);
    muon_get_stats(opt, &res.stats);
    muon_destroy(opt);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(run_rank, r);
  for (auto& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  return results;
}

}  // namespace muon_test
