// Test helpers: ranks of a job as threads of the test, with in-process
// communicators wrapped as the engine's Comm.
#ifndef MUON_TESTING_RANKS_H_
#define MUON_TESTING_RANKS_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/comm/comm.h"
#include "muon/comm/inprocess_comm.h"

namespace muon {
namespace testranks {

// Runs body(rank) for rank 0 .. n-1, each on its own thread, and joins them.
inline void OnThreads(int n, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// An in-process world of `n` ranks.
class World {
 public:
  explicit World(int n) : world_(*InProcessWorld::Create(n)) {}

  // World rank `rank`'s communicator over the world ranks `members` (empty:
  // the whole world), as the engine sees it.
  std::shared_ptr<Comm> Join(int rank, const std::vector<int>& members = {},
                             const std::string& name = "world") {
    muon_comm_t table;
    absl::Status made = MakeInProcessComm(world_, members, rank, &table);
    if (!made.ok()) return nullptr;
    absl::StatusOr<std::shared_ptr<Comm>> comm = Comm::Create(table, name);
    return comm.ok() ? *comm : nullptr;
  }

 private:
  std::shared_ptr<InProcessWorld> world_;
};

}  // namespace testranks
}  // namespace muon

#endif  // MUON_TESTING_RANKS_H_
