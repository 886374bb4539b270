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

int64_t SplitOrthogonalizer::Chunk(size_t block_bytes, int64_t count) const {
  const int64_t fit = block_bytes == 0 ? count : static_cast<int64_t>(room_bytes_ / block_bytes);
  return std::max<int64_t>(1, std::min(count, fit));
}

absl::Status SplitOrthogonalizer::Reserve(MathBackend& math, const MemorySource& memory,
                                          const NsConfig& config, const BlockSplit& split,
                                          int64_t count, int64_t rows, int64_t cols,
                                          DType dtype) {
  if (count <= 0) return absl::OkStatus();
  for (const BlockShape& b : SplitBlockShapes(split, rows, cols)) {
    const size_t block = static_cast<size_t>(b.rows * b.cols) * SizeOf(dtype);
    const int64_t chunk = Chunk(block, count);
    if (moment_ptrs_.size() < static_cast<size_t>(chunk)) {
      moment_ptrs_.resize(static_cast<size_t>(chunk));
    }
    MUON_RETURN_IF_ERROR(
        blocks_.Grow(memory, static_cast<size_t>(chunk) * block, "split blocks"));
    if (split.dim == 0) {
      MUON_RETURN_IF_ERROR(moments_.Grow(
          memory, static_cast<size_t>(chunk * b.rows) * sizeof(float), "split blocks' moments"));
    }
    // Every chunk's shape: the full ones and the last.
    MUON_RETURN_IF_ERROR(math.Reserve(config, chunk, b.rows, b.cols));
    if (count % chunk != 0) {
      MUON_RETURN_IF_ERROR(math.Reserve(config, count % chunk, b.rows, b.cols));
    }
  }
  return absl::OkStatus();
}

absl::Status SplitOrthogonalizer::Run(MathBackend& math, const NsConfig& config,
                                      const BlockSplit& split, absl::Span<const double> factors,
                                      const NorMuonStep* normuon, float* const* moments,
                                      const MatrixBatch& matrices) {
  if (matrices.count == 0) return absl::OkStatus();
  const size_t esize = SizeOf(matrices.dtype);
  const int64_t period = Period(split), per = matrices.rows * matrices.cols;
  int64_t offset = 0;  // block j's first row (dim 0) or column (dim 1) in a period
  for (size_t j = 0; j < split.sizes.size(); ++j) {
    const BlockShape b = SplitBlockShape(split, j, matrices.rows, matrices.cols);
    const int64_t size = split.sizes[j];
    const int64_t chunk = Chunk(static_cast<size_t>(b.rows * b.cols) * esize, matrices.count);
    if (blocks_.size() < static_cast<size_t>(chunk * b.rows * b.cols) * esize ||
        moment_ptrs_.size() < static_cast<size_t>(chunk)) {
      return absl::FailedPreconditionError("split blocks run before their room was reserved");
    }
    // Block j of a chunk's matrices as runs of equal pitch: the matrices
    // follow one another, so period after period (dim 0: runs of `size`
    // rows; dim 1: row after row, runs of `size` columns) the run at
    // `offset` is the next run of the blocks, which follow one another too.
    const int64_t run = split.dim == 0 ? size * matrices.cols : size;
    const int64_t pitch = split.dim == 0 ? period * matrices.cols : period;
    for (int64_t k0 = 0; k0 < matrices.count; k0 += chunk) {
      const int64_t count = std::min(chunk, matrices.count - k0);
      const int64_t runs = count * per / pitch;
      unsigned char* first =
          static_cast<unsigned char*>(matrices.data) +
          static_cast<size_t>(k0 * per + (split.dim == 0 ? offset * matrices.cols : offset)) *
              esize;
      MUON_RETURN_IF_ERROR(math.CopyRuns(blocks_.data(), static_cast<size_t>(run) * esize, first,
                                         static_cast<size_t>(pitch) * esize,
                                         static_cast<size_t>(run) * esize,
                                         static_cast<size_t>(runs)));
      const MatrixBatch block{blocks_.data(), count, b.rows, b.cols, matrices.dtype};
      MUON_RETURN_IF_ERROR(math.Orthogonalize(config, block));
      if (normuon != nullptr) {
        MUON_RETURN_IF_ERROR(RunNorMuon(math, *normuon, split, j, offset, moments + k0, block));
      }
      if (factors[j] != 1.0) {
        // Rounded to the Newton-Schulz dtype's precision whatever holds it
        // (an fp32 update buffer or a bf16 slot give the same values).
        MUON_RETURN_IF_ERROR(
            math.ScaleRounded(block, static_cast<float>(factors[j]), config.dtype));
      }
      MUON_RETURN_IF_ERROR(math.CopyRuns(first, static_cast<size_t>(pitch) * esize,
                                         blocks_.data(), static_cast<size_t>(run) * esize,
                                         static_cast<size_t>(run) * esize,
                                         static_cast<size_t>(runs)));
    }
    offset += size;
  }
  return absl::OkStatus();
}

absl::Status SplitOrthogonalizer::RunNorMuon(MathBackend& math, const NorMuonStep& normuon,
                                             const BlockSplit& split, size_t j, int64_t offset,
                                             float* const* moments, const MatrixBatch& block) {
  // The block's rows' moments: its own run of them for dim 1; for dim 0 its
  // rows' entries among the matrix's (runs of `size` in each period of
  // them), gathered and put back.
  const int64_t size = split.sizes[j], period = Period(split);
  const size_t run = static_cast<size_t>(size) * sizeof(float);
  const size_t pitch = static_cast<size_t>(period) * sizeof(float);
  const size_t runs = static_cast<size_t>(block.rows / size);
  for (int64_t k = 0; k < block.count; ++k) {
    float*& mine = moment_ptrs_[static_cast<size_t>(k)];
    if (moments[k] == nullptr) {
      mine = nullptr;
    } else if (split.dim == 1) {
      mine = moments[k] + static_cast<int64_t>(j) * block.rows;
    } else {
      mine = reinterpret_cast<float*>(moments_.data()) + k * block.rows;
      MUON_RETURN_IF_ERROR(math.CopyRuns(mine, run, moments[k] + offset, pitch, run, runs));
    }
  }
  MUON_RETURN_IF_ERROR(math.NorMuon(normuon, block, moment_ptrs_.data()));
  for (int64_t k = 0; k < block.count && split.dim == 0; ++k) {
    if (moments[k] == nullptr) continue;
    MUON_RETURN_IF_ERROR(
        math.CopyRuns(moments[k] + offset, pitch, moment_ptrs_[static_cast<size_t>(k)], run, run,
                      runs));
  }
  return absl::OkStatus();
}

}  // namespace muon
