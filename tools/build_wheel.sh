#!/usr/bin/env bash
# Builds the wheel (libmuon.so and the CUDA plugin inside the `muon` package) in
# one command; prints its path.
#
#   tools/build_wheel.sh [output folder, default wheelhouse/]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-wheelhouse}"
bazel build --noshow_progress //:libmuon.so //:libmuon_cuda.so >&2
plugin=()
[ -s bazel-bin/libmuon_cuda.so ] && plugin=(--cuda-plugin bazel-bin/libmuon_cuda.so)
python3 tools/make_wheel.py --lib bazel-bin/libmuon.so "${plugin[@]}" \
  --package capi/python/muon --header capi/muon.h --out "$out"
