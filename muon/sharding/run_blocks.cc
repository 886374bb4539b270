// The runs of a piece as strided blocks (RunBlock): converting, walking and
// checking the tiling of blocks without expanding them (layout.h).
#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/sharding/layout.h"

namespace muon {

std::vector<Run> ExpandBlocks(absl::Span<const RunBlock> blocks) {
  std::vector<Run> out;
  out.reserve(static_cast<size_t>(RunCount(blocks)));
  for (const RunBlock& b : blocks) {
    for (int64_t i = 0; i < b.count; ++i) out.push_back({b.offset + i * b.pitch, b.length});
  }
  return out;
}

std::vector<RunBlock> ToBlocks(const std::vector<Run>& runs) {
  std::vector<RunBlock> out;
  for (const Run& r : runs) {
    if (!out.empty() && r.length > 0) {
      RunBlock& b = out.back();
      if (b.length == r.length) {
        if (b.count == 1 && r.offset >= b.offset + b.length) {
          b.pitch = r.offset - b.offset;
          b.count = 2;
          continue;
        }
        if (b.count > 1 && r.offset == b.offset + b.count * b.pitch) {
          ++b.count;
          continue;
        }
      }
    }
    out.push_back({r.offset, r.length, r.length, 1});
  }
  return out;
}

int64_t RunCount(absl::Span<const RunBlock> blocks) {
  int64_t n = 0;
  for (const RunBlock& b : blocks) n += b.count;
  return n;
}

BlockCursor::BlockCursor(absl::Span<const RunBlock> blocks) : blocks_(blocks) {
  int64_t end = 0;  // of the previous block's last run
  for (size_t i = 0; i < blocks.size() && sorted_; ++i) {
    const RunBlock& b = blocks[i];
    sorted_ = (b.count == 1 || (b.pitch > 0 && b.pitch >= b.length)) &&
              (i == 0 || end <= b.offset);
    end = b.offset + (b.count - 1) * b.pitch + b.length;
  }
  if (!sorted_) expanded_ = ExpandBlocks(blocks);
}

void BlockCursor::Seek(int64_t begin) {
  if (begin < last_begin_) {
    block_ = 0;
    run_ = 0;
    local_ = 0;
  }
  last_begin_ = begin;
  const absl::Span<const RunBlock> blocks = blocks_;
  while (block_ < blocks.size()) {
    const RunBlock& b = blocks[block_];
    if (b.offset + (b.count - 1) * b.pitch + b.length <= begin) {
      local_ += (b.count - run_) * b.length;
      ++block_;
      run_ = 0;
      continue;
    }
    // The first run of this block that ends after `begin` (its last does).
    const int64_t past = begin - b.offset - b.length;  // run i ends after begin: i * pitch > past
    const int64_t first = past < 0 ? 0 : past / b.pitch + 1;
    if (first > run_) {
      local_ += (first - run_) * b.length;
      run_ = first;
    }
    return;
  }
}

std::vector<LocatedRun> BlockCursor::Intersect(int64_t begin, int64_t end) {
  if (!sorted_) return muon::Intersect(expanded_, begin, end);
  Seek(begin);
  std::vector<LocatedRun> out;
  int64_t local = local_;
  int64_t i = run_;
  for (size_t k = block_; k < blocks_.size(); ++k, i = 0) {
    const RunBlock& b = blocks_[k];
    for (; i < b.count; ++i) {
      const int64_t offset = b.offset + i * b.pitch;
      if (offset >= end) return out;
      const int64_t lo = std::max(begin, offset);
      const int64_t hi = std::min(end, offset + b.length);
      if (lo < hi) out.push_back({local + (lo - offset), {lo, hi - lo}});
      local += b.length;
    }
  }
  return out;
}

bool BlockCursor::Meets(int64_t begin, int64_t end) {
  if (!sorted_) {
    for (const Run& r : expanded_) {
      if (r.offset < end && r.offset + r.length > begin) return true;
    }
    return false;
  }
  Seek(begin);
  return block_ < blocks_.size() && blocks_[block_].offset + run_ * blocks_[block_].pitch < end;
}

namespace {

absl::Status OverlapError(const std::string& who, int64_t offset) {
  return absl::InvalidArgumentError(absl::StrCat(
      who, ": pieces overlap at element ", offset, " (flat ranges or shard sizes of two "
      "ranks cover the same elements)"));
}

absl::Status GapError(const std::string& who, int64_t at, int64_t offset) {
  return absl::InvalidArgumentError(absl::StrCat(
      who, ": elements [", at, ", ", offset, ") are held by no rank (a flat range or "
      "shard is missing)"));
}

}  // namespace

absl::Status CheckTilingBlocks(const std::vector<const Piece*>& pieces, int64_t numel,
                               const std::string& who) {
  std::vector<PieceBlocks> views;
  views.reserve(pieces.size());
  for (const Piece* p : pieces) views.push_back({p->blocks, p->canonical});
  return CheckTilingBlocks(views, numel, who);
}

absl::Status CheckTilingBlocks(const std::vector<PieceBlocks>& pieces, int64_t numel,
                               const std::string& who) {
  // Every run inside the tensor (the first one outside, in piece order).
  std::vector<const RunBlock*> canon;
  for (const PieceBlocks& p : pieces) {
    for (const RunBlock& b : p.blocks) {
      int64_t bad = -1;  // the first run outside, if any
      if (b.offset < 0 || b.offset + b.length > numel) {
        bad = 0;
      } else if (b.count > 1) {
        const int64_t fits = (numel - b.offset - b.length) / b.pitch + 1;  // runs inside
        if (fits < b.count) bad = fits;
      }
      if (bad >= 0) {
        const int64_t offset = b.offset + bad * b.pitch;
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": a piece covers elements [", offset, ", ", offset + b.length,
                         ") outside the ", numel, " of the tensor"));
      }
      if (p.canonical && b.count > 0) canon.push_back(&b);
    }
  }
  // The canonical runs in increasing offset, by a merge of the blocks: the
  // heap holds each unfinished block's next run.
  std::vector<int64_t> next(canon.size(), 0);  // runs of each block done
  using Item = std::pair<int64_t, size_t>;     // (offset of the next run, block)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (size_t k = 0; k < canon.size(); ++k) heap.push({canon[k]->offset, k});
  int64_t at = 0;
  std::vector<size_t> group;
  while (!heap.empty()) {
    const auto [offset, k] = heap.top();
    heap.pop();
    if (offset < at) return OverlapError(who, offset);
    if (offset > at) return GapError(who, at, offset);
    const RunBlock& b = *canon[k];
    at = offset + b.length;
    group.assign(1, k);
    int64_t periods = 1;  // runs each block of the group moves on
    if (b.count - next[k] > 1) {
      // The runs that follow, contiguous, from blocks of the same pitch with
      // a run after this one: if they end exactly a pitch after `offset`,
      // the next periods repeat this one shifted, up to the first run of
      // another block.
      const int64_t period_end = offset + b.pitch;
      while (at < period_end && !heap.empty() && heap.top().first == at) {
        const size_t j = heap.top().second;
        if (canon[j]->pitch != b.pitch || canon[j]->count - next[j] < 2) break;
        heap.pop();
        at += canon[j]->length;
        group.push_back(j);
      }
      if (at == period_end) {
        periods = b.count - next[k];
        for (size_t j : group) periods = std::min(periods, canon[j]->count - next[j]);
        if (!heap.empty()) {
          periods = std::min(periods, std::max<int64_t>(1, (heap.top().first - offset) / b.pitch));
        }
        at = offset + periods * b.pitch;
      }
    }
    for (size_t j : group) {
      next[j] += periods;
      if (next[j] < canon[j]->count) heap.push({canon[j]->offset + next[j] * canon[j]->pitch, j});
    }
  }
  if (at != numel) return GapError(who, at, numel);
  return absl::OkStatus();
}

}  // namespace muon
