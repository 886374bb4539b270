// The conformance suite as one C function (see BUILD.bazel).
#include <cstring>
#include <string>
#include <vector>

#include "muon/comm/testing/conformance.h"

extern "C" __attribute__((visibility("default"))) int muon_conformance_run(
    const muon_comm_t* table, int exact_sums, char* report, size_t capacity) {
  if (table == nullptr) return -1;
  muon::ConformanceOptions options;
  options.exact_sums = exact_sums != 0;
  std::string text;
  int failures = 0;
  try {
    std::vector<std::string> skipped;
    for (const std::string& f : muon::RunConformance(*table, options, &skipped)) {
      text += f + "\n";
      ++failures;
    }
    for (const std::string& s : skipped) text += "skipped: " + s + "\n";
  } catch (...) {
    text += "the suite threw an exception\n";
    ++failures;
  }
  if (report != nullptr && capacity > 0) {
    const size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
    std::memcpy(report, text.data(), n);
    report[n] = '\0';
  }
  return failures;
}
