#!/usr/bin/env bash
# Runs Python tests (tests/python) against an AddressSanitizer + UBSan build of
# libmuon.so: `bazel build --config=asan //:libmuon.so`, ASan's runtime
# preloaded into the interpreter (it must come first in the process, and
# CPython is not built with it), MUON_LIBRARY pointing at that build. Covers
# the C API as Python drives it: ctypes arguments, Python communicators and
# custom-path callbacks called back from the library, faults injected at every
# collective, checkpoints, and torch.distributed ranks (gloo) in processes.
#
# Leak checking is off: CPython and torch keep allocations for the life of the
# process by design (libmuon's own leaks are checked by the C/C++ tests under
# --config=asan). libstdc++ is preloaded too: the interpreter does not link it,
# and ASan must find its __cxa_throw when it starts, or the first C++ exception
# (torch's, or libmuon's caught std::bad_alloc) stops the process.
# PYTHONMALLOC=malloc puts Python's own small objects (bytes, ctypes buffers
# handed to the library) on ASan's heap instead of CPython's arenas.
#
# Prints one line per test, "//tests/python:<name> (asan) PASSED in <s>s" (or
# FAILED / TIMEOUT, with the test's output before it), and exits nonzero if any
# failed.
#
#   bash tools/asan_python.sh                       # the set below
#   bash tools/asan_python.sh parity_test fault_test
set -uo pipefail
cd "$(dirname "$0")/.."

tests=(
  errors_test         # every refusal of the C API, through ctypes
  checkpoint_test     # save, resume bit for bit
  lowlevel_dist_test  # ranks as Python threads: in-process adapter, Python communicator
  fault_test          # faults at every collective through Python communicators and callbacks
  parity_test         # against an independent reference Muon, fp32 and bf16/fp16
  dist_layouts_test   # torch.distributed (gloo, 4 processes), every layout
)
[ $# -gt 0 ] && tests=("$@")
per_test_timeout="${MUON_ASAN_PYTHON_TIMEOUT:-900}"

bazel build --noshow_progress --config=asan //:libmuon.so \
  //muon/comm/testing:libmuon_conformance.so || exit 1
bin="$(bazel info --config=asan bazel-bin 2>/dev/null)" || exit 1
lib="${bin}/libmuon.so"
if ! readelf -d "$lib" | grep -q 'NEEDED.*libasan'; then
  echo "asan_python: ${lib} is not an AddressSanitizer build" >&2
  exit 1
fi
preload=""
for so in libasan.so libstdc++.so.6; do
  path="$(g++ -print-file-name="$so")"
  if [[ "$path" != /* || ! -e "$path" ]]; then
    echo "asan_python: g++ does not know ${so} (Debian: libasan8, libstdc++6)" >&2
    exit 1
  fi
  preload="${preload:+${preload} }${path}"
done

export MUON_LIBRARY="$lib"
export MUON_CONFORMANCE_LIBRARY="${bin}/muon/comm/testing/libmuon_conformance.so"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONMALLOC=malloc

rc=0
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for t in "${tests[@]}"; do
  start=$(date +%s)
  # -s: a process stopped by ASan never hands pytest's captured output back.
  LD_PRELOAD="$preload" timeout "$per_test_timeout" bash tests/python/run_python.sh \
    -m pytest -q -s -p no:cacheprovider "tests/python/${t}.py" >"$out" 2>&1
  status=$?
  took=$(( $(date +%s) - start ))
  if [ "$status" -eq 0 ]; then
    echo "//tests/python:${t} (asan) PASSED in ${took}s"
  else
    cat "$out"
    verdict=FAILED
    [ "$status" -eq 124 ] && verdict=TIMEOUT
    echo "//tests/python:${t} (asan) ${verdict} in ${took}s"
    rc=1
  fi
done
exit "$rc"
