// A grow-only, 64-byte aligned host block from a backend's memory source
// (operator new when the source is empty): the CPU products' working memory.
#ifndef MUON_MATH_CPU_GROWING_BLOCK_H_
#define MUON_MATH_CPU_GROWING_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <new>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "muon/math/backend.h"

namespace muon {

class GrowingBlock {
 public:
  GrowingBlock(const MemorySource* source, const char* what) : source_(source), what_(what) {}
  GrowingBlock(const GrowingBlock&) = delete;
  GrowingBlock& operator=(const GrowingBlock&) = delete;
  ~GrowingBlock() { Free(); }

  // At least `bytes`, kept until a larger size is asked for.
  absl::StatusOr<void*> Get(size_t bytes) {
    if (bytes > bytes_) {
      Free();
      const size_t want = bytes + 64;
      if (source_->allocate) {
        absl::StatusOr<void*> p = source_->allocate(want, what_);
        if (!p.ok()) return p.status();
        block_ = *p;
      } else {
        block_ = ::operator new(want, std::nothrow);
        if (block_ == nullptr) {
          return absl::ResourceExhaustedError(absl::StrCat(what_, ": out of host memory"));
        }
      }
      bytes_ = bytes;
    }
    const auto at = reinterpret_cast<uintptr_t>(block_);
    return reinterpret_cast<void*>((at + 63) & ~uintptr_t{63});
  }

 private:
  void Free() {
    if (block_ == nullptr) return;
    if (source_->free) {
      source_->free(block_);
    } else {
      ::operator delete(block_);
    }
    block_ = nullptr;
    bytes_ = 0;
  }

  const MemorySource* source_;
  const char* what_;
  void* block_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace muon

#endif  // MUON_MATH_CPU_GROWING_BLOCK_H_
