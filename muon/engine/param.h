// A registered parameter: its borrowed tensors, its matrix view and its
// momentum buffer (owned, in the memory of the optimizer's device).
#ifndef MUON_ENGINE_PARAM_H_
#define MUON_ENGINE_PARAM_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/common/matrix_view.h"
#include "muon/common/tensor.h"
#include "muon/device/device.h"
#include "muon/math/split_blocks.h"
#include "muon/sharding/layout.h"

namespace muon {

// The fully custom path (muon_register_param_custom): the host assigns,
// gathers and redistributes through callbacks.
struct CustomPath {
  // The owner's world rank; a negative one is an error, with the host's
  // detail (if any) in *detail.
  std::function<int(int world_size, std::string* detail)> assign;
  std::function<absl::Status(const float* local, int64_t n, int owner, const float** full,
                             int64_t* rows, int64_t* cols, void* stream)>
      gather;
  std::function<absl::Status(const float* full, int64_t rows, int64_t cols, int owner,
                             float* local, int64_t n, void* stream)>
      redistribute;
};

// The most elements a custom-path matrix may declare (global rows x cols):
// its owner holds an fp32 copy of it and the Newton-Schulz workspace (at most
// 3 floats per element more), 16 bytes per element, and that byte count must
// fit in int64_t. Refused at registration (muon.h).
inline constexpr int64_t kMaxCustomElements = std::numeric_limits<int64_t>::max() / 16;

struct Param {
  std::string name;
  TensorView value;  // borrowed: this rank's piece
  TensorView grad;   // borrowed, same shape and dtype as value
  MatrixView view = MatrixView::k2D;
  // The matrix view of the GLOBAL tensor: `batch` matrices of rows x cols.
  std::vector<int64_t> global_shape;
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  DType state_dtype = DType::kF32;
  // numel() elements of state_dtype, zero at start; allocated by the
  // optimizer on its device (empty for ZeRO-2 parameters another rank owns).
  DeviceBuffer momentum;
  // Distributed: how the global tensor is split down to `value`, and the
  // global elements `value` holds (the whole tensor when not distributed).
  Layout layout;
  Piece piece;
  std::shared_ptr<CustomPath> custom;  // set on the custom path (no layout then)
  // ZeRO-2 replicated mode: the group it is replicated over, or -1.
  int zero2_group = -1;
  bool holds_state = true;  // false for ZeRO-2 parameters another rank owns
  // Restored before the first step from a blob that held none of its
  // momentum (ZeRO-2): the setup checks that this rank does not own it.
  bool momentum_elsewhere = false;
  bool active = true;       // false while no gradient is bound (skipped by steps)
  // Its multipliers (muon_param_options_t): lr * lr_scale, weight decay *
  // weight_decay_scale.
  double lr_scale = 1.0, weight_decay_scale = 1.0;
  // Its matrices orthogonalized as independent blocks (split_sizes; none:
  // whole), each lr-adjusted for its own shape at the owner.
  BlockSplit split;
  // NorMuon's moments per matrix (one per row of each block).
  int64_t moment_count() const { return SplitMomentCount(split, rows, cols); }

  int64_t numel() const { return value.numel(); }  // local elements
  size_t momentum_bytes() const { return static_cast<size_t>(numel()) * SizeOf(state_dtype); }
};

// Checks the tensors and builds a Param (no momentum buffer yet, piece = the
// whole tensor). Both tensors must be on the same device. The matrix view applies to `global_shape` (the local shape when
// null). The errors name the parameter and the cause: bad tensors, shape or
// dtype mismatch between param and grad, fewer than 2 dims (use AdamW), more
// than 2 dims without a matrix view, unknown view, more matrices with
// elements than one parameter may declare (kMaxParamMatrices).
absl::StatusOr<Param> MakeParam(const DLTensor* value, const DLTensor* grad, std::string name,
                                int view, bool momentum_fp32,
                                const std::vector<int64_t>* global_shape = nullptr);

}  // namespace muon

#endif  // MUON_ENGINE_PARAM_H_
