"""The house's rule on function length: no function of the C++ library's
non-test sources (muon/ and capi/, without *_test.cc and testing/ folders)
is longer than MAX_LINES lines, from the first line of its declaration
(its template line, if any, but not the comment above it) to its closing
brace. Comments, strings and lambdas inside a function count toward it.
Each function over the limit is printed as `path:line: name is N lines (at
most MAX_LINES)` and the script exits 1; it prints nothing and exits 0 when
all hold.

  python3 tools/check_functions.py [--report [N]] [file ...]

--report also prints the N longest functions (default 5), longest first.
Files default to the tracked and new (not ignored) sources under muon/ and
capi/.

The sources are read without a compiler: comments, string and character
literals (raw strings too) and preprocessor lines are blanked first, then
braces are matched. A brace at namespace or class level opens a function
body when what precedes it since the last `;`, `{` or `}` ends in a
parameter list (with qualifiers, a trailing return type or a constructor's
initializer list after it); braces inside a parameter list or an
initializer list are part of the declaration; any other brace opens a
scope (namespace, class, extern "C") or an initializer, whose functions,
if any, are looked for inside it."""
import os
import re
import subprocess
import sys

MAX_LINES = 120
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUFFIXES = (".cc", ".h", ".cu", ".cuh")


def blank(text):
    """`text` with what it holds replaced by spaces, its newlines kept."""
    return re.sub(r"[^\n]", " ", text)


def strip(src):
    """The source with comments, literals and preprocessor lines blanked
    (a literal keeps its quotes, so that it stays one token), every newline
    in place: line numbers are the source's."""
    out = []
    i, n = 0, len(src)
    line_start = True  # only whitespace since the last newline
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = i
            while True:  # a backslash at the end continues the comment
                k = src.find("\n", j)
                if k < 0:
                    j = n
                    break
                if src[k - 1] == "\\" or (src[k - 1] == "\r" and src[k - 2] == "\\"):
                    j = k + 1
                    continue
                j = k
                break
            out.append(blank(src[i:j]))
            i = j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(src[i:j]))
            i = j
            continue
        if c == "#" and line_start:
            j = i
            while j < n and src[j] != "\n":  # to the end of the line, continuations too
                if src.startswith("/*", j):
                    k = src.find("*/", j + 2)
                    j = n if k < 0 else k + 2
                elif src.startswith("//", j):
                    break
                elif src[j] == "\\" and src[j + 1 : j + 2] == "\n":
                    j += 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
            continue
        if c in "\"'":
            k = i
            while k > 0 and (src[k - 1].isalnum() or src[k - 1] in "_.'"):
                k -= 1
            prefix = src[k:i]
            if c == "'" and prefix[:1].isdigit():
                out.append(c)  # a digit separator (1'000'000)
                i += 1
                continue
            if c == '"' and prefix in ("R", "u8R", "uR", "UR", "LR"):
                m = re.compile(r'"([^()\\\s]{0,16})\(').match(src, i)
                if m:
                    end = ")" + m.group(1) + '"'
                    j = src.find(end, m.end())
                    j = n if j < 0 else j + len(end)
                    out.append('"' + blank(src[i + 1 : j - 1]) + '"')
                    i = j
                    continue
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + blank(src[i + 1 : j - 1]) + c if j - i >= 2 else c)
            i = j
            line_start = False
            continue
        out.append(c)
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        i += 1
    return "".join(out)


ACCESS = re.compile(r"^\s*(?:(?:public|private|protected)\s*:(?!:)\s*)+")
# What may follow a function's parameter list before its body: qualifiers,
# attributes, a trailing return type.
QUALIFIERS = re.compile(
    r"\)(?:\s*(?:const|volatile|noexcept|override|final|mutable|constexpr|&&?|"
    r"noexcept\s*\(.*\)|throw\s*\(.*\)|__attribute__\s*\(\(.*\)\)|\[\[.*\]\]))*"
    r"\s*(?:->\s*[^{;]*)?$",
    re.S,
)
NAME = re.compile(
    r"((?:[\w~]+(?:<[^()]*>)?::)*(?:operator\s*(?:\(\)|\[\]|[^\s(]+)|~?\w+))\s*$")


