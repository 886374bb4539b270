#!/bin/bash
# Runs examples/demo and checks what it prints.
# Usage: demo_test.sh <path to the demo binary>
set -euo pipefail

out="$("$1")" || { echo "FAIL: demo exited with status $?" >&2; exit 1; }
echo "$out"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The per-rank table: rank, tp, fsdp, owned, orthogonalized, bytes sent,
# bytes received, collectives, rounds, NS MFLOP.
rows="$(awk '/^per rank, last step:$/ {on = 1; next} on && /^ *[0-9]+ / {print} on && /^$/ {on = 0}' <<<"$out")"
[[ "$(wc -l <<<"$rows")" == 4 ]] || fail "expected one stats line for each of the 4 ranks"
total="$(sed -n 's/^matrices in the job: \([0-9]*\);.*/\1/p' <<<"$out")"
[[ "$total" == 9 ]] || fail "expected 9 matrices in the job, got '$total'"
awk -v total="$total" '
  {
    if ($2 != $1 % 2 || $3 != int($1 / 2)) { print "rank " $1 ": wrong mesh coordinates"; bad = 1 }
    if ($4 != $5) { print "rank " $1 ": owns " $4 " matrices but orthogonalized " $5; bad = 1 }
    if ($6 <= 0 || $7 <= 0) { print "rank " $1 ": sent or received nothing"; bad = 1 }
    if ($8 < 2 || $9 < 1) { print "rank " $1 ": expected a gather and a scatter per round"; bad = 1 }
    if ($4 > 0 && $10 <= 0) { print "rank " $1 ": owns matrices but computed no FLOPs"; bad = 1 }
    owned += $4; sent += $6; received += $7
  }
  END {
    if (owned != total) { print "owned matrices add up to " owned ", not " total; bad = 1 }
    if (sent != received) { print "bytes sent (" sent ") != bytes received (" received ")"; bad = 1 }
    exit bad
  }' <<<"$rows" || fail "the per-rank stats are inconsistent"
grep -q "(each once: yes)$" <<<"$out" || fail "some matrix was not orthogonalized exactly once"
tail -n 1 <<<"$out" | grep -qx 'matches single-process Muon: yes' ||
  fail "the last line is not 'matches single-process Muon: yes'"
echo "demo_test: OK"
