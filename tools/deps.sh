#!/usr/bin/env bash
# Installs the Debian packages libmuon builds and tests with, when missing,
# then the Python environment of the tests (.venv/, from
# tools/python-requirements.txt) when missing or out of date.
# Safe to run repeatedly: it asks apt and pip only for what is not installed yet.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  bazel-bootstrap      # Bazel 4, builds offline with the shims in third_party/shims
  g++ binutils         # compiler, nm/readelf for the exported-symbol test
  libabsl-dev          # Abseil (linked as shared libraries)
  libgtest-dev         # GoogleTest
  libopenblas-dev      # CBLAS for the CPU backend
  libdnnl-dev          # oneDNN: native bf16 products of the CPU backend (AMX, AVX512-BF16)
  libdlpack-dev        # DLPack's header (DLTensor in the C ABI)
  zlib1g-dev           # zlib: the handshake compresses parameter tables
  libopenmpi-dev openmpi-bin  # the MPI adapter (libmuon_mpi.so) and its mpirun test
  python3 python3-venv # the Python package; its tests' torch comes from PyPI (.venv)
  clang-14 libclang-rt-14-dev  # the libFuzzer targets of fuzz/ (tools/fuzz.sh)
)

python_env() {
  local stamp=.venv/requirements.txt
  local wanted
  wanted="$(cat tools/python-requirements.txt tools/python-nodeps.txt)"
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$wanted" = "$(cat "$stamp")" ]; then
    return 0
  fi
  echo "deps: installing the Python environment (.venv: $(grep -v '^#' \
    tools/python-requirements.txt | xargs))" >&2
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv .venv
  # DS_BUILD_OPS=0: DeepSpeed's sdist builds no C++/CUDA ops (none is used here).
  DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check \
    -r tools/python-requirements.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
    -r tools/python-nodeps.txt
  printf '%s\n' "$wanted" > "$stamp"
}

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  python_env
  exit 0
fi

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
python_env
