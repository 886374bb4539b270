#!/usr/bin/env bash
# The house's rules (docs/ARCHITECTURE.md), checked on the tracked tree:
#   - no folder is named dist (packaging tools read such a folder as build output);
#   - nothing under muon/ includes capi/; inside muon/, only muon/comm/
#     includes the public headers (include/libmuon/), and they include only
#     the C library's, DLPack's and each other;
#   - no non-test source file under muon/, capi/ or include/, and no Python
#     file under python/, is over 600 lines, and the optimizer (a
#     coordinator) is under 400;
#   - no function of a non-test source under muon/ or capi/ is over 120
#     lines, its comments and lambdas included (tools/check_functions.py;
#     --report names the longest);
#   - the README is at most 250 lines (reference lives in docs/), and every
#     relative link of a Markdown file names a file and heading that exist;
#   - no file cites a DESIGN.md (the design documents are not in the tree);
#   - muon/sharding/ prices matrices from muon/math/ns_config.h, without the
#     backend interface (muon/math/backend.h);
#   - the Python package's modules import only lower layers
#     (tools/check_imports.py);
#   - the Python package type-checks (mypy from .venv, which tools/deps.sh
#     makes): its hints, public and internal, agree with the code.
# Prints "house rules: PASSED", or each broken rule and exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
broken=0
fail() { echo "house rules: $*"; broken=1; }

files=$(git ls-files --cached --others --exclude-standard)
if dirs=$(grep -E '(^|/)dist/' <<<"$files"); [ -n "$dirs" ]; then
  fail "a folder named dist: $(head -1 <<<"$dirs")"
fi
for f in $(grep -E '^muon/.*\.(h|cc|cu)$' <<<"$files"); do
  [ -f "$f" ] || continue
  grep -qE '#include "capi/' "$f" && fail "$f includes capi/ (nothing under muon/ may)"
  [[ "$f" != muon/comm/* ]] && grep -qE '#include "libmuon/' "$f" &&
    fail "$f includes libmuon/ (only muon/comm/ may)"
done
for f in $(grep -E '^include/.*\.h$' <<<"$files"); do
  [ -f "$f" ] || continue
  other=$(grep -E '^#include' "$f" | grep -vE '<(stddef|stdint)\.h>|<dlpack/dlpack\.h>|"libmuon/[a-z_]+\.h"')
  [ -n "$other" ] && fail "$f includes $other (include/ holds the C ABI: DLPack only)"
done
for f in $(grep -E '^(muon|capi|include)/.*\.(h|c|cc|cu)$|^python/.*\.py$' <<<"$files" |
           grep -vE '_test\.cc$|/testing/'); do
  [ -f "$f" ] || continue
  n=$(wc -l <"$f")
  [ "$n" -gt 600 ] && fail "$f has $n lines (at most 600)"
done
# tools/fuzz.sh compiles libmuon's host sources by hand: a new source must be
# listed there (or here, when the host library does not link it).
not_in_fuzz='^(capi/muon_mpi|muon/comm/mpi_comm|muon/device/gpu_device)\.cc$'
for f in $(grep -E '^(muon|capi)/.*\.cc$' <<<"$files" | grep -vE '_test\.cc$|/testing/|/cuda/'); do
  [ -f "$f" ] || continue
  grep -qE "$not_in_fuzz" <<<"$f" && continue
  grep -q "$f" tools/fuzz.sh || fail "$f is not among tools/fuzz.sh's sources"
done
n=$(wc -l <muon/engine/optimizer.cc)
[ "$n" -ge 400 ] && fail "muon/engine/optimizer.cc has $n lines (under 400: it coordinates)"
if cites=$(git grep -l 'DESIGN\.md' -- . ':!tools/check_layout.sh'); then
  fail "cites a DESIGN.md that is not in the tree: $(tr '\n' ' ' <<<"$cites")"
fi
if uses=$(git grep -l '#include "muon/math/backend.h"' -- 'muon/sharding/*.cc' 'muon/sharding/*.h' \
          ':!*_test.cc'); then
  fail "muon/sharding/ includes the backend interface: $(tr '\n' ' ' <<<"$uses")"
fi
n=$(wc -l <README.md)
[ "$n" -gt 250 ] && fail "README.md has $n lines (at most 250: move reference into docs/)"
python3 tools/check_links.py || fail "broken links (above)"
python3 tools/check_imports.py || fail "Python imports against the layers (above)"
python3 tools/check_functions.py || fail "functions over 120 lines (above)"
if [ -x .venv/bin/mypy ]; then
  .venv/bin/mypy --ignore-missing-imports --no-error-summary python/muon ||
    fail "the Python package's type hints (mypy, above)"
else
  fail "no .venv/bin/mypy to check the Python package's types: run tools/deps.sh"
fi
[ "$broken" -eq 0 ] && echo "house rules: PASSED"
exit "$broken"
