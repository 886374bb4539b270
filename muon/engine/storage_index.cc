#include "muon/engine/storage_index.h"

#include <iterator>

namespace muon {

StorageIndex::Range StorageIndex::RangeOf(const TensorView& t, Entry e) {
  Range r;
  r.begin = reinterpret_cast<uintptr_t>(t.data);
  r.end = r.begin + t.nbytes();
  r.entry = e;
  return r;
}

StorageIndex::Entry StorageIndex::FirstOverlap(const TensorView& t) const {
  Entry first;
  if (Empty(t)) return first;
  const Key key = KeyOf(t);
  const Range mine = RangeOf(t, first);
  auto meets = [&](const Range& r) { return r.begin < mine.end && mine.begin < r.end; };
  auto device = ordered_.find(key);
  if (device != ordered_.end()) {
    const std::map<uintptr_t, Range>& ranges = device->second;
    // The ranges are disjoint: only the last one starting at or before
    // `mine` can reach into it; after it, those starting inside it.
    auto it = ranges.upper_bound(mine.begin);
    if (it != ranges.begin() && meets(std::prev(it)->second)) {
      first = std::prev(it)->second.entry;
    }
    for (; it != ranges.end() && it->first < mine.end; ++it) {
      if (Earlier(it->second.entry, first)) first = it->second.entry;
    }
  }
  for (const auto& [k, r] : aside_) {
    if (k == key && meets(r) && Earlier(r.entry, first)) first = r.entry;
  }
  return first;
}

void StorageIndex::Insert(const TensorView& t, Entry e) {
  if (Empty(t)) return;
  const Key key = KeyOf(t);
  const Range r = RangeOf(t, e);
  std::map<uintptr_t, Range>& ranges = ordered_[key];
  auto it = ranges.upper_bound(r.begin);
  const bool overlaps = (it != ranges.begin() && std::prev(it)->second.end > r.begin) ||
                        (it != ranges.end() && it->first < r.end);
  if (overlaps) {
    aside_.push_back({key, r});
  } else {
    ranges.emplace_hint(it, r.begin, r);
  }
}

void StorageIndex::Erase(const TensorView& t, Entry e) {
  if (Empty(t)) return;
  const Key key = KeyOf(t);
  const Range r = RangeOf(t, e);
  auto same = [&](const Range& q) {
    return q.begin == r.begin && q.end == r.end && q.entry.param == e.param &&
           q.entry.grad == e.grad;
  };
  for (auto it = aside_.begin(); it != aside_.end(); ++it) {
    if (it->first == key && same(it->second)) {
      aside_.erase(it);
      return;
    }
  }
  auto device = ordered_.find(key);
  if (device == ordered_.end()) return;
  auto it = device->second.find(r.begin);
  if (it != device->second.end() && same(it->second)) device->second.erase(it);
}

void StorageIndex::Clear() {
  ordered_.clear();
  aside_.clear();
}

}  // namespace muon
