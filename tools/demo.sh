#!/usr/bin/env bash
# The main demo: builds libmuon and runs the quickstart on the built-in defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
bazel run --noshow_progress //examples:demo
