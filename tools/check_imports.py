"""The house's import rule for the Python package python/muon: each module
has a level, and imports (at module level, inside a function, or for type
checkers under `if TYPE_CHECKING:`) only modules of lower levels, so the
package's modules form layers with no cycle. A module
missing from LEVELS, or an import upward or sideways, is printed and the
script exits 1; it prints nothing when all hold."""
import ast
import os
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "muon")

# Lowest first: the ctypes declarations, then the low level that mirrors the
# C ABI, then the torch layer, then the framework adapters, then the package.
LEVELS = {
    "_lib": 0,              # loads libmuon.so, declares the C ABI
    "_errors": 1,           # MuonError, status checks
    "_tensor": 1,           # numpy/torch tensors as DLTensors
    "_flat": 1,             # FSDP1/ZeRO flat ranges (no muon import)
    "_megatron_attrs": 1,   # Megatron-core's param attributes and parallel_state, read
    "_allocator": 1,        # TorchAllocator: torch's allocators for the library's memory
    "_options": 1,          # muon_options_t / muon_param_options_t from Python values
    "_comm": 2,             # placements, Python communicators
    "_optimizer_state": 2,  # muon.Optimizer's state and QK-Clip methods
    "_optimizer_pending": 2,  # muon.Optimizer's splits and views given before registration
    "_callbacks": 3,        # Python callables as the library's C callbacks
    "_dist": 3,             # torch.distributed communicators
    "_optimizer_comms": 3,  # muon.Optimizer's communicators
    "_optimizer": 4,        # muon.Optimizer (the C ABI's mirror)
    "_base_config": 5,      # DistributedConfigBase: the protocol muon.Muon drives
    "_group_options": 5,    # muon.Muon's param-group options, checked
    "_newton_schulz": 5,    # zeropower_via_newtonschulz
    "_config": 6,           # DistributedConfig
    "_library_groups": 6,   # muon.Muon's library optimizer per param group
    "_torch_state": 6,      # muon.Muon's state_dict, load_state_dict, copies
    "_pg_job": 6,           # one collective attach of a process-group config
    "_dtensor_config": 7,   # create_dtensor_config
    "_pg_functions": 7,     # processgroup_*_fn, the process-group configs' custom path
    "_torch": 7,            # muon.Muon
    "_pg_layout": 8,        # a process-group config's layout, read at attach
    "_pg_config": 9,        # create_processgroup_config and its kin
    "megatron": 10,
    "deepspeed": 10,
    "torchtitan": 10,
    "transformers": 11,     # (the DeepSpeed adapter below it)
    "__init__": 12,
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
