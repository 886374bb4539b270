#include "muon/math/split_blocks.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "muon/common/status.h"

namespace muon {

namespace {

int64_t Period(const BlockSplit& s) {
  return std::accumulate(s.sizes.begin(), s.sizes.end(), int64_t{0});
}

}  // namespace

std::string SplitString(const BlockSplit& split) {
  if (split.none()) return "none";
  return absl::StrCat("dim ", split.dim, ", sizes {", absl::StrJoin(split.sizes, ", "), "}");
}

absl::Status CheckBlockSplit(const BlockSplit& split, int64_t rows, int64_t cols,
                             absl::string_view who) {
  if (split.none()) return absl::OkStatus();
  if (split.dim != 0 && split.dim != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": split_dim ", split.dim, " is invalid; use 0 (rows) or 1 (columns)"));
  }
  if (static_cast<int64_t>(split.sizes.size()) > kMaxSplitSizes) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": split_sizes lists ",
                                                   split.sizes.size(), " sizes, more than the ",
                                                   kMaxSplitSizes, " allowed"));
  }
  int64_t period = 0;
  for (size_t i = 0; i < split.sizes.size(); ++i) {
    const int64_t v = split.sizes[i];
    const int64_t extent = split.dim == 0 ? rows : cols;
    if (v <= 0 || v > extent - period) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": split_sizes[", i, "] is ", v, "; sizes must be > 0 and add up to at most the ",
          split.dim == 0 ? "rows" : "columns", " of each matrix (", extent, ")"));
    }
    period += v;
  }
  const int64_t extent = split.dim == 0 ? rows : cols;
  if (extent % period != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": split_sizes {", absl::StrJoin(split.sizes, ", "), "} add up to ", period,
        ", which does not divide the ", extent, " ", split.dim == 0 ? "rows" : "columns",
        " of each matrix (the sizes repeat along split_dim ", split.dim,
        " until they cover it)"));
  }
  return absl::OkStatus();
}

BlockShape SplitBlockShape(const BlockSplit& split, size_t j, int64_t rows, int64_t cols) {
  if (split.none()) return {rows, cols};
  const int64_t periods = (split.dim == 0 ? rows : cols) / Period(split);
  const int64_t extent = periods * split.sizes[j];
  return split.dim == 0 ? BlockShape{extent, cols} : BlockShape{rows, extent};
}

std::vector<BlockShape> SplitBlockShapes(const BlockSplit& split, int64_t rows, int64_t cols) {
  std::vector<BlockShape> shapes;
  for (size_t j = 0; j < std::max<size_t>(1, split.sizes.size()); ++j) {
    shapes.push_back(SplitBlockShape(split, j, rows, cols));
  }
  return shapes;
}

double SplitNewtonSchulzFlops(const NsConfig& config, const BlockSplit& split, int64_t rows,
                              int64_t cols) {
  if (split.none()) return NewtonSchulzFlops(config, rows, cols);
  double flops = 0;
  for (size_t j = 0; j < split.sizes.size(); ++j) {
    const BlockShape b = SplitBlockShape(split, j, rows, cols);
    flops += NewtonSchulzFlops(config, b.rows, b.cols);
  }
  return flops;
}

int64_t SplitMomentCount(const BlockSplit& split, int64_t rows, int64_t cols) {
  (void)cols;
  if (split.none() || split.dim == 0) return rows;
  return rows * static_cast<int64_t>(split.sizes.size());
}

