#!/usr/bin/env bash
# The wheel as a user gets it: built by tools/build_wheel.sh, installed with pip
# into a fresh virtual environment (numpy at the pinned version, no torch),
# then imported and stepped from outside the repository. Prints
# "//tools:wheel_check PASSED" or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/muon_wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
wheel=$(bash tools/build_wheel.sh "$tmp/wheelhouse")
/usr/bin/python3 -m venv "$tmp/venv"
numpy=$(grep -E '^numpy==' tools/python-requirements.txt)
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$numpy" "$wheel"
cd "$tmp"
env -u MUON_LIBRARY -u PYTHONPATH "$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import os, sys
import numpy
import muon
venv = sys.argv[1]
assert muon.__file__.startswith(venv), muon.__file__
assert muon.library_path.startswith(os.path.dirname(muon.__file__)), muon.library_path
assert "torch" not in sys.modules
w = numpy.random.default_rng(0).standard_normal((8, 5)).astype(numpy.float32)
g = numpy.ones_like(w)
start = w.copy()
with muon.Optimizer(lr=0.02, ns_dtype="fp32") as opt:
    opt.register(w, g, name="w")
    opt.step()
assert numpy.isfinite(w).all() and not numpy.array_equal(w, start)
print("wheel stepped: libmuon %s from %s" % (muon.__version__, muon.library_path))
print("//tools:wheel_check PASSED")
PY
