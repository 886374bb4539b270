#!/usr/bin/env bash
# Runs every test: the whole suite, then the C/C++ tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer (the MPI adapter's under mpirun
# too), Python tests against an ASan build of libmuon.so, the threaded
# multi-rank and C API tests under ThreadSanitizer, the libFuzzer targets for
# a bounded time each, libmuon as a dependency of
# another workspace, and the pip-installed wheel. Ends with "N passed, N
# skipped, N failed": a test whose every case skipped (a GPU test where no GPU
# is) ran nothing, so it is listed with its reason and not counted as passed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
# The targets of the bazel run just made that ran nothing (tools/skipped_tests.py).
skipped() { python3 tools/skipped_tests.py bazel-testlogs 2>&1 | tee -a "$log"; }

echo "== the house's rules (docs/ARCHITECTURE.md)"
bash tools/check_layout.sh 2>&1 | tee -a "$log" || rc=1

echo "== all tests"
bazel test --noshow_progress //... 2>&1 | tee -a "$log" || rc=1
skipped

echo "== C/C++ tests under ASan + UBSan (the MPI adapter's under mpirun)"
bazel test --noshow_progress --config=asan --test_tag_filters=-no_asan -- \
  //muon/... //capi/... //tests/c_api/... //tests/distributed/... //tests/mpi/... 2>&1 | tee -a "$log" || rc=1
skipped

echo "== Python tests against libmuon.so built with ASan + UBSan"
bash tools/asan_python.sh 2>&1 | tee -a "$log" || rc=1

echo "== multi-rank (threaded) and C API tests under ThreadSanitizer"
bazel test --noshow_progress --config=tsan --test_tag_filters=-no_tsan -- \
  //muon/comm/... //muon/device/... //muon/engine/... //muon/sharding/... //tests/distributed/... \
  //capi/... //tests/c_api/... 2>&1 | tee -a "$log" || rc=1
skipped

echo "== libFuzzer targets (bounded)"
# Prints //fuzz:<target> PASSED or FAILED per target (counted below).
bash tools/fuzz.sh 30 2>&1 | tee -a "$log" || rc=1

echo "== libmuon as a dependency of another Bazel workspace"
bash tools/check_bazel_dependency.sh 2>&1 | tee -a "$log" || rc=1

echo "== the Python wheel, pip-installed into a fresh environment"
bash tools/check_wheel.sh 2>&1 | tee -a "$log" || rc=1

skips=$(grep -cE '^//[^ ]* SKIPPED \(' "$log")
passed=$(( $(grep -cE '^//.* PASSED' "$log") - skips ))
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log")
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1   # a build error counts as a failure
echo "${passed} passed, ${skips} skipped, ${failed} failed"
exit "$rc"
