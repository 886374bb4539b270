// libmuon demo: distributed Muon on 4 ranks, tensor parallel 2 x FSDP 2.
//
// Four ranks run as threads of this process. Each rank has its own optimizer
// and holds only its own piece of every weight matrix, exactly as in a
// Megatron-style TP + FSDP job. libmuon gathers each matrix's pieces on one
// owner rank, orthogonalizes it there (every matrix exactly once in the whole
// job), and sends each rank back the update for its piece.
//
// The ranks talk through libmuon's in-process communicators. A real job hands
// libmuon its own NCCL or MPI communicators instead (muon_comm_from_nccl, or a
// table of C callbacks); nothing else in this program would change.
//
// At the end the same model is trained in a single process, and every rank's
// pieces must be bit-identical to it.
//
//   bazel run //examples:demo
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"

namespace {

constexpr int kTP = 2;    // tensor-parallel ranks
constexpr int kFSDP = 2;  // fully-sharded data-parallel ranks
constexpr int kRanks = kTP * kFSDP;
constexpr int kSteps = 5;

// Rank r sits at (tp, fsdp) = (r % kTP, r / kTP): the TP group {2f, 2f + 1}
// holds neighbouring ranks (as Megatron places them), the FSDP group {t, t + 2}.
int TpOf(int rank) { return rank % kTP; }
int FsdpOf(int rank) { return rank / kTP; }

// ---- The model: a two-layer transformer's weight matrices ----

enum class Kind {
  kColumnParallel,  // split over TP by rows (output features): QKV, MLP up
  kRowParallel,     // split over TP by columns (input features): attention out, MLP down
  kEmbedding,       // the same copy on both TP ranks (replicated)
};

struct Param {
  std::string name;
  int64_t rows, cols;
  Kind kind;
};

std::vector<Param> Model() {
  // 45 rows: FSDP splits them unevenly (23 and 22 rows, as torch.chunk does).
  std::vector<Param> model = {{"embed", 45, 32, Kind::kEmbedding}};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = "layer" + std::to_string(layer) + ".";
    model.push_back({l + "attn.qkv", 96, 32, Kind::kColumnParallel});
    model.push_back({l + "attn.out", 32, 32, Kind::kRowParallel});
    model.push_back({l + "mlp.up", 128, 32, Kind::kColumnParallel});
    model.push_back({l + "mlp.down", 32, 128, Kind::kRowParallel});
  }
  return model;
}

const char* Describe(Kind kind) {
  switch (kind) {
    case Kind::kColumnParallel:
      return "Shard(TP, dim 0), Shard(FSDP, dim 0, chunk)";
    case Kind::kRowParallel:
      return "Shard(TP, dim 1), Shard(FSDP, dim 0, chunk)";
    case Kind::kEmbedding:
      return "Replicate(TP), Shard(FSDP, dim 0, chunk)";
  }
  return "";
}

// The placements libmuon is told about, applied left to right: from the
// global matrix down to this rank's piece.
std::vector<muon_placement_t> Placements(Kind kind, int32_t tp_group, int32_t fsdp_group) {
  muon_placement_t tp{}, fsdp{};
  tp.group = tp_group;
  tp.kind = MUON_PLACEMENT_SHARD;
  tp.split = MUON_SPLIT_EVEN;  // Megatron: equal parts
  tp.dim = kind == Kind::kRowParallel ? 1 : 0;
  if (kind == Kind::kEmbedding) tp.kind = MUON_PLACEMENT_REPLICATE;
  fsdp.group = fsdp_group;
  fsdp.kind = MUON_PLACEMENT_SHARD;
  fsdp.split = MUON_SPLIT_CHUNK;  // FSDP2 / torch.chunk: ceil(rows / 2) rows each
  fsdp.dim = 0;
  return {tp, fsdp};
}

// The same layout, computed by hand: the block of the global matrix a rank
// holds (a rectangle, stored row-major in the rank's local buffer).
struct Block {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  int64_t numel() const { return rows * cols; }
};

void EvenPart(int64_t size, int parts, int index, int64_t* start, int64_t* len) {
  *len = size / parts;
  *start = index * *len;
}

void ChunkPart(int64_t size, int parts, int index, int64_t* start, int64_t* len) {
  const int64_t chunk = (size + parts - 1) / parts;
  *start = std::min(size, index * chunk);
  *len = std::min(size, *start + chunk) - *start;
}

Block LocalBlock(const Param& p, int rank) {
  Block b{0, p.rows, 0, p.cols};
  int64_t start, len;
  if (p.kind == Kind::kColumnParallel) {
    EvenPart(b.rows, kTP, TpOf(rank), &start, &len);
    b.row0 += start;
    b.rows = len;
  } else if (p.kind == Kind::kRowParallel) {
    EvenPart(b.cols, kTP, TpOf(rank), &start, &len);
    b.col0 += start;
    b.cols = len;
  }
  ChunkPart(b.rows, kFSDP, FsdpOf(rank), &start, &len);
  b.row0 += start;
  b.rows = len;
  return b;
}

