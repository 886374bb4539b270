// Where the registered parameters' tensors lie, so that registration refuses
// a tensor sharing a byte of storage with a registered one in O(log n): per
// device, the byte ranges ordered by start address. Registered ranges never
// overlap one another (registration refuses that), so a new range can only
// meet the one starting before it and those starting inside it.
//
// A rebinding (Registry::Rebind) is not compared with the other parameters'
// tensors (a host may rebind into storage another parameter is about to
// leave): a rebound range that overlaps a registered one is kept aside, in a
// short list searched in full, so that the ordered ranges stay disjoint.
#ifndef MUON_ENGINE_STORAGE_INDEX_H_
#define MUON_ENGINE_STORAGE_INDEX_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "muon/common/tensor.h"

namespace muon {

class StorageIndex {
 public:
  // One tensor of a registered parameter.
  struct Entry {
    int64_t param = -1;
    bool grad = false;  // false: the parameter's value, true: its gradient
  };

  // The tensor that shares storage with `t`: of all that do, the one of the
  // lowest parameter id, its value before its gradient (the order in which
  // a scan over the parameters in registration order meets them). param is
  // -1 when none does. Empty tensors share nothing.
  Entry FirstOverlap(const TensorView& t) const;

  // Records `t` as `e`'s storage (nothing for an empty tensor).
  void Insert(const TensorView& t, Entry e);
  // Forgets that `t` is `e`'s storage (as inserted).
  void Erase(const TensorView& t, Entry e);
  void Clear();

 private:
  struct Range {
    uintptr_t begin = 0, end = 0;
    Entry entry;
  };
  using Key = std::pair<int32_t, int32_t>;  // DLPack device type and id
  static bool Empty(const TensorView& t) { return t.data == nullptr || t.nbytes() == 0; }
  static Key KeyOf(const TensorView& t) { return {t.device.device_type, t.device.device_id}; }
  static Range RangeOf(const TensorView& t, Entry e);
  // Whether `a` should be reported before `b`.
  static bool Earlier(const Entry& a, const Entry& b) {
    return b.param < 0 || a.param < b.param || (a.param == b.param && !a.grad && b.grad);
  }

  // Per device: start address -> range; disjoint.
  std::map<Key, std::map<uintptr_t, Range>> ordered_;
  // Rebound ranges that overlapped an ordered one when they were recorded.
  std::vector<std::pair<Key, Range>> aside_;
};

}  // namespace muon

#endif  // MUON_ENGINE_STORAGE_INDEX_H_
