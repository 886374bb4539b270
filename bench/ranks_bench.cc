// In-process ranks sharing the machine's cores: the wall time of one
// muon_step of a data-parallel job of N ranks (threads of this process over
// libmuon's in-process communicators, the C API only), against one process
// stepping the same matrices alone.
//
// By default every rank holds every whole matrix (DDP: one REPLICATE placement
// over the world; the host averaged the gradients), so the job's Newton-Schulz
// work is the same as one process's: each matrix is orthogonalized once, by
// its owner (balanced assignment); but every rank steps every matrix
// element-wise (momentum, update), N times one process's element-wise work.
// So each N is also set against one process doing the job's work: one thread
// stepping N replicas alone, the first with Newton-Schulz and the N - 1 others
// with ns_steps 0 (element-wise only). The CPU backend
// divides the cores among the ranks of a process (muon/math/cpu/cpu_threads.h):
//   threads per rank = max(1, cores / (in-process ranks x LOCAL_WORLD_SIZE)),
// MUON_CPU_THREADS=n overrides. Each N runs twice: with the rule, and with
// MUON_CPU_THREADS set to the core count (every rank uses every core: the
// behaviour before the rule), in the same run. The library reads
// MUON_CPU_THREADS at each Newton-Schulz call, so setenv between runs works.
//
// For 8 ranks it also prints the CPU time one rank spends per step:
// CLOCK_THREAD_CPUTIME_ID around muon_step in the rank's thread (with one
// thread per rank the rank's thread runs its Newton-Schulz itself; BLAS or
// OpenMP worker threads, and the exchange's helper thread, are not counted
// there), and the process's CPU time per step (CLOCK_PROCESS_CPUTIME_ID, every
// thread) divided by the ranks; both per 1e9 parameters of the whole matrix set.
//
// The matrices: GPT-2 124M's 2-D hidden weights (bench/models/gpt2-124m.json:
// per layer attn.c_attn 2304x768, attn.c_proj 768x768, mlp.c_fc 3072x768,
// mlp.c_proj 768x3072; 12 layers, 84.9 M elements; the embeddings belong to
// AdamW), fp32 parameters and gradients, default options (bf16 Newton-Schulz).
//
//   bazel run -c opt //bench:ranks_bench                      (12 layers: minutes on 2 cores)
//   bazel run -c opt //bench:ranks_bench -- --layers=1        (well under a minute)
//   options: --layers=L (1..12), --fp32 (fp32 Newton-Schulz), --steps=S (timed
//   steps after one warm-up step, default 3), --ranks=2,4,8, --layout=fsdp
//   (each rank holds torch.chunk rows of every matrix instead of a replica: the
//   job's element-wise work is then one process's, where DDP's replicas each
//   do all of it)
//
// Every run's parameters are compared with the one process's (max abs diff).
// Exits 1 if a call fails.
#include <dlpack/dlpack.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"

namespace {

struct Shape {
  const char* name;
  int64_t rows, cols;
};
// One GPT-2 124M layer's matrices (bench/models/gpt2-124m.json, role "matrix").
const Shape kLayer[] = {
    {"attn.c_attn", 2304, 768},
    {"attn.c_proj", 768, 768},
    {"mlp.c_fc", 3072, 768},
    {"mlp.c_proj", 768, 3072},
};
constexpr int kMaxLayers = 12;

struct Config {
  int layers = kMaxLayers;
  bool fp32 = false;
  int steps = 3;
  std::vector<int> ranks = {2, 4, 8};
  bool fsdp = false;  // --layout=fsdp: rows split over the ranks instead of replicas
};

// ---- Time ----

double Seconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The first three fields of /proc/loadavg: how busy the machine was.
std::string LoadAverage() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  double a = 0, b = 0, c = 0;
  const int n = std::fscanf(f, "%lf %lf %lf", &a, &b, &c);
  std::fclose(f);
  if (n != 3) return "?";
  char out[64];
  std::snprintf(out, sizeof out, "%.2f %.2f %.2f", a, b, c);
  return out;
}

// CPU seconds the whole machine spent busy (/proc/stat's first line: user,
// nice, system, irq, softirq of every core and process), 0 if unreadable.
double MachineBusySeconds() {
  FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return 0;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system,
                            &idle, &iowait, &irq, &softirq);
  std::fclose(f);
  if (n != 7) return 0;
  return static_cast<double>(user + nice + system + irq + softirq) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- The threads rule, as muon/math/cpu/cpu_threads.cc computes it ----

int Cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

int EnvCount(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n > 0 && n < (1 << 20)) ? static_cast<int>(n) : 0;
}

int ThreadsPerRank(int ranks) {
  const int override_threads = EnvCount("MUON_CPU_THREADS");
  if (override_threads > 0) return override_threads;
  return std::max(1, Cores() / (std::max(1, ranks) * std::max(1, EnvCount("LOCAL_WORLD_SIZE"))));
}

// ---- Tensors ----

// Rows [row0, row0 + local_rows) of a global rows x cols matrix and its
// gradient (the whole matrix by default).
struct Matrix {
  std::vector<int64_t> global_shape, shape;
  int64_t row0;
  std::vector<float> value, grad;
  DLTensor value_dl{}, grad_dl{};
  Matrix(int64_t rows, int64_t cols, uint64_t seed, int64_t first_row = 0, int64_t local_rows = -1)
      : global_shape{rows, cols},
        shape{local_rows < 0 ? rows : local_rows, cols},
        row0(first_row),
        value(shape[0] * cols),
        grad(shape[0] * cols) {
    // Deterministic and the same on every rank: a DDP job's replicas and its
    // averaged gradients, or an FSDP job's pieces of them.
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    auto uniform = [&x] {  // xorshift64, in [-0.5, 0.5)
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f;
    };
    const size_t begin = static_cast<size_t>(row0 * cols);
    for (size_t i = 0; i < begin + value.size(); ++i) {
      const float v = 0.02f * uniform(), g = uniform();
      if (i >= begin) {
        value[i - begin] = v;
        grad[i - begin] = g;
      }
    }
    Describe(&value_dl, value.data());
    Describe(&grad_dl, grad.data());
  }
  void Describe(DLTensor* dl, float* data) {
    dl->data = data;
    dl->device = {kDLCPU, 0};
    dl->ndim = 2;
    dl->dtype = {kDLFloat, 32, 1};
    dl->shape = shape.data();
  }
};

using Model = std::vector<std::unique_ptr<Matrix>>;

// The model's matrices, or with `ranks` > 0 rank `rank`'s rows of each
// (torch.chunk of dim 0, as FSDP2 splits them).
Model MakeModel(int layers, int ranks = 0, int rank = 0) {
  Model m;
  for (int l = 0; l < layers; ++l) {
    for (size_t k = 0; k < sizeof kLayer / sizeof kLayer[0]; ++k) {
      const int64_t rows = kLayer[k].rows;
      int64_t row0 = 0, local = rows;
      if (ranks > 0) {
        const int64_t chunk = (rows + ranks - 1) / ranks;
        row0 = std::min(rows, rank * chunk);
        local = std::min(rows, row0 + chunk) - row0;
      }
      m.push_back(std::make_unique<Matrix>(rows, kLayer[k].cols, m.size(), row0, local));
    }
  }
  return m;
}

std::string Name(size_t i) {
  const size_t per = sizeof kLayer / sizeof kLayer[0];
  return "h." + std::to_string(i / per) + "." + kLayer[i % per].name;
}

// The largest difference between a rank's pieces and the whole matrices' rows.
double MaxDiff(const Model& piece, const Model& whole) {
  double worst = 0;
  for (size_t i = 0; i < piece.size(); ++i) {
    const std::vector<float>& x = piece[i]->value;
    const float* y = whole[i]->value.data() + piece[i]->row0 * piece[i]->shape[1];
    for (size_t j = 0; j < x.size(); ++j) {
      worst = std::max(worst, static_cast<double>(std::fabs(x[j] - y[j])));
    }
  }
  return worst;
}

// ---- Ranks ----

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

// A failed call ends the program at once: the other ranks would otherwise
// wait for this one at the next barrier or collective.
[[noreturn]] void Fail(const char* call, muon_status_t status) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s: %s\n", call, muon_status_string(status),
               muon_last_error_message());
  std::_Exit(1);
}

