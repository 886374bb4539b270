"""A param group's options for muon.Muon: torch.optim.Muon's checks (with its
messages), the library's own, and what a group becomes as muon.Optimizer's
keyword arguments. Nothing here holds state."""

import math
import numbers
import operator

import torch

from . import _optimizer

DEFAULT_COEFFICIENTS = (3.4445, -4.775, 2.0315)
_ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped", "spectral")
_NS_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32",
              "fp16": "fp16", "float16": "fp16"}
# Changing these in a param group rebuilds its library optimizer (momentum kept);
# lr, weight_decay and momentum are set on it before each step.
_REBUILD_KEYS = ("nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn", "ns_dtype")
# The options a param group holds: torch.optim.Muon's, then ours. load_state_dict
# fills only these from the constructor's values (a checkpoint of torch.optim.Muon
# lacks ours), never keys torch.optim.Optimizer adds to `defaults` itself
# ("differentiable"), so that state_dict() -> load_state_dict() -> state_dict()
# is the identity.
_TORCH_GROUP_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps",
                     "ns_steps", "adjust_lr_fn")
# The update variants: each group key, the muon.Optimizer argument it becomes,
# its default, and how it is read.
_VARIANTS = (("extra_scale_factor", "update_scale", 1.0, float),
             ("cautious_wd", "cautious_wd", False, bool),
             ("normuon", "normuon", False, bool),
             ("normuon_beta2", "normuon_beta2", 0.95, float),
             ("normuon_eps", "normuon_eps", 1e-8, float),
             ("ns_algorithm", "ns_algorithm", "standard", str),
             ("gram_restarts", "gram_restarts", (2,), tuple),
             ("skip_nonfinite_updates", "skip_nonfinite_updates", False, bool))
GROUP_KEYS = _TORCH_GROUP_KEYS + ("ns_dtype", "adamw_lr", "adamw_betas", "adamw_eps",
                                  "adamw_wd") + tuple(v[0] for v in _VARIANTS)


