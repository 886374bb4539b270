// The conformance suite against the library's own host adapters: the world
// of one, and in-process worlds of 1 to 5 ranks and sub-groups over
// reordered, non-contiguous rank lists (threads).
#include "muon/comm/testing/conformance.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "muon/comm/inprocess_comm.h"
#include "muon/comm/self_comm.h"
#include "muon/testing/ranks.h"

namespace muon {
namespace {

TEST(Conformance, TheWorldOfOne) {
  std::vector<std::string> skipped;
  const auto failures = RunConformance(SelfCommTable(), ConformanceOptions(), &skipped);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  EXPECT_TRUE(skipped.empty());
}

// Runs the suite on every member of `groups` (lists of world ranks) of an
// in-process world of n ranks, each member on its thread.
void ExpectInProcessConforms(int n, const std::vector<std::vector<int>>& groups) {
  auto world = InProcessWorld::Create(n);
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<std::vector<std::string>> failures(n);
  testranks::OnThreads(n, [&](int rank) {
    for (const std::vector<int>& members : groups) {
      const bool member = members.empty() ||
                          std::find(members.begin(), members.end(), rank) != members.end();
      if (!member) continue;
      muon_comm_t table;
      ASSERT_TRUE(MakeInProcessComm(*world, members, rank, &table).ok());
      std::vector<std::string> skipped;
      for (const std::string& f : RunConformance(table, ConformanceOptions(), &skipped)) {
        failures[rank].push_back("group [" + absl::StrJoin(members, ",") + "]: " + f);
      }
      for (const std::string& s : skipped) {  // the adapter provides every collective
        failures[rank].push_back("group [" + absl::StrJoin(members, ",") + "]: skipped " + s);
      }
      table.release(table.ctx);
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(failures[r].empty()) << "rank " << r << ":\n" << absl::StrJoin(failures[r], "\n");
  }
}

TEST(Conformance, InProcessWorldsOfOneToFive) {
  for (int n = 1; n <= 5; ++n) {
    SCOPED_TRACE("world of " + std::to_string(n));
    ExpectInProcessConforms(n, {{}});
  }
}

TEST(Conformance, InProcessSubGroupsInAnyOrder) {
  // Two disjoint groups run side by side: {4, 1, 3} and {2, 0}.
  ExpectInProcessConforms(5, {{4, 1, 3}, {2, 0}});
}

}  // namespace
}  // namespace muon
