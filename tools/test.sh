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
# Each stage's header; the one before it is closed with its wall time (where
# the suite's minutes go).
stage_name="" stage_start=$SECONDS
stage() {
  [ -n "$stage_name" ] && echo "-- ${stage_name}: $((SECONDS - stage_start)) s"
  stage_name=$1 stage_start=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}

stage "the house's rules (docs/ARCHITECTURE.md)"
bash tools/check_layout.sh 2>&1 | tee -a "$log" || rc=1

stage "all tests"
bazel test --noshow_progress //... 2>&1 | tee -a "$log" || rc=1
skipped

stage "C/C++ tests under ASan + UBSan (the MPI adapter's under mpirun)"
bazel test --noshow_progress --config=asan --test_tag_filters=-no_asan -- \
  //muon/... //capi/... //tests/c_api/... //tests/distributed/... //tests/mpi/... 2>&1 | tee -a "$log" || rc=1
skipped

stage "Python tests against libmuon.so built with ASan + UBSan"
bash tools/asan_python.sh 2>&1 | tee -a "$log" || rc=1

stage "multi-rank (threaded) and C API tests under ThreadSanitizer"
bazel test --noshow_progress --config=tsan --test_tag_filters=-no_tsan -- \
  //muon/comm/... //muon/device/... //muon/engine/... //muon/sharding/... //tests/distributed/... \
  //capi/... //tests/c_api/... 2>&1 | tee -a "$log" || rc=1
skipped

stage "libFuzzer targets (bounded)"
# Prints //fuzz:<target> PASSED or FAILED per target (counted below).
bash tools/fuzz.sh 30 2>&1 | tee -a "$log" || rc=1

stage "libmuon as a dependency of another Bazel workspace"
bash tools/check_bazel_dependency.sh 2>&1 | tee -a "$log" || rc=1

stage "the Python wheel, pip-installed into a fresh environment"
bash tools/check_wheel.sh 2>&1 | tee -a "$log" || rc=1

stage ""

skips=$(grep -cE '^//[^ ]* SKIPPED \(' "$log")
passed=$(( $(grep -cE '^//.* PASSED' "$log") - skips ))
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log")
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1   # a build error counts as a failure
echo "${passed} passed, ${skips} skipped, ${failed} failed"
exit "$rc"
