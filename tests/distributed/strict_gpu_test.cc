// The GPU path's host logic, run on the strict GPU (muon/device/testing/
// strict_gpu.h) through the C API: kDLCUDA tensors in device memory the host
// cannot touch, every copy and kernel deferred until a wait, a stream of the
// host's own. What the library does wrong there (a host read of device
// memory, a read before the wait it needs, host memory handed where device
// memory belongs) faults or gives wrong numbers here, as on a GPU. The
// arithmetic is the CPU backend's, so the results must equal a host run's
// bit for bit.
#include <dlfcn.h>
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capi/muon.h"
#include "gtest/gtest.h"
#include "muon/device/strict_cpu_runtime.h"

namespace muon_test {
namespace {

using muon::CopyKind;
using muon::StrictCpuRuntime;

// The runtime of the strict plugin the library loads (MUON_CUDA_PLUGIN).
StrictCpuRuntime* Rt() {
  static StrictCpuRuntime* rt = [] {
    const char* path = std::getenv("MUON_CUDA_PLUGIN");
    void* h = path == nullptr ? nullptr : dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return static_cast<StrictCpuRuntime*>(nullptr);
    auto fn = reinterpret_cast<StrictCpuRuntime* (*)()>(dlsym(h, "muon_strict_gpu_runtime"));
    return fn == nullptr ? nullptr : fn();
  }();
  return rt;
}

constexpr DLDataType kF32{kDLFloat, 32, 1};

// A float tensor on the host or on strict-cpu device `device` (-1: host).
struct Tensor {
  std::vector<int64_t> shape;
  int device = -1;
  std::vector<float> host;
  float* dev = nullptr;
  DLTensor dl{};

  Tensor(std::vector<int64_t> s, int on) : shape(std::move(s)), device(on) {
    const size_t n = numel();
    if (device < 0) {
      host.assign(n, 0.0f);
    } else {
      EXPECT_TRUE(Rt()->SetDevice(device).ok());
      dev = static_cast<float*>(*Rt()->Malloc(n * 4, "tensor"));
    }
    dl.data = device < 0 ? static_cast<void*>(host.data()) : static_cast<void*>(dev);
    dl.device = device < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, device};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = kF32;
    dl.shape = shape.data();
  }
  ~Tensor() {
    if (dev != nullptr) Rt()->Free(dev);
  }
  Tensor(const Tensor&) = delete;
  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  // Writes `v` (kept alive by the caller until `stream` ran) / reads back after a wait.
  void Write(const std::vector<float>& v, void* stream) {
    if (device < 0) {
      ASSERT_EQ(v.size(), host.size());
      std::copy(v.begin(), v.end(), host.begin());  // the registered storage stays
      return;
    }
    ASSERT_TRUE(
        Rt()->MemcpyAsync(dev, v.data(), v.size() * 4, CopyKind::kHostToDevice, stream, "w").ok());
  }
  std::vector<float> Read(void* stream) {
    if (device < 0) return host;
    std::vector<float> out(numel());
    EXPECT_TRUE(
        Rt()->MemcpyAsync(out.data(), dev, out.size() * 4, CopyKind::kDeviceToHost, stream, "r")
            .ok());
    EXPECT_TRUE(Rt()->StreamSynchronize(stream, "reading back").ok());
    return out;
  }
};

std::vector<float> Values(size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.31f * static_cast<float>(i) + 1.7f * salt);
  return v;
}

muon_optimizer_t* Create(int prefetch) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.lr = 0.02;
  o.weight_decay = 0.01;
  o.prefetch_count = prefetch;
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_OK) << muon_last_error_message();
  return opt;
}

std::vector<unsigned char> Save(const muon_optimizer_t* opt) {
  size_t size = 0;
  EXPECT_EQ(muon_save_state(opt, nullptr, 0, &size), MUON_OK);
  std::vector<unsigned char> blob(size);
  EXPECT_EQ(muon_save_state(opt, blob.data(), size, &size), MUON_OK) << muon_last_error_message();
  return blob;
}

// Two matrices (one tall, one wide) stepped on `device` (-1: the host).
struct Model {
  muon_optimizer_t* opt;
  void* stream;
  std::vector<std::unique_ptr<Tensor>> params, grads;

  Model(int device, int prefetch, void* s) : opt(Create(prefetch)), stream(s) {
    const std::vector<std::vector<int64_t>> shapes = {{12, 5}, {6, 16}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      params.push_back(std::make_unique<Tensor>(shapes[i], device));
      grads.push_back(std::make_unique<Tensor>(shapes[i], device));
      // (The host values must outlive the copy: it runs at the wait.)
      const std::vector<float> init = Values(params[i]->numel(), 100 + static_cast<int>(i));
      params[i]->Write(init, stream);
      if (device >= 0) {
        EXPECT_TRUE(Rt()->StreamSynchronize(stream, "init").ok());
      }
      muon_param_options_t po;
      muon_param_options_init(&po, sizeof po);
      const std::string name = "w" + std::to_string(i);
      po.name = name.c_str();
      int64_t id = -1;
      EXPECT_EQ(muon_register_param(opt, &params[i]->dl, &grads[i]->dl, &po, &id), MUON_OK)
          << muon_last_error_message();
    }
  }
  ~Model() { muon_destroy(opt); }

