#!/bin/bash
# Runs examples/c/quickstart and checks what it prints.
# Usage: quickstart_test.sh <path to the quickstart binary>
set -euo pipefail

out="$("$1")" || { echo "FAIL: quickstart exited with status $?" >&2; exit 1; }
echo "$out"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

grep -q '^registered encoder.weight \[32 x 96\] as param 0$' <<<"$out" ||
  fail "encoder.weight was not registered as param 0"
grep -q '^registered decoder.weight \[96 x 32\] as param 1$' <<<"$out" ||
  fail "decoder.weight was not registered as param 1"
grep -q "^registering a bias: INVALID_ARGUMENT (.*'encoder.bias'.*AdamW" <<<"$out" ||
  fail "the 1-D parameter was not refused with a message naming it"
[[ "$(grep -c '^step ' <<<"$out")" == 10 ]] || fail "expected 10 step lines"
tail -n 1 <<<"$out" | grep -qx 'done' || fail "the last line is not 'done'"

# The loss goes down at every step, and by a fair amount overall.
awk '/^step / {
       loss = $4 + 0
       if (!(loss == loss) || loss < 0) { print "bad loss at step " $2; bad = 1 }
       if (n > 0 && loss >= prev) { print "loss did not decrease at step " $2; bad = 1 }
       if (n == 0) first = loss
       prev = loss; n++
     }
     END {
       if (n == 0) { print "no steps"; exit 1 }
       if (!(prev < 0.9 * first)) { print "loss went from " first " to " prev; bad = 1 }
       exit bad
     }' <<<"$out" || fail "the loss does not decrease"
echo "quickstart_test: OK"
