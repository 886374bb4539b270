"""muon.Optimizer's options as the C ABI's structs: the names of its enums, the
Newton-Schulz coefficient presets and tables, and split blocks, written into
muon_options_t and muon_param_options_t (include/libmuon/muon.h)."""

from __future__ import annotations

import ctypes
import operator
from typing import Sequence, Union

from . import _lib

# ns_coefficients: an (a, b, c) row for every iteration, a list of rows (row i
# for iteration i, the last reused), or a preset's name (NS_PRESETS).
Coefficients = Union[str, Sequence[float], Sequence[Sequence[float]]]

_ADJUST_LR = {
    "original": _lib.ADJUST_LR_ORIGINAL,
    "match_rms_adamw": _lib.ADJUST_LR_MATCH_RMS_ADAMW,
    "none": _lib.ADJUST_LR_NONE,
    "spectral_unclamped": _lib.ADJUST_LR_SPECTRAL_UNCLAMPED,
    "spectral": _lib.ADJUST_LR_SPECTRAL,
}
_NS_DTYPE = {
    "bf16": _lib.NS_DTYPE_BF16,
    "bfloat16": _lib.NS_DTYPE_BF16,
    "fp32": _lib.NS_DTYPE_FP32,
    "float32": _lib.NS_DTYPE_FP32,
    "fp16": _lib.NS_DTYPE_FP16,
    "float16": _lib.NS_DTYPE_FP16,
}
_NS_ALGORITHM = {"standard": _lib.NS_STANDARD, "gram": _lib.NS_GRAM}
MATRIX_VIEW = {
    "2d": _lib.MATRIX_VIEW_2D,
    "flatten_trailing": _lib.MATRIX_VIEW_FLATTEN_TRAILING,
    "batched_leading": _lib.MATRIX_VIEW_BATCHED_LEADING,
}
_ASSIGNMENT = {
    "balanced": _lib.ASSIGNMENT_BALANCED,
    "round_robin": _lib.ASSIGNMENT_ROUND_ROBIN,
    "spread": _lib.ASSIGNMENT_SPREAD,
    "split": _lib.ASSIGNMENT_SPLIT,
}
REPLICATED_MODE = {
    "host_averaged": _lib.REPLICATED_HOST_AVERAGED,
    "zero2": _lib.REPLICATED_ZERO2,
}


def choice(kind, value, table):
    key = str(value).lower().replace("-", "_")
    if key.startswith("torch."):  # torch.bfloat16 / torch.float32 for ns_dtype
        key = key[len("torch."):]
    if key not in table:
        raise ValueError("muon: unknown %s %r; use one of %s" % (kind, value, sorted(table)))
    return table[key]


# The built-in schedules (muon.h's muon_ns_coefficients_t), by name.
NS_PRESETS = {
    "polar_express": _lib.NS_COEFFICIENTS_POLAR_EXPRESS,
    "cans": _lib.NS_COEFFICIENTS_CANS,
    "deepseekv4": _lib.NS_COEFFICIENTS_DEEPSEEK_V4,
    "deepseek_v4": _lib.NS_COEFFICIENTS_DEEPSEEK_V4,
    "cubic5": _lib.NS_COEFFICIENTS_CUBIC5,
    "aol": _lib.NS_COEFFICIENTS_AOL,
}


def set_coefficients(o, spec):
    """Fills the coefficient fields of `o`; returns the ctypes table to keep alive."""
    if isinstance(spec, str):
        key = spec.lower().replace("-", "_")
        if key not in NS_PRESETS:
            raise ValueError("muon: unknown ns_coefficients preset %r; use one of %s, an "
                             "(a, b, c) tuple or a list of them"
                             % (spec, ", ".join(repr(k) for k in NS_PRESETS if k != "deepseek_v4")))
        o.ns_coefficients = NS_PRESETS[key]
        return None
    rows = list(spec)
    if len(rows) == 3 and not any(hasattr(v, "__len__") for v in rows):
        o.ns_coefficients = _lib.NS_COEFFICIENTS_FIXED
        o.ns_a, o.ns_b, o.ns_c = (float(v) for v in rows)
        return None
    flat = []
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != 3:
            raise ValueError("muon: ns_coefficients row %d has %d values, not (a, b, c)"
                             % (i, len(row)))
        flat.extend(float(v) for v in row)
    table = (ctypes.c_double * max(len(flat), 1))(*flat)
    o.ns_coefficients = _lib.NS_COEFFICIENTS_TABLE
    o.ns_table_rows = len(rows)
    o.ns_table = ctypes.cast(table, ctypes.POINTER(ctypes.c_double))
    return table



