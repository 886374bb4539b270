// Split Newton-Schulz's member sums for tests: the members are threads of
// one process, each with its own backend and block, summing through a
// barrier (test-only).
#ifndef MUON_MATH_TESTING_MEMBER_SUMMER_H_
#define MUON_MATH_TESTING_MEMBER_SUMMER_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "muon/math/backend.h"

namespace muon {
namespace testing {

// Element-wise sums among `members` threads: each deposits its values, waits
// for all, then adds every member's values in member order (so every member
// gets the same bits), and waits again before the slots can be reused.
class Summer {
 public:
  explicit Summer(int members)
      : members_(members), slots_(static_cast<size_t>(members)), calls_(slots_.size(), 0) {}

  template <typename T>
  absl::Status Sum(int member, T* values, int64_t count) {
    slots_[static_cast<size_t>(member)].assign(values, values + count);
    Wait();
    for (int64_t i = 0; i < count; ++i) {
      T total = 0;
      for (int r = 0; r < members_; ++r) total += static_cast<T>(slots_[static_cast<size_t>(r)][i]);
      values[i] = total;
    }
    Wait();
    ++calls_[static_cast<size_t>(member)];  // each member its own
    if (member == 0) log_.push_back({std::is_same<T, double>::value, count});
    return absl::OkStatus();
  }

  // Host values.
  MemberSums For(int member) {
    MemberSums s;
    s.f64 = [this, member](double* v, int64_t n) { return Sum(member, v, n); };
    s.f32 = [this, member](float* v, int64_t n) { return Sum(member, v, n); };
    return s;
  }

  int Calls(int member) const { return calls_[static_cast<size_t>(member)]; }
  // Member 0's sums, in order.
  const std::vector<MemberSum>& Log() const { return log_; }

 private:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++waiting_ == members_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

  const int members_;
  std::vector<std::vector<double>> slots_;
  std::vector<int> calls_;
  std::vector<MemberSum> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  int64_t generation_ = 0;
};

}  // namespace testing
}  // namespace muon

#endif  // MUON_MATH_TESTING_MEMBER_SUMMER_H_
