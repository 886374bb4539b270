#!/usr/bin/env bash
# The GPU proof, on a machine with a GPU, from the repository root with the
# .gpu folder made by tools/gpu_bundle.sh (or .carry/gpu.tar.xz, that folder
# compressed, which this script unpacks): the CUDA backend's unit test, the
# GPU tests (parity with torch.optim.Muon and the CPU backend, ranks on one
# GPU, CUDA graphs, memory, no host wait), the benchmark table, the profile
# (tests/gpu/probes.py) and compute-sanitizer. Each stage has its own time
# limit, so one that hangs cannot take the others' time, and every output
# file is written as it goes to ${OUT:-.gpu/out}/ (a run cut off still
# leaves what it did).
#
#   bash tests/gpu/run_on_gpu.sh [STAGE...]   # no names: every stage, in order
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-.gpu/out}"
mkdir -p "$out"
if [ ! -d .gpu ] && [ -f .carry/gpu.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('.carry/gpu.tar.xz').extractall('.')"
fi

# CUDA's libraries: the toolkit's, or the ones torch's packages bring.
cuda_dirs="$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = set()
for sp in site.getsitepackages():
    for lib in glob.glob(os.path.join(sp, "nvidia", "**", "libcu*.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)"
export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MUON_LIBRARY="$PWD/.gpu/lib/libmuon.so"
export PYTHONPATH="$PWD/python"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export MUON_REQUIRE_GPU=1  # every GPU test's skip is a failure here
san="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
summary="$out/summary.txt"

# Before anything: a driver, a GPU, and every library the bundle needs.
preflight() {
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,power.limit --format=csv \
    || { echo "preflight: no driver or GPU (nvidia-smi)"; return 1; }
  local missing=0 f
  for f in .gpu/lib/libmuon.so .gpu/lib/libmuon_cuda.so .gpu/bin/cuda_backend_test \
      .gpu/bin/cuda_split_test .gpu/bin/ns_bench; do
    [ -e "$f" ] || { echo "preflight: $f is missing (tools/gpu_bundle.sh makes it)"; missing=1; continue; }
    if ldd "$f" | grep -q "not found"; then
      echo "preflight: $f has unresolved libraries:"; ldd "$f" | grep "not found"; missing=1
    fi
  done
  ldd .gpu/lib/libmuon_cuda.so | grep -E "cudart|cublas"
  echo "CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING-unset}; CPU: $(lscpu | sed -n 's/^Model name: *//p')"
  python3 -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "CUDA", torch.version.cuda, "sees a GPU:", ok); sys.exit(0 if ok else 1)' \
    || { echo "preflight: torch sees no GPU"; missing=1; }
  return $missing
}

# stage NAME LIMIT_S OUTFILE CMD...: runs CMD under its limit, appends its
# output to OUTFILE and one line (rc, seconds) to the summary.
status=0
stage() {
  local name=$1 limit=$2 file=$3; shift 3
  echo "== $name (limit ${limit}s)" | tee -a "$out/$file"
  local t0=$SECONDS rc
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$out/$file"
  rc=${PIPESTATUS[0]}
  local note=""
  [ "$rc" = 124 ] && note=" (timed out)"
  echo "$name rc=$rc$note in $((SECONDS - t0))s" | tee -a "$summary"
  [ "$rc" = 0 ] || status=1
  return "$rc"
}

want() { [ ${#stages[@]} = 0 ] || [[ " ${stages[*]} " == *" $1 "* ]]; }
stages=("$@")
export -f preflight
stage preflight 30 preflight.txt bash -c preflight || { echo "preflight failed: nothing was run"; exit 1; }
want cuda_backend_test && stage cuda_backend_test 60 tests.txt .gpu/bin/cuda_backend_test
want cuda_split_test && stage cuda_split_test 30 tests.txt .gpu/bin/cuda_split_test
# pytest-timeout may be missing there; the stage's own limit still holds.
per_test=(); python3 -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout 60)
want gpu_test && stage gpu_test 140 tests.txt \
  python3 -m pytest -q -rs -s -p no:cacheprovider "${per_test[@]}" tests/gpu/gpu_test.py
want bench && stage bench 190 bench.md \
  python3 tests/gpu/bench_gpu.py --ns-bench .gpu/bin/ns_bench --iters 5
want profile && stage profile 50 profile.txt python3 tests/gpu/probes.py profile
# (not the test that makes a cudaMalloc fail on purpose: memcheck reports
# that call; nor the Gram sweep, whose kernels the tiles' test runs too)
want memcheck && stage memcheck 50 sanitizer.txt \
  "$san" --tool memcheck --leak-check no --error-exitcode 3 .gpu/bin/cuda_backend_test \
  --gtest_filter=-CudaBackend.AnErrorPendingBeforeALaunchIsLeftForItsCaller:*GramNewtonSchulzMatchesCpu
want racecheck && stage racecheck 30 sanitizer.txt \
  "$san" --tool racecheck --error-exitcode 3 .gpu/bin/ns_bench --iters 1 --tiles 2 2x64x96
cat "$summary"
exit $status
