#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (-fsanitize=fuzzer,address,undefined,
# -O1 -g) straight from the sources each needs, then runs each for a bounded time
# over a temporary copy of its seed corpus (fuzz/corpus/<target>/, left untouched).
#
#   bash tools/fuzz.sh [seconds_per_target] [target ...]   (default: 30 s, every target)
#   bash tools/fuzz.sh 0 [target ...]                        (build only: .fuzz-build/<target>)
#
# Prints "//fuzz:<target> PASSED" (with the executions libFuzzer reports) or
# "//fuzz:<target> FAILED" per target and exits 1 when any target failed to
# build or found a crash, a leak, undefined behaviour or a timeout; the input
# that did so is kept as fuzz-artifacts/<target>/crash-*. Objects are cached in
# .fuzz-build/ (rebuilt when a source or a header it includes changes).
# Environment: CXX (default clang++-14, else clang++), FUZZ_JOBS (parallel
# compiles), FUZZ_ARGS (extra libFuzzer flags).
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
shift || true
ALL_TARGETS=(state_blob_fuzzer api_sequence_fuzzer placement_fuzzer fault_fuzzer)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")

if [ -z "${CXX:-}" ]; then
  CXX=$(command -v clang++-14 || command -v clang++ || true)
fi
if [ -z "$CXX" ]; then
  echo "fuzz: clang++ not found (bash tools/deps.sh installs clang and libclang-rt-14-dev)" >&2
  for t in "${targets[@]}"; do echo "//fuzz:$t FAILED (no clang)"; done
  exit 1
fi

# ---- Sources, per target (the deps of the Bazel targets they stand for) ----
# The core below the engine: dtypes, tensors, the math and the host device.
COMMON_SRCS=(
  muon/common/dtype.cc muon/common/matrix_view.cc muon/common/tensor.cc
  muon/math/ns_config.cc muon/math/ns_program.cc muon/math/normuon.cc muon/math/split_blocks.cc muon/math/split_ns.cc muon/math/cpu/cpu_backend.cc muon/math/cpu/cpu_backend_aol.cc muon/math/cpu/cpu_backend_split.cc muon/math/cpu/gram_ns.cc muon/math/cpu/aol.cc
  muon/math/cpu/bf16_gemm.cc muon/math/cpu/bf16_kernels.cc muon/math/cpu/f32_gemm.cc muon/math/cpu/f32_products.cc muon/math/cpu/cpu_features.cc muon/math/cpu/cpu_kernels.cc muon/math/cpu/parallel.cc muon/math/cpu/blas_tiles.cc muon/math/cpu/cpu_threads.cc muon/math/cpu/native_bf16.cc muon/math/cpu/onednn_library.cc
  muon/device/device.cc muon/device/host_device.cc muon/device/memory_ops.cc
  muon/comm/callback_error.cc muon/comm/comm.cc
)
# The distributed logic (//muon/sharding:{layout,assignment,plan,handshake,exchange}).
SHARDING_SRCS=(
  muon/sharding/layout.cc muon/sharding/run_blocks.cc muon/sharding/assignment.cc muon/sharding/plan.cc
  muon/sharding/plan_units.cc muon/sharding/handshake.cc muon/sharding/handshake_wire.cc
  muon/comm/host_collectives.cc muon/sharding/exchange.cc
)
# libmuon.so's C entry points over the engine (//capi, as //:libmuon.so links it).
CAPI_SRCS=(
  "${COMMON_SRCS[@]}" "${SHARDING_SRCS[@]}"
  muon/comm/self_comm.cc muon/comm/ordered_sum.cc muon/comm/inprocess_comm.cc
  muon/comm/nccl_comm.cc muon/device/cuda_loader.cc
  muon/engine/checkpoint.cc muon/engine/custom_stepper.cc muon/engine/exchange_stepper.cc muon/engine/exchange_stepper_split.cc
  muon/engine/local_update.cc muon/engine/optimizer.cc muon/engine/step_outcome.cc muon/engine/optimizer_state.cc
  muon/engine/device_outcome.cc muon/engine/options.cc
  muon/engine/orthogonalize.cc muon/engine/outcome.cc muon/engine/param.cc
  muon/engine/pipeline.cc muon/engine/registry.cc muon/engine/setup.cc
  muon/engine/storage_index.cc muon/engine/owner_moments.cc muon/engine/qk_clip.cc
  muon/engine/optimizer_variants.cc
  muon/engine/state_restore.cc muon/engine/zero2_stepper.cc
  capi/capi_internal.cc capi/comm_capi.cc capi/convert.cc capi/muon_capi.cc
)
sources_of() {
  case "$1" in
    state_blob_fuzzer | api_sequence_fuzzer | fault_fuzzer) echo "fuzz/$1.cc ${CAPI_SRCS[*]}" ;;
    placement_fuzzer) echo "fuzz/$1.cc ${COMMON_SRCS[*]} ${SHARDING_SRCS[*]}" ;;
    *) return 1 ;;
  esac
}
ABSL_LIBS=(-labsl_statusor -labsl_status -labsl_cord -labsl_cord_internal -labsl_cordz_info
  -labsl_cordz_functions -labsl_cordz_handle -labsl_strings -labsl_strings_internal
  -labsl_str_format_internal -labsl_int128 -labsl_throw_delegate -labsl_raw_logging_internal
  -labsl_synchronization -labsl_time -labsl_base -labsl_spinlock_wait
  -labsl_raw_hash_set -labsl_hash -labsl_city -labsl_low_level_hash)
