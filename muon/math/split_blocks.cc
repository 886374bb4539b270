#include "muon/math/split_blocks.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "muon/common/half.h"

namespace muon {

namespace {

int64_t Period(const BlockSplit& s) {
  return std::accumulate(s.sizes.begin(), s.sizes.end(), int64_t{0});
}

// Copies block j of one matrix (rows x cols, `esize`-byte elements) to or
// from `block` (packed row-major): each period's piece is a run of rows
// (dim 0) or, row by row, a run of columns (dim 1).
void MoveBlock(const BlockSplit& s, int64_t j, int64_t rows, int64_t cols, size_t esize,
               unsigned char* matrix, unsigned char* block, bool out) {
  const int64_t period = Period(s);
  int64_t offset = 0;
  for (int64_t i = 0; i < j; ++i) offset += s.sizes[static_cast<size_t>(i)];
  const int64_t size = s.sizes[static_cast<size_t>(j)];
  auto move = [&](unsigned char* at_matrix, unsigned char* at_block, int64_t elements) {
    const size_t bytes = static_cast<size_t>(elements) * esize;
    if (out) {
      std::memcpy(at_block, at_matrix, bytes);
    } else {
      std::memcpy(at_matrix, at_block, bytes);
    }
  };
  if (s.dim == 0) {
    const int64_t periods = rows / period;
    for (int64_t g = 0; g < periods; ++g) {
      move(matrix + static_cast<size_t>((g * period + offset) * cols) * esize,
           block + static_cast<size_t>(g * size * cols) * esize, size * cols);
    }
    return;
  }
  const int64_t periods = cols / period, width = periods * size;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < periods; ++g) {
      move(matrix + static_cast<size_t>(r * cols + g * period + offset) * esize,
           block + static_cast<size_t>(r * width + g * size) * esize, size);
    }
  }
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

absl::Status SplitOrthogonalizer::Reserve(MathBackend& math, const NsConfig& config,
                                          const BlockSplit& split, int64_t rows, int64_t cols,
                                          DType dtype) {
  for (const BlockShape& b : SplitBlockShapes(split, rows, cols)) {
    const size_t bytes = static_cast<size_t>(b.rows * b.cols) * SizeOf(dtype);
    if (block_.size() < bytes) block_.resize(bytes);
    if (split.dim == 0 && moments_.size() < static_cast<size_t>(b.rows)) {
      moments_.resize(static_cast<size_t>(b.rows));
    }
    absl::Status st = math.Reserve(config, 1, b.rows, b.cols);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status SplitOrthogonalizer::Run(MathBackend& math, const NsConfig& config,
                                      const BlockSplit& split, absl::Span<const double> factors,
                                      const NorMuonStep* normuon, float* const* moments,
                                      const MatrixBatch& matrices) {
  const size_t esize = SizeOf(matrices.dtype);
  const int type = static_cast<int>(matrices.dtype);
  const int precision = config.dtype == NsDtype::kBF16   ? ew::kBF16
                        : config.dtype == NsDtype::kFP16 ? ew::kF16
                                                         : ew::kF32;
  const int64_t per = matrices.rows * matrices.cols;
  int64_t offset = 0;  // block j's first row (dim 0) among the matrix's
  for (size_t j = 0; j < split.sizes.size(); ++j) {
    const BlockShape b = SplitBlockShape(split, j, matrices.rows, matrices.cols);
    const int64_t n = b.rows * b.cols;
    if (block_.size() < static_cast<size_t>(n) * esize) {
      return absl::FailedPreconditionError("split blocks run before their room was reserved");
    }
    const int64_t period = Period(split), size = split.sizes[j];
    for (int64_t k = 0; k < matrices.count; ++k) {
      unsigned char* matrix =
          static_cast<unsigned char*>(matrices.data) + static_cast<size_t>(k * per) * esize;
      MoveBlock(split, static_cast<int64_t>(j), matrices.rows, matrices.cols, esize, matrix,
                block_.data(), /*out=*/true);
      const MatrixBatch one{block_.data(), 1, b.rows, b.cols, matrices.dtype};
      absl::Status st = math.Orthogonalize(config, one);
      if (st.ok() && normuon != nullptr && moments[k] != nullptr) {
        // The block's rows' moments: its own run of them for dim 1; for
        // dim 0 its rows' entries among the matrix's, gathered and put back.
        float* mine = moments[k] + (split.dim == 1 ? static_cast<int64_t>(j) * b.rows : 0);
        if (split.dim == 0) {
          for (int64_t r = 0; r < b.rows; ++r) {
            moments_[static_cast<size_t>(r)] =
                moments[k][(r / size) * period + offset + r % size];
          }
          mine = moments_.data();
        }
        st = math.NorMuon(*normuon, one, &mine);
        if (split.dim == 0) {
          for (int64_t r = 0; r < b.rows; ++r) {
            moments[k][(r / size) * period + offset + r % size] = moments_[static_cast<size_t>(r)];
          }
        }
      }
      if (!st.ok()) return st;
      if (factors[j] != 1.0) {
        // Rounded to the Newton-Schulz dtype's precision whatever holds it
        // (an fp32 update buffer or a bf16 slot give the same values).
        const float f = static_cast<float>(factors[j]);
        for (int64_t e = 0; e < n; ++e) {
          ew::Store(type, block_.data(), e,
                    ew::RoundTo(precision, ew::Load(type, block_.data(), e) * f));
        }
      }
      MoveBlock(split, static_cast<int64_t>(j), matrices.rows, matrices.cols, esize, matrix,
                block_.data(), /*out=*/false);
    }
    offset += split.sizes[j];
  }
  return absl::OkStatus();
}

}  // namespace muon
