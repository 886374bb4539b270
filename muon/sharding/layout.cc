#include "muon/sharding/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/common/tensor.h"

namespace muon {
namespace {

int64_t Product(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= v[i];
  return n;
}

void Append(std::vector<Run>* out, Run r) {
  if (r.length == 0) return;
  if (!out->empty() && out->back().offset + out->back().length == r.offset) {
    out->back().length += r.length;
  } else {
    out->push_back(r);
  }
}

// Maps logical ranges of a piece (positions in its local order) to global runs.
class RunMap {
 public:
  explicit RunMap(const std::vector<Run>& runs) : runs_(runs) {
    starts_.reserve(runs.size());
    int64_t pos = 0;
    for (const Run& r : runs) {
      starts_.push_back(pos);
      pos += r.length;
    }
  }

  // Appends the global runs of local positions [begin, begin + length).
  void Map(int64_t begin, int64_t length, std::vector<Run>* out) const {
    if (length <= 0) return;
    size_t i = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1);
    int64_t left = length;
    int64_t at = begin;
    while (left > 0 && i < runs_.size()) {
      const int64_t within = at - starts_[i];
      const int64_t take = std::min(left, runs_[i].length - within);
      Append(out, {runs_[i].offset + within, take});
      left -= take;
      at += take;
      ++i;
    }
  }

 private:
  const std::vector<Run>& runs_;
  std::vector<int64_t> starts_;
};

std::string Describe(const Placement& p, size_t index) {
  const char* kind = p.kind == PlacementKind::kShard       ? "Shard"
                     : p.kind == PlacementKind::kFlatRange ? "FlatRange"
                                                           : "Replicate";
  return absl::StrCat("placement ", index, " (", kind, " over group ", p.group, ")");
}

// The runs of the box [lo[k], lo[k] + extent[k]) of each dim k of a tensor
// of `shape`, in row-major order, as blocks. With d the innermost dim the box
// does not cover whole (every dim inside it whole), there is one run per
// index of the dims before d, extent[d] * inner long; along dim d - 1 they are
// shape[d] * inner apart, so they make one block per index of the dims before
// d - 1. No two runs touch (dim d is not whole), so the expansion is what
// mapping each Shard's slices row by row gives.
std::vector<RunBlock> BoxBlocks(const std::vector<int64_t>& shape, const std::vector<int64_t>& lo,
                                const std::vector<int64_t>& extent) {
  std::vector<RunBlock> out;
  const size_t n = shape.size();
  for (size_t k = 0; k < n; ++k) {
    if (extent[k] == 0) return out;
  }
  size_t split = n;
  while (split > 0 && extent[split - 1] == shape[split - 1]) --split;
  if (split == 0) {
    const int64_t numel = Product(shape, 0, n);
    if (numel > 0) out.push_back({0, numel, numel, 1});
    return out;
  }
  const size_t d = split - 1;
  const int64_t inner = Product(shape, d + 1, n);
  const int64_t length = extent[d] * inner;
  if (d == 0) {
    out.push_back({lo[0] * inner, length, length, 1});
    return out;
  }
  const int64_t pitch = shape[d] * inner;
  const size_t e = d - 1;  // the blocks' dim: one run per index
  std::vector<int64_t> at(lo.begin(), lo.begin() + e);
  int64_t count = 1;
  for (size_t k = 0; k < e; ++k) count *= extent[k];
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0;
    for (size_t k = 0; k < e; ++k) offset = offset * shape[k] + at[k];
    offset = ((offset * shape[e] + lo[e]) * shape[d] + lo[d]) * inner;
    out.push_back({offset, length, pitch, extent[e]});
    for (size_t k = e; k-- > 0;) {
      if (++at[k] < lo[k] + extent[k]) break;
      at[k] = lo[k];
    }
  }
  return out;
}

// The `i`-th placement, `p`, of the piece of `who`, named for errors (made
// only then).
struct Where {
  const std::string& who;
  const Placement& p;
  size_t i;
  std::string operator()() const { return absl::StrCat(who, ": ", Describe(p, i)); }
};

