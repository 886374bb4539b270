"""The house's import rule for the Python package python/muon: each module
has a level, and imports (at module level or inside a function) only modules
of lower levels, so the package's modules form layers with no cycle. A module
missing from LEVELS, or an import upward or sideways, is printed and the
script exits 1; it prints nothing when all hold."""
import ast
import os
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "muon")

# Lowest first: the ctypes declarations, then the low level that mirrors the
# C ABI, then the torch layer, then the framework adapters, then the package.
LEVELS = {
    "_lib": 0,            # loads libmuon.so, declares the C ABI
    "_errors": 1,         # MuonError, status checks
    "_tensor": 1,         # numpy/torch tensors as DLTensors
    "_flat": 1,           # FSDP1/ZeRO flat ranges (no muon import)
    "_comm": 2,           # placements, Python communicators
    "_optimizer": 3,      # muon.Optimizer (the C ABI's mirror)
    "_dist": 3,           # torch.distributed communicators
    "_config": 4,         # DistributedConfig
    "_newton_schulz": 4,  # zeropower_via_newtonschulz
    "_torch": 4,          # muon.Muon
    "_dtensor_config": 5,
    "_pg_config": 6,
    "megatron": 7,
    "deepspeed": 7,
    "__init__": 8,
}


def imported(tree):
    """(line, module) for every import of a sibling module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                yield node.lineno, node.module.split(".")[0]
            elif node.level == 1:
                for alias in node.names:
                    yield node.lineno, alias.name
            elif node.level == 0 and node.module and node.module.split(".")[0] == "muon":
                parts = node.module.split(".")
                if len(parts) > 1:
                    yield node.lineno, parts[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "muon" and len(parts) > 1:
                    yield node.lineno, parts[1]


def main():
    broken = 0
    for name in sorted(os.listdir(PACKAGE)):
        if not name.endswith(".py"):
            continue
        module = name[:-3]
        path = os.path.join("python", "muon", name)
        if module not in LEVELS:
            print("%s: not in tools/check_imports.py's LEVELS: give it a level" % path)
            broken += 1
            continue
        with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for line, target in imported(tree):
            if target not in LEVELS:
                continue  # not a module of the package (a name from __init__)
            if LEVELS[target] >= LEVELS[module]:
                print("%s:%d: %s (level %d) imports %s (level %d): only lower levels" % (
                    path, line, module, LEVELS[module], target, LEVELS[target]))
                broken += 1
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