SplitOrthogonalizer::Room& SplitOrthogonalizer::Room::operator=(Room&& other) noexcept {
  if (this != &other) {
    Free();
    memory_ = std::move(other.memory_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SplitOrthogonalizer::Room::Free() {
  if (ptr_ == nullptr) return;
  if (memory_.free) {
    memory_.free(ptr_);
  } else {
    ::operator delete(ptr_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status SplitOrthogonalizer::Room::Grow(const MemorySource& from, size_t want,
                                             const char* what) {
  if (want <= bytes_) return absl::OkStatus();
  Free();
  memory_ = from;
  if (memory_.allocate) {
    absl::StatusOr<void*> p = memory_.allocate(want, what);
    if (!p.ok()) return p.status();
    ptr_ = *p;
  } else {
    ptr_ = ::operator new(want, std::nothrow);
    if (ptr_ == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": out of host memory"));
    }
  }
  bytes_ = want;
  return absl::OkStatus();
}

absl::Status SplitOrthogonalizer::Reserve(MathBackend& math, const MemorySource& memory,
                                          const NsConfig& config, const BlockSplit& split,
                                          int64_t count, int64_t rows, int64_t cols,
                                          DType dtype) {
  if (moment_ptrs_.size() < static_cast<size_t>(count)) {
    moment_ptrs_.resize(static_cast<size_t>(count));
  }
  for (const BlockShape& b : SplitBlockShapes(split, rows, cols)) {
    const size_t bytes = static_cast<size_t>(count * b.rows * b.cols) * SizeOf(dtype);
    MUON_RETURN_IF_ERROR(blocks_.Grow(memory, bytes, "split blocks"));
    if (split.dim == 0) {
      MUON_RETURN_IF_ERROR(moments_.Grow(
          memory, static_cast<size_t>(count * b.rows) * sizeof(float), "split blocks' moments"));
    }
    MUON_RETURN_IF_ERROR(math.Reserve(config, count, b.rows, b.cols));
  }
  return absl::OkStatus();
}

absl::Status SplitOrthogonalizer::Run(MathBackend& math, const NsConfig& config,
                                      const BlockSplit& split, absl::Span<const double> factors,
                                      const NorMuonStep* normuon, float* const* moments,
                                      const MatrixBatch& matrices) {
  const size_t esize = SizeOf(matrices.dtype);
  const int64_t count = matrices.count, period = Period(split);
  if (count == 0) return absl::OkStatus();
  auto* whole = static_cast<unsigned char*>(matrices.data);
  int64_t offset = 0;  // block j's first row (dim 0) or column (dim 1) in a period
  for (size_t j = 0; j < split.sizes.size(); ++j) {
    const BlockShape b = SplitBlockShape(split, j, matrices.rows, matrices.cols);
    const int64_t size = split.sizes[j];
    if (blocks_.size() < static_cast<size_t>(count * b.rows * b.cols) * esize ||
        moment_ptrs_.size() < static_cast<size_t>(count)) {
      return absl::FailedPreconditionError("split blocks run before their room was reserved");
    }
    // Every matrix's block j as runs of equal pitch: the matrices follow one
    // another, so period after period (dim 0: runs of `size` rows; dim 1:
    // row after row, runs of `size` columns) the run at `offset` is the
    // next run of the blocks, which follow one another too.
    const int64_t run = split.dim == 0 ? size * matrices.cols : size;
    const int64_t pitch = split.dim == 0 ? period * matrices.cols : period;
    const int64_t runs = count * matrices.rows * matrices.cols / pitch;
    unsigned char* first = whole + static_cast<size_t>(split.dim == 0 ? offset * matrices.cols
                                                                      : offset) * esize;
    MUON_RETURN_IF_ERROR(math.CopyRuns(blocks_.data(), static_cast<size_t>(run) * esize, first,
                                       static_cast<size_t>(pitch) * esize,
                                       static_cast<size_t>(run) * esize,
                                       static_cast<size_t>(runs)));
    const MatrixBatch block{blocks_.data(), count, b.rows, b.cols, matrices.dtype};
    MUON_RETURN_IF_ERROR(math.Orthogonalize(config, block));
    if (normuon != nullptr) {
      // The block's rows' moments: its own run of them for dim 1; for dim 0
      // its rows' entries among the matrix's (runs of `size` in each period
      // of them), gathered and put back.
      for (int64_t k = 0; k < count; ++k) {
        float*& mine = moment_ptrs_[static_cast<size_t>(k)];
        if (moments[k] == nullptr) {
          mine = nullptr;
        } else if (split.dim == 1) {
          mine = moments[k] + static_cast<int64_t>(j) * b.rows;
        } else {
          mine = reinterpret_cast<float*>(moments_.data()) + k * b.rows;
          MUON_RETURN_IF_ERROR(math.CopyRuns(mine, static_cast<size_t>(size) * sizeof(float),
                                             moments[k] + offset,
                                             static_cast<size_t>(period) * sizeof(float),
                                             static_cast<size_t>(size) * sizeof(float),
                                             static_cast<size_t>(b.rows / size)));
        }
      }
      MUON_RETURN_IF_ERROR(math.NorMuon(*normuon, block, moment_ptrs_.data()));
      for (int64_t k = 0; k < count && split.dim == 0; ++k) {
        if (moments[k] == nullptr) continue;
        MUON_RETURN_IF_ERROR(math.CopyRuns(moments[k] + offset,
                                           static_cast<size_t>(period) * sizeof(float),
                                           moment_ptrs_[static_cast<size_t>(k)],
                                           static_cast<size_t>(size) * sizeof(float),
                                           static_cast<size_t>(size) * sizeof(float),
                                           static_cast<size_t>(b.rows / size)));
      }
    }
    if (factors[j] != 1.0) {
      // Rounded to the Newton-Schulz dtype's precision whatever holds it
      // (an fp32 update buffer or a bf16 slot give the same values).
      MUON_RETURN_IF_ERROR(math.ScaleRounded(block, static_cast<float>(factors[j]), config.dtype));
    }
    MUON_RETURN_IF_ERROR(math.CopyRuns(first, static_cast<size_t>(pitch) * esize, blocks_.data(),
                                       static_cast<size_t>(run) * esize,
                                       static_cast<size_t>(run) * esize,
                                       static_cast<size_t>(runs)));
    offset += size;
  }
  return absl::OkStatus();
}

}  // namespace muon