// The slice [*a, *b) of a dim of size `d` that Shard `p` over a group of
// `n` gives group rank `r`.
absl::Status ShardBounds(const Placement& p, int64_t d, int n, int r, const Where& where,
                         int64_t* a, int64_t* b) {
  switch (p.split) {
    case ShardSplit::kEven:
      if (d % n != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ": dim ", p.dim, " of size ", d, " does not split evenly over ", n,
            " ranks; use the chunk split or explicit sizes"));
      }
      *a = r * (d / n);
      *b = *a + d / n;
      return absl::OkStatus();
    case ShardSplit::kChunk: {
      // ceil(d / n) each, the tail short or empty; computed without
      // d + n - 1, r * c past d or a + c, which overflow for a
      // dimension near INT64_MAX (of an empty tensor, or a global
      // shape a rank declares).
      const int64_t c = d / n + (d % n != 0 ? 1 : 0);
      *a = r > 0 && c > d / r ? d : std::min<int64_t>(r * c, d);
      *b = *a + std::min<int64_t>(c, d - *a);
      return absl::OkStatus();
    }
    case ShardSplit::kSizes: {
      if (p.sizes.size() != static_cast<size_t>(n)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ": ", p.sizes.size(), " sizes given for a group of ", n, " ranks"));
      }
      int64_t total = 0;
      for (int64_t s : p.sizes) {
        if (s < 0) {
          return absl::InvalidArgumentError(absl::StrCat(where(), ": negative size ", s));
        }
        if (s > d - total) {  // (the sum itself may overflow)
          return absl::InvalidArgumentError(absl::StrCat(
              where(), ": sizes add up to more than ", d, ", the size of dim ", p.dim));
        }
        total += s;
      }
      if (total != d) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ": sizes add up to ", total, ", but dim ", p.dim, " has size ", d));
      }
      for (int k = 0; k < r; ++k) *a += p.sizes[k];
      *b = *a + p.sizes[r];
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": unknown split ", static_cast<int>(p.split)));
  }
}

// A piece as the placements narrow it, one placement at a time (Compute).
// Without a FlatRange (and unless `row_by_row`) the Shards only narrow a box
// of the global tensor, whose runs are made once at the end (BoxBlocks);
// otherwise every placement maps the runs so far, one slice per index of the
// dims before its own.
struct PieceBuilder {
  const std::vector<int>& group_sizes;
  const std::vector<int>& coords;
  const bool with_runs;
  const bool boxed;
  Piece piece;
  std::vector<int64_t> box_lo;  // boxed: the box in the global tensor
  std::vector<bool> used;       // per group: an earlier placement's

