// The optimizer state as a self-describing byte blob (see muon_save_state).
//
// Format 2 (written), little-endian:
//   "MUONSTAT" | u32 format=2 | u32 0 | i64 step_count | u64 param_count |
//   per param: u32 name_len, name, u8 state dtype, u8 view, u8 kind, u8 0,
//              u32 ndim, i64 local dims[ndim], u32 global_ndim,
//              i64 global dims[global_ndim], u64 num_runs,
//              (i64 offset, i64 length)[num_runs], u64 nbytes, momentum bytes.
// kind 0: the momentum bytes are the global elements the runs list, in order
// (offsets into the row-major flattened global tensor; the runs in
// increasing order, disjoint, as every placement gives them): any rank of
// any layout can find its elements there. kind 1 (the custom path, whose layout
// only the host knows): the bytes are this rank's local piece, no runs. A
// param holding no state here (ZeRO-2, another rank owns it) has no runs and
// no bytes.
// Format 3 (written by a NorMuon optimizer): format 2, then the NorMuon
// second moments of the matrices the saving rank owned:
//   u64 moment_count | per matrix: u32 name_len, name, i64 matrix index,
//   i64 rows, f32 moments[rows]
// (names and indices unique within the blob).
// Format 1 (read): the same without kind, global dims and runs (a u16 0 after
// view): local pieces only.
#ifndef MUON_ENGINE_CHECKPOINT_H_
#define MUON_ENGINE_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/engine/param.h"

namespace muon {

// The largest step count a blob holds (and ParseStateBlob accepts): the
// count of the step after it could not be counted. Optimizer::Step refuses
// to step past it, so that every state it reaches can be saved and loaded.
constexpr int64_t kMaxSavedStepCount = std::numeric_limits<int64_t>::max() - 1;

constexpr uint8_t kGlobalRuns = 0;  // entry kind: global runs
constexpr uint8_t kLocalOnly = 1;   // entry kind: a local piece only

// The runs a param's entry lists (empty for local-only entries and for
// params holding no state here).
std::vector<Run> SavedRuns(const Param& p);

// One matrix's NorMuon second moments in a blob (format 3).
struct SavedMoments {
  std::string name;
  int64_t index = 0;
  std::vector<float> values;  // one per row
};

// The blob's size; with `moments` (a NorMuon optimizer's, possibly none
// owned) format 3, else format 2.
size_t StateBlobSize(const std::vector<Param>& params,
                     const std::vector<SavedMoments>* moments = nullptr);

// Writes the blob into out[0, StateBlobSize(params, moments)); momentum[i]
// is a host copy of params[i].momentum (the buffer itself on the host
// device).
void WriteStateBlob(const std::vector<Param>& params, int64_t step_count,
                    const std::vector<const void*>& momentum,
                    const std::vector<SavedMoments>* moments, unsigned char* out);

// One parameter's entry of a parsed blob; `bytes` points into the blob.
struct SavedParam {
  std::string name;
  DType state_dtype = DType::kF32;
  uint8_t view = 0;
  uint8_t kind = kGlobalRuns;
  std::vector<int64_t> local_shape, global_shape;
  std::vector<Run> runs;  // kind kGlobalRuns: the global elements of `bytes`, in order
  int64_t held = 0;       // elements in `bytes`
  const unsigned char* bytes = nullptr;
  uint64_t nbytes = 0;
};

struct SavedState {
  uint32_t format = 0;
  int64_t step_count = 0;
  std::vector<SavedParam> params;
  std::vector<SavedMoments> moments;  // format 3 only
};

// Checks a blob on its own (magic, format, reserved and padding words, step
// count, every size against its shapes, each entry's runs together: inside
// the global tensor, in increasing order without overlap, their elements the
// byte count's; no trailing bytes) without reference to any optimizer;
// errors start with `blob` (e.g. "state blob 2").
absl::StatusOr<SavedState> ParseStateBlob(const unsigned char* data, size_t size,
                                          const std::string& blob);

}  // namespace muon

#endif  // MUON_ENGINE_CHECKPOINT_H_
