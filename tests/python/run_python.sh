#!/usr/bin/env bash
# Runs the Python interpreter on its arguments with the ctypes package importable
# and MUON_LIBRARY pointing at the built libmuon.so, from a Bazel test's runfiles
# (or from the repository root). The interpreter is $MUON_PYTHON if set (forward
# one with --test_env=MUON_PYTHON=...), else the repository's .venv (torch,
# numpy and pytest, made by tools/deps.sh), else /usr/bin/python3.
#
#   run_python.sh -m pytest -q tests/python/parity_test.py
#   run_python.sh examples/python/quickstart.py
set -euo pipefail

root="${TEST_SRCDIR:+${TEST_SRCDIR}/${TEST_WORKSPACE}}"
root="${root:-$(pwd)}"

if [[ -n "${MUON_LIBRARY:-}" && "${MUON_LIBRARY}" != /* ]]; then
  MUON_LIBRARY="$(pwd)/${MUON_LIBRARY#./}"  # $(rootpath) is relative to the runfiles root
fi
if [[ -z "${MUON_LIBRARY:-}" && -e "${root}/libmuon.so" ]]; then
  MUON_LIBRARY="${root}/libmuon.so"
fi
export MUON_LIBRARY

export PYTHONPATH="${root}/python${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONDONTWRITEBYTECODE=1
# Bazel runs tests side by side: one compute thread each (torch's and
# OpenBLAS's), unless the caller chose otherwise.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# The outputs directory of a Bazel test, or a scratch one: keeps pytest and
# torch from writing caches into the runfiles tree or the home directory.
export HOME="${TEST_TMPDIR:-${HOME:-/tmp}}"

if [[ -z "${MUON_PYTHON:-}" ]]; then
  # This script in the runfiles tree links to the checkout's copy.
  checkout="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)"
  MUON_PYTHON=/usr/bin/python3
  [[ -x "${checkout}/.venv/bin/python" ]] && MUON_PYTHON="${checkout}/.venv/bin/python"
fi
exec "${MUON_PYTHON}" "$@"