# oneDNN for native bf16 products; libgomp for the OpenMP thread count
# (cpu_threads.cc, compiled with -fopenmp=libgomp as GCC's -fopenmp would).
LIBS=("${ABSL_LIBS[@]}" -lopenblas -lz -lgomp -ldl -lpthread)

SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
CXXFLAGS=(-std=c++17 -O1 -g "${SAN[@]}" -fsanitize=fuzzer-no-link -I. -Iinclude -DMUON_FUZZING
  -Wno-unused-command-line-argument)

build=.fuzz-build
mkdir -p "$build/obj"

# Compiles one source to $build/obj unless its object is newer than it and
# than every header it included (the -MMD list).
compile() {
  local src=$1 obj="$build/obj/${1//\//_}.o"
  local dep="${obj%.o}.d"
  if [ -f "$obj" ] && [ -f "$dep" ]; then
    local stale=0 f
    for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep"); do
      [ "$f" -nt "$obj" ] && { stale=1; break; }
    done
    [ "$stale" -eq 0 ] && return 0
  fi
  local extra=()
  case "$src" in
    muon/math/cpu/cpu_threads.cc|muon/math/cpu/blas_tiles.cc|muon/math/cpu/bf16_gemm.cc|muon/math/cpu/f32_gemm.cc|muon/math/cpu/bf16_kernels.cc|muon/math/cpu/native_bf16.cc|muon/math/cpu/parallel.cc) extra=(-fopenmp=libgomp) ;;
    muon/math/cpu/cpu_kernels.cc) extra=(-ffp-contract=off) ;;
  esac
  "$CXX" "${CXXFLAGS[@]}" "${extra[@]}" -MMD -MF "$dep" -c "$src" -o "$obj"
}
export -f compile
export CXX build
export CXXFLAGS_STR="${CXXFLAGS[*]}"

all_srcs=()
for t in "${targets[@]}"; do
  srcs=$(sources_of "$t") || { echo "fuzz: unknown target $t" >&2; exit 2; }
  all_srcs+=($srcs)
done
jobs=${FUZZ_JOBS:-$(nproc)}
echo "fuzz: compiling $(printf '%s\n' "${all_srcs[@]}" | sort -u | wc -l) sources with $CXX"
if ! printf '%s\n' "${all_srcs[@]}" | sort -u |
  xargs -P "$jobs" -I{} bash -c 'CXXFLAGS=($CXXFLAGS_STR); compile "$@"' _ {}; then
  echo "fuzz: compilation failed" >&2
  for t in "${targets[@]}"; do echo "//fuzz:$t FAILED (build)"; done
  exit 1
fi

rc=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  objs=()
  for s in $(sources_of "$t"); do objs+=("$build/obj/${s//\//_}.o"); done
  bin="$build/$t"
  if ! "$CXX" "${SAN[@]}" -fsanitize=fuzzer -g "${objs[@]}" "${LIBS[@]}" -o "$bin"; then
    echo "//fuzz:$t FAILED (link)"
    rc=1
    continue
  fi
  if [ "$seconds" -eq 0 ]; then
    echo "fuzz: built $bin"
    continue
  fi
  # Runs over a copy of the seeds, so that new inputs stay out of the tree.
  corpus="$work/$t"
  mkdir -p "$corpus" "fuzz-artifacts/$t"
  [ -d "fuzz/corpus/$t" ] && cp -r "fuzz/corpus/$t/." "$corpus/"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  log="$work/$t.log"
  echo "fuzz: running $t for ${seconds}s"
  # One worker: the executions reported are those of this process.
  OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" "$corpus" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="fuzz-artifacts/$t/" "${dict[@]}" ${FUZZ_ARGS:-} \
    >"$log" 2>&1
  status=$?
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -1)
  if [ "$status" -eq 0 ]; then
    echo "//fuzz:$t PASSED (${execs:-?} executions in ${seconds}s, corpus $(ls "$corpus" | wc -l) inputs)"
    rmdir "fuzz-artifacts/$t" 2>/dev/null
  else
    tail -n 60 "$log"
    echo "//fuzz:$t FAILED (exit $status, ${execs:-?} executions; input in fuzz-artifacts/$t/)"
    rc=1
  fi
done
rmdir fuzz-artifacts 2>/dev/null
exit "$rc"