  // Narrows the piece by placement `p` (the `i`-th).
  absl::Status Apply(const Placement& p, size_t i, const std::string& who) {
    const Where where{who, p, i};
    if (p.group < 0 || static_cast<size_t>(p.group) >= group_sizes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": group ", p.group, " is not known (", group_sizes.size(),
                       " groups are)"));
    }
    if (used[p.group]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": the group is already used by an earlier placement"));
    }
    used[p.group] = true;
    RunMap map(piece.runs);
    std::vector<Run> next;
    switch (p.kind) {
      case PlacementKind::kReplicate:
        if (coords[p.group] != 0) piece.canonical = false;
        return absl::OkStatus();
      case PlacementKind::kShard:
        MUON_RETURN_IF_ERROR(ApplyShard(p, where, map, &next));
        break;
      case PlacementKind::kFlatRange:
        MUON_RETURN_IF_ERROR(ApplyFlatRange(p, where, map, &next));
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ": unknown placement kind ", static_cast<int>(p.kind)));
    }
    piece.runs = std::move(next);
    return absl::OkStatus();
  }

  // A Shard: the box narrowed (boxed: no runs until the end, *next stays
  // empty as the runs are), or the runs of its slices into *next.
  absl::Status ApplyShard(const Placement& p, const Where& where, const RunMap& map,
                          std::vector<Run>* next) {
    if (p.dim < 0 || static_cast<size_t>(p.dim) >= piece.shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": dim ", p.dim,
                                                     " does not exist in shape ",
                                                     ShapeString(piece.shape)));
    }
    const int64_t d = piece.shape[p.dim];
    int64_t a = 0, b = 0;
    MUON_RETURN_IF_ERROR(
        ShardBounds(p, d, group_sizes[p.group], coords[p.group], where, &a, &b));
    const int64_t outer = Product(piece.shape, 0, p.dim);
    const int64_t inner = Product(piece.shape, p.dim + 1, piece.shape.size());
    piece.shape[p.dim] = b - a;
    if (boxed) {
      box_lo[p.dim] += a;
      return absl::OkStatus();  // the runs come from the box at the end
    }
    // (An empty slice has no runs, however many rows it spans.)
    for (int64_t o = 0; with_runs && (b - a) * inner > 0 && o < outer; ++o) {
      map.Map((o * d + a) * inner, (b - a) * inner, next);
    }
    return absl::OkStatus();
  }

  // A FlatRange: the range of the piece so far, flat; its runs into *next.
  absl::Status ApplyFlatRange(const Placement& p, const Where& where, const RunMap& map,
                              std::vector<Run>* next) {
    const int64_t current = Product(piece.shape, 0, piece.shape.size());
    if (p.start < 0 || p.length < 0 || p.start > current || p.length > current - p.start) {
      int64_t end = 0;
      const std::string range =
          __builtin_add_overflow(p.start, p.length, &end)
              ? absl::StrCat("[", p.start, ", ", p.start, " + ", p.length, ")")
              : absl::StrCat("[", p.start, ", ", end, ")");
      return absl::InvalidArgumentError(absl::StrCat(
          where(), ": range ", range, " does not lie inside the ", current,
          " elements of the tensor it splits (shape ", ShapeString(piece.shape), ")"));
    }
    if (with_runs) map.Map(p.start, p.length, next);
    piece.shape = {p.length};
    return absl::OkStatus();
  }
};

// ComputePiece, and PieceShape when `with_runs` is false (PieceBuilder says
// how the runs are made).
absl::StatusOr<Piece> Compute(const Layout& layout, const std::vector<int>& group_sizes,
                              const std::vector<int>& coords, const std::string& who,
                              bool with_runs, bool row_by_row, bool as_blocks = false) {
  // No negative dimension, and no product of dimensions below overflows.
  // (The messages are made only for an error: CheckShape again with its name.)
  if (!CheckShape(layout.global_shape, std::string()).ok()) {
    return CheckShape(layout.global_shape, absl::StrCat(who, ": global shape"));
  }
  bool boxed = !row_by_row;
  for (const Placement& p : layout.placements) {
    if (p.kind == PlacementKind::kFlatRange) boxed = false;
  }
  PieceBuilder b{group_sizes, coords, with_runs, boxed, Piece(),
                 std::vector<int64_t>(layout.global_shape.size(), 0),
                 std::vector<bool>(group_sizes.size(), false)};
  Piece& piece = b.piece;
  piece.shape = layout.global_shape;
  const int64_t numel = Product(piece.shape, 0, piece.shape.size());
  if (numel > 0 && with_runs && !boxed) piece.runs.push_back({0, numel});
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    MUON_RETURN_IF_ERROR(b.Apply(layout.placements[i], i, who));
  }
  if (boxed && with_runs) {
    if (as_blocks) {
      piece.blocks = BoxBlocks(layout.global_shape, b.box_lo, piece.shape);
    } else {
      piece.runs = ExpandBlocks(BoxBlocks(layout.global_shape, b.box_lo, piece.shape));
    }
  } else if (with_runs && as_blocks) {
    piece.blocks = ToBlocks(piece.runs);
    std::vector<Run>().swap(piece.runs);
  }
  piece.numel = Product(piece.shape, 0, piece.shape.size());
  return std::move(piece);
}

}  // namespace

absl::StatusOr<Piece> ComputePiece(const Layout& layout, const std::vector<int>& group_sizes,
                                   const std::vector<int>& coords, const std::string& who) {
  return Compute(layout, group_sizes, coords, who, /*with_runs=*/true, /*row_by_row=*/false);
}

absl::StatusOr<Piece> ComputePieceRowByRow(const Layout& layout,
                                           const std::vector<int>& group_sizes,
                                           const std::vector<int>& coords,
                                           const std::string& who) {
  return Compute(layout, group_sizes, coords, who, /*with_runs=*/true, /*row_by_row=*/true);
}

