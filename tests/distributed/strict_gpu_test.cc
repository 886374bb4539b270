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
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "muon/device/testing/strict_cpu_runtime.h"

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

using Tweak = void (*)(muon_options_t*);
// Sets parameter i's options (i = 0: the 12 x 5 matrix, 1: the 6 x 16 one).
using ParamTweak = void (*)(size_t i, muon_param_options_t*);

muon_optimizer_t* Create(int prefetch, int skip_nonfinite = 0, size_t round_bytes = 0,
                         int update_in_grad = 0,
                         const std::function<void(muon_options_t*)>& tweak = nullptr) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  if (tweak != nullptr) tweak(&o);
  o.update_in_grad = update_in_grad;
  o.skip_nonfinite = skip_nonfinite;
  o.round_bytes = round_bytes;
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

  Model(int device, int prefetch, void* s, int skip_nonfinite = 0, Tweak tweak = nullptr,
        ParamTweak param_tweak = nullptr)
      : opt(Create(prefetch, skip_nonfinite, 0, 0, tweak)), stream(s) {
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
      if (param_tweak != nullptr) param_tweak(i, &po);
      int64_t id = -1;
      EXPECT_EQ(muon_register_param(opt, &params[i]->dl, &grads[i]->dl, &po, &id), MUON_OK)
          << muon_last_error_message();
    }
  }
  ~Model() { muon_destroy(opt); }

  // `poison`: that many gradient elements of the first parameter are NaN or Inf.
  // `wait`: the host waits for the stream after the step (else the gradients'
  // host copies are kept in `kept` until it does).
  std::vector<std::vector<float>> kept;
  muon_status_t Step(int salt, int poison = 0, bool wait = true) {
    std::vector<std::vector<float>> g;
    for (size_t i = 0; i < grads.size(); ++i) {
      g.push_back(Values(grads[i]->numel(), salt * 7 + static_cast<int>(i)));
      for (int k = 0; i == 0 && k < poison; ++k) {
        g.back()[static_cast<size_t>(3 + 7 * k)] =
            k % 2 == 0 ? std::nanf("") : std::numeric_limits<float>::infinity();
      }
      grads[i]->Write(g.back(), stream);
    }
    const muon_status_t st = muon_step(opt, stream);
    if (!wait) {
      for (auto& x : g) kept.push_back(std::move(x));
      return st;
    }
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

// Bit patterns (NaN compares unequal to itself).
std::vector<uint32_t> Bits(const std::vector<std::vector<float>>& v) {
  std::vector<uint32_t> out;
  for (const auto& x : v) {
    for (float f : x) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      out.push_back(b);
    }
  }
  return out;
}

// A fresh GPU optimizer over `gpu`'s parameter values, loaded with `gpu`'s
// state blob, stepped once more beside `host` (step 9).
std::unique_ptr<Model> ResumeAndStep(Model& gpu, Model& host, int prefetch, Tweak tweak,
                                     ParamTweak param_tweak = nullptr) {
  const std::vector<unsigned char> blob = Save(gpu.opt);
  auto resumed = std::make_unique<Model>(0, prefetch, gpu.stream, 0, tweak, param_tweak);
  for (size_t i = 0; i < resumed->params.size(); ++i) {
    std::vector<float> v = gpu.params[i]->Read(gpu.stream);
    resumed->params[i]->Write(v, gpu.stream);
    EXPECT_TRUE(Rt()->StreamSynchronize(gpu.stream, "copy").ok());
  }
  EXPECT_EQ(muon_load_state(resumed->opt, blob.data(), blob.size()), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(host.Step(9), MUON_OK);
  EXPECT_EQ(resumed->Step(9), MUON_OK) << muon_last_error_message();
  return resumed;
}

muon_stats_t Stats(const muon_optimizer_t* opt) {
  muon_stats_t st;
  muon_stats_init(&st, sizeof st);
  EXPECT_EQ(muon_get_stats(opt, &st), MUON_OK);
  return st;
}

// Non-finite gradients on the GPU: counted by the momentum kernel (stats as
// the host's); with skip_nonfinite, counted by a kernel before the step and
// the step skipped, nothing changed, as on the host.
TEST(StrictGpu, NonFiniteGradientsAreCountedAndSkippedAsOnTheHost) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  for (int skip : {0, 1}) {
    SCOPED_TRACE("skip_nonfinite " + std::to_string(skip));
    Model host(-1, 0, nullptr, skip), gpu(0, 0, stream, skip);
    ASSERT_EQ(host.Step(1), MUON_OK);
    ASSERT_EQ(gpu.Step(1), MUON_OK) << muon_last_error_message();
    EXPECT_EQ(Stats(gpu.opt).nonfinite_grads, 0);
    const std::vector<uint32_t> before = Bits(gpu.Values_());
    ASSERT_EQ(host.Step(2, 3), MUON_OK);
    ASSERT_EQ(gpu.Step(2, 3), MUON_OK) << muon_last_error_message();
    const muon_stats_t hs = Stats(host.opt), gs = Stats(gpu.opt);
    EXPECT_EQ(gs.nonfinite_grads, 3);
    EXPECT_EQ(gs.nonfinite_grads, hs.nonfinite_grads);
    EXPECT_EQ(gs.steps_skipped, skip);
    EXPECT_EQ(gs.steps_skipped, hs.steps_skipped);
    EXPECT_EQ(Bits(gpu.Values_()), Bits(host.Values_()));
    if (skip) {
      EXPECT_EQ(Bits(gpu.Values_()), before);  // nothing changed
    }
    int64_t hc = -1, gc = -1;
    muon_step_count(host.opt, &hc);
    muon_step_count(gpu.opt, &gc);
    EXPECT_EQ(gc, hc);
    EXPECT_EQ(gc, skip ? 1 : 2);
    ASSERT_EQ(host.Step(3), MUON_OK);
    ASSERT_EQ(gpu.Step(3), MUON_OK);
    EXPECT_EQ(Bits(gpu.Values_()), Bits(host.Values_()));
  }
  Rt()->StreamDestroy(stream);
}

// skip_nonfinite_updates (the NaN guard) on the GPU: the orthogonalized
// updates counted on the device, the host waits for the count; a
// non-finite gradient poisons the momentum, so that step and the next are
// skipped with nothing applied, as on the host (stats, step count, bits).
TEST(StrictGpu, TheNaNGuardSkipsNonFiniteUpdatesAsOnTheHost) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  const Tweak guard = [](muon_options_t* o) { o->skip_nonfinite_updates = 1; };
  Model host(-1, 1, nullptr, 0, guard), gpu(0, 1, stream, 0, guard);
  ASSERT_EQ(host.Step(1), MUON_OK) << muon_last_error_message();
  ASSERT_EQ(gpu.Step(1), MUON_OK) << muon_last_error_message();
  EXPECT_EQ(Stats(gpu.opt).steps_skipped, 0);
  const std::vector<uint32_t> before = Bits(gpu.Values_());
  EXPECT_NE(before, Bits(Model(0, 1, stream, 0, guard).Values_()));  // step 1 applied
  for (int s = 2; s <= 3; ++s) {
    ASSERT_EQ(host.Step(s, s == 2 ? 1 : 0), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(gpu.Step(s, s == 2 ? 1 : 0), MUON_OK) << muon_last_error_message();
  }
  const muon_stats_t hs = Stats(host.opt), gs = Stats(gpu.opt);
  EXPECT_EQ(gs.steps_skipped, 2);
  EXPECT_EQ(hs.steps_skipped, 2);
  EXPECT_EQ(Bits(gpu.Values_()), before);  // nothing applied since step 1
  EXPECT_EQ(Bits(gpu.Values_()), Bits(host.Values_()));
  int64_t hc = -1, gc = -1;
  muon_step_count(host.opt, &hc);
  muon_step_count(gpu.opt, &gc);
  EXPECT_EQ(gc, 3);
  EXPECT_EQ(gc, hc);
  EXPECT_EQ(Rt()->pending(), 0);
  Rt()->StreamDestroy(stream);
}

