#!/usr/bin/env bash
# The GPU proof, on a machine with a GPU, from the repository root with the
# .gpu folder made by tools/gpu_bundle.sh: the CUDA backend's unit test, the
# GPU tests (parity with torch.optim.Muon and the CPU backend, ranks on one
# GPU, CUDA graphs, memory) and the benchmark table. Writes what it printed
# to ${OUT:-.gpu/out}/ as well.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-.gpu/out}"
mkdir -p "$out"

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
export PYTHONPATH="$PWD/capi/python"
export PYTHONUNBUFFERED=1
export MUON_REQUIRE_GPU=1  # every GPU test's skip is a failure here

# Before anything: a driver, a GPU, and every library the bundle needs.
preflight() {
  nvidia-smi -L >"$out/gpu.txt" 2>&1 || { cat "$out/gpu.txt"; echo "preflight: no driver or GPU (nvidia-smi)"; return 1; }
  cat "$out/gpu.txt"
  nvidia-smi --query-gpu=driver_version,compute_cap --format=csv,noheader
  local missing=0 f
  for f in .gpu/lib/libmuon.so .gpu/lib/libmuon_cuda.so .gpu/bin/cuda_backend_test .gpu/bin/ns_bench; do
    [ -e "$f" ] || { echo "preflight: $f is missing (tools/gpu_bundle.sh makes it)"; missing=1; continue; }
    if ldd "$f" | grep -q "not found"; then
      echo "preflight: $f has unresolved libraries:"; ldd "$f" | grep "not found"; missing=1
    fi
  done
  python3 -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "CUDA", torch.version.cuda, "sees a GPU:", ok); sys.exit(0 if ok else 1)' \
    || { echo "preflight: torch sees no GPU"; missing=1; }
  return $missing
}
if ! preflight; then
  echo "preflight failed: nothing was run"
  exit 1
fi

status=0
echo "== cuda_backend_test"
.gpu/bin/cuda_backend_test 2>&1 | tee "$out/cuda_backend_test.txt" || status=1
echo "== gpu_test.py"
python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu/gpu_test.py 2>&1 | tee "$out/gpu_test.txt" \
  || status=1
echo "== bench_gpu.py"
python3 tests/gpu/bench_gpu.py --ns-bench .gpu/bin/ns_bench "$@" 2>&1 | tee "$out/bench.md" \
  || status=1
exit $status
