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

# Loopback TCP and shared memory only: no network probing, no InfiniBand warnings.
exec mpirun --allow-run-as-root --oversubscribe -np "$np" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  --mca btl_vader_single_copy_mechanism none \
  "$bin"