// The host steps on another stream than the last step's, without waiting in
// between: the new stream waits for the old one's work (an event).
TEST(StrictGpu, ANewStreamIsOrderedAfterTheLastStepsStream) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* a = *Rt()->StreamCreate();
  void* b = *Rt()->StreamCreate();
  Model host(-1, 0, nullptr), gpu(0, 0, a);
  ASSERT_EQ(host.Step(1), MUON_OK);
  ASSERT_EQ(gpu.Step(1, 0, /*wait=*/false), MUON_OK);  // step 1's work stays on stream a
  // Step 2 on stream b, with step 1's gradients again (nothing new to write):
  // it must wait for where step 1 ended on a (its momentum, its parameters),
  // which nothing but the library orders.
  ASSERT_EQ(host.Step(1), MUON_OK);
  ASSERT_EQ(muon_step(gpu.opt, b), MUON_OK) << muon_last_error_message();
  gpu.stream = b;
  EXPECT_EQ(gpu.Values_(), host.Values_());  // waits for b only
  ASSERT_TRUE(Rt()->StreamSynchronize(a, "a").ok());
  Rt()->StreamDestroy(a);
  Rt()->StreamDestroy(b);
}

// A step captured into a CUDA graph (after the first, which sets up): the
// capture makes no call CUDA refuses during one (no allocation, no host wait,
// no copy to or from host memory), and each replay steps like muon_step,
// following an lr / weight decay / momentum schedule pushed between replays
// (muon_push_hyperparameters), not the values of the captured call.
TEST(StrictGpu, AStepCapturedIntoAGraphReplaysLikeSteps) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  Model host(-1, 0, nullptr), gpu(0, 0, stream);
  for (int s = 1; s <= 2; ++s) {
    ASSERT_EQ(host.Step(s), MUON_OK);
    ASSERT_EQ(gpu.Step(s), MUON_OK);
  }
  auto write_grads = [&](int s) {
    gpu.kept.clear();
    for (size_t i = 0; i < gpu.grads.size(); ++i) {
      gpu.kept.push_back(Values(gpu.grads[i]->numel(), s * 7 + static_cast<int>(i)));
      gpu.grads[i]->Write(gpu.kept.back(), stream);
    }
    ASSERT_TRUE(Rt()->StreamSynchronize(stream, "gradients").ok());
  };
  write_grads(3);
  const std::vector<float> before = gpu.params[0]->Read(stream);
  ASSERT_TRUE(Rt()->BeginCapture(stream).ok());
  const muon_status_t captured = muon_step(gpu.opt, stream);
  const std::string why = muon_last_error_message();
  absl::StatusOr<StrictCpuRuntime::Graph> graph = Rt()->EndCapture(stream);
  ASSERT_EQ(captured, MUON_OK) << why;
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(gpu.params[0]->Read(stream), before);  // recorded, not run
  for (int s = 3; s <= 6; ++s) {
    if (s > 3) write_grads(s);
    if (s >= 5) {  // a schedule: other values from the fifth step on
      for (muon_optimizer_t* opt : {host.opt, gpu.opt}) {
        ASSERT_EQ(muon_set_lr(opt, 0.005 * s), MUON_OK);
        ASSERT_EQ(muon_set_weight_decay(opt, 0.02 * s), MUON_OK);
        ASSERT_EQ(muon_set_momentum(opt, 0.1 * s), MUON_OK);
      }
      ASSERT_EQ(muon_push_hyperparameters(gpu.opt, stream), MUON_OK) << muon_last_error_message();
    }
    ASSERT_TRUE(Rt()->Replay(*graph, stream).ok());
    ASSERT_EQ(host.Step(s), MUON_OK);
    EXPECT_EQ(gpu.Values_(), host.Values_()) << "replay of step " << s;
  }
  Rt()->StreamDestroy(stream);
}

// torch's recipe: warm-up steps on a side stream, then the capture on
// another stream (torch.cuda.graph's own). The capture is told by the new
// stream, not the last step's (else the step waits for the host and copies
// to host memory there, which CUDA refuses mid-capture), and the replays
// step like muon_step.
TEST(StrictGpu, AStepCapturedOnAnotherStreamThanTheLastStepsReplaysLikeSteps) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* side = *Rt()->StreamCreate();
  void* capture = *Rt()->StreamCreate();
  Model host(-1, 0, nullptr), gpu(0, 0, side);
  for (int s = 1; s <= 2; ++s) {
    ASSERT_EQ(host.Step(s), MUON_OK);
    ASSERT_EQ(gpu.Step(s), MUON_OK);
  }
  gpu.stream = capture;
  ASSERT_TRUE(Rt()->BeginCapture(capture).ok());
  const muon_status_t captured = muon_step(gpu.opt, capture);
  const std::string why = muon_last_error_message();
  absl::StatusOr<StrictCpuRuntime::Graph> graph = Rt()->EndCapture(capture);
  ASSERT_EQ(captured, MUON_OK) << why;
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int s = 3; s <= 4; ++s) {
    gpu.kept.clear();
    for (size_t i = 0; i < gpu.grads.size(); ++i) {
      gpu.kept.push_back(Values(gpu.grads[i]->numel(), s * 7 + static_cast<int>(i)));
      gpu.grads[i]->Write(gpu.kept.back(), capture);
    }
    ASSERT_TRUE(Rt()->Replay(*graph, capture).ok());
    ASSERT_EQ(host.Step(s), MUON_OK);
    EXPECT_EQ(gpu.Values_(), host.Values_()) << "replay of step " << s;
  }
  ASSERT_TRUE(Rt()->StreamSynchronize(side, "side").ok());
  Rt()->StreamDestroy(side);
  Rt()->StreamDestroy(capture);
}

// The host may destroy the last step's stream once it waited for it (torch
// frees a side stream's handle with the Stream object): the next step, on
// another stream, must not touch the destroyed one.
TEST(StrictGpu, AStepAfterTheLastStepsStreamWasDestroyedRunsOnTheNewOne) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* first = *Rt()->StreamCreate();
  void* second = *Rt()->StreamCreate();
  Model host(-1, 0, nullptr), gpu(0, 0, first);
  ASSERT_EQ(host.Step(1), MUON_OK);
  ASSERT_EQ(gpu.Step(1), MUON_OK);  // waits for `first`
  Rt()->StreamDestroy(first);
  gpu.stream = second;
  ASSERT_EQ(host.Step(2), MUON_OK);
  ASSERT_EQ(gpu.Step(2), MUON_OK) << muon_last_error_message();
  EXPECT_EQ(gpu.Values_(), host.Values_());
  Rt()->StreamDestroy(second);
}

// A step only enqueues: after the first (which sets up), one rank's steps
// copy nothing from or to pageable host memory (a copy CUDA may make the
// host wait for), wait for no stream, and allocate nothing.
TEST(StrictGpu, OneRanksStepsCopyNoPageableHostMemory) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  Model gpu(0, 0, stream);
  ASSERT_EQ(gpu.Step(1), MUON_OK);
  for (int s = 2; s <= 4; ++s) {
    gpu.kept.clear();
    for (size_t i = 0; i < gpu.grads.size(); ++i) {
      gpu.kept.push_back(Values(gpu.grads[i]->numel(), s * 7 + static_cast<int>(i)));
      gpu.grads[i]->Write(gpu.kept.back(), stream);
    }
    const StrictCpuRuntime::Counters before = Rt()->counters(0);
    ASSERT_EQ(muon_step(gpu.opt, stream), MUON_OK) << muon_last_error_message();
    const StrictCpuRuntime::Counters after = Rt()->counters(0);
    EXPECT_EQ(after.pageable_copies - before.pageable_copies, 0) << "step " << s;
    EXPECT_EQ(after.stream_waits - before.stream_waits, 0) << "step " << s;
    EXPECT_EQ(after.mallocs - before.mallocs, 0) << "step " << s;
    EXPECT_EQ(after.host_allocs - before.host_allocs, 0) << "step " << s;
    ASSERT_TRUE(Rt()->StreamSynchronize(stream, "after the step").ok());
  }
  EXPECT_EQ(Stats(gpu.opt).nonfinite_grads, 0);
  Rt()->StreamDestroy(stream);
}

// The momentum and update of every parameter are one launch each per step
// (multi-tensor kernels), however many parameters.
TEST(StrictGpu, EachStepLaunchesOneMomentumAndOneUpdateKernel) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* h = dlopen(std::getenv("MUON_CUDA_PLUGIN"), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr);
  auto launches = reinterpret_cast<void (*)(int, int64_t*, int64_t*)>(
      dlsym(h, "muon_strict_gpu_launches"));
  ASSERT_NE(launches, nullptr);
  void* stream = *Rt()->StreamCreate();
  Model gpu(0, 0, stream);
  ASSERT_EQ(gpu.params.size(), 2u);
  ASSERT_EQ(gpu.Step(1), MUON_OK);
  int64_t momentum0 = 0, apply0 = 0, momentum1 = 0, apply1 = 0;
  launches(0, &momentum0, &apply0);
  for (int s = 2; s <= 4; ++s) ASSERT_EQ(gpu.Step(s), MUON_OK);
  launches(0, &momentum1, &apply1);
  EXPECT_EQ(momentum1 - momentum0, 3);
  EXPECT_EQ(apply1 - apply0, 3);
  Rt()->StreamDestroy(stream);
}