#define CHECK_MUON(call)                                 \
  do {                                                   \
    const muon_status_t status_ = (call);                \
    if (status_ != MUON_OK) Fail(#call, status_);        \
  } while (0)

// What one run measured: per timed step, the job's wall time, rank 0's
// thread CPU time, the mean and the largest of the ranks' thread CPU times,
// the process's CPU time; after the run, every rank's model.
struct Run {
  int ranks = 1;
  std::vector<double> wall, rank0_cpu, mean_cpu, max_cpu, process_cpu;
  std::vector<Model> models;
  int64_t owned_max = 0, owned_min = 0;
  // Over the timed steps: the CPU time the machine spent outside this
  // process, as a share of its cores (other jobs on a shared machine).
  double others = 0;
};

struct RankTimes {
  std::vector<double> start, end, cpu;
};

// An optimizer over `model`: replicas or rows over `world` when there is one,
// alone otherwise; `ns_steps` Newton-Schulz iterations.
muon_optimizer_t* CreateOptimizer(const Config& cfg, int ns_steps, int ranks, int rank,
                                  muon_inprocess_world_t* world, Model* model) {
  muon_options_t o;
  CHECK_MUON(muon_options_init(&o, sizeof o));
  o.lr = 0.02;
  o.ns_dtype = cfg.fp32 ? MUON_NS_DTYPE_FP32 : MUON_NS_DTYPE_BF16;
  o.ns_steps = ns_steps;
  muon_optimizer_t* opt = nullptr;
  CHECK_MUON(muon_create(&o, &opt));
  int32_t world_group = -1;
  if (world != nullptr) {
    muon_comm_t comm;
    CHECK_MUON(muon_inprocess_comm(world, nullptr, ranks, rank, &comm));
    CHECK_MUON(muon_set_world(opt, &comm, &world_group));
  }
  muon_placement_t placement{};  // DDP: replicas; FSDP: torch.chunk rows
  placement.kind = cfg.fsdp ? MUON_PLACEMENT_SHARD : MUON_PLACEMENT_REPLICATE;
  placement.group = world_group;
  placement.dim = 0;
  placement.split = MUON_SPLIT_CHUNK;
  for (size_t i = 0; i < model->size(); ++i) {
    Matrix& m = *(*model)[i];
    const std::string name = Name(i);
    muon_param_options_t po;
    CHECK_MUON(muon_param_options_init(&po, sizeof po));
    po.name = name.c_str();
    if (world != nullptr) {
      po.global_ndim = 2;
      po.global_shape = m.global_shape.data();
      po.num_placements = 1;
      po.placements = &placement;
    }
    int64_t id = -1;
    CHECK_MUON(muon_register_param(opt, &m.value_dl, &m.grad_dl, &po, &id));
  }
  return opt;
}

struct Guard {
  muon_optimizer_t* opt;
  explicit Guard(muon_optimizer_t* o) : opt(o) {}
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  ~Guard() { muon_destroy(opt); }
};

// One rank: registers its matrices (replicas or rows over the world when there
// is one), steps once to warm up, then `steps` times between barriers.
void RankMain(const Config& cfg, int ranks, int rank, muon_inprocess_world_t* world,
              Barrier* barrier, Model* model, RankTimes* times, Run* run, int64_t* owned) {
  muon_optimizer_t* opt = CreateOptimizer(cfg, 5, ranks, rank, world, model);
  Guard guard(opt);
  CHECK_MUON(muon_step(opt, nullptr));  // warm-up: the handshake, every allocation
  double busy0 = 0, own0 = 0, wall0 = 0;
  barrier->Wait();
  if (rank == 0) {
    busy0 = MachineBusySeconds();
    own0 = Seconds(CLOCK_PROCESS_CPUTIME_ID);
    wall0 = Seconds(CLOCK_MONOTONIC);
  }
  for (int s = 0; s < cfg.steps; ++s) {
    barrier->Wait();
    double process0 = 0;
    if (rank == 0) process0 = Seconds(CLOCK_PROCESS_CPUTIME_ID);
    barrier->Wait();
    const double cpu0 = Seconds(CLOCK_THREAD_CPUTIME_ID);
    times->start.push_back(Seconds(CLOCK_MONOTONIC));
    const muon_status_t st = muon_step(opt, nullptr);
    times->end.push_back(Seconds(CLOCK_MONOTONIC));
    times->cpu.push_back(Seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0);
    barrier->Wait();
    if (rank == 0) run->process_cpu.push_back(Seconds(CLOCK_PROCESS_CPUTIME_ID) - process0);
    CHECK_MUON(st);
  }
  if (rank == 0) {
    const double others =
        (MachineBusySeconds() - busy0) - (Seconds(CLOCK_PROCESS_CPUTIME_ID) - own0);
    run->others = std::max(0.0, others / ((Seconds(CLOCK_MONOTONIC) - wall0) * Cores()));
  }
  muon_stats_t stats;
  CHECK_MUON(muon_stats_init(&stats, sizeof stats));
  CHECK_MUON(muon_get_stats(opt, &stats));
  *owned = stats.matrices_owned;
}

void Measure(const Config& cfg, int ranks, Run* run) {
  run->ranks = ranks;
  run->models.resize(ranks);
  for (int r = 0; r < ranks; ++r) {
    run->models[r] = MakeModel(cfg.layers, cfg.fsdp && ranks > 1 ? ranks : 0, r);
  }
  muon_inprocess_world_t* world = nullptr;
  if (ranks > 1) CHECK_MUON(muon_inprocess_world_create(ranks, &world));
  Barrier barrier(ranks);
  std::vector<RankTimes> times(ranks);
  std::vector<int64_t> owned(ranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      RankMain(cfg, ranks, r, world, &barrier, &run->models[r], &times[r], run, &owned[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  if (world != nullptr) muon_inprocess_world_destroy(world);
  for (int s = 0; s < cfg.steps; ++s) {
    double start = times[0].start[s], end = times[0].end[s], cpu = 0, max_cpu = 0;
    for (int r = 0; r < ranks; ++r) {
      start = std::min(start, times[r].start[s]);
      end = std::max(end, times[r].end[s]);
      cpu += times[r].cpu[s];
      max_cpu = std::max(max_cpu, times[r].cpu[s]);
    }
    run->wall.push_back(end - start);
    run->rank0_cpu.push_back(times[0].cpu[s]);
    run->mean_cpu.push_back(cpu / ranks);
    run->max_cpu.push_back(max_cpu);
  }
  run->owned_max = *std::max_element(owned.begin(), owned.end());
  run->owned_min = *std::min_element(owned.begin(), owned.end());
}

// DDP's work done by one process: the job orthogonalizes each matrix once and
// steps each of its `ranks` replicas element-wise. One thread steps `ranks`
// optimizers over replicas of their own, each alone (no world): the first with
// 5 Newton-Schulz iterations, the others with 0 (their momentum, their
// update's normalization and apply, no products). The median wall time of the
// whole sequence.
double SameWorkMs(const Config& cfg, int ranks) {
  std::vector<Model> replicas(ranks);
  std::vector<std::unique_ptr<Guard>> opts;
  for (int r = 0; r < ranks; ++r) {
    replicas[r] = MakeModel(cfg.layers);
    opts.push_back(std::unique_ptr<Guard>(
        new Guard(CreateOptimizer(cfg, r == 0 ? 5 : 0, 1, 0, nullptr, &replicas[r]))));
    CHECK_MUON(muon_step(opts.back()->opt, nullptr));  // warm-up
  }
  std::vector<double> wall;
  for (int s = 0; s < cfg.steps; ++s) {
    const double start = Seconds(CLOCK_MONOTONIC);
    for (const auto& g : opts) CHECK_MUON(muon_step(g->opt, nullptr));
    wall.push_back(Seconds(CLOCK_MONOTONIC) - start);
  }
  return 1e3 * Median(wall);
}

bool ParseArgs(int argc, char** argv, Config* cfg) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--layers=", 0) == 0) {
      cfg->layers = std::atoi(a.c_str() + 9);
    } else if (a == "--fp32") {
      cfg->fp32 = true;
    } else if (a == "--layout=ddp" || a == "--layout=fsdp") {
      cfg->fsdp = a == "--layout=fsdp";
    } else if (a.rfind("--steps=", 0) == 0) {
      cfg->steps = std::atoi(a.c_str() + 8);
    } else if (a.rfind("--ranks=", 0) == 0) {
      cfg->ranks.clear();
      for (const char* p = a.c_str() + 8; *p != '\0';) {
        char* end = nullptr;
        cfg->ranks.push_back(static_cast<int>(std::strtol(p, &end, 10)));
        if (end == p || cfg->ranks.back() < 2) return false;
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      return false;
    }
  }
  return cfg->layers >= 1 && cfg->layers <= kMaxLayers && cfg->steps >= 1 && !cfg->ranks.empty();
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!ParseArgs(argc, argv, &cfg)) {
    std::fprintf(stderr, "usage: ranks_bench [--layers=1..12] [--fp32] [--steps=S] "
                         "[--ranks=2,4,8] [--layout=ddp|fsdp]\n");
    return 2;
  }
  const std::string load_start = LoadAverage();
  const int cores = Cores();
  const char* user_threads = std::getenv("MUON_CPU_THREADS");
  const std::string user_threads_value = user_threads != nullptr ? user_threads : "";
  const std::string all_cores = std::to_string(cores);
  auto use_rule = [&] {
    if (user_threads != nullptr) {
      setenv("MUON_CPU_THREADS", user_threads_value.c_str(), 1);
    } else {
      unsetenv("MUON_CPU_THREADS");
    }
  };

  Model shapes = MakeModel(cfg.layers);
  double elements = 0;
  for (const auto& m : shapes) elements += static_cast<double>(m->value.size());
  shapes.clear();

  std::printf("# In-process ranks on %d cores: one %s step, GPT-2 124M matrices\n\n", cores,
              cfg.fsdp ? "FSDP" : "DDP");
  std::printf("- matrices: %d layer(s) of GPT-2 124M (c_attn 2304x768, attn c_proj 768x768, "
              "c_fc 3072x768, mlp c_proj 768x3072): %zu matrices, %.2f M elements, fp32 "
              "parameters\n",
              cfg.layers, cfg.layers * sizeof kLayer / sizeof kLayer[0], elements / 1e6);
  std::printf("- Newton-Schulz: %s, 5 iterations; each matrix orthogonalized once in the job, "
              "whole, by its owner (balanced assignment)\n",
              cfg.fp32 ? "fp32" : "bf16 (default)");
  if (cfg.fsdp) {
    std::printf("- layout FSDP: each rank holds torch.chunk rows of every matrix (SHARD dim 0 "
                "over the world): the job's element-wise work (momentum, update) is one "
                "process's, split over the ranks; the exchange gathers each matrix to its owner "
                "and scatters the result's rows back\n");
  } else {
    std::printf("- layout DDP: every rank holds every whole matrix (REPLICATE over the world): "
                "each rank runs the element-wise momentum and update over all of them (N times "
                "one process's element-wise work in the job) and receives every result it did "
                "not compute; --layout=fsdp splits that work instead\n");
  }
  std::printf("- cores (sched_getaffinity): %d; LOCAL_WORLD_SIZE %s; MUON_CPU_THREADS %s\n", cores,
              std::getenv("LOCAL_WORLD_SIZE") ? std::getenv("LOCAL_WORLD_SIZE") : "unset",
              user_threads ? user_threads : "unset (the rule)");
  std::printf("- load average before the run (/proc/loadavg): %s; \"other processes' CPU\": "
              "the machine's busy time outside this process during the timed steps "
              "(/proc/stat), as a share of the cores\n",
              load_start.c_str());
  std::printf("- ms per step: the job's wall time of one muon_step, from the first rank's "
              "start to the last rank's end, median of %d steps after a warm-up step\n\n",
              cfg.steps);
  std::fflush(stdout);

  // One process alone (no world), then each N with the rule and with every core per rank.
  Run one;
  use_rule();
  Measure(cfg, 1, &one);
  const double one_ms = 1e3 * Median(one.wall);
  std::printf("| ranks | threads per rank | setting | ms per step | vs one process | "
              "one process doing the job's work, ms | vs it | "
              "matrices owned per rank | max abs diff vs one process | other processes' CPU "
              "|\n|---:|---:|---|---:|---:|---:|---:|---|---:|---:|\n");
  std::printf("| 1 (one process) | %d | %s | %.1f | 1.00 | | | %lld | 0 | %.0f%% |\n",
              ThreadsPerRank(1), user_threads ? "MUON_CPU_THREADS (yours)" : "rule", one_ms,
              static_cast<long long>(one.owned_max), 100 * one.others);
  std::fflush(stdout);

  Run eight_rule, eight_all;
  bool have_eight = false;
  for (int n : cfg.ranks) {
    // The job's work in one process: DDP's N replicas' element-wise work, or
    // (FSDP) one process's step.
    use_rule();
    const double same_ms = cfg.fsdp ? one_ms : SameWorkMs(cfg, n);
    for (int all : {0, 1}) {
      if (all) {
        setenv("MUON_CPU_THREADS", all_cores.c_str(), 1);
      } else {
        use_rule();
      }
      Run run;
      Measure(cfg, n, &run);
      double diff = 0;
      for (const Model& m : run.models) diff = std::max(diff, MaxDiff(m, one.models[0]));
      const double ms = 1e3 * Median(run.wall);
      std::printf("| %d | %d | %s | %.1f | %.2f | %.1f | %.2f | %lld-%lld | %.3g | %.0f%% |\n",
                  n, ThreadsPerRank(n),
                  all ? ("MUON_CPU_THREADS=" + all_cores + " (every core per rank)").c_str()
                      : (user_threads ? "MUON_CPU_THREADS (yours)" : "rule"),
                  ms, ms / one_ms, same_ms, ms / same_ms, static_cast<long long>(run.owned_min),
                  static_cast<long long>(run.owned_max), diff, 100 * run.others);
      std::fflush(stdout);
      if (n == 8) {
        run.models.clear();
        (all ? eight_all : eight_rule) = std::move(run);
        have_eight = true;
      }
    }
  }
  use_rule();

  if (have_eight) {
    const double per_billion = 1e9 / elements;
    setenv("MUON_CPU_THREADS", all_cores.c_str(), 1);
    const int all_threads = ThreadsPerRank(8);
    use_rule();
    const int rule_threads = ThreadsPerRank(8);
    std::printf("\n## One rank's CPU time per step at 8 ranks\n\n");
    std::printf("Medians over the timed steps. Each rank orthogonalizes about 1/8 of the "
                "matrices (its own, whole) and %s; \"per 1e9 params\" scales a rank's ms per "
                "step to 1e9 parameters of the whole matrix set (x %.2f here).\n\n",
                cfg.fsdp ? "steps its 1/8 of the rows" : "steps its copy of every matrix",
                per_billion);
    std::printf("| per step, 8 ranks | %s: %d thread(s) per rank | MUON_CPU_THREADS=%s: %d "
                "per rank |\n|---|---:|---:|\n",
                user_threads ? "MUON_CPU_THREADS (yours)" : "rule", rule_threads,
                all_cores.c_str(), all_threads);
    auto row = [&](const char* what, double rule, double all) {
      std::printf("| %s | %.1f | %.1f |\n", what, rule, all);
    };
    const Run& a = eight_rule;
    const Run& b = eight_all;
    row("job wall ms", 1e3 * Median(a.wall), 1e3 * Median(b.wall));
    row("rank 0's thread CPU ms", 1e3 * Median(a.rank0_cpu), 1e3 * Median(b.rank0_cpu));
    row("a rank's thread CPU ms, mean of the 8", 1e3 * Median(a.mean_cpu),
        1e3 * Median(b.mean_cpu));
    row("a rank's thread CPU ms, the largest of the 8", 1e3 * Median(a.max_cpu),
        1e3 * Median(b.max_cpu));
    row("process CPU ms / 8 (every thread)", 1e3 * Median(a.process_cpu) / 8,
        1e3 * Median(b.process_cpu) / 8);
    row("**mean rank thread CPU ms per 1e9 params**", 1e3 * Median(a.mean_cpu) * per_billion,
        1e3 * Median(b.mean_cpu) * per_billion);
    row("largest rank thread CPU ms per 1e9 params", 1e3 * Median(a.max_cpu) * per_billion,
        1e3 * Median(b.max_cpu) * per_billion);
    row("process CPU ms / 8 per 1e9 params", 1e3 * Median(a.process_cpu) / 8 * per_billion,
        1e3 * Median(b.process_cpu) / 8 * per_billion);
    std::printf("\nA rank's thread CPU time is CLOCK_THREAD_CPUTIME_ID around muon_step in "
                "the rank's thread. With one thread per rank (the rule, here: %s) that thread "
                "runs the rank's whole Newton-Schulz and the rank's element-wise work itself; "
                "with more, OpenBLAS's and OpenMP's worker threads do part of the products and "
                "are not counted there. The process's CPU time (CLOCK_PROCESS_CPUTIME_ID, every "
                "thread, read between barriers around the step) divided by the 8 ranks counts "
                "those workers and the exchange's helper threads too.\n",
                rule_threads == 1 ? "1 thread per rank" : "more than 1 thread per rank");
  }
  return 0;
}
