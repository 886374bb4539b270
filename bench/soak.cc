// Soak: a long run of the distributed optimizer, watching the process for
// growth. Four ranks run as threads of this process over libmuon's in-process
// communicators (the C API, libmuon.so), TP 2 x FSDP 2: every matrix is
// sharded, so each step gathers every matrix to its owner, orthogonalizes it
// there and scatters the update back (two all-to-alls per round), agrees on
// the outcome (an all-gather), and the learning rate follows a schedule set
// before every step. Rank 0 prints the process's resident memory (VmRSS),
// thread count (Threads) and open file descriptors (entries of /proc/self/fd)
// before the first step and every --every steps, with the steps per second
// of each interval, then the growth from step 1,000 to the end.
//
//   bazel run -c opt //bench:soak                      (BENCHMARKS.md has its output)
//   bazel run -c opt //bench:soak -- --steps=4000 --every=500
//
// Exits 1 if a step fails, a weight is not finite, or the two copies of the
// replicated matrix differ.
#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"

namespace {

constexpr int kTP = 2;
constexpr int kFSDP = 2;
constexpr int kRanks = kTP * kFSDP;
constexpr double kPi = 3.14159265358979323846;

int TpOf(int rank) { return rank % kTP; }
int FsdpOf(int rank) { return rank / kTP; }

enum class Kind { kColumnParallel, kRowParallel, kReplicated };

struct Param {
  const char* name;
  int64_t rows, cols;
  Kind kind;
};

// A small transformer block's matrices: 45 rows split unevenly by FSDP.
const Param kModel[] = {
    {"embed", 45, 64, Kind::kReplicated},
    {"attn.qkv", 192, 64, Kind::kColumnParallel},
    {"attn.out", 64, 64, Kind::kRowParallel},
    {"mlp.up", 256, 64, Kind::kColumnParallel},
    {"mlp.down", 64, 256, Kind::kRowParallel},
};
constexpr int kParams = sizeof(kModel) / sizeof(kModel[0]);

struct Block {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

Block LocalBlock(const Param& p, int rank) {
  Block b{0, p.rows, 0, p.cols};
  if (p.kind == Kind::kColumnParallel) {
    b.rows = p.rows / kTP;
    b.row0 = TpOf(rank) * b.rows;
  } else if (p.kind == Kind::kRowParallel) {
    b.cols = p.cols / kTP;
    b.col0 = TpOf(rank) * b.cols;
  }
  const int64_t chunk = (b.rows + kFSDP - 1) / kFSDP;  // torch.chunk
  const int64_t start = std::min(b.rows, FsdpOf(rank) * chunk);
  const int64_t end = std::min(b.rows, start + chunk);
  b.row0 += start;
  b.rows = end - start;
  return b;
}

std::vector<muon_placement_t> Placements(Kind kind, int32_t tp_group, int32_t fsdp_group) {
  muon_placement_t tp{}, fsdp{};
  tp.group = tp_group;
  tp.kind = kind == Kind::kReplicated ? MUON_PLACEMENT_REPLICATE : MUON_PLACEMENT_SHARD;
  tp.split = MUON_SPLIT_EVEN;
  tp.dim = kind == Kind::kRowParallel ? 1 : 0;
  fsdp.group = fsdp_group;
  fsdp.kind = MUON_PLACEMENT_SHARD;
  fsdp.split = MUON_SPLIT_CHUNK;
  fsdp.dim = 0;
  return {tp, fsdp};
}

float Gradient(int param, int64_t row, int64_t col, int64_t step) {
  const int64_t h = (param * 1009 + row * 131 + col * 71 + step * 37) % 97;
  return static_cast<float>(h - 48) / 48.0f;
}

DLTensor Float32Tensor(float* data, int64_t* shape) {
  DLTensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

// ---- The process, from /proc/self ----

struct Sample {
  int64_t step = 0;
  long rss_kb = 0;
  long threads = 0;
  long fds = 0;
  double seconds = 0;  // since the first step began
};

long StatusField(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long value = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      value = std::strtol(line + n + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return value;
}

long OpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  long n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

// ---- One rank ----

// The ranks wait for each other before the first sample (every rank's thread
// started and its parameters registered) and after the last (none has exited).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  int64_t generation_ = 0;
};

struct Shared {
  int64_t steps = 20000;
  int64_t every = 2000;
  int64_t baseline = 1000;  // growth is measured from here
  std::vector<Sample> samples;  // rank 0's
  std::chrono::steady_clock::time_point start;
  std::vector<std::vector<std::vector<float>>> weights;  // [rank][param]
  std::vector<std::string> errors;                      // [rank]
  Barrier barrier{kRanks};
};

#define CHECK_MUON(call)                                                                    \
  do {                                                                                      \
    const muon_status_t status_ = (call);                                                   \
    if (status_ != MUON_OK) {                                                               \
      return std::string(#call) + ": " + muon_status_string(status_) + ": " +               \
             muon_last_error_message();                                                     \
    }                                                                                       \
  } while (0)

Sample Take(int64_t step, const Shared& s) {
  Sample x;
  x.step = step;
  x.rss_kb = StatusField("VmRSS");
  x.threads = StatusField("Threads");
  x.fds = OpenFds();
  x.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count();
  return x;
}

void PrintRow(const Sample& x, const Sample* prev) {
  char rate[32] = "";
  if (prev != nullptr && x.seconds > prev->seconds) {
    std::snprintf(rate, sizeof rate, "%.0f",
                  static_cast<double>(x.step - prev->step) / (x.seconds - prev->seconds));
  }
  std::printf("| %lld | %.1f | %ld | %ld | %s |\n", static_cast<long long>(x.step),
              static_cast<double>(x.rss_kb) / 1024.0, x.threads, x.fds, rate);
  std::fflush(stdout);
}

std::string RunRank(muon_inprocess_world_t* world, int rank, Shared* s) {
  muon_options_t options;
  CHECK_MUON(muon_options_init(&options, sizeof options));
  muon_optimizer_t* opt = nullptr;
  CHECK_MUON(muon_create(&options, &opt));
  struct Guard {
    muon_optimizer_t* opt;
    ~Guard() { muon_destroy(opt); }
  } guard{opt};

  muon_comm_t comm;
  int32_t world_group, tp_group, fsdp_group;
  CHECK_MUON(muon_inprocess_comm(world, nullptr, kRanks, rank, &comm));
  CHECK_MUON(muon_set_world(opt, &comm, &world_group));
  const int32_t tp_members[kTP] = {kTP * FsdpOf(rank), kTP * FsdpOf(rank) + 1};
  CHECK_MUON(muon_inprocess_comm(world, tp_members, kTP, rank, &comm));
  CHECK_MUON(muon_add_group(opt, &comm, &tp_group));
  const int32_t fsdp_members[kFSDP] = {TpOf(rank), TpOf(rank) + kTP};
  CHECK_MUON(muon_inprocess_comm(world, fsdp_members, kFSDP, rank, &comm));
  CHECK_MUON(muon_add_group(opt, &comm, &fsdp_group));

  std::vector<Block> blocks(kParams);
  std::vector<std::vector<float>>& weights = s->weights[rank];
  std::vector<std::vector<float>> grads(kParams);
  std::vector<std::vector<int64_t>> shapes(kParams);
  weights.resize(kParams);
  for (int i = 0; i < kParams; ++i) {
    const Param& p = kModel[i];
    const Block b = LocalBlock(p, rank);
    blocks[i] = b;
    weights[i].assign(b.rows * b.cols, 0.0f);
    for (int64_t r = 0; r < b.rows; ++r) {
      for (int64_t c = 0; c < b.cols; ++c) {
        weights[i][r * b.cols + c] = 0.01f * std::sin(static_cast<float>(
                                                (b.row0 + r) * 7 + (b.col0 + c) * 3 + i));
      }
    }
    grads[i].assign(b.rows * b.cols, 0.0f);
    shapes[i] = {b.rows, b.cols};
    const int64_t global_shape[2] = {p.rows, p.cols};
    const std::vector<muon_placement_t> placements = Placements(p.kind, tp_group, fsdp_group);
    DLTensor w = Float32Tensor(weights[i].data(), shapes[i].data());
    DLTensor g = Float32Tensor(grads[i].data(), shapes[i].data());
    muon_param_options_t po;
    CHECK_MUON(muon_param_options_init(&po, sizeof po));
    po.name = p.name;
    po.global_ndim = 2;
    po.global_shape = global_shape;
    po.num_placements = static_cast<int32_t>(placements.size());
    po.placements = placements.data();
    int64_t id;
    CHECK_MUON(muon_register_param(opt, &w, &g, &po, &id));
  }

  s->barrier.Wait();
  if (rank == 0) {
    s->start = std::chrono::steady_clock::now();
    s->samples.push_back(Take(0, *s));
    PrintRow(s->samples.back(), nullptr);
  }
  for (int64_t step = 1; step <= s->steps; ++step) {
    for (int i = 0; i < kParams; ++i) {
      const Block& b = blocks[i];
      for (int64_t r = 0; r < b.rows; ++r) {
        for (int64_t c = 0; c < b.cols; ++c) {
          grads[i][r * b.cols + c] = Gradient(i, b.row0 + r, b.col0 + c, step);
        }
      }
    }
    // A cosine schedule down to a tenth of the peak.
    const double t = static_cast<double>(step) / static_cast<double>(s->steps);
    CHECK_MUON(muon_set_lr(opt, 0.002 * (0.55 + 0.45 * std::cos(kPi * t))));
    CHECK_MUON(muon_step(opt, nullptr));
    if (rank == 0 && (step % s->every == 0 || step == s->baseline || step == s->steps)) {
      s->samples.push_back(Take(step, *s));
      const Sample& x = s->samples.back();
      if (step % s->every == 0 || step == s->steps) {
        // The interval's rate: from the previous printed row.
        const Sample* prev = nullptr;
        for (size_t k = s->samples.size() - 1; k-- > 0;) {
          if (s->samples[k].step % s->every == 0) {
            prev = &s->samples[k];
            break;
          }
        }
        PrintRow(x, prev);
      }
    }
  }
  s->barrier.Wait();
  int64_t count = 0;
  CHECK_MUON(muon_step_count(opt, &count));
  if (count != s->steps) return "step count " + std::to_string(count);
  for (const std::vector<float>& w : weights) {
    for (float v : w) {
      if (!std::isfinite(v)) return "a weight is not finite";
    }
  }
  return "";
}

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') {
      return std::atoll(argv[i] + n + 1);
    }
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  Shared s;
  s.steps = Flag(argc, argv, "--steps", 20000);
  s.every = Flag(argc, argv, "--every", 2000);
  s.baseline = std::min<int64_t>(1000, s.steps);
  if (s.steps < 1 || s.every < 1) {
    std::fprintf(stderr, "usage: soak [--steps=N] [--every=N]\n");
    return 2;
  }
  s.weights.resize(kRanks);
  s.errors.resize(kRanks);

  int64_t elements = 0;
  for (const Param& p : kModel) elements += p.rows * p.cols;
  std::printf("soak: %d ranks (threads, in-process communicators), TP %d x FSDP %d, "
              "%d matrices (%lld fp32 elements), %lld steps\n\n",
              kRanks, kTP, kFSDP, kParams, static_cast<long long>(elements),
              static_cast<long long>(s.steps));
  std::printf("| step | RSS MiB | threads | open fds | steps/s |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");

  muon_inprocess_world_t* world = nullptr;
  if (muon_inprocess_world_create(kRanks, &world) != MUON_OK) {
    std::fprintf(stderr, "muon_inprocess_world_create: %s\n", muon_last_error_message());
    return 1;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { s.errors[r] = RunRank(world, r, &s); });
  }
  for (std::thread& t : threads) t.join();
  muon_inprocess_world_destroy(world);

