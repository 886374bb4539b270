#!/bin/bash
# The shared library exports the C API and nothing else, every function the
# header declares is exported, the SONAME is right, and (optionally) no
# dependency matches a forbidden pattern.
#
# Usage: symbols_test.sh <library> <header> [<soname> [<minimum functions>
#                        [<forbidden NEEDED regex>]]]
# Defaults: libmuon.so.1, 20, none.
set -euo pipefail

lib="$1"
header="$2"
want_soname="${3:-libmuon.so.1}"
min_functions="${4:-20}"
forbidden_needed="${5:-}"
fail=0

for tool in nm readelf; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: $tool (binutils) is not on PATH" >&2
    exit 1
  fi
done

defined="$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' | sort -u)"
if [[ -z "$defined" ]]; then
  echo "FAIL: nm -D found no defined dynamic symbols in $lib" >&2
  exit 1
fi

# 1. Only muon_* leaves the library.
stray="$(grep -v '^muon_' <<<"$defined" || true)"
if [[ -n "$stray" ]]; then
  echo "FAIL: $lib exports symbols outside the muon_ namespace:" >&2
  sed 's/^/  /' <<<"$stray" >&2
  fail=1
fi

# 2. Every MUON_API function of the header is exported (as code).
# The header and the sections it includes (#include "libmuon/muon_<name>.h",
# read from the header's own folder; muon_mpi.h's include of muon.h is not a
# section).
header_text() {
  cat "$1"
  local section
  for section in $(grep -o '^#include "libmuon/muon_[a-z_]*\.h"' "$1" | cut -d/ -f2 | tr -d '"'); do
    header_text "$(dirname "$1")/$section"
  done
}
declared="$(header_text "$header" | grep '^MUON_API ' | grep -o 'muon_[a-z0-9_]*(' | tr -d '(' | sort -u)"
n_declared="$(grep -c . <<<"$declared" || true)"
if (( n_declared < min_functions )); then
  echo "FAIL: found only $n_declared MUON_API functions in $header; is the scan broken?" >&2
  fail=1
fi
functions="$(nm -D --defined-only "$lib" | awk 'NF >= 3 && $2 == "T" { print $3 }' | sed 's/@.*//')"
while read -r name; do
  if ! grep -qx "$name" <<<"$functions"; then
    echo "FAIL: $name is declared in $(basename "$header") but not exported as a function" >&2
    fail=1
  fi
done <<<"$declared"

# And nothing is exported that the header does not declare.
while read -r name; do
  if ! grep -qx "$name" <<<"$declared"; then
    echo "FAIL: $name is exported but not declared in $(basename "$header")" >&2
    fail=1
  fi
done <<<"$defined"

# 3. SONAME.
soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')"
if [[ "$soname" != "$want_soname" ]]; then
  echo "FAIL: SONAME is '$soname', expected $want_soname" >&2
  fail=1
fi

# 4. Dependencies it must not have (libmuon.so: no MPI, NCCL or CUDA runtime).
needed="$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')"
if [[ -z "$needed" ]]; then
  echo "FAIL: readelf found no NEEDED entries in $lib" >&2
  fail=1
fi
if [[ -n "$forbidden_needed" ]]; then
  bad="$(grep -E "$forbidden_needed" <<<"$needed" || true)"
  if [[ -n "$bad" ]]; then
    echo "FAIL: $lib depends on:" >&2
    sed 's/^/  /' <<<"$bad" >&2
    fail=1
  fi
fi

if (( fail )); then
  exit 1
fi
echo "symbols_test: $n_declared functions exported, nothing else; SONAME $soname"
