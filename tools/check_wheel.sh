#!/usr/bin/env bash
# The wheel as a user gets it: built by tools/build_wheel.sh, installed with pip
# into a fresh virtual environment (numpy at the pinned version, no torch),
# then imported and stepped from outside the repository, with Debian's Abseil,
# OpenBLAS, oneDNN, libgomp, libgfortran and libquadmath hidden (a user
# namespace binds an empty file over each, so loading one fails). Prints
# "//tools:wheel_check PASSED" or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/muon_wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
wheel=$(bash tools/build_wheel.sh "$tmp/wheelhouse")
case "$(basename "$wheel")" in
  libmuon-*-py3-none-manylinux_2_*_x86_64.whl) echo "wheel: $(basename "$wheel")" ;;
  *) echo "wheel_check: $(basename "$wheel") has no manylinux tag" >&2; exit 1 ;;
esac
PATH="$PWD/.venv/bin:$PATH" .venv/bin/auditwheel show "$wheel" >"$tmp/show" 2>&1
# The symbol versions allow manylinux. (auditwheel calls the whole wheel
# linux_x86_64 when the CUDA plugin is inside: its CUDA runtime and cuBLASLt
# stay outside the policy on purpose, as in torch's wheels.)
grep -q 'constrains the platform tag to "manylinux_2_' "$tmp/show" || {
  cat "$tmp/show" >&2; echo "wheel_check: auditwheel does not see a manylinux wheel" >&2; exit 1; }
/usr/bin/python3 -m venv "$tmp/venv"
numpy=$(grep -E '^numpy==' tools/python-requirements.txt)
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$numpy" "$wheel"

# The files to hide: every Debian copy of the libraries the wheel bundles or
# opens on request.
hide=()
while IFS= read -r f; do hide+=("$(readlink -f "$f")"); done < <(
  find /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu -name 'libabsl_*.so*' -o \
    -name 'libopenblas*.so*' -o -name 'libdnnl.so*' -o -name 'libgomp.so*' -o \
    -name 'libgfortran.so*' -o -name 'libquadmath.so*' 2>/dev/null)
mapfile -t hide < <(printf '%s\n' "${hide[@]}" | sort -u)
[ ${#hide[@]} -gt 0 ] || { echo "wheel_check: found no Debian libraries to hide" >&2; exit 1; }
if ! unshare -rm true 2>/dev/null; then
  echo "wheel_check: 'unshare -rm' is refused here, so Debian's libraries cannot be hidden;" \
       "the check needs user namespaces (sysctl kernel.unprivileged_userns_clone=1)" >&2
  exit 1
fi
printf '%s\n' "${hide[@]}" >"$tmp/hidden"
cd "$tmp"
# In the namespace: hide, prove the hiding holds, then run as a user would.
env -u MUON_LIBRARY -u PYTHONPATH -u MUON_CPU_BF16 unshare -rm bash -c '
  set -euo pipefail
  while IFS= read -r f; do mount --bind /dev/null "$f"; done <"$1/hidden"
  exec "$1/venv/bin/python" - "$1/venv" "$(wc -l <"$1/hidden")"' _ "$tmp" <<'PY'
import ctypes, importlib.metadata, os, sys
venv, hidden = sys.argv[1], int(sys.argv[2])
for name in ("libopenblas.so.0", "libabsl_strings.so.20220623", "libdnnl.so.2"):
    try:
        ctypes.CDLL(name)
    except OSError:
        continue
    raise SystemExit("wheel_check: %s still loads, so the hiding does not hold" % name)
print("hidden: %d Debian library files (Abseil, OpenBLAS, oneDNN, gomp, gfortran, quadmath)"
      % hidden)
import numpy
import muon
# The import name: the distribution is libmuon, the package it installs is muon.
dist = importlib.metadata.distribution("libmuon")
assert "muon/__init__.py" in {str(f) for f in dist.files}, "libmuon does not install muon/"
assert "muon/py.typed" in {str(f) for f in dist.files}, "the wheel lacks muon/py.typed"
assert dist.version == muon.__version__, (dist.version, muon.__version__)
assert muon.__file__.startswith(venv), muon.__file__
assert muon.library_path.startswith(os.path.dirname(muon.__file__)), muon.library_path
assert "torch" not in sys.modules
for ns_dtype in ("fp32", "bf16"):
    w = numpy.random.default_rng(0).standard_normal((8, 5)).astype(numpy.float32)
    g = numpy.ones_like(w)
    start = w.copy()
    with muon.Optimizer(lr=0.02, ns_dtype=ns_dtype) as opt:
        opt.register(w, g, name="w")
        opt.step()
    assert numpy.isfinite(w).all() and not numpy.array_equal(w, start), ns_dtype
# oneDNN is opened only when asked for; asked for here, where it is hidden, the
# step fails naming what to do, and the matrix is unchanged.
os.environ["MUON_CPU_BF16"] = "onednn"
w = numpy.ones((8, 5), numpy.float32)
try:
    with muon.Optimizer(lr=0.02, ns_dtype="bf16") as opt:
        opt.register(w, numpy.ones_like(w), name="w")
        opt.step()
except muon.MuonError as e:
    assert "MUON_CPU_BF16" in str(e), e
    print("oneDNN asked for and hidden:", str(e).splitlines()[0][:160])
else:
    raise SystemExit("wheel_check: MUON_CPU_BF16=onednn stepped with oneDNN hidden")
assert (w == 1).all(), "a failed step changed the matrix"
print("wheel stepped (fp32, bf16): libmuon %s from %s" % (muon.__version__, muon.library_path))
print("//tools:wheel_check PASSED")
PY
