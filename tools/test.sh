#!/usr/bin/env bash
# Runs every test: the whole suite, then the C/C++ unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh

# CI and small machines: keep Bazel's memory and parallelism modest.
BAZEL_FLAGS=(--noshow_progress)

echo "== all tests"
bazel test "${BAZEL_FLAGS[@]}" //...

echo "== C/C++ unit tests under ASan + UBSan"
bazel test "${BAZEL_FLAGS[@]}" --config=asan --test_tag_filters=-no_asan -- //muon/... //tests/c_api/...