def matching(s, i):
    """The index just past the brace that closes s[i] (a `{`)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def init_list_start(header):
    """Where a constructor's initializer list starts in `header` (the index
    of its `:`), or -1: a single colon after the closing parenthesis of the
    parameter list (qualifiers between)."""
    depth = 0
    for j, c in enumerate(header):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                m = re.match(r"(?:\s*(?:noexcept|const|constexpr))*\s*:(?!:)", header[j + 1 :])
                if m:
                    return j + m.end()
    return -1


def declaration(header):
    """`header` without the access specifiers before it and a constructor's
    initializer list after it."""
    h = header[ACCESS.match(header).end() :] if ACCESS.match(header) else header
    at = init_list_start(h)
    return h[: at - 1] if at >= 0 else h


def is_function(header):
    """Whether a brace after `header` (at namespace or class level) opens a
    function body: the declaration ends in a parameter list and what may
    follow one (`struct S {`, `namespace {`, `extern "C" {` and `x = {`
    do not)."""
    h = declaration(header).strip()
    return ")" in h and not h.endswith("=") and bool(QUALIFIERS.search(h))


def name_of(header):
    """The function's name as its declaration gives it (`Class::Method`)."""
    h = re.sub(r"\s+", " ", declaration(header).strip())
    h = re.sub(r"\)\s*->.*$", ")", h)
    depth = 0
    for j in range(h.rfind(")"), -1, -1):  # back to the parameter list's `(`
        if h[j] == ")":
            depth += 1
        elif h[j] == "(":
            depth -= 1
            if depth == 0:
                m = NAME.search(h[:j])
                if m:
                    return m.group(1).replace(" ", "")
                return "(lambda)" if h[:j].rstrip().endswith("]") else h[:j][-40:]
    return h[-40:]


def functions(path, src=None):
    """(first line, last line, name) of every function defined in `path`
    (or in `src`, its text)."""
    if src is None:
        with open(path, encoding="utf-8", errors="replace") as f:
            src = f.read()
    s = strip(src)
    found = []
    func = None  # the function being read: [first line, name, open braces]
    header_from = 0  # where the declaration before the next brace starts
    paren = 0  # parentheses open in that declaration
    line = 1
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "\n":
            line += 1
        elif func is not None:  # blocks and lambdas: the function's
            if c == "{":
                func[2] += 1
            elif c == "}":
                func[2] -= 1
                if func[2] == 0:
                    found.append((func[0], line, func[1]))
                    func = None
                    header_from, paren = i + 1, 0
        elif c == "(":
            paren += 1
        elif c == ")":
            paren = max(0, paren - 1)
        elif c == ";" and paren == 0:
            header_from = i + 1
        elif c == "}":  # a namespace's, a class's or an initializer's end
            header_from, paren = i + 1, 0
        elif c == "{":
            header = s[header_from:i]
            if paren > 0 or (init_list_start(header) >= 0 and re.search(r"[\w>]\s*$", header)):
                # A brace in a parameter list (a default argument), or after
                # a name in an initializer list (a member's or a base's
                # braced initializer): part of the declaration.
                j = matching(s, i)
                line += s.count("\n", i, j)
                i = j
                continue
            if is_function(header):
                start = header_from
                m = ACCESS.match(header)
                if m:
                    start += m.end()
                while start < i and s[start].isspace():
                    start += 1
                func = [s.count("\n", 0, start) + 1, name_of(header), 1]
            else:  # a namespace, a class, an initializer: look inside
                header_from, paren = i + 1, 0
        i += 1
    return found


def sources():
    """The non-test sources of muon/ and capi/, tracked or new."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "muon", "capi"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return sorted(
        f for f in set(files)
        if f.endswith(SUFFIXES) and not f.endswith("_test.cc") and "/testing/" not in "/" + f
        and os.path.isfile(os.path.join(ROOT, f))
    )


def main(argv):
    report = 0
    args = list(argv)
    if args and args[0] == "--report":
        args.pop(0)
        report = int(args.pop(0)) if args and args[0].isdigit() else 5
    paths = [os.path.relpath(os.path.abspath(p), ROOT) for p in args]
    os.chdir(ROOT)
    paths = paths or sources()
    every = []
    for path in paths:
        for first, last, name in functions(path):
            every.append((last - first + 1, path, first, name))
    broken = 0
    for length, path, first, name in sorted(every, key=lambda e: (e[1], e[2])):
        if length > MAX_LINES:
            print(f"{path}:{first}: {name} is {length} lines (at most {MAX_LINES})")
            broken = 1
    if report:
        every.sort(key=lambda e: (-e[0], e[1], e[2]))
        print(f"the {min(report, len(every))} longest of {len(every)} functions "
              f"(at most {MAX_LINES} lines):")
        for length, path, first, name in every[:report]:
            print(f"  {length:4d}  {path}:{first}  {name}")
    return broken


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
