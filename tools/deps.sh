#!/usr/bin/env bash
# Installs the Debian packages libmuon builds and tests with, when missing.
# Safe to run repeatedly: it asks apt only for what is not installed yet.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap      # Bazel 4, builds offline with the shims in third_party/shims
  g++ binutils         # compiler, nm/readelf for the exported-symbol test
  libabsl-dev          # Abseil (linked as shared libraries)
  libgtest-dev         # GoogleTest
  libopenblas-dev      # CBLAS for the CPU backend
  libdlpack-dev        # DLPack's header (DLTensor in the C ABI)
  libopenmpi-dev openmpi-bin  # the MPI adapter (libmuon_mpi.so) and its mpirun test
  python3 python3-numpy python3-pytest python3-torch  # the Python package and its tests
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "deps: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
