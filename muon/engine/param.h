// A registered parameter: its borrowed tensors, its matrix view and its
// momentum buffer (owned).
#ifndef MUON_ENGINE_PARAM_H_
#define MUON_ENGINE_PARAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/common/tensor.h"

namespace muon {

enum class MatrixView { k2D = 0, kFlattenTrailing = 1, kBatchedLeading = 2 };

struct Param {
  std::string name;
  TensorView value;  // borrowed
  TensorView grad;   // borrowed, same shape and dtype as value
  MatrixView view = MatrixView::k2D;
  int64_t batch = 1;  // matrices in the view
  int64_t rows = 0;
  int64_t cols = 0;
  DType state_dtype = DType::kF32;
  std::vector<unsigned char> momentum;  // batch*rows*cols elements of state_dtype, zero at start

  int64_t numel() const { return batch * rows * cols; }
  void* momentum_data() { return momentum.data(); }
  const void* momentum_data() const { return momentum.data(); }
};

// Checks the tensors and builds a Param (momentum zeroed). The errors name
// the parameter and the cause: bad tensors, shape or dtype mismatch between
// param and grad, fewer than 2 dims (use AdamW), more than 2 dims without a
// matrix view, unknown view.
absl::StatusOr<Param> MakeParam(const DLTensor* value, const DLTensor* grad, std::string name,
                                int view, bool momentum_fp32);

}  // namespace muon

#endif  // MUON_ENGINE_PARAM_H_
