// How registration and the first step's setup grow with the number of
// parameters: N small parameters (64 x 64 matrices, 1 x 64 and 64 x 1 vectors
// as matrices, 32 x 64 matrices, in turn) registered through the C API on the
// CPU device, then two steps. Per N it prints the seconds spent in
// muon_register_param (all N calls), the first muon_step (the setup:
// handshake, plan, update buffers, steppers; then the step itself), the
// second muon_step (a step alone, for comparison) and the time per parameter
// of each, so that growth faster than N shows as a per-parameter time that
// rises with N. Newton-Schulz runs 0 iterations (its workspace is reserved
// all the same): the figures are bookkeeping, not math.
//
// Three tables: one process (a world of one rank), then two in-process ranks
// (threads; rank 0's times) with every parameter sharded over its rows
// (torch.chunk split), then two ranks with every parameter in ZeRO-2 mode.
// The tensors of a rank lie back to back in one host arena (value, grad,
// value, ...), every one touching the next: the overlap check sees
// neighbours that touch.
//
//   bazel run -c opt //bench:registration_bench [-- N ...]   (default 1000 10000 30000)
#include <dlpack/dlpack.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"

namespace {

struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{64, 64}, {1, 64}, {64, 1}, {32, 64}};
constexpr int kNumShapes = sizeof kShapes / sizeof kShapes[0];

enum class Mode { kOneProcess, kSharded, kZero2 };
constexpr int kRanks = 2;  // of the two distributed modes

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

bool Check(muon_status_t s, const char* what) {
  if (s == MUON_OK) return true;
  std::fprintf(stderr, "%s: %s\n", what, muon_last_error_message());
  return false;
}

struct Times {
  bool ok = false;
  double registration = 0, first = 0, second = 0;
};

// One rank's run: registers n parameters, steps twice.
Times RunRank(int n, Mode mode, muon_inprocess_world_t* world, int rank) {
  Times t;
  // The local shapes (rows split in chunks over the ranks when sharded).
  std::vector<int64_t> global(2 * static_cast<size_t>(n)), local(2 * static_cast<size_t>(n));
  std::vector<size_t> at(static_cast<size_t>(n));
  size_t floats = 0;
  for (int i = 0; i < n; ++i) {
    const Shape& s = kShapes[i % kNumShapes];
    global[2 * i] = local[2 * i] = s.rows;
    global[2 * i + 1] = local[2 * i + 1] = s.cols;
    if (mode == Mode::kSharded) {
      const int64_t chunk = (s.rows + kRanks - 1) / kRanks;
      const int64_t a = std::min<int64_t>(rank * chunk, s.rows);
      local[2 * i] = std::min<int64_t>(a + chunk, s.rows) - a;
    }
    at[i] = floats;
    floats += 2 * static_cast<size_t>(local[2 * i] * local[2 * i + 1]);  // value, then grad
  }
  std::vector<float> arena(floats + 1, 0.01f);
  std::vector<DLTensor> values(n), grads(n);
  std::vector<std::string> names(n);
  for (int i = 0; i < n; ++i) {
    const int64_t numel = local[2 * i] * local[2 * i + 1];
    for (DLTensor* d : {&values[i], &grads[i]}) {
      d->data = arena.data() + at[i] + (d == &grads[i] ? numel : 0);
      d->device = {kDLCPU, 0};
      d->ndim = 2;
      d->dtype = {kDLFloat, 32, 1};
      d->shape = &local[2 * i];
      d->strides = nullptr;
      d->byte_offset = 0;
    }
    names[i] = "layers." + std::to_string(i / kNumShapes) + ".w" + std::to_string(i % kNumShapes);
  }

  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.ns_steps = 0;
  muon_optimizer_t* opt = nullptr;
  if (!Check(muon_create(&o, &opt), "muon_create")) return t;
  bool ok = true;
  int32_t group = -1;
  auto t0 = std::chrono::steady_clock::now();
  if (world != nullptr) {
    muon_comm_t comm;
    ok = Check(muon_inprocess_comm(world, nullptr, 0, rank, &comm), "muon_inprocess_comm") &&
         Check(muon_set_world(opt, &comm, &group), "muon_set_world");
  }
  for (int i = 0; i < n && ok; ++i) {
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = names[i].c_str();
    muon_placement_t pl{};
    if (mode != Mode::kOneProcess) {
      pl.kind = mode == Mode::kSharded ? MUON_PLACEMENT_SHARD : MUON_PLACEMENT_REPLICATE;
      pl.group = group;
      pl.dim = 0;
      pl.split = MUON_SPLIT_CHUNK;
      po.global_ndim = 2;
      po.global_shape = &global[2 * i];
      po.num_placements = 1;
      po.placements = &pl;
      if (mode == Mode::kZero2) po.replicated_mode = MUON_REPLICATED_ZERO2;
    }
    int64_t id = -1;
    ok = Check(muon_register_param(opt, &values[i], &grads[i], &po, &id), "muon_register_param");
  }
  t.registration = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  ok = ok && Check(muon_step(opt, nullptr), "the first muon_step");
  t.first = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  ok = ok && Check(muon_step(opt, nullptr), "the second muon_step");
  t.second = Seconds(t0);
  muon_destroy(opt);
  t.ok = ok;
  return t;
}

// Runs every rank of `mode` and prints rank 0's row; false on failure.
bool Measure(int n, Mode mode) {
  Times t;
  if (mode == Mode::kOneProcess) {
    t = RunRank(n, mode, nullptr, 0);
  } else {
    muon_inprocess_world_t* world = nullptr;
    if (!Check(muon_inprocess_world_create(kRanks, &world), "muon_inprocess_world_create")) {
      return false;
    }
    std::vector<Times> each(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] { each[r] = RunRank(n, mode, world, r); });
    }
    for (std::thread& th : threads) th.join();
    muon_inprocess_world_destroy(world);
    t = each[0];
    for (const Times& e : each) t.ok = t.ok && e.ok;
  }
  if (!t.ok) return false;
  const double us = 1e6 / n;
  std::printf("| %d | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f |\n", n, t.registration, t.first,
              t.second, t.registration * us, t.first * us, t.second * us);
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {1000, 10000, 30000};
  const struct {
    Mode mode;
    const char* title;
  } tables[] = {
      {Mode::kOneProcess, "one process (a world of one rank)"},
      {Mode::kSharded, "2 in-process ranks, every parameter's rows sharded (chunks); rank 0"},
      {Mode::kZero2, "2 in-process ranks, every parameter in ZeRO-2 mode; rank 0"},
  };
  std::printf("N small parameters (64x64, 1x64, 64x1, 32x64 in turn), CPU device, ns_steps 0\n");
  for (const auto& table : tables) {
    std::printf("\n%s\n\n| N | registration (s) | first step (s) | second step (s) | "
                "registration (us/param) | first step (us/param) | second step (us/param) |\n"
                "|---:|---:|---:|---:|---:|---:|---:|\n",
                table.title);
    for (int n : sizes) {
      if (n < 1 || !Measure(n, table.mode)) return 1;
    }
  }
  return 0;
}