absl::StatusOr<Piece> ComputePieceBlocks(const Layout& layout,
                                         const std::vector<int>& group_sizes,
                                         const std::vector<int>& coords, const std::string& who) {
  return Compute(layout, group_sizes, coords, who, /*with_runs=*/true, /*row_by_row=*/false,
                 /*as_blocks=*/true);
}

absl::StatusOr<Piece> PieceShape(const Layout& layout, const std::vector<int>& group_sizes,
                                 const std::vector<int>& coords, const std::string& who) {
  return Compute(layout, group_sizes, coords, who, /*with_runs=*/false, /*row_by_row=*/false);
}

std::vector<LocatedRun> Intersect(const std::vector<Run>& runs, int64_t begin, int64_t end) {
  std::vector<LocatedRun> out;
  int64_t local = 0;
  for (const Run& r : runs) {
    const int64_t lo = std::max(begin, r.offset);
    const int64_t hi = std::min(end, r.offset + r.length);
    if (lo < hi) out.push_back({local + (lo - r.offset), {lo, hi - lo}});
    local += r.length;
  }
  return out;
}

RunCursor::RunCursor(const std::vector<Run>& runs) : runs_(&runs) {
  for (size_t i = 1; i < runs.size() && sorted_; ++i) {
    sorted_ = runs[i - 1].offset + runs[i - 1].length <= runs[i].offset;
  }
}

void RunCursor::Seek(int64_t begin) {
  if (begin < last_begin_) {
    next_ = 0;
    local_ = 0;
  }
  last_begin_ = begin;
  const std::vector<Run>& runs = *runs_;
  while (next_ < runs.size() && runs[next_].offset + runs[next_].length <= begin) {
    local_ += runs[next_].length;
    ++next_;
  }
}

std::vector<LocatedRun> RunCursor::Intersect(int64_t begin, int64_t end) {
  if (!sorted_) return muon::Intersect(*runs_, begin, end);
  Seek(begin);
  std::vector<LocatedRun> out;
  int64_t local = local_;
  for (size_t i = next_; i < runs_->size() && (*runs_)[i].offset < end; ++i) {
    const Run& r = (*runs_)[i];
    const int64_t lo = std::max(begin, r.offset);
    const int64_t hi = std::min(end, r.offset + r.length);
    if (lo < hi) out.push_back({local + (lo - r.offset), {lo, hi - lo}});
    local += r.length;
  }
  return out;
}

bool RunCursor::Meets(int64_t begin, int64_t end) {
  if (!sorted_) {
    for (const Run& r : *runs_) {
      if (r.offset < end && r.offset + r.length > begin) return true;
    }
    return false;
  }
  Seek(begin);
  // Past the cursor every run ends after `begin`; the first starts first.
  return next_ < runs_->size() && (*runs_)[next_].offset < end;
}

absl::Status CheckTiling(const std::vector<const Piece*>& pieces, int64_t numel,
                         const std::string& who) {
  std::vector<Run> canon;
  for (const Piece* p : pieces) {
    for (const Run& r : p->runs) {
      if (r.offset < 0 || r.offset + r.length > numel) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": a piece covers elements [",
                                                       r.offset, ", ", r.offset + r.length,
                                                       ") outside the ", numel, " of the tensor"));
      }
      if (p->canonical) canon.push_back(r);
    }
  }
  std::sort(canon.begin(), canon.end(),
            [](const Run& a, const Run& b) { return a.offset < b.offset; });
  int64_t at = 0;
  for (const Run& r : canon) {
    if (r.offset < at) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": pieces overlap at element ", r.offset, " (flat ranges or shard sizes of two "
          "ranks cover the same elements)"));
    }
    if (r.offset > at) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": elements [", at, ", ", r.offset, ") are held by no rank (a flat range or "
          "shard is missing)"));
    }
    at = r.offset + r.length;
  }
  if (at != numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": elements [", at, ", ", numel, ") are held by no rank (a flat range or shard is "
        "missing)"));
  }
  return absl::OkStatus();
}

}  // namespace muon