  int failed = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (!s.errors[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, s.errors[r].c_str());
      failed = 1;
    }
  }
  // The replicated embedding: TP ranks 2f and 2f + 1 hold the same rows.
  for (int f = 0; f < kFSDP; ++f) {
    if (s.weights[kTP * f][0] != s.weights[kTP * f + 1][0]) {
      std::fprintf(stderr, "the replicated embedding differs between ranks %d and %d\n",
                   kTP * f, kTP * f + 1);
      failed = 1;
    }
  }
  if (failed) return 1;

  const Sample* base = nullptr;
  for (const Sample& x : s.samples) {
    if (x.step == s.baseline) base = &x;
  }
  const Sample& last = s.samples.back();
  if (base != nullptr && last.step > base->step) {
    std::printf("\nfrom step %lld to step %lld: RSS %+.1f MiB (%+ld kB), threads %+ld, "
                "open fds %+ld; %.0f steps/s over the whole run (%.1f s)\n",
                static_cast<long long>(base->step), static_cast<long long>(last.step),
                static_cast<double>(last.rss_kb - base->rss_kb) / 1024.0,
                last.rss_kb - base->rss_kb, last.threads - base->threads,
                last.fds - base->fds,
                static_cast<double>(last.step) / last.seconds, last.seconds);
  }
  return 0;
}
