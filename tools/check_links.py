"""The house's link rule: every relative link in the tracked Markdown files
names a file that exists, and every #anchor a heading of that file (GitHub's
slugs). Prints each broken link and exits 1; prints nothing when all hold."""
import functools
import os
import re
import subprocess
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
    found, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                found.add(slug(line.lstrip("#")))
    return found


def links(path):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                yield n, target


def main():
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                            "*.md"], capture_output=True, text=True, check=True).stdout.split()
    broken = 0
    for md in files:
        if not os.path.exists(md):
            continue
        for n, target in links(md):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(dest):
                print("%s:%d: link to %s: no such file" % (md, n, target))
                broken += 1
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                print("%s:%d: link to %s: no such heading" % (md, n, target))
                broken += 1
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