// skip_nonfinite counts every gradient in one launch per step (a
// multi-tensor kernel), however many parameters.
TEST(StrictGpu, SkipNonfiniteCountsEveryGradientInOneLaunch) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* h = dlopen(std::getenv("MUON_CUDA_PLUGIN"), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr);
  auto count_launches =
      reinterpret_cast<int64_t (*)(int)>(dlsym(h, "muon_strict_gpu_count_launches"));
  ASSERT_NE(count_launches, nullptr);
  void* stream = *Rt()->StreamCreate();
  Model gpu(0, 0, stream, /*skip_nonfinite=*/1);
  ASSERT_EQ(gpu.params.size(), 2u);
  ASSERT_EQ(gpu.Step(1), MUON_OK);
  const int64_t before = count_launches(0);
  for (int s = 2; s <= 4; ++s) ASSERT_EQ(gpu.Step(s), MUON_OK);
  EXPECT_EQ(count_launches(0) - before, 3);
  EXPECT_EQ(Stats(gpu.opt).nonfinite_grads, 0);
  Rt()->StreamDestroy(stream);
}

// A host allocator (muon_options_t.allocate) serves every byte of device
// memory the optimizer holds (the Newton-Schulz workspace included), on the
// GPU it asked for, and gets all of it back; the steps equal the host's.
struct DevicePool {
  std::map<void*, size_t> live;
  int64_t served = 0;
  std::string bad;
  static void* Allocate(void* ctx, size_t bytes, int32_t type, int32_t id, void*) {
    auto* pool = static_cast<DevicePool*>(ctx);
    if (type != kDLCUDA || id != 0) pool->bad = "asked for another device";
    absl::StatusOr<void*> p = Rt()->Malloc(bytes, "the pool");
    if (!p.ok()) return nullptr;
    pool->live[*p] = bytes;
    ++pool->served;
    return *p;
  }
  static void Release(void* ctx, void* ptr, size_t bytes, int32_t, int32_t, void*) {
    auto* pool = static_cast<DevicePool*>(ctx);
    auto it = pool->live.find(ptr);
    if (it == pool->live.end() || it->second != bytes) pool->bad = "a release that does not match";
    if (it != pool->live.end()) pool->live.erase(it);
    Rt()->Free(ptr);
  }
};

TEST(StrictGpu, TheHostsAllocatorServesEveryDeviceBuffer) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  DevicePool pool;
  {
    Model host(-1, 0, nullptr);
    // A model whose optimizer takes the pool: made by hand (Model's takes none).
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    o.lr = 0.02;
    o.weight_decay = 0.01;
    o.prefetch_count = 0;
    o.allocate = &DevicePool::Allocate;
    o.release = &DevicePool::Release;
    o.allocator_ctx = &pool;
    Model gpu(0, 0, stream);
    muon_destroy(gpu.opt);
    ASSERT_EQ(muon_create(&o, &gpu.opt), MUON_OK) << muon_last_error_message();
    for (size_t i = 0; i < gpu.params.size(); ++i) {
      muon_param_options_t po;
      muon_param_options_init(&po, sizeof po);
      const std::string name = "w" + std::to_string(i);
      po.name = name.c_str();
      int64_t id = -1;
      ASSERT_EQ(muon_register_param(gpu.opt, &gpu.params[i]->dl, &gpu.grads[i]->dl, &po, &id),
                MUON_OK)
          << muon_last_error_message();
    }
    for (int s = 1; s <= 3; ++s) {
      ASSERT_EQ(host.Step(s), MUON_OK);
      ASSERT_EQ(gpu.Step(s), MUON_OK) << muon_last_error_message();
      EXPECT_EQ(gpu.Values_(), host.Values_()) << "step " << s;
    }
    const muon_stats_t st = Stats(gpu.opt);
    int64_t pooled = 0;
    for (const auto& [p, b] : pool.live) pooled += static_cast<int64_t>(b);
    EXPECT_EQ(st.memory_bytes, pooled);  // everything it holds is the pool's
    EXPECT_GT(pool.served, 2);
  }
  EXPECT_TRUE(pool.live.empty()) << pool.live.size() << " device buffers never released";
  EXPECT_EQ(pool.bad, "");
  Rt()->StreamDestroy(stream);
}

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
    ASSERT_EQ(Save(gpu.opt), Save(host.opt));
    const std::unique_ptr<Model> resumed = ResumeAndStep(gpu, host, prefetch, nullptr);
    EXPECT_EQ(resumed->Values_(), host.Values_());
    // muon_get_state into host memory.
    Tensor m({12, 5}, -1), hm({12, 5}, -1);
    ASSERT_EQ(muon_get_state(resumed->opt, 0, &m.dl), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_get_state(host.opt, 0, &hm.dl), MUON_OK);
    EXPECT_EQ(m.host, hm.host);
  }
  EXPECT_EQ(Rt()->pending(), 0);
  Rt()->StreamDestroy(stream);
}