def moments_shape(shape, view, split=None):
    """The shape of NorMuon's moments of a global `shape` seen as `view`: a
    moment per row of each matrix (of each block, with column blocks)."""
    blocks = len(split[1]) if split is not None and split[0] == 1 else 1
    if view == MATRIX_VIEW["batched_leading"] and len(shape) >= 3:
        return (int(shape[0]), int(shape[1]) * blocks)
    return (int(shape[0]) * blocks,) if shape else (0,)


def split_spec(split_sizes, split_dim, who):
    """(dim, sizes) from register()'s arguments, or None."""
    if split_sizes is None:
        return None
    sizes = tuple(operator.index(v) for v in split_sizes)
    if not sizes:
        raise ValueError("muon: %s: split_sizes is empty; give None for no split" % who)
    return (operator.index(split_dim), sizes)


def fill_split(po, split, keep):
    """Writes a (dim, sizes) split into muon_param_options_t `po`."""
    if split is None:
        return
    array = (ctypes.c_int64 * len(split[1]))(*split[1])
    keep.append(array)
    po.split_dim = split[0]
    po.num_split_sizes = len(split[1])
    po.split_sizes = ctypes.cast(array, ctypes.POINTER(ctypes.c_int64))


def fill_options(o, assign_callback, lr=None, weight_decay=None, momentum=None, nesterov=None,
                 ns_steps=None, ns_coefficients=None, eps=None, adjust_lr="original",
                 ns_dtype=None, momentum_fp32=None, assignment=None, prefetch_count=None,
                 async_parallelism=None, round_bytes=None, skip_nonfinite=None,
                 update_in_grad=None, update_scale=None, cautious_wd=None, normuon=None,
                 normuon_beta2=None, normuon_eps=None, ns_algorithm=None, gram_restarts=None,
                 skip_nonfinite_updates=None):
    """Writes muon.Optimizer's arguments (None: the library's default, already
    in `o` from muon_options_init) into muon_options_t `o`. A callable
    assignment becomes assign_callback(assignment), the ctypes callback the
    caller keeps alive. Returns the coefficient table `o` points at (None
    unless rows were given), to keep until muon_create has copied it."""
    if lr is not None:
        o.lr = float(lr)
    if weight_decay is not None:
        o.weight_decay = float(weight_decay)
    if momentum is not None:
        o.momentum = float(momentum)
    if nesterov is not None:
        o.nesterov = 1 if nesterov else 0
    if ns_steps is not None:
        o.ns_steps = operator.index(ns_steps)
    if eps is not None:
        o.eps = float(eps)
    o.adjust_lr = choice("adjust_lr", "none" if adjust_lr is None else adjust_lr,
                         _ADJUST_LR)
    if ns_dtype is not None:
        o.ns_dtype = choice("ns_dtype", ns_dtype, _NS_DTYPE)
    if momentum_fp32 is not None:
        o.momentum_fp32 = 1 if momentum_fp32 else 0
    if skip_nonfinite is not None:
        o.skip_nonfinite = 1 if skip_nonfinite else 0
    if update_in_grad is not None:
        o.update_in_grad = 1 if update_in_grad else 0
    if update_scale is not None:
        o.update_scale = float(update_scale)
    if cautious_wd is not None:
        o.cautious_wd = 1 if cautious_wd else 0
    if normuon is not None:
        o.normuon = 1 if normuon else 0
    if normuon_beta2 is not None:
        o.normuon_beta2 = float(normuon_beta2)
    if normuon_eps is not None:
        o.normuon_eps = float(normuon_eps)
    if skip_nonfinite_updates is not None:
        o.skip_nonfinite_updates = 1 if skip_nonfinite_updates else 0
    if ns_algorithm is not None:
        o.ns_algorithm = choice("ns_algorithm", ns_algorithm, _NS_ALGORITHM)
    if gram_restarts is not None:
        bits = 0
        for i in gram_restarts:
            i = operator.index(i)
            if not 0 <= i < 64:
                raise ValueError("muon: gram_restarts holds iteration %d; iterations 0 to "
                                 "63 can restart" % i)
            bits |= 1 << i
        o.ns_gram_restarts = bits
    if assignment is not None:
        if callable(assignment):
            o.assignment = _lib.ASSIGNMENT_CUSTOM
            o.assign_fn = assign_callback(assignment)
        else:
            o.assignment = choice("assignment", assignment, _ASSIGNMENT)
    if prefetch_count is not None:
        o.prefetch_count = operator.index(prefetch_count)
    if async_parallelism is not None:
        o.async_parallelism = 1 if async_parallelism else 0
    if round_bytes is not None:
        o.round_bytes = operator.index(round_bytes)
    table = None
    if ns_coefficients is not None:
        table = set_coefficients(o, ns_coefficients)
    return table