def real_value(name, value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError("Tensor %s must be 1-element" % name)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("muon.Muon: %s must be a real number, got %s (%r)"
                        % (name, type(value).__name__, value))
    return float(value)


def ns_dtype_of(value):
    key = str(value).lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key not in _NS_DTYPES:
        raise ValueError("muon.Muon: ns_dtype %r is not supported; use 'bf16' (as "
                         "torch.optim.Muon), 'fp32' or 'fp16'" % (value,))
    return _NS_DTYPES[key]


def coefficients_key(spec):
    """A comparable form of ns_coefficients (a tuple, rows of tuples, or a preset)."""
    if isinstance(spec, str):
        return spec
    try:
        rows = list(spec)
    except TypeError:
        raise TypeError("muon.Muon: ns_coefficients must be an (a, b, c) tuple, a list of them "
                        "or a preset ('polar_express', 'cans', 'deepseekv4', 'cubic5', 'aol'), got %r"
                        % (spec,)) from None
    if not any(hasattr(v, "__len__") for v in rows):
        if len(rows) != 3:
            raise ValueError("muon.Muon: ns_coefficients must be (a, b, c), got %d values"
                             % len(rows))
        return tuple(real_value("ns_coefficients", v) for v in rows)
    if not rows or any(not hasattr(row, "__len__") or len(row) != 3 for row in rows):
        raise ValueError("muon.Muon: ns_coefficients rows must each be (a, b, c), got %r"
                         % (spec,))
    return tuple(tuple(real_value("ns_coefficients", v) for v in row) for row in rows)


def variants_of(group):
    """A param group's update variants, as muon.Optimizer's keyword arguments."""
    readers = {float: lambda key, v: real_value(key, v), bool: lambda key, v: bool(v),
               str: lambda key, v: str(v), tuple: lambda key, v: tuple(v)}
    return {arg: readers[kind](key, group.get(key, default))
            for key, arg, default, kind in _VARIANTS}


def group_split(group):
    """A param group's split blocks ("split_sizes", "split_dim"; validated) as
    (dim, sizes), or None."""
    sizes = group.get("split_sizes")
    dim = group.get("split_dim", 0)
    if sizes is None:
        if dim != 0:
            raise ValueError("muon.Muon: split_dim is %r but no split_sizes are given" % (dim,))
        return None
    try:
        sizes = tuple(operator.index(v) for v in sizes)
        dim = operator.index(dim)
    except TypeError:
        raise TypeError("muon.Muon: split_sizes must be a list of ints and split_dim an int, "
                        "got %r and %r" % (group.get("split_sizes"), dim)) from None
    if not sizes or any(v <= 0 for v in sizes):
        raise ValueError("muon.Muon: split_sizes must be positive ints, got %r" % (sizes,))
    if dim not in (0, 1):
        raise ValueError("muon.Muon: split_dim must be 0 (rows) or 1 (columns), got %r" % dim)
    return (dim, sizes)


_VIEWS = ("batched_leading", "flatten_trailing")


def group_view(group):
    """How a param group's parameters of 3 or more dims are seen ("matrix_view";
    validated): "batched_leading" (n, d1, d2, ...) as n matrices d1 x (d2*...),
    stacked experts; "flatten_trailing" as one d0 x (d1*...) matrix, a conv's
    filters; None when the group gives none (such a parameter is refused)."""
    view = group.get("matrix_view")
    if view is not None and view not in _VIEWS:
        raise ValueError("muon.Muon: matrix_view must be 'batched_leading' (n stacked "
                         "matrices: MoE experts) or 'flatten_trailing' (one d0 x (d1*...) "
                         "matrix: conv filters), got %r" % (view,))
    return view


def view_for(view, ndim):
    """The matrix view a param of `ndim` dims registers with in a group whose
    matrix_view is `view`: 2-D params as they are."""
    return "2d" if ndim == 2 else view


def ndim_error(shape, where):
    """The refusal of a parameter of 3 or more dims (`shape`: its global shape, or
    its number of dims where only that is known) in a group without a
    matrix_view."""
    if isinstance(shape, int):
        what, flat = "%d dims" % shape, "one d0 x (d1*...) matrix"
    else:
        what = "shape %s (%d dims)" % (tuple(shape), len(shape))
        flat = "one %d x %d matrix" % (shape[0], math.prod(shape[1:]))
    return ("muon.Muon: %s has %s: say how Muon sees it with the param group key "
            "matrix_view: 'batched_leading' (one matrix per leading index: stacked MoE "
            "experts) or 'flatten_trailing' (%s: a convolution's filters)" % (where, what, flat))


def lowlevel_kwargs(group):
    """The muon.Optimizer arguments of a param group (validated beforehand)."""
    adjust = group["adjust_lr_fn"]
    return dict(
        lr=real_value("lr", group["lr"]),
        weight_decay=real_value("weight_decay", group["weight_decay"]),
        momentum=real_value("momentum", group["momentum"]),
        nesterov=bool(group["nesterov"]),
        ns_steps=operator.index(group["ns_steps"]),
        ns_coefficients=group["ns_coefficients"],
        eps=real_value("eps", group["eps"]),
        adjust_lr="original" if adjust is None else adjust,
        ns_dtype=ns_dtype_of(group["ns_dtype"]),
        **variants_of(group),
    )


def check_group(group):
    """torch.optim.Muon's checks (same messages), then the library's own."""
    if not isinstance(group.get("adamw", False), bool):
        raise TypeError("muon.Muon: a param group's \"adamw\" must be True (every param of "
                        "the group to AdamW) or False, got %r" % (group["adamw"],))
    lr = real_value("lr", group["lr"])
    if not 0.0 <= lr:
        raise ValueError("Learning rate should be >= 0 but is: %s" % lr)
    momentum = real_value("momentum", group["momentum"])
    if not 0.0 <= momentum:
        raise ValueError("momentum should be >= 0 but is: %s" % momentum)
    if not momentum < 1.0:  # (torch accepts it; the library's lerp needs momentum < 1)
        raise ValueError("momentum should be in [0, 1) but is: %s" % momentum)
    weight_decay = real_value("weight_decay", group["weight_decay"])
    if not 0.0 <= weight_decay:
        raise ValueError("weight decay should be >= 0 but is: %s" % weight_decay)
    eps = real_value("eps", group["eps"])
    if not eps > 0.0:
        raise ValueError("eps should be > 0 but is: %s" % eps)
    group_split(group)
    group_view(group)
    variant = variants_of(group)
    if not (0.0 <= variant["update_scale"] < math.inf):
        raise ValueError("muon.Muon: extra_scale_factor should be a finite number >= 0 but is: "
                         "%s" % variant["update_scale"])
    if not 0.0 <= variant["normuon_beta2"] < 1.0:
        raise ValueError("muon.Muon: normuon_beta2 should be in [0, 1) but is: %s"
                         % variant["normuon_beta2"])
    if variant["ns_algorithm"] not in ("standard", "gram"):
        raise ValueError("muon.Muon: ns_algorithm %r is not supported; use 'standard' or "
                         "'gram'" % (variant["ns_algorithm"],))
    if not 0.0 < variant["normuon_eps"] < math.inf:
        raise ValueError("muon.Muon: normuon_eps should be a finite number > 0 but is: %s"
                         % variant["normuon_eps"])
    try:
        ns_steps = operator.index(group["ns_steps"])
    except TypeError:
        raise TypeError("muon.Muon: ns_steps must be an int, got %s"
                        % type(group["ns_steps"]).__name__) from None
    if not 0 <= ns_steps < 100:
        raise ValueError("ns_steps should be in [0, 100) but is: %d" % ns_steps)
    if group["adjust_lr_fn"] not in _ADJUST_LR_FNS:
        raise ValueError("Adjust learning rate function %s is not supported"
                         % group["adjust_lr_fn"])
    ns_dtype_of(group["ns_dtype"])
    coefficients_key(group["ns_coefficients"])
    _check_adamw(group)
    try:  # everything else the library checks (finite coefficients, ...)
        _optimizer.Optimizer(**lowlevel_kwargs(group)).close()
    except _optimizer.MuonError as e:
        raise ValueError("muon.Muon: %s" % e.message) from None


def _check_adamw(group):
    """The AdamW options of a group (torch.optim.AdamW's messages)."""
    lr = group["adamw_lr"]
    if lr is not None and not 0.0 <= real_value("adamw_lr", lr):
        raise ValueError("Invalid learning rate: %s" % lr)
    eps = real_value("adamw_eps", group["adamw_eps"])
    if not 0.0 <= eps:
        raise ValueError("Invalid epsilon value: %s" % eps)
    betas = tuple(group["adamw_betas"])
    if len(betas) != 2:
        raise ValueError("muon.Muon: adamw_betas must be (beta1, beta2), got %r" % (betas,))
    for k, beta in enumerate(betas):
        if not 0.0 <= real_value("adamw_betas", beta) < 1.0:
            raise ValueError("Invalid beta parameter at index %d: %s" % (k, beta))
    wd = group["adamw_wd"]
    if wd is not None and not 0.0 <= real_value("adamw_wd", wd):
        raise ValueError("Invalid weight_decay value: %s" % wd)


def local_shard_error(what, param):
    """Why a plain tensor cannot be stepped as a whole tensor, or None. One that
    spmd_types marks varying (or partial) over a mesh axis is this rank's own
    piece of a sharded parameter (torchtitan 0.3's tensor parallel under its
    default spmd_backend "spmd_types" leaves such params): stepped as whole,
    each piece would be orthogonalized alone."""
    local = getattr(param, "_local_type", None)
    if not isinstance(local, dict):
        return None
    varying = sorted(str(axis) for axis, kind in local.items()
                     if getattr(kind, "name", str(kind)) in ("V", "P"))
    if not varying:
        return None
    return ("muon.Muon: %s (shape %s) is a plain tensor that spmd_types marks as varying over "
            "mesh axis %s: it is this rank's piece of a sharded parameter, not the whole "
            "matrix, and libmuon reads layouts from DTensors; give the params as DTensors "
            "(torchtitan: parallelism.spmd_backend = 'partial_dtensor' or 'full_dtensor') "
            "with distributed_config=muon.create_dtensor_config()"
            % (what, tuple(param.shape), ", ".join(varying)))


def check_param(p, distributed, view=None):
    """What construction checks of a matrix (`view`: its group's matrix_view). A
    complex one is refused by step(), as torch.optim.Muon does (RuntimeError,
    check_step_param). A parameter that is not contiguous (a transposed view,
    a strided slice) is stepped through a contiguous copy
    (LibraryGroup.shadows in _library_groups.py)."""
    # With a distributed config the local tensor may be a 1-D flat shard
    # (ZeRO, FSDP1, Megatron's distributed optimizer); the caller checks the
    # global shape instead.
    error = local_shard_error("a parameter", p)
    if error:
        raise ValueError(error)
    if not distributed and (p.ndim < 2 or (p.ndim > 2 and view is None)):
        raise ValueError("Muon only supports 2D parameters whereas we found a parameter with "
                         "size: %s%s" % (p.size(), "; libmuon: give its param group a "
                                         "matrix_view ('batched_leading' for stacked matrices "
                                         "such as MoE experts, 'flatten_trailing' for conv "
                                         "filters)" if p.ndim > 2 else ""))
    if torch.is_complex(p):
        return
    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError("muon.Muon: parameter of size %s has dtype %s; libmuon steps float32, "
                        "bfloat16 and float16 parameters" % (tuple(p.shape), p.dtype))
    # A CUDA parameter needs libmuon_cuda.so (the library names it when missing).
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError("muon.Muon: parameter of size %s is on %s; libmuon steps parameters on "
                         "the CPU and on CUDA GPUs" % (tuple(p.shape), p.device))


def check_step_param(p, grad):
    """torch.optim.Muon's checks of a parameter it is about to step (same types
    and messages)."""
    if torch.is_complex(p):
        raise RuntimeError("Muon does not support complex parameters")
    if grad is not None and grad.is_sparse:
        raise RuntimeError("Muon does not support sparse gradients")