// ---- Made-up but deterministic initial weights and gradients ----

float InitialWeight(int param, int64_t row, int64_t col) {
  return 0.02f * static_cast<float>(((param * 31 + row * 17 + col * 7) % 23) - 11) / 11.0f;
}

float Gradient(int param, int64_t row, int64_t col, int step) {
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
  t.shape = shape;  // strides NULL: row-major contiguous
  return t;
}

// Every libmuon call returns a status; on error, say which call and why.
#define CHECK_MUON(call)                                                      \
  do {                                                                        \
    const muon_status_t status_ = (call);                                     \
    if (status_ != MUON_OK) {                                                 \
      return std::string(#call) + ": " + muon_status_string(status_) + ": " + \
             muon_last_error_message();                                       \
    }                                                                         \
  } while (0)

// What one rank holds: its block of every matrix, and the gradient buffers.
struct RankState {
  std::vector<Block> blocks;
  std::vector<std::vector<float>> weights, grads;
  muon_stats_t stats;
};

// ---- One rank of the distributed job (runs on its own thread) ----

std::string RunRank(muon_inprocess_world_t* world, int rank, const std::vector<Param>& model,
                    RankState* out) {
  muon_options_t options;
  CHECK_MUON(muon_options_init(&options, sizeof options));  // the built-in defaults
  muon_optimizer_t* opt = nullptr;
  CHECK_MUON(muon_create(&options, &opt));
  // From here on, destroy the optimizer on every way out.
  struct Guard {
    muon_optimizer_t* opt;
    ~Guard() { muon_destroy(opt); }
  } guard{opt};

  // 1. Communicators: the world, then the TP and FSDP groups this rank is in.
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

  // 2. Register this rank's piece of every matrix, with the global shape and
  //    the placements that cut it out. The name identifies the matrix across
  //    ranks.
  const size_t n = model.size();
  out->blocks.resize(n);
  out->weights.resize(n);
  out->grads.resize(n);
  std::vector<std::vector<int64_t>> local_shapes(n);
  for (size_t i = 0; i < n; ++i) {
    const Param& p = model[i];
    const Block b = LocalBlock(p, rank);
    out->blocks[i] = b;
    out->weights[i].resize(b.numel());
    out->grads[i].resize(b.numel());
    for (int64_t r = 0; r < b.rows; ++r) {
      for (int64_t c = 0; c < b.cols; ++c) {
        out->weights[i][r * b.cols + c] =
            InitialWeight(static_cast<int>(i), b.row0 + r, b.col0 + c);
      }
    }
    local_shapes[i] = {b.rows, b.cols};
    const int64_t global_shape[2] = {p.rows, p.cols};
    const std::vector<muon_placement_t> placements = Placements(p.kind, tp_group, fsdp_group);

    DLTensor weight = Float32Tensor(out->weights[i].data(), local_shapes[i].data());
    DLTensor grad = Float32Tensor(out->grads[i].data(), local_shapes[i].data());
    muon_param_options_t po;
    CHECK_MUON(muon_param_options_init(&po, sizeof po));
    po.name = p.name.c_str();
    po.global_ndim = 2;
    po.global_shape = global_shape;
    po.num_placements = static_cast<int32_t>(placements.size());
    po.placements = placements.data();
    int64_t id;
    CHECK_MUON(muon_register_param(opt, &weight, &grad, &po, &id));
  }

  // 3. Train: write this rank's part of each gradient in place, then step.
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const Block& b = out->blocks[i];
      for (int64_t r = 0; r < b.rows; ++r) {
        for (int64_t c = 0; c < b.cols; ++c) {
          out->grads[i][r * b.cols + c] =
              Gradient(static_cast<int>(i), b.row0 + r, b.col0 + c, step);
        }
      }
    }
    CHECK_MUON(muon_step(opt, nullptr));
  }

  // 4. What this rank moved and computed in the last step.
  CHECK_MUON(muon_stats_init(&out->stats, sizeof out->stats));
  CHECK_MUON(muon_get_stats(opt, &out->stats));
  return "";
}

// ---- The same model in a single process: the reference ----

std::string RunSingleProcess(const std::vector<Param>& model,
                             std::vector<std::vector<float>>* weights) {
  muon_options_t options;
  CHECK_MUON(muon_options_init(&options, sizeof options));
  muon_optimizer_t* opt = nullptr;
  CHECK_MUON(muon_create(&options, &opt));
  struct Guard {
    muon_optimizer_t* opt;
    ~Guard() { muon_destroy(opt); }
  } guard{opt};

  const size_t n = model.size();
  weights->resize(n);
  std::vector<std::vector<float>> grads(n);
  std::vector<std::vector<int64_t>> shapes(n);
  for (size_t i = 0; i < n; ++i) {
    const Param& p = model[i];
    (*weights)[i].resize(p.rows * p.cols);
    grads[i].resize(p.rows * p.cols);
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t c = 0; c < p.cols; ++c) {
        (*weights)[i][r * p.cols + c] = InitialWeight(static_cast<int>(i), r, c);
      }
    }
    shapes[i] = {p.rows, p.cols};
    DLTensor weight = Float32Tensor((*weights)[i].data(), shapes[i].data());
    DLTensor grad = Float32Tensor(grads[i].data(), shapes[i].data());
    muon_param_options_t po;
    CHECK_MUON(muon_param_options_init(&po, sizeof po));
    po.name = p.name.c_str();
    int64_t id;
    CHECK_MUON(muon_register_param(opt, &weight, &grad, &po, &id));
  }
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < model[i].rows; ++r) {
        for (int64_t c = 0; c < model[i].cols; ++c) {
          grads[i][r * model[i].cols + c] = Gradient(static_cast<int>(i), r, c, step);
        }
      }
    }
    CHECK_MUON(muon_step(opt, nullptr));
  }
  return "";
}