  muon_status_t Step(int salt) {
    std::vector<std::vector<float>> g;
    for (size_t i = 0; i < grads.size(); ++i) {
      g.push_back(Values(grads[i]->numel(), salt * 7 + static_cast<int>(i)));
      grads[i]->Write(g.back(), stream);
    }
    const muon_status_t st = muon_step(opt, stream);
    // The gradients' host copies must outlive the copies that read them.
    if (stream != nullptr || grads[0]->device >= 0) {
      EXPECT_TRUE(Rt()->StreamSynchronize(stream, "after the step").ok());
    }
    return st;
  }
  std::vector<std::vector<float>> Values_() {
    std::vector<std::vector<float>> out;
    for (auto& p : params) out.push_back(p->Read(stream));
    return out;
  }
};

TEST(StrictGpu, StepsEqualTheHostBitForBitAndResume) {
  ASSERT_NE(Rt(), nullptr) << "MUON_CUDA_PLUGIN must name libmuon_strict_gpu.so";
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  for (int prefetch : {0, 1}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    Model host(-1, prefetch, nullptr), gpu(0, prefetch, stream);
    for (int s = 0; s < 3; ++s) {
      ASSERT_EQ(host.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(gpu.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(gpu.Values_(), host.Values_()) << "step " << s;
    }
    // The state blob: the same bytes; loaded into a fresh GPU optimizer over
    // the same parameters, it continues like the host run.
    const std::vector<unsigned char> blob = Save(gpu.opt);
    ASSERT_EQ(blob, Save(host.opt));
    Model resumed(0, prefetch, stream);
    for (size_t i = 0; i < resumed.params.size(); ++i) {
      std::vector<float> v = gpu.params[i]->Read(stream);
      resumed.params[i]->Write(v, stream);
      ASSERT_TRUE(Rt()->StreamSynchronize(stream, "copy").ok());
    }
    ASSERT_EQ(muon_load_state(resumed.opt, blob.data(), blob.size()), MUON_OK)
        << muon_last_error_message();
    ASSERT_EQ(host.Step(9), MUON_OK);
    ASSERT_EQ(resumed.Step(9), MUON_OK) << muon_last_error_message();
    EXPECT_EQ(resumed.Values_(), host.Values_());
    // muon_get_state into host memory.
    Tensor m({12, 5}, -1), hm({12, 5}, -1);
    ASSERT_EQ(muon_get_state(resumed.opt, 0, &m.dl), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_get_state(host.opt, 0, &hm.dl), MUON_OK);
    EXPECT_EQ(m.host, hm.host);
  }
  EXPECT_EQ(Rt()->pending(), 0);
  Rt()->StreamDestroy(stream);
}

// The stand-in NCCL (FAKE_NCCL) with device semantics over the strict GPU:
// buffers must be device memory, calls run when their stream does.
struct FakeNccl {
  void* (*clique_create)(int) = nullptr;
  void (*clique_destroy)(void*) = nullptr;
  bool ok = false;

  static FakeNccl& Get() {
    static FakeNccl f = [] {
      FakeNccl x;
      const char* path = std::getenv("FAKE_NCCL");
      void* h = path == nullptr ? nullptr : dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) return x;
      x.clique_create = reinterpret_cast<void* (*)(int)>(dlsym(h, "fake_nccl_clique_create"));
      x.clique_destroy = reinterpret_cast<void (*)(void*)>(dlsym(h, "fake_nccl_clique_destroy"));
      using Work = int (*)(void*, char*, size_t);
      auto set = reinterpret_cast<void (*)(int (*)(const void*, size_t, char*, size_t),
                                           int (*)(void*, Work, void*))>(
          dlsym(h, "fake_nccl_set_device"));
      if (x.clique_create == nullptr || set == nullptr) return x;
      set(
          [](const void* ptr, size_t bytes, char* why, size_t n) {
            const absl::Status st = Rt()->CheckDeviceMemory(ptr, bytes, "");
            if (!st.ok()) std::snprintf(why, n, "%s", std::string(st.message()).c_str() + 2);
            return st.ok() ? 0 : 1;
          },
          [](void* stream, Work work, void* arg) {
            return Rt()->Enqueue(stream, [work, arg] {
                     char why[512] = {};
                     const int r = work(arg, why, sizeof why);
                     return r == 0 ? absl::OkStatus()
                                   : absl::InternalError(std::string("NCCL: ") + why);
                   }).ok()
                       ? 0
                       : 1;
          });
      x.ok = true;
      return x;
    }();
    return f;
  }
};

struct FakeNcclComm {  // as in fake_nccl.cc
  int rank;
  int size;
  void* clique;
};

enum class Wire { kInProcess, kNccl };

// Ranks as threads, each with its own strict GPU and stream, a parameter
// sharded over the world (dim 0), through `wire`: the handshake, the
// exchange and the verdicts over GPU buffers, equal to one host process.
void ExpectRanksEqualOneProcess(Wire wire, int ranks, int prefetch) {
  const int64_t rows = 12, cols = 6;
  // The single-process reference.
  muon_optimizer_t* ref = Create(prefetch);
  Tensor rp({rows, cols}, -1), rg({rows, cols}, -1);
  rp.Write(Values(rows * cols, 3), nullptr);  // (host: copied into the registered storage)
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = "w";
  int64_t id = -1;
  ASSERT_EQ(muon_register_param(ref, &rp.dl, &rg.dl, &po, &id), MUON_OK);
  for (int s = 0; s < 3; ++s) {
    rg.Write(Values(rows * cols, 50 + s), nullptr);
    ASSERT_EQ(muon_step(ref, nullptr), MUON_OK);
  }
  muon_destroy(ref);

  muon_inprocess_world_t* world = nullptr;
  void* clique = nullptr;
  std::vector<FakeNcclComm> nccl(ranks);
  if (wire == Wire::kInProcess) {
    ASSERT_EQ(muon_inprocess_world_create(ranks, &world), MUON_OK);
  } else {
    ASSERT_TRUE(FakeNccl::Get().ok) << "FAKE_NCCL names the stand-in libnccl.so.2";
    clique = FakeNccl::Get().clique_create(ranks);
    for (int r = 0; r < ranks; ++r) nccl[r] = {r, ranks, clique};
  }
  std::vector<std::vector<float>> got(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(Rt()->SetDevice(r).ok());
      void* stream = *Rt()->StreamCreate();
      muon_optimizer_t* opt = Create(prefetch);
      muon_comm_t comm;
      int32_t world_group = -1;
      const muon_status_t made = wire == Wire::kInProcess
                                     ? muon_inprocess_comm(world, nullptr, 0, r, &comm)
                                     : muon_comm_from_nccl(&nccl[r], &comm);
      const int64_t local_rows = rows / ranks;
      Tensor p({local_rows, cols}, r), g({local_rows, cols}, r);
      const std::vector<float> all = Values(rows * cols, 3);
      const std::vector<float> mine(all.begin() + r * local_rows * cols,
                                    all.begin() + (r + 1) * local_rows * cols);
      p.Write(mine, stream);
      ASSERT_TRUE(Rt()->StreamSynchronize(stream, "init").ok());
      muon_placement_t shard{};
      shard.kind = MUON_PLACEMENT_SHARD;
      shard.dim = 0;
      int64_t global[2] = {rows, cols};
      muon_param_options_t o;
      muon_param_options_init(&o, sizeof o);
      o.name = "w";
      o.global_ndim = 2;
      o.global_shape = global;
      o.num_placements = 1;
      o.placements = &shard;
      int64_t pid = -1;
      if (made != MUON_OK || muon_set_world(opt, &comm, &world_group) != MUON_OK ||
          (shard.group = world_group, muon_register_param(opt, &p.dl, &g.dl, &o, &pid)) !=
              MUON_OK) {
        errors[r] = muon_last_error_message();
      }
      for (int s = 0; s < 3 && errors[r].empty(); ++s) {
        const std::vector<float> ga = Values(rows * cols, 50 + s);
        const std::vector<float> gm(ga.begin() + r * local_rows * cols,
                                    ga.begin() + (r + 1) * local_rows * cols);
        g.Write(gm, stream);
        if (muon_step(opt, stream) != MUON_OK) errors[r] = muon_last_error_message();
        const absl::Status waited = Rt()->StreamSynchronize(stream, "after the step");
        if (errors[r].empty() && !waited.ok()) errors[r] = std::string(waited.message());
      }
      got[r] = p.Read(stream);
      muon_destroy(opt);
      Rt()->StreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  if (world != nullptr) muon_inprocess_world_destroy(world);
  if (clique != nullptr) FakeNccl::Get().clique_destroy(clique);
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  std::vector<float> joined;
  for (int r = 0; r < ranks; ++r) joined.insert(joined.end(), got[r].begin(), got[r].end());
  EXPECT_EQ(joined, rp.host);
}

TEST(StrictGpu, RanksOverTheInProcessCommunicatorEqualOneHostProcess) {
  ASSERT_NE(Rt(), nullptr);
  for (int ranks : {2, 3}) {
    for (int prefetch : {0, 1}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, prefetch " + std::to_string(prefetch));
      ExpectRanksEqualOneProcess(Wire::kInProcess, ranks, prefetch);
    }
  }
}

// NCCL moves device memory only, when the stream gets there: the handshake
// and the verdicts must stage host values through device buffers.
TEST(StrictGpu, RanksOverNcclEqualOneHostProcess) {
  ASSERT_NE(Rt(), nullptr);
  for (int ranks : {2, 3}) {
    for (int prefetch : {0, 1}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, prefetch " + std::to_string(prefetch));
      ExpectRanksEqualOneProcess(Wire::kNccl, ranks, prefetch);
    }
  }
}

}  // namespace
}  // namespace muon_test
