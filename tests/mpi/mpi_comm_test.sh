#!/bin/bash
# Runs an MPI test program on 4 processes (or as many as the second argument
# says) with mpirun (OpenMPI). Skips, saying so, only when mpirun is not
# installed (Debian: openmpi-bin).
#
# Usage: mpi_comm_test.sh <path to the test binary> [processes, default 4]
set -euo pipefail

bin="$1"
np="${2:-4}"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIPPED: mpirun is not installed (apt-get install openmpi-bin); the MPI adapter was not run"
  exit 0
fi

# OpenMPI puts its session directory (with Unix sockets, whose paths are
# limited to ~100 bytes) under TMPDIR: keep it short.
session=$(mktemp -d /tmp/muon_mpi.XXXXXX)
trap 'rm -rf "$session"' EXIT
export TMPDIR="$session"
export OMPI_MCA_tmpdir_base="$session"

# Under --config=asan (.bazelrc gives the test ASAN_OPTIONS): with
# $MUON_MPI_LSAN_SUPPRESSIONS (lsan_openmpi.supp), leaks are checked, OpenMPI's
# own excepted, which takes the slow unwinder on every allocation; without it
# (the conformance runs: their hundreds of thousands of 7-byte messages run
# about 5x slower unwound so) only memory errors and UB are checked.
if [[ -n "${ASAN_OPTIONS:-}" ]]; then
  if [[ -n "${MUON_MPI_LSAN_SUPPRESSIONS:-}" ]]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS}:fast_unwind_on_malloc=0"
    export LSAN_OPTIONS="suppressions=$(readlink -f "${MUON_MPI_LSAN_SUPPRESSIONS}")${LSAN_OPTIONS:+:${LSAN_OPTIONS}}"
  else
    export ASAN_OPTIONS="${ASAN_OPTIONS}:detect_leaks=0"
  fi
fi

# Loopback TCP and shared memory only: no network probing, no InfiniBand warnings.
exec mpirun --allow-run-as-root --oversubscribe -np "$np" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  --mca btl_vader_single_copy_mechanism none \
  "$bin"