// Number of elements of rank `s`'s pieces that differ (in any bit) from the
// single-process weights.
int64_t CountMismatches(const std::vector<Param>& model, const RankState& s,
                        const std::vector<std::vector<float>>& reference) {
  int64_t bad = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    const Block& b = s.blocks[i];
    for (int64_t r = 0; r < b.rows; ++r) {
      for (int64_t c = 0; c < b.cols; ++c) {
        const float got = s.weights[i][r * b.cols + c];
        const float want = reference[i][(b.row0 + r) * model[i].cols + (b.col0 + c)];
        bad += std::memcmp(&got, &want, sizeof got) != 0;
      }
    }
  }
  return bad;
}

}  // namespace

int main() {
  int32_t major, minor, patch;
  muon_get_version(&major, &minor, &patch);
  std::printf(
      "libmuon %d.%d.%d demo: %d ranks (threads) as TP %d x FSDP %d, %d Muon steps, "
      "default options\n\n",
      major, minor, patch, kRanks, kTP, kFSDP, kSteps);

  const std::vector<Param> model = Model();
  std::printf("%-16s %-10s %-46s %s\n", "matrix", "global", "placements (global -> local)",
              "rank 0's piece");
  for (const Param& p : model) {
    const Block b = LocalBlock(p, 0);
    std::printf("%-16s %-10s %-46s %lld x %lld\n", p.name.c_str(),
                (std::to_string(p.rows) + " x " + std::to_string(p.cols)).c_str(), Describe(p.kind),
                static_cast<long long>(b.rows), static_cast<long long>(b.cols));
  }

  // The distributed run: one thread per rank, all sharing one in-process world.
  muon_inprocess_world_t* world = nullptr;
  if (muon_inprocess_world_create(kRanks, &world) != MUON_OK) {
    std::fprintf(stderr, "muon_inprocess_world_create: %s\n", muon_last_error_message());
    return 1;
  }
  std::vector<RankState> ranks(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] { errors[rank] = RunRank(world, rank, model, &ranks[rank]); });
  }
  for (std::thread& t : threads) t.join();
  muon_inprocess_world_destroy(world);
  for (int rank = 0; rank < kRanks; ++rank) {
    if (!errors[rank].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, errors[rank].c_str());
      return 1;
    }
  }

  std::printf("\nper rank, last step:\n");
  std::printf("%4s %3s %5s %6s %15s %11s %15s %12s %7s %10s\n", "rank", "tp", "fsdp", "owned",
              "orthogonalized", "bytes sent", "bytes received", "collectives", "rounds",
              "NS MFLOP");
  int64_t orthogonalized = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    const muon_stats_t& s = ranks[rank].stats;
    std::printf("%4d %3d %5d %6lld %15lld %11lld %15lld %12lld %7lld %10.2f\n", rank, TpOf(rank),
                FsdpOf(rank), static_cast<long long>(s.matrices_owned),
                static_cast<long long>(s.matrices_orthogonalized),
                static_cast<long long>(s.bytes_sent), static_cast<long long>(s.bytes_received),
                static_cast<long long>(s.collectives), static_cast<long long>(s.rounds),
                s.ns_flops / 1e6);
    orthogonalized += s.matrices_orthogonalized;
  }
  const int64_t total = ranks[0].stats.matrices_total;
  std::printf(
      "\nmatrices in the job: %lld; orthogonalized in the last step: %lld (each once: %s)\n",
      static_cast<long long>(total), static_cast<long long>(orthogonalized),
      orthogonalized == total ? "yes" : "no");

  // The reference: the same model and gradients on global tensors, no world.
  std::vector<std::vector<float>> reference;
  const std::string error = RunSingleProcess(model, &reference);
  if (!error.empty()) {
    std::fprintf(stderr, "single process: %s\n", error.c_str());
    return 1;
  }
  int64_t mismatches = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    const int64_t bad = CountMismatches(model, ranks[rank], reference);
    if (bad > 0) std::printf("rank %d: %lld elements differ\n", rank, static_cast<long long>(bad));
    mismatches += bad;
  }
  const bool ok = mismatches == 0 && orthogonalized == total;
  std::printf("matches single-process Muon: %s\n", ok ? "yes" : "no");
  return ok ? 0 : 1;
}
