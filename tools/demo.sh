#!/usr/bin/env bash
# The main demo: builds libmuon and runs distributed Muon on 4 in-process ranks
# (TP 2 x FSDP 2, built-in defaults), checked against a single process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
bazel run --noshow_progress //examples:demo
