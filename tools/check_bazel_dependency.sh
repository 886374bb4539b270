#!/usr/bin/env bash
# Builds and runs examples/bazel_dependency as a separate Bazel workspace that
# depends on this checkout as @libmuon: proves the targets build without this
# repository's .bazelrc and that muon_dependencies() works from elsewhere.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ws=$(mktemp -d)
trap 'cd "$ws" && bazel shutdown >/dev/null 2>&1; rm -rf "$ws"' EXIT
cp "$root/examples/bazel_dependency/WORKSPACE.example" "$ws/WORKSPACE"
cp "$root/examples/bazel_dependency/BUILD.example" "$ws/BUILD.bazel"
cp "$root/examples/bazel_dependency/trainer.c" "$ws/"
cd "$ws"
out=$(bazel run --noshow_progress --spawn_strategy=processwrapper-sandbox \
  --override_repository=libmuon="$root" //:trainer 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep "trainer linked libmuon" || { echo "$out"; exit 1; }
echo "//tools:bazel_dependency_check PASSED"
