// Test harness for the distributed engine: a device mesh of N in-process
// ranks (threads), parameters described by placements over mesh dimensions,
// local pieces cut from global tensors by an index computation written here
// (independent of the library's layout code), and a single-process reference
// run of the same model.
#ifndef MUON_TESTS_DISTRIBUTED_HARNESS_H_
#define MUON_TESTS_DISTRIBUTED_HARNESS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "libmuon/muon.h"

namespace muon_test {

// A mesh: dims[0] varies fastest. rank = sum coord[d] * stride[d].
struct Mesh {
  std::vector<int> dims;
  int size() const;
  std::vector<int> Coords(int rank) const;
  // World ranks of rank's group along mesh dim d, ordered by coord[d].
  std::vector<int32_t> Group(int rank, int d) const;
};

struct TPlacement {
  int kind = MUON_PLACEMENT_SHARD;  // muon_placement_kind_t
  int mesh_dim = 0;                 // which mesh dim's group (-1: the whole world)
  int dim = 0;
  int split = MUON_SPLIT_EVEN;
  std::vector<int64_t> sizes;  // SPLIT_SIZES
};

inline TPlacement Shard(int mesh_dim, int dim, int split = MUON_SPLIT_EVEN,
                        std::vector<int64_t> sizes = {}) {
  TPlacement p;
  p.kind = MUON_PLACEMENT_SHARD;
  p.mesh_dim = mesh_dim;
  p.dim = dim;
  p.split = split;
  p.sizes = std::move(sizes);
  return p;
}

// The harness hands out the ranges itself (FlatCut).
inline TPlacement Flat(int mesh_dim) {
  TPlacement p;
  p.kind = MUON_PLACEMENT_FLAT_RANGE;
  p.mesh_dim = mesh_dim;
  return p;
}

inline TPlacement Replicate(int mesh_dim) {
  TPlacement p;
  p.kind = MUON_PLACEMENT_REPLICATE;
  p.mesh_dim = mesh_dim;
  return p;
}

struct TParam {
  std::string name;
  std::vector<int64_t> shape;
  int view = MUON_MATRIX_VIEW_2D;
  std::vector<TPlacement> placements;
  // Which world ranks register it (null: all).
  std::function<bool(int rank)> registered_on;
  int replicated_mode = MUON_REPLICATED_HOST_AVERAGED;  // muon_replicated_mode_t
  double lr_scale = 1.0, weight_decay_scale = 1.0;     // muon_param_options_t's
  int split_dim = 0;                                   // muon_param_options_t's split blocks
  std::vector<int64_t> split_sizes;
};

// Flat ranges the harness hands out: rank r of a group of n over m elements
// gets [cut(r), cut(r + 1)), cuts from uneven weights (some zero) so ranges
// split rows and some are empty.
int64_t FlatCut(int r, int n, int64_t m);

// The global flat indices this rank's piece holds, in local order.
std::vector<int64_t> LocalIndices(const TParam& p, const Mesh& mesh, int rank);

// Fault injection: one rank's collectives, counted over all its
// communicators (the world and the groups) from the start of the run; call
// number `fail_on` of kind `kind` (-1: any kind) fails with UNAVAILABLE after
// moving the data, so that the other ranks' calls complete.
struct CallCounter {
  int fail_on = -1;
  int kind = -1;  // 0 all_gather, 1 all_to_all_v, 2 reduce_scatter; -1 any
  int calls = 0;  // of the counted kind(s)
  int fail_status = MUON_UNAVAILABLE;  // what the failing call returns (any int)
  // A lying link: call number `corrupt_on` (an all_gather) arrives with byte
  // `corrupt_at` of what it received XORed with `corrupt_mask`.
  int corrupt_on = -1;
  size_t corrupt_at = 0;
  unsigned char corrupt_mask = 0;
};
// `inner` with its collectives counted (and failed) by *counter, which must
// outlive the table; release releases `inner`.
muon_comm_t WrapFailing(const muon_comm_t& inner, CallCounter* counter);

struct RunConfig {
  int steps = 20;
  int ns_dtype = MUON_NS_DTYPE_FP32;
  int assignment = MUON_ASSIGNMENT_BALANCED;
  int prefetch_count = 1;
  int async_parallelism = 1;
  size_t round_bytes = 0;
  // Optional custom assignment (MUON_ASSIGNMENT_CUSTOM); its state is a
  // pointer to the calling rank's world rank (int).
  muon_status_t (*assign_fn)(void*, size_t, const muon_matrix_info_t*, int32_t*) = nullptr;
  // Per-rank changes, for the misuse tests: of a parameter before it is
  // registered (shape, flat range) and of the options.
  std::function<void(int rank, TParam* p, int64_t* flat_start, int64_t* flat_length)> mutate;
  std::function<void(int rank, muon_options_t* o)> mutate_options;
  // The same change of the options on every rank and in the reference run
  // (an algorithm variant: a schedule, cautious weight decay, ...).
  std::function<void(muon_options_t* o)> variant;
  // After the steps, on every rank and in the reference run (rank 0): more
  // calls on the optimizer (QK-Clip, ...); its failure is the rank's error.
  std::function<muon_status_t(int rank, muon_optimizer_t* opt)> after_steps;
  // >= 0: every rank's world all_to_all_v fails on this call (0-based, counted
  // over the whole run) with MUON_UNAVAILABLE after moving the data. The run
  // then checks the refusal of a further step and the recovery by restoring
  // the checkpoint taken before the failing step.
  int fail_exchange_call = -1;
  // >= 0: collective number `fail_call` of rank `fail_rank` (-1: of every
  // rank), counted over all of that rank's communicators (world and groups,
  // setup included) from the start, fails the same way; then the same
  // refusal and recovery as above. count_calls: count without failing
  // (RankResult::calls_before_step).
  int fail_call = -1;
  int fail_rank = -1;
  int fail_status = MUON_UNAVAILABLE;  // what it returns: any int a C callback could
  bool count_calls = false;
  // >= 0: what rank `corrupt_rank` receives in its all_gather number
  // `corrupt_call` (counted as fail_call counts) has byte `corrupt_byte`
  // XORed with `corrupt_mask` (CallCounter::corrupt_on).
  int corrupt_call = -1;
  int corrupt_rank = -1;
  size_t corrupt_byte = 0;
  unsigned char corrupt_mask = 0;
  // Go on stepping after a failed step (every step's status in
  // RankResult::step_errors), without the refusal and recovery checks.
  bool keep_stepping = false;
  // Resume: the steps run are first_step .. first_step + steps - 1 (their
  // gradients); before the first, the params start from resume_values (whole
  // tensors by name) and the state from resume_from (every rank's blob of a
  // previous run, through muon_load_states; or, with resume_own_blob, this
  // rank's own through muon_load_state). save_at_end: RankResult::blob.
  int first_step = 0;
  const std::map<std::string, std::vector<float>>* resume_values = nullptr;
  const std::vector<std::vector<unsigned char>>* resume_from = nullptr;
  bool resume_own_blob = false;
  bool save_at_end = false;
  // With fail_exchange_call: restore with muon_set_state, one param at a time
  // (a step tried before the last one must still be refused), not a blob.
  bool restore_with_set_state = false;
  // Hand every communicator over with broadcast and barrier NULL (the
  // optional collectives).
  bool without_optional_collectives = false;
};

struct RankResult {
  std::vector<std::vector<float>> params;  // final local values, per registered param
  std::vector<std::vector<int64_t>> indices;
  std::vector<std::string> names;
  muon_stats_t stats{};
  std::string error;  // first failure on this rank, empty if none
  // With fail_exchange_call: what a second step said, and whether the step
  // after restoring the checkpoint succeeded.
  std::string refused;
  bool again_ok = false;  // that second step succeeded (a setup that failed is set up again)
  std::string refused_when_partly_restored;  // restore_with_set_state, all but one
  bool recovered = false;
  std::string recovery_error;  // why not, when it did not
  int failed_step = -1;  // the first step that failed, -1 if none
  std::vector<std::string> step_errors;  // per step: its error, empty if it succeeded
  std::vector<unsigned char> blob;       // save_at_end: muon_save_state's blob
  // Collectives this rank issued before each step (and, last, in all), when
  // counting (count_calls, fail_call or fail_exchange_call).
  std::vector<int> calls_before_step;
};

// A 1-D float32 host tensor of *n elements over `data`.
DLTensor Tensor1D(float* data, int64_t* n);

// Runs the model on the mesh (one thread per rank) and returns each rank's result.
std::vector<RankResult> RunDistributed(const std::vector<TParam>& model, const Mesh& mesh,
                                       const RunConfig& cfg);

// Runs the model in one process on global tensors; params by name order of `model`.
std::vector<std::vector<float>> RunReference(const std::vector<TParam>& model,
                                             const RunConfig& cfg);

// Initial value and gradient of global element i of param `name` at `step`.
float InitValue(const std::string& name, int64_t i);
float GradValue(const std::string& name, int64_t i, int step);

}  // namespace muon_test

#endif  // MUON_TESTS_DISTRIBUTED_HARNESS_H_
