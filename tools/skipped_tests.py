"""Lists the tests of the last `bazel test` run that ran nothing: every case
skipped (a GPU test where no GPU is). Bazel reports such a target PASSED;
tools/test.sh counts them apart, so that a run where a test ran nothing is
never counted as a pass. Prints "//<target> SKIPPED (<reason>)" per target,
and "//<target> PARTLY SKIPPED (...)" where some cases ran."""

import os
import re
import sys


def summarize(text):
    """(ran, skipped, reason) of one test log (gtest or pytest)."""
    ran = skipped = 0
    reason = ""
    m = re.search(r"^\[  PASSED  \] (\d+) test", text, re.M)
    if m:
        ran += int(m.group(1))
    m = re.search(r"^\[  SKIPPED \] (\d+) test", text, re.M)
    if m:
        skipped += int(m.group(1))
    m = re.search(r"^\[  FAILED  \] (\d+) test", text, re.M)
    if m:
        ran += int(m.group(1))
    for m in re.finditer(r"^=*\s*(.*?\b(?:passed|failed|skipped)\b.*?) in [\d.]+s", text, re.M):
        for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", m.group(1)):
            if kind == "skipped":
                skipped += int(n)
            else:
                ran += int(n)
    m = re.search(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", text, re.M) or re.search(
        r"^\S+: Skipped\n(.*)$", text, re.M) or re.search(r"GTEST_SKIP|Skipped\n(.*)", text)
    if m and m.groups():
        reason = m.group(1).strip()
    return ran, skipped, reason


def main(root):
    found = 0
    for dirpath, _, files in os.walk(root, followlinks=True):
        if "test.log" not in files:
            continue
        with open(os.path.join(dirpath, "test.log"), errors="replace") as f:
            text = f.read()
        ran, skipped, reason = summarize(text)
        if skipped == 0:
            continue
        rel = os.path.relpath(dirpath, root)
        pkg, name = os.path.split(rel)
        target = "//%s:%s" % (pkg, name)
        if ran == 0:
            print("%s SKIPPED (%s)" % (target, reason or "every case skipped"))
            found += 1
        else:
            print("%s PARTLY SKIPPED (%d of %d cases: %s)" % (target, skipped, ran + skipped,
                                                            reason or "see its log"))
    return found


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs")