// NorMuon (its moments in device memory), with Gram Newton-Schulz in fp16
// and without: the GPU path's host logic steps, saves, gives the moments
// and resumes as the host does, bit for bit.
TEST(StrictGpu, NorMuonStepsEqualTheHostBitForBitAndResume) {
  ASSERT_NE(Rt(), nullptr) << "MUON_CUDA_PLUGIN must name libmuon_strict_gpu.so";
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  const Tweak variants[] = {
      [](muon_options_t* o) { o->normuon = 1; },
      [](muon_options_t* o) {
        o->normuon = 1;
        o->normuon_beta2 = 0.8;
        o->ns_algorithm = MUON_NS_GRAM;
        o->ns_dtype = MUON_NS_DTYPE_FP16;
      },
  };
  for (Tweak tweak : variants) {
    Model host(-1, 1, nullptr, 0, tweak), gpu(0, 1, stream, 0, tweak);
    for (int s = 0; s < 3; ++s) {
      ASSERT_EQ(host.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(gpu.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(Bits(gpu.Values_()), Bits(host.Values_())) << "step " << s;
    }
    // The moments, nonzero, as the host's; the state blobs alike.
    Tensor m({1, 12}, -1), hm({1, 12}, -1);
    ASSERT_EQ(muon_get_moments(gpu.opt, 0, &m.dl), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(muon_get_moments(host.opt, 0, &hm.dl), MUON_OK) << muon_last_error_message();
    EXPECT_EQ(m.host, hm.host);
    EXPECT_NE(m.host, std::vector<float>(12, 0.0f));
    ASSERT_EQ(Save(gpu.opt), Save(host.opt));
    const std::unique_ptr<Model> resumed = ResumeAndStep(gpu, host, 1, tweak);
    EXPECT_EQ(Bits(resumed->Values_()), Bits(host.Values_()));
  }
  EXPECT_EQ(Rt()->pending(), 0);
  Rt()->StreamDestroy(stream);
}

// Per-parameter options on the GPU: split blocks (rows of the tall matrix
// in periods of {4, 2}, columns of the wide one in periods of {3, 5}), with
// NorMuon and without, lr and weight-decay multipliers, cautious decay. The
// blocks are gathered, orthogonalized, scaled and scattered in device memory
// (the strict runtime refuses host pointers), bit for bit as on the host;
// the moments and the state blob alike; resumed alike.
TEST(StrictGpu, SplitBlocksAndParamScalesStepAsOnTheHostBitForBit) {
  ASSERT_NE(Rt(), nullptr) << "MUON_CUDA_PLUGIN must name libmuon_strict_gpu.so";
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  const ParamTweak split = [](size_t i, muon_param_options_t* po) {
    static const int64_t rows[] = {4, 2}, cols[] = {3, 5};
    po->split_dim = static_cast<int32_t>(i);
    po->num_split_sizes = 2;
    po->split_sizes = i == 0 ? rows : cols;
    po->lr_scale = i == 0 ? 0.5 : 1.0;
    po->weight_decay_scale = i == 0 ? 3.0 : 0.25;
  };
  const Tweak variants[] = {
      [](muon_options_t* o) { o->cautious_wd = 1; },
      [](muon_options_t* o) {
        o->normuon = 1;
        o->ns_dtype = MUON_NS_DTYPE_FP32;
      },
      [](muon_options_t* o) {
        o->normuon = 1;
        o->adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW;
      },
  };
  for (size_t v = 0; v < std::size(variants); ++v) {
    SCOPED_TRACE("variant " + std::to_string(v));
    const Tweak tweak = variants[v];
    Model host(-1, 1, nullptr, 0, tweak, split), gpu(0, 1, stream, 0, tweak, split);
    Model whole(-1, 1, nullptr, 0, tweak);
    for (int s = 0; s < 3; ++s) {
      ASSERT_EQ(host.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(gpu.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(whole.Step(s), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(Bits(gpu.Values_()), Bits(host.Values_())) << "step " << s;
    }
    // The options took effect: the split and scaled run differs from the
    // plain one in both matrices.
    const auto got = host.Values_(), plain = whole.Values_();
    EXPECT_NE(got[0], plain[0]);
    EXPECT_NE(got[1], plain[1]);
    if (v > 0) {
      // Split dim 1: each of the 6 rows has one moment per block.
      Tensor m({1, 12}, -1), hm({1, 12}, -1);
      ASSERT_EQ(muon_get_moments(gpu.opt, 1, &m.dl), MUON_OK) << muon_last_error_message();
      ASSERT_EQ(muon_get_moments(host.opt, 1, &hm.dl), MUON_OK) << muon_last_error_message();
      EXPECT_EQ(m.host, hm.host);
      EXPECT_NE(m.host, std::vector<float>(12, 0.0f));
    }
    ASSERT_EQ(Save(gpu.opt), Save(host.opt));
    const std::unique_ptr<Model> resumed = ResumeAndStep(gpu, host, 1, tweak, split);
    EXPECT_EQ(Bits(resumed->Values_()), Bits(host.Values_()));
  }
  EXPECT_EQ(Rt()->pending(), 0);
  Rt()->StreamDestroy(stream);
}

// QK-Clip on the GPU: the heads' rows scaled in device memory on the given
// stream (the strict runtime refuses host pointers), bit for bit as on the
// host; muon_qk_clip without a stream is refused there, nothing scaled.
TEST(StrictGpu, QkClipScalesTheHeadsOnTheStreamAsOnTheHost) {
  ASSERT_NE(Rt(), nullptr) << "MUON_CUDA_PLUGIN must name libmuon_strict_gpu.so";
  ASSERT_TRUE(Rt()->SetDevice(0).ok());
  void* stream = *Rt()->StreamCreate();
  Model host(-1, 1, nullptr), gpu(0, 1, stream), unclipped(-1, 1, nullptr);
  // A fused projection, the 12 x 5 matrix: query heads in rows [0, 6), two
  // rows each, key heads in rows [6, 12).
  muon_qk_clip_layer_t layer;
  muon_qk_clip_layer_init(&layer, sizeof layer);
  layer.q_param = layer.k_param = 0;
  layer.num_heads = 3;
  layer.q_head_rows = layer.k_head_rows = 2;
  layer.k_first_row = 6;
  int64_t host_id = -1, gpu_id = -1;
  ASSERT_EQ(muon_register_qk_clip(host.opt, &layer, &host_id), MUON_OK);
  ASSERT_EQ(muon_register_qk_clip(gpu.opt, &layer, &gpu_id), MUON_OK);
  const float logits[3] = {200.0f, 50.0f, 160.0f};
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(host.Step(s), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(gpu.Step(s), MUON_OK) << muon_last_error_message();
    ASSERT_EQ(unclipped.Step(s), MUON_OK) << muon_last_error_message();
    const auto before = gpu.Values_();
    int32_t clipped = -1;
    EXPECT_EQ(muon_qk_clip(gpu.opt, gpu_id, logits, 3, 100.0, &clipped),
              MUON_FAILED_PRECONDITION);
    EXPECT_NE(std::string(muon_last_error_message()).find("muon_qk_clip_on_stream"),
              std::string::npos)
        << muon_last_error_message();
    EXPECT_EQ(Bits(gpu.Values_()), Bits(before)) << "refused, yet scaled";
    ASSERT_EQ(muon_qk_clip(host.opt, host_id, logits, 3, 100.0, &clipped), MUON_OK)
        << muon_last_error_message();
    EXPECT_EQ(clipped, 2);
    clipped = -1;
    ASSERT_EQ(muon_qk_clip_on_stream(gpu.opt, gpu_id, logits, 3, 100.0, stream, &clipped),
              MUON_OK)
        << muon_last_error_message();
    EXPECT_EQ(clipped, 2);
    ASSERT_EQ(Bits(gpu.Values_()), Bits(host.Values_())) << "step " << s;
  }
  // Head 1 (rows 2, 3 and 8, 9) kept as the unclipped run's; heads 0 and 2 not.
  const std::vector<float> got = host.Values_()[0], plain = unclipped.Values_()[0];
  for (int64_t r = 0; r < 12; ++r) {
    const bool kept = r == 2 || r == 3 || r == 8 || r == 9;
    for (int64_t c = 0; c < 5; ++c) {
      const size_t i = static_cast<size_t>(r * 5 + c);
      if (kept) {
        EXPECT_EQ(got[i], plain[i]) << "row " << r;
      }
    }
    if (!kept) {
      EXPECT_NE(std::vector<float>(got.begin() + r * 5, got.begin() + r * 5 + 5),
                std::vector<float>(plain.begin() + r * 5, plain.begin() + r * 5 + 5))
          << "row " << r;
    }
  }
  EXPECT_EQ(Rt()->pending(), 0);
  Rt()->StreamDestroy(stream);
}

// The stand-in NCCL (FAKE_NCCL) with device semantics over the strict GPU:
// buffers must be device memory, calls run when their stream does.
struct FakeNccl {
  void* (*clique_create)(int) = nullptr;
  void (*clique_destroy)(void*) = nullptr;
  void (*fail_next)(int) = nullptr;  // this thread's next data call fails
  bool ok = false;

  static FakeNccl& Get() {
    static FakeNccl f = [] {
      FakeNccl x;
      const char* path = std::getenv("FAKE_NCCL");
      void* h = path == nullptr ? nullptr : dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) return x;
      x.clique_create = reinterpret_cast<void* (*)(int)>(dlsym(h, "fake_nccl_clique_create"));
      x.clique_destroy = reinterpret_cast<void (*)(void*)>(dlsym(h, "fake_nccl_clique_destroy"));
      x.fail_next = reinterpret_cast<void (*)(int)>(dlsym(h, "fake_nccl_fail_next"));
      using Work = int (*)(void*, char*, size_t);
      using Release = void (*)(void*);
      auto set = reinterpret_cast<void (*)(int (*)(const void*, size_t, char*, size_t),
                                           int (*)(void*, Work, Release, void*))>(
          dlsym(h, "fake_nccl_set_device"));
      if (x.clique_create == nullptr || set == nullptr) return x;
      set(
          [](const void* ptr, size_t bytes, char* why, size_t n) {
            const absl::Status st = Rt()->CheckDeviceMemory(ptr, bytes, "");
            if (!st.ok()) std::snprintf(why, n, "%s", std::string(st.message()).c_str() + 2);
            return st.ok() ? 0 : 1;
          },
          [](void* stream, Work work, Release release, void* arg) {
            // The call's state lives as long as the work item (a captured
            // one: as long as its graph, replayed many times).
            std::shared_ptr<void> owner(arg, release);
            return Rt()->Enqueue(stream, [work, arg, owner] {
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
// Seven matrices (more than ranks, so that rounds can split), each sharded
// over the world on dim 0.
const std::vector<std::pair<int64_t, int64_t>>& Shapes() {
  static const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {12, 6}, {12, 9}, {6, 4}, {6, 6}, {12, 3}, {6, 10}, {18, 4}};
  return shapes;
}

// One process stepping matrices of `shapes` (values Values(., 3 + i)) with the
// gradients of `steps` (Values(., 50 + s + 9 i)), `schedule(opt, s)` (when
// set) before step s: what the ranks must equal.
using Schedule = std::function<void(muon_optimizer_t*, int)>;
std::vector<std::vector<float>> OneProcess(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                           const std::vector<int>& steps, int prefetch,
                                           const Schedule& schedule = nullptr) {
  muon_optimizer_t* ref = Create(prefetch);
  std::vector<std::unique_ptr<Tensor>> rp, rg;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [rows, cols] = shapes[i];
    rp.push_back(std::make_unique<Tensor>(std::vector<int64_t>{rows, cols}, -1));
    rg.push_back(std::make_unique<Tensor>(std::vector<int64_t>{rows, cols}, -1));
    rp[i]->Write(Values(rows * cols, 3 + i), nullptr);  // (host: into the registered storage)
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    const std::string name = "w" + std::to_string(i);
    po.name = name.c_str();
    int64_t id = -1;
    EXPECT_EQ(muon_register_param(ref, &rp[i]->dl, &rg[i]->dl, &po, &id), MUON_OK);
  }
  for (int s : steps) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      rg[i]->Write(Values(rg[i]->numel(), 50 + s + 9 * i), nullptr);
    }
    if (schedule) schedule(ref, s);
    EXPECT_EQ(muon_step(ref, nullptr), MUON_OK);
  }
  muon_destroy(ref);
  std::vector<std::vector<float>> out;
  for (const auto& t : rp) out.push_back(t->host);
  return out;
}

// Rank r's rows of a tensor of `cols` columns sharded on dim 0 over `ranks`.
std::vector<float> RowsOf(const std::vector<float>& all, int r, int ranks, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(all.size()) / cols, local = rows / ranks;
  return std::vector<float>(all.begin() + r * local * cols, all.begin() + (r + 1) * local * cols);
}

// Registers p and g (rank's rows) as the dim-0 shard over `group` of the
// rows x cols parameter `name` (or, `kind` REPLICATE, the whole).
muon_status_t RegisterShard(muon_optimizer_t* opt, int32_t group, const std::string& name,
                            int64_t rows, int64_t cols, Tensor& p, Tensor& g,
                            int32_t kind = MUON_PLACEMENT_SHARD) {
  muon_placement_t shard{};
  shard.kind = kind;
  shard.group = group;
  int64_t global[2] = {rows, cols};
  muon_param_options_t o;
  muon_param_options_init(&o, sizeof o);
  o.name = name.c_str();
  o.global_ndim = 2;
  o.global_shape = global;
  o.num_placements = 1;
  o.placements = &shard;
  int64_t id = -1;
  return muon_register_param(opt, &p.dl, &g.dl, &o, &id);
}

// `round_bytes` 1 gives each owner one matrix per round, so that with
// prefetch the exchanges run on the pipeline's worker thread. `other_device`:
// the rank's thread has another device current when it calls muon_step (the
// library makes the tensors' device current for the step, and puts the
// caller's back).
// One rank's dim-0 shards of the Shapes() matrices on strict-cpu device r
// (of `ranks`), on `stream`.
struct RankShards {
  int r, ranks;
  void* stream;
  std::vector<std::unique_ptr<Tensor>> p, g;
  std::vector<std::vector<float>> kept;  // the gradients' host values, until a wait

  // Makes, initializes and registers them: "" or the error.
  std::string Register(muon_optimizer_t* opt, int32_t group) {
    for (size_t i = 0; i < Shapes().size(); ++i) {
      const auto [rows, cols] = Shapes()[i];
      p.push_back(std::make_unique<Tensor>(std::vector<int64_t>{rows / ranks, cols}, r));
      g.push_back(std::make_unique<Tensor>(std::vector<int64_t>{rows / ranks, cols}, r));
      const std::vector<float> mine = RowsOf(Values(rows * cols, 3 + i), r, ranks, cols);
      p[i]->Write(mine, stream);
      EXPECT_TRUE(Rt()->StreamSynchronize(stream, "init").ok());
      if (RegisterShard(opt, group, "w" + std::to_string(i), rows, cols, *p[i], *g[i]) != MUON_OK) {
        return muon_last_error_message();
      }
    }
    return "";
  }
  // Step s's gradients, written on the stream (kept until the next call).
  void WriteGrads(int s) {
    kept.assign(Shapes().size(), {});
    for (size_t i = 0; i < Shapes().size(); ++i) {
      const auto [rows, cols] = Shapes()[i];
      kept[i] = RowsOf(Values(rows * cols, 50 + s + 9 * i), r, ranks, cols);
      g[i]->Write(kept[i], stream);
    }
  }
  std::vector<std::vector<float>> Read() {
    std::vector<std::vector<float>> out;
    for (auto& t : p) out.push_back(t->Read(stream));
    return out;
  }
};

// The ranks' pieces of each matrix, joined in rank order, equal one process's.
void ExpectJoinedEqual(const std::vector<std::vector<std::vector<float>>>& got,
                       const std::vector<std::vector<float>>& expected) {
  for (size_t i = 0; i < expected.size(); ++i) {
    std::vector<float> joined;
    for (const auto& rank : got) joined.insert(joined.end(), rank[i].begin(), rank[i].end());
    EXPECT_EQ(joined, expected[i]) << "w" << i;
  }
}

// `memory`: when set, each rank's muon_stats_t.memory_bytes after the steps.
void ExpectRanksEqualOneProcess(Wire wire, int ranks, int prefetch, size_t round_bytes = 0,
                                bool other_device = false, int update_in_grad = 0,
                                std::vector<int64_t>* memory = nullptr) {
  const std::vector<std::vector<float>> expected = OneProcess(Shapes(), {0, 1, 2}, prefetch);

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
  std::vector<std::vector<std::vector<float>>> got(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(Rt()->SetDevice(r).ok());
      void* stream = *Rt()->StreamCreate();
      muon_optimizer_t* opt = Create(prefetch, 0, round_bytes, update_in_grad);
      muon_comm_t comm;
      int32_t world_group = -1;
      const muon_status_t made = wire == Wire::kInProcess
                                     ? muon_inprocess_comm(world, nullptr, 0, r, &comm)
                                     : muon_comm_from_nccl(&nccl[r], &comm);
      if (made != MUON_OK || muon_set_world(opt, &comm, &world_group) != MUON_OK) {
        errors[r] = muon_last_error_message();
      }
      RankShards shards{r, ranks, stream, {}, {}, {}};
      if (errors[r].empty()) errors[r] = shards.Register(opt, world_group);
      for (int s = 0; s < 3 && errors[r].empty(); ++s) {
        shards.WriteGrads(s);
        const StrictCpuRuntime::Counters before = Rt()->counters(r);
        if (other_device) {
          ASSERT_TRUE(Rt()->SetDevice((r + 1) % ranks).ok());
        }
        if (muon_step(opt, stream) != MUON_OK) errors[r] = muon_last_error_message();
        if (other_device) {
          EXPECT_EQ(*Rt()->GetDevice(), (r + 1) % ranks) << "the caller's device changed";
          ASSERT_TRUE(Rt()->SetDevice(r).ok());
        }
        const StrictCpuRuntime::Counters after = Rt()->counters(r);
        if (wire == Wire::kNccl && s > 0) {
          // The steady state: no allocation, no wait for the stream; the
          // one host wait is for the last step's verdicts, which the stream
          // copied at that step's end.
          EXPECT_EQ(after.stream_waits - before.stream_waits, 0) << "step " << s;
          EXPECT_EQ(after.event_waits - before.event_waits, 1) << "step " << s;
          EXPECT_EQ(after.pageable_copies - before.pageable_copies, 0) << "step " << s;
          EXPECT_EQ(after.mallocs - before.mallocs, 0) << "step " << s;
          EXPECT_EQ(after.frees - before.frees, 0) << "step " << s;
        }
        const absl::Status waited = Rt()->StreamSynchronize(stream, "after the step");
        if (errors[r].empty() && !waited.ok()) errors[r] = std::string(waited.message());
      }
      if (round_bytes == 1 && errors[r].empty()) {
        EXPECT_GT(Stats(opt).rounds, 1);  // the worker thread exchanges
      }
      if (memory != nullptr) (*memory)[static_cast<size_t>(r)] = Stats(opt).memory_bytes;
      got[r] = shards.Read();
      shards = RankShards{};
      muon_destroy(opt);
      Rt()->StreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  if (world != nullptr) muon_inprocess_world_destroy(world);
  if (clique != nullptr) FakeNccl::Get().clique_destroy(clique);
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  ExpectJoinedEqual(got, expected);
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

// MUON_ASSIGNMENT_SPLIT over 4 ranks (the model of alloc_count_test's):
// "big" (16 x 96, dim-0 shards) costs more than the 15 replicated 8 x 8
// matrices' mean, so its members orthogonalize it together. `gpu`: each rank
// on strict-cpu device r over `wire`; else on the host over in-process ranks.
// `tweak` (may be null) sets options beside the assignment.
struct SplitJob {
  std::vector<std::vector<std::vector<float>>> values;  // per rank, per param
  int64_t owned = 0, total = 0;                          // summed over the ranks, rank 0's
  std::vector<std::string> errors;
};

SplitJob RunSplitJob(bool gpu, Wire wire, int prefetch, Tweak tweak) {
  constexpr int kRanks = 4, kSmall = 15;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{16, 96}};
  for (int i = 0; i < kSmall; ++i) shapes.push_back({8, 8});
  muon_inprocess_world_t* world = nullptr;
  void* clique = nullptr;
  std::vector<FakeNcclComm> nccl(kRanks);
  if (wire == Wire::kInProcess || !gpu) {
    EXPECT_EQ(muon_inprocess_world_create(kRanks, &world), MUON_OK);
  } else {
    EXPECT_TRUE(FakeNccl::Get().ok) << "FAKE_NCCL names the stand-in libnccl.so.2";
    clique = FakeNccl::Get().clique_create(kRanks);
    for (int r = 0; r < kRanks; ++r) nccl[r] = {r, kRanks, clique};
  }
  SplitJob job;
  job.values.resize(kRanks);
  job.errors.resize(kRanks);
  std::vector<muon_stats_t> stats(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const int device = gpu ? r : -1;
      void* stream = nullptr;
      if (gpu) {
        EXPECT_TRUE(Rt()->SetDevice(r).ok());
        stream = *Rt()->StreamCreate();
      }
      std::string& error = job.errors[r];
      muon_optimizer_t* opt = Create(prefetch, 0, 0, 0, [tweak](muon_options_t* o) {
        o->assignment = MUON_ASSIGNMENT_SPLIT;
        if (tweak != nullptr) tweak(o);
      });
      muon_comm_t comm;
      int32_t group = -1;
      const muon_status_t made = clique == nullptr
                                     ? muon_inprocess_comm(world, nullptr, 0, r, &comm)
                                     : muon_comm_from_nccl(&nccl[r], &comm);
      if (made != MUON_OK || muon_set_world(opt, &comm, &group) != MUON_OK) {
        error = muon_last_error_message();
      }
      std::vector<std::unique_ptr<Tensor>> p, g;
      std::vector<std::vector<float>> kept;
      auto sync = [&](const char* what) {
        if (gpu) {
          EXPECT_TRUE(Rt()->StreamSynchronize(stream, what).ok());
        }
      };
      for (size_t i = 0; i < shapes.size() && error.empty(); ++i) {
        const auto [rows, cols] = shapes[i];
        const int64_t local = i == 0 ? rows / kRanks : rows;
        p.push_back(std::make_unique<Tensor>(std::vector<int64_t>{local, cols}, device));
        g.push_back(std::make_unique<Tensor>(std::vector<int64_t>{local, cols}, device));
        const std::vector<float> all = Values(rows * cols, 3 + static_cast<int>(i));
        const std::vector<float> mine = i == 0 ? RowsOf(all, r, kRanks, cols) : all;
        p[i]->Write(mine, stream);
        sync("init");  // (before `mine` goes)
        if (RegisterShard(opt, group, "w" + std::to_string(i), rows, cols, *p[i], *g[i],
                          i == 0 ? MUON_PLACEMENT_SHARD : MUON_PLACEMENT_REPLICATE) != MUON_OK) {
          error = muon_last_error_message();
        }
      }
      for (int step = 0; step < 3 && error.empty(); ++step) {
        kept.assign(shapes.size(), {});
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto [rows, cols] = shapes[i];
          const std::vector<float> all = Values(rows * cols, 50 + step + 9 * static_cast<int>(i));
          kept[i] = i == 0 ? RowsOf(all, r, kRanks, cols) : all;
          g[i]->Write(kept[i], stream);
        }
        if (muon_step(opt, stream) != MUON_OK) error = muon_last_error_message();
        sync("after the step");
      }
      stats[r] = Stats(opt);
      for (auto& t : p) job.values[r].push_back(t->Read(stream));
      p.clear();
      g.clear();
      muon_destroy(opt);
      if (gpu) Rt()->StreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  if (world != nullptr) muon_inprocess_world_destroy(world);
  if (clique != nullptr) FakeNccl::Get().clique_destroy(clique);
  for (const muon_stats_t& st : stats) job.owned += st.matrices_owned;
  job.total = stats[0].matrices_total;
  return job;
}

// The members' sums cross through device buffers (on NCCL: on the
// communication lane, ordered against the math by stream points), and each
// member runs the block's program as steps of the GPU backend
// (muon/math/split_ns.h): every rank's values equal the host ranks' (the
// CPU backend's own OrthogonalizeBlock) bit for bit, for plain Muon in bf16
// and fp32, NorMuon, cubic5's two-product iterations, Gram Newton-Schulz
// (bf16 with a restart; fp16 without, with NorMuon) and AOL's pre-scaling
// (bf16 and fp32).
TEST(StrictGpu, AMatrixSplitOverRanksStepsAsOnTheHostBitForBit) {
  ASSERT_NE(Rt(), nullptr);
  const Tweak tweaks[] = {
      nullptr,
      [](muon_options_t* o) {
        o->ns_dtype = MUON_NS_DTYPE_FP32;
        o->normuon = 1;
      },
      [](muon_options_t* o) {
        o->ns_coefficients = MUON_NS_COEFFICIENTS_CUBIC5;
        o->normuon = 1;
      },
      [](muon_options_t* o) { o->ns_algorithm = MUON_NS_GRAM; },
      [](muon_options_t* o) {
        o->ns_algorithm = MUON_NS_GRAM;
        o->ns_gram_restarts = 0;
        o->ns_dtype = MUON_NS_DTYPE_FP16;
        o->normuon = 1;
      },
      [](muon_options_t* o) {
        o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
        o->ns_steps = 4;
      },
      [](muon_options_t* o) {
        o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
        o->ns_steps = 4;
        o->ns_dtype = MUON_NS_DTYPE_FP32;
      },
  };
  for (size_t t = 0; t < std::size(tweaks); ++t) {
    const SplitJob host = RunSplitJob(false, Wire::kInProcess, 0, tweaks[t]);
    for (int r = 0; r < 4; ++r) ASSERT_EQ(host.errors[r], "") << "host rank " << r;
    // A matrix was split: its members each count it as owned.
    ASSERT_GT(host.owned, host.total) << "no matrix was split; the test proves nothing";
    for (Wire wire : {Wire::kNccl, Wire::kInProcess}) {
      for (int prefetch : {0, 1}) {
        SCOPED_TRACE("options " + std::to_string(t) +
                     (wire == Wire::kNccl ? ", NCCL" : ", in-process") + ", prefetch " +
                     std::to_string(prefetch));
        const SplitJob gpus = RunSplitJob(true, wire, prefetch, tweaks[t]);
        for (int r = 0; r < 4; ++r) ASSERT_EQ(gpus.errors[r], "") << "rank " << r;
        EXPECT_EQ(gpus.owned, host.owned);
        for (int r = 0; r < 4; ++r) {
          EXPECT_EQ(Bits(gpus.values[r]), Bits(host.values[r])) << "rank " << r;
        }
      }
    }
  }
}

// What a GPU backend refuses (as the CUDA backend refuses fp16 AOL) fails the
// setup on every rank when the matrix is split too, naming it and the
// matrix, and nothing changes.
TEST(StrictGpu, WhatTheGpuRefusesOnASplitMatrixFailsEveryRank) {
  ASSERT_NE(Rt(), nullptr);
  const SplitJob gpus = RunSplitJob(true, Wire::kNccl, 0, [](muon_options_t* o) {
    o->ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
    o->ns_steps = 4;
    o->ns_dtype = MUON_NS_DTYPE_FP16;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(gpus.errors[r].find("'w0' (split over ranks): ns_coefficients AOL with ns_dtype "
                                  "fp16 runs on the CPU backend only"),
              std::string::npos)
        << "rank " << r << ": " << gpus.errors[r];
    for (size_t i = 1; i < gpus.values[r].size(); ++i) {
      EXPECT_EQ(gpus.values[r][i], Values(64, 3 + static_cast<int>(i))) << "rank " << r;
    }
  }
}

// A round per matrix with prefetch: the exchanges run on the pipeline's
// worker thread, which must make the GPU current (a new thread starts on
// device 0); and a caller whose current device is another one.
// update_in_grad: the updates live in the gradients (exchanged from and
// into them), with the same bits as the host's update buffers, and the
// optimizer holds 2 bytes per parameter element less (the buffers are bf16,
// as Newton-Schulz is by default).
TEST(StrictGpu, UpdatesInTheGradientsEqualOneHostProcessWithLessMemory) {
  ASSERT_NE(Rt(), nullptr);
  const int ranks = 3;
  std::vector<int64_t> with(ranks), without(ranks);
  ExpectRanksEqualOneProcess(Wire::kNccl, ranks, 1, 0, false, /*update_in_grad=*/1, &with);
  ExpectRanksEqualOneProcess(Wire::kNccl, ranks, 1, 0, false, /*update_in_grad=*/0, &without);
  int64_t local_elements = 0;
  for (const auto& [rows, cols] : Shapes()) local_elements += rows / ranks * cols;
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(without[r] - with[r], 2 * local_elements) << "rank " << r;
  }
}

// The ranks' threads meet here (a capture forbids the others' host waits).
class Meeting {
 public:
  explicit Meeting(int n) : n_(n) {}
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    const int round = round_;
    if (++here_ == n_) {
      here_ = 0;
      ++round_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return round_ != round; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, here_ = 0, round_ = 0;
};

// Several ranks capture a step into CUDA graphs (the exchanges forked onto
// the communication stream and joined back, the collectives and the step's
// verdict inside the graph, no host memory copied) and replay it, following
// an lr / weight decay / momentum schedule pushed between replays: the same
// bits as one host process stepping through the same schedule.
TEST(StrictGpu, RanksCaptureAStepAndReplayItThroughASchedule) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(FakeNccl::Get().ok) << "FAKE_NCCL names the stand-in libnccl.so.2";
  constexpr int kRanks = 2;
  const Schedule schedule = [](muon_optimizer_t* opt, int s) {
    if (s < 3) return;
    EXPECT_EQ(muon_set_lr(opt, 0.004 * s), MUON_OK);
    EXPECT_EQ(muon_set_weight_decay(opt, 0.03 * s), MUON_OK);
    EXPECT_EQ(muon_set_momentum(opt, 0.15 * s), MUON_OK);
  };
  const std::vector<std::vector<float>> expected = OneProcess(Shapes(), {0, 1, 2, 3, 4}, 1, schedule);

  void* clique = FakeNccl::Get().clique_create(kRanks);
  std::vector<FakeNcclComm> nccl(kRanks);
  for (int r = 0; r < kRanks; ++r) nccl[r] = {r, kRanks, clique};
  Meeting meet(kRanks);
  std::vector<std::vector<std::vector<float>>> got(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(Rt()->SetDevice(r).ok());
      void* stream = *Rt()->StreamCreate();
      muon_optimizer_t* opt = Create(1, 0, /*round_bytes=*/1);  // several rounds
      muon_comm_t comm;
      int32_t world_group = -1;
      if (muon_comm_from_nccl(&nccl[r], &comm) != MUON_OK ||
          muon_set_world(opt, &comm, &world_group) != MUON_OK) {
        errors[r] = muon_last_error_message();
      }
      RankShards shards{r, kRanks, stream, {}, {}, {}};
      if (errors[r].empty()) errors[r] = shards.Register(opt, world_group);
      auto write_grads = [&](int s) {
        shards.WriteGrads(s);
        ASSERT_TRUE(Rt()->StreamSynchronize(stream, "gradients").ok());
      };
      for (int s = 0; s <= 1; ++s) {  // set up, then one step as usual
        write_grads(s);
        if (errors[r].empty() && muon_step(opt, stream) != MUON_OK) {
          errors[r] = muon_last_error_message();
        }
        ASSERT_TRUE(Rt()->StreamSynchronize(stream, "step").ok());
      }
      write_grads(2);
      meet.Arrive();
      ASSERT_TRUE(Rt()->BeginCapture(stream).ok());
      if (errors[r].empty() && muon_step(opt, stream) != MUON_OK) {
        errors[r] = muon_last_error_message();
      }
      absl::StatusOr<StrictCpuRuntime::Graph> graph = Rt()->EndCapture(stream);
      if (errors[r].empty() && !graph.ok()) errors[r] = std::string(graph.status().message());
      meet.Arrive();
      for (int s = 2; s <= 4 && errors[r].empty(); ++s) {
        if (s > 2) write_grads(s);
        schedule(opt, s);
        if (s >= 3 && muon_push_hyperparameters(opt, stream) != MUON_OK) {
          errors[r] = muon_last_error_message();
        }
        ASSERT_TRUE(Rt()->Replay(*graph, stream).ok());
        const absl::Status ran = Rt()->StreamSynchronize(stream, "replay");
        if (!ran.ok()) errors[r] = std::string(ran.message());
      }
      got[r] = shards.Read();
      shards = RankShards{};
      muon_destroy(opt);
      Rt()->StreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  FakeNccl::Get().clique_destroy(clique);
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  ExpectJoinedEqual(got, expected);
}

TEST(StrictGpu, TheWorkerThreadAndTheCallerRunOnTheTensorsDevice) {
  ASSERT_NE(Rt(), nullptr);
  for (Wire wire : {Wire::kNccl, Wire::kInProcess}) {
    SCOPED_TRACE(wire == Wire::kNccl ? "NCCL" : "in-process");
    ExpectRanksEqualOneProcess(wire, 3, 1, /*round_bytes=*/1);
    ExpectRanksEqualOneProcess(wire, 3, 2, /*round_bytes=*/1, /*other_device=*/true);
  }
}

enum class Fault { kMomentumKernel, kOtherLr };

// On a GPU the step does not wait for its verdicts: they gate the updates on
// the device, and the host judges them at the next step. Rank 1's momentum
// kernel fails at step 2 (or rank 1 alone steps with another lr): rank 1
// returns the error at once (or OK, not knowing), ranks 0 and 2 return OK,
// nobody applies step 2 (the go-ahead said no on every GPU), a save before
// the next step is refused, and step 3 fails on every rank naming rank 1's
// cause (or both lrs). Every rank then loads the blob it saved after step 1
// and continues like a run without the fault.
void ExpectDeferredVerdict(Fault fault) {
  ASSERT_NE(Rt(), nullptr);
  ASSERT_TRUE(FakeNccl::Get().ok);
  static auto fail_momentum = [] {
    void* h = dlopen(std::getenv("MUON_CUDA_PLUGIN"), RTLD_NOW | RTLD_LOCAL);
    return reinterpret_cast<void (*)(int)>(dlsym(h, "muon_strict_gpu_fail_next_momentum"));
  }();
  ASSERT_NE(fail_momentum, nullptr);
  constexpr int kRanks = 3;
  const int64_t rows = 12, cols = 6, local_rows = rows / kRanks;
  void* clique = FakeNccl::Get().clique_create(kRanks);
  std::vector<FakeNcclComm> nccl(kRanks);
  for (int r = 0; r < kRanks; ++r) nccl[r] = {r, kRanks, clique};
  std::vector<std::vector<muon_status_t>> statuses(kRanks);
  std::vector<std::string> step3(kRanks), save2(kRanks);
  std::vector<std::vector<float>> after1(kRanks), after2(kRanks), resumed(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(Rt()->SetDevice(r).ok());
      void* stream = *Rt()->StreamCreate();
      muon_optimizer_t* opt = Create(0);
      muon_comm_t comm;
      int32_t world_group = -1;
      ASSERT_EQ(muon_comm_from_nccl(&nccl[r], &comm), MUON_OK);
      ASSERT_EQ(muon_set_world(opt, &comm, &world_group), MUON_OK);
      Tensor p({local_rows, cols}, r), g({local_rows, cols}, r);
      const std::vector<float> mine = RowsOf(Values(rows * cols, 3), r, kRanks, cols);
      p.Write(mine, stream);
      ASSERT_TRUE(Rt()->StreamSynchronize(stream, "init").ok());
      ASSERT_EQ(RegisterShard(opt, world_group, "w0", rows, cols, p, g), MUON_OK);
      auto step = [&](int s) {
        const std::vector<float> gm = RowsOf(Values(rows * cols, 50 + s), r, kRanks, cols);
        g.Write(gm, stream);
        const muon_status_t st = muon_step(opt, stream);
        const std::string msg = muon_last_error_message();
        EXPECT_TRUE(Rt()->StreamSynchronize(stream, "after the step").ok());
        return std::make_pair(st, msg);
      };
      statuses[r].push_back(step(1).first);
      after1[r] = p.Read(stream);
      const std::vector<unsigned char> blob1 = Save(opt);
      if (r == 1 && fault == Fault::kMomentumKernel) fail_momentum(1);
      if (r == 1 && fault == Fault::kOtherLr) muon_set_lr(opt, 0.03);
      statuses[r].push_back(step(2).first);
      if (r == 1) muon_set_lr(opt, 0.02);
      after2[r] = p.Read(stream);
      if (r == 1 && fault == Fault::kMomentumKernel) {
        // The failing rank, which knew at once, restores before the next
        // call: it still takes part in judging step 2 there (no hang).
        p.Write(after1[r], stream);
        ASSERT_TRUE(Rt()->StreamSynchronize(stream, "early restore").ok());
        EXPECT_EQ(muon_load_state(opt, blob1.data(), blob1.size()), MUON_OK);
      }
      size_t size = 0;
      const bool restored_early = r == 1 && fault == Fault::kMomentumKernel;
      if (!restored_early && muon_save_state(opt, nullptr, 0, &size) == MUON_OK) {
        std::vector<unsigned char> b(size);
        if (muon_save_state(opt, b.data(), size, &size) != MUON_OK) {
          save2[r] = muon_last_error_message();
        }
      }
      const auto [st3, msg3] = step(3);
      statuses[r].push_back(st3);
      step3[r] = msg3;
      // Resume from step 1 everywhere, then steps 2 and 3 as they should have gone.
      p.Write(after1[r], stream);
      ASSERT_TRUE(Rt()->StreamSynchronize(stream, "restore").ok());
      EXPECT_EQ(muon_load_state(opt, blob1.data(), blob1.size()), MUON_OK)
          << muon_last_error_message();
      statuses[r].push_back(step(2).first);
      statuses[r].push_back(step(3).first);
      resumed[r] = p.Read(stream);
      muon_destroy(opt);
      Rt()->StreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  FakeNccl::Get().clique_destroy(clique);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(statuses[r].size(), 5u);
    EXPECT_EQ(statuses[r][0], MUON_OK);
    // Step 2: the failing rank knows at once; the others at step 3.
    EXPECT_EQ(statuses[r][1], r == 1 && fault == Fault::kMomentumKernel ? MUON_INTERNAL : MUON_OK);
    EXPECT_EQ(after2[r], after1[r]) << "step 2 was applied";
    if (!(r == 1 && fault == Fault::kMomentumKernel)) {
      EXPECT_NE(save2[r].find("step 2 failed on some rank"), std::string::npos) << save2[r];
    }
    if (fault == Fault::kMomentumKernel) {
      EXPECT_EQ(statuses[r][2], MUON_INTERNAL);
      EXPECT_NE(step3[r].find("step 2 failed on 1 of 3 ranks (rank 1: INTERNAL: "),
                std::string::npos)
          << step3[r];
      EXPECT_NE(step3[r].find("injected failure on strict-cpu device 1"), std::string::npos)
          << step3[r];
    } else {
      EXPECT_EQ(statuses[r][2], MUON_INVALID_ARGUMENT);
      EXPECT_NE(step3[r].find("step 2: the ranks step with different hyper-parameters (rank 0 "
                              "has lr=0.02"),
                std::string::npos)
          << step3[r];
      EXPECT_NE(step3[r].find("rank 1 has lr=0.03"), std::string::npos) << step3[r];
    }
    EXPECT_EQ(statuses[r][3], MUON_OK);
    EXPECT_EQ(statuses[r][4], MUON_OK);
  }
  // The resumed run equals one that never failed: the single-process reference.
  std::vector<float> joined;
  for (int r = 0; r < kRanks; ++r) joined.insert(joined.end(), resumed[r].begin(), resumed[r].end());
  EXPECT_EQ(joined, OneProcess({{rows, cols}}, {1, 2, 3}, 0)[0]);
}

// Three GPUs over the stand-in NCCL step a 12 x 6 matrix sharded on dim 0,
// made with `skip_nonfinite` and `tweak`, three steps; rank 1's gradient of
// step 2 holds a NaN. Each rank's stats and its rows after the steps.
struct NaNRun {
  std::vector<muon_stats_t> stats;
  std::vector<float> joined;  // the ranks' rows, in order
};
constexpr int64_t kNaNRows = 12, kNaNCols = 6;
NaNRun ThreeGpusWithANaNGradientAtStep2(int skip_nonfinite, Tweak tweak) {
  NaNRun out;
  if (Rt() == nullptr || !FakeNccl::Get().ok) {
    ADD_FAILURE() << "the strict GPU and the stand-in NCCL are needed";
    return out;
  }
  constexpr int kRanks = 3;
  const int64_t rows = kNaNRows, cols = kNaNCols, local_rows = rows / kRanks;
  void* clique = FakeNccl::Get().clique_create(kRanks);
  std::vector<FakeNcclComm> nccl(kRanks);
  for (int r = 0; r < kRanks; ++r) nccl[r] = {r, kRanks, clique};
  std::vector<std::vector<float>> got(kRanks);
  out.stats.resize(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_TRUE(Rt()->SetDevice(r).ok());
      void* stream = *Rt()->StreamCreate();
      muon_optimizer_t* opt = Create(1, skip_nonfinite, 0, 0, tweak);
      muon_comm_t comm;
      int32_t world_group = -1;
      ASSERT_EQ(muon_comm_from_nccl(&nccl[r], &comm), MUON_OK);
      ASSERT_EQ(muon_set_world(opt, &comm, &world_group), MUON_OK);
      Tensor p({local_rows, cols}, r), g({local_rows, cols}, r);
      const std::vector<float> mine = RowsOf(Values(rows * cols, 3), r, kRanks, cols);
      p.Write(mine, stream);
      ASSERT_TRUE(Rt()->StreamSynchronize(stream, "init").ok());
      ASSERT_EQ(RegisterShard(opt, world_group, "w0", rows, cols, p, g), MUON_OK);
      for (int s = 1; s <= 3; ++s) {
        std::vector<float> gm = RowsOf(Values(rows * cols, 50 + s), r, kRanks, cols);
        if (s == 2 && r == 1) gm[4] = std::nanf("");
        g.Write(gm, stream);
        EXPECT_EQ(muon_step(opt, stream), MUON_OK) << muon_last_error_message();
        EXPECT_TRUE(Rt()->StreamSynchronize(stream, "after the step").ok());
      }
      out.stats[r] = Stats(opt);
      got[r] = p.Read(stream);
      muon_destroy(opt);
      Rt()->StreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  FakeNccl::Get().clique_destroy(clique);
  for (const std::vector<float>& g : got) out.joined.insert(out.joined.end(), g.begin(), g.end());
  return out;
}

// skip_nonfinite over NCCL: a NaN in rank 1's gradient at step 2 skips the
// step on every rank (the counts agreed through device buffers); the run
// equals one process that stepped 1 and 3.
TEST(StrictGpu, ANonFiniteGradientOnOneRankSkipsTheStepOnEveryGpu) {
  const NaNRun run = ThreeGpusWithANaNGradientAtStep2(/*skip_nonfinite=*/1, nullptr);
  ASSERT_EQ(run.stats.size(), 3u);
  for (size_t r = 0; r < run.stats.size(); ++r) {
    EXPECT_EQ(run.stats[r].steps_skipped, 1) << "rank " << r;
    EXPECT_EQ(run.stats[r].steps, 2) << "rank " << r;
  }
  EXPECT_EQ(run.joined, OneProcess({{kNaNRows, kNaNCols}}, {1, 3}, 1)[0]);
}

// The NaN guard over three GPUs (device verdicts, the gate): the owner of
// the sharded matrix sees the non-finite update the NaN gradient makes;
// every rank skips that step and the next (the momentum keeps the NaN), so
// the parameter is one process's after step 1 alone.
TEST(StrictGpu, ANonFiniteUpdateSkipsTheStepOnEveryGpu) {
  const NaNRun run = ThreeGpusWithANaNGradientAtStep2(
      0, [](muon_options_t* o) { o->skip_nonfinite_updates = 1; });
  ASSERT_EQ(run.stats.size(), 3u);
  for (size_t r = 0; r < run.stats.size(); ++r) {
    EXPECT_EQ(run.stats[r].steps_skipped, 2) << "rank " << r;
    EXPECT_EQ(run.stats[r].steps, 3) << "rank " << r;
  }
  EXPECT_EQ(run.joined, OneProcess({{kNaNRows, kNaNCols}}, {1}, 1)[0]);
}

TEST(StrictGpu, AMomentumKernelFailingOnOneRankIsAppliedNowhereAndFailsTheNextStepEverywhere) {
  ExpectDeferredVerdict(Fault::kMomentumKernel);
}

TEST(StrictGpu, AnotherLrOnOneRankIsAppliedNowhereAndFailsTheNextStepNamingBoth) {
  ExpectDeferredVerdict(Fault::kOtherLr);
}

}  // namespace
}  // namespace muon_test
