"""muon.Muon: a torch.optim.Optimizer whose step runs in libmuon.

With distributed_config=None it behaves like torch.optim.Muon (PyTorch >= 2.9):
the same signature and defaults, param groups with their own hyper-parameters,
LR schedulers, zero_grad(set_to_none=True/False), parameters without a
gradient skipped, and state_dict()/load_state_dict() in torch's format
(state[index]["momentum_buffer"]), copy.deepcopy and pickle. One low-level
muon.Optimizer per param group borrows the parameters and gradients in place
(no copies; only a parameter or gradient that is not contiguous goes through
a contiguous copy, as the library reads and writes contiguous memory).
"""

import collections
import math
import numbers
import operator

import torch

from . import _optimizer
from ._flat import FlatBuffer, fsdp1_segments

_DEFAULT_COEFFICIENTS = (3.4445, -4.775, 2.0315)
_ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped")
_NS_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32",
              "fp16": "fp16", "float16": "fp16"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
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
_GROUP_KEYS = _TORCH_GROUP_KEYS + ("ns_dtype", "adamw_lr", "adamw_betas", "adamw_eps",
                                   "adamw_wd") + tuple(v[0] for v in _VARIANTS)
# What __getstate__ returns carries this key; torch's load_state_dict calls
# __setstate__ with a dict without it.
_COPY_MARK = "_muon_copy"

_increment_version = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)


def _real(name, value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError("Tensor %s must be 1-element" % name)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("muon.Muon: %s must be a real number, got %s (%r)"
                        % (name, type(value).__name__, value))
    return float(value)


def _ns_dtype(value):
    key = str(value).lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key not in _NS_DTYPES:
        raise ValueError("muon.Muon: ns_dtype %r is not supported; use 'bf16' (as "
                         "torch.optim.Muon), 'fp32' or 'fp16'" % (value,))
    return _NS_DTYPES[key]


def _coefficients_key(spec):
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
        return tuple(_real("ns_coefficients", v) for v in rows)
    if not rows or any(not hasattr(row, "__len__") or len(row) != 3 for row in rows):
        raise ValueError("muon.Muon: ns_coefficients rows must each be (a, b, c), got %r"
                         % (spec,))
    return tuple(tuple(_real("ns_coefficients", v) for v in row) for row in rows)


def _variant(group):
    """A param group's update variants, as muon.Optimizer's keyword arguments."""
    readers = {float: lambda key, v: _real(key, v), bool: lambda key, v: bool(v),
               str: lambda key, v: str(v), tuple: lambda key, v: tuple(v)}
    return {arg: readers[kind](key, group.get(key, default))
            for key, arg, default, kind in _VARIANTS}


def _group_split(group):
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


def _lowlevel_kwargs(group):
    """The muon.Optimizer arguments of a param group (validated beforehand)."""
    adjust = group["adjust_lr_fn"]
    return dict(
        lr=_real("lr", group["lr"]),
        weight_decay=_real("weight_decay", group["weight_decay"]),
        momentum=_real("momentum", group["momentum"]),
        nesterov=bool(group["nesterov"]),
        ns_steps=operator.index(group["ns_steps"]),
        ns_coefficients=group["ns_coefficients"],
        eps=_real("eps", group["eps"]),
        adjust_lr="original" if adjust is None else adjust,
        ns_dtype=_ns_dtype(group["ns_dtype"]),
        **_variant(group),
    )


def _check_group(group):
    """torch.optim.Muon's checks (same messages), then the library's own."""
    if not isinstance(group.get("adamw", False), bool):
        raise TypeError("muon.Muon: a param group's \"adamw\" must be True (every param of "
                        "the group to AdamW) or False, got %r" % (group["adamw"],))
    lr = _real("lr", group["lr"])
    if not 0.0 <= lr:
        raise ValueError("Learning rate should be >= 0 but is: %s" % lr)
    momentum = _real("momentum", group["momentum"])
    if not 0.0 <= momentum:
        raise ValueError("momentum should be >= 0 but is: %s" % momentum)
    if not momentum < 1.0:  # (torch accepts it; the library's lerp needs momentum < 1)
        raise ValueError("momentum should be in [0, 1) but is: %s" % momentum)
    weight_decay = _real("weight_decay", group["weight_decay"])
    if not 0.0 <= weight_decay:
        raise ValueError("weight decay should be >= 0 but is: %s" % weight_decay)
    eps = _real("eps", group["eps"])
    if not eps > 0.0:
        raise ValueError("eps should be > 0 but is: %s" % eps)
    _group_split(group)
    variant = _variant(group)
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
    _ns_dtype(group["ns_dtype"])
    _coefficients_key(group["ns_coefficients"])
    _check_adamw(group)
    try:  # everything else the library checks (finite coefficients, ...)
        _optimizer.Optimizer(**_lowlevel_kwargs(group)).close()
    except _optimizer.MuonError as e:
        raise ValueError("muon.Muon: %s" % e.message) from None


def _check_adamw(group):
    """The AdamW options of a group (torch.optim.AdamW's messages)."""
    lr = group["adamw_lr"]
    if lr is not None and not 0.0 <= _real("adamw_lr", lr):
        raise ValueError("Invalid learning rate: %s" % lr)
    eps = _real("adamw_eps", group["adamw_eps"])
    if not 0.0 <= eps:
        raise ValueError("Invalid epsilon value: %s" % eps)
    betas = tuple(group["adamw_betas"])
    if len(betas) != 2:
        raise ValueError("muon.Muon: adamw_betas must be (beta1, beta2), got %r" % (betas,))
    for k, beta in enumerate(betas):
        if not 0.0 <= _real("adamw_betas", beta) < 1.0:
            raise ValueError("Invalid beta parameter at index %d: %s" % (k, beta))
    wd = _real("adamw_wd", group["adamw_wd"])
    if not 0.0 <= wd:
        raise ValueError("Invalid weight_decay value: %s" % wd)


def _check_param(p, distributed):
    """What construction checks of a matrix. A complex one is refused by step(),
    as torch.optim.Muon does (RuntimeError, _check_step_param). A parameter that
    is not contiguous (a transposed view, a strided slice) is stepped through a
    contiguous copy (_Group.shadows)."""
    # With a distributed config the local tensor may be a 1-D flat shard
    # (ZeRO, FSDP1, Megatron's distributed optimizer); the config checks the
    # global shape instead.
    if p.ndim != 2 and not distributed:
        raise ValueError("Muon only supports 2D parameters whereas we found a parameter with "
                         "size: %s" % (p.size(),))
    if torch.is_complex(p):
        return
    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError("muon.Muon: parameter of size %s has dtype %s; libmuon steps float32, "
                        "bfloat16 and float16 parameters" % (tuple(p.shape), p.dtype))
    # A CUDA parameter needs libmuon_cuda.so (the library names it when missing).
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError("muon.Muon: parameter of size %s is on %s; libmuon steps parameters on "
                         "the CPU and on CUDA GPUs" % (tuple(p.shape), p.device))


def _check_step_param(p, grad):
    """torch.optim.Muon's checks of a parameter it is about to step (same types
    and messages)."""
    if torch.is_complex(p):
        raise RuntimeError("Muon does not support complex parameters")
    if grad is not None and grad.is_sparse:
        raise RuntimeError("Muon does not support sparse gradients")


def _library_param(g, i, p):
    """The tensor the library updates for g.params[i] (`p`): p itself where it is
    contiguous, else its contiguous copy g.shadows[i] (made here, kept)."""
    if p.is_contiguous():
        g.shadows[i] = None
        return p
    shadow = g.shadows[i]
    if shadow is None or shadow.shape != p.shape or shadow.dtype != p.dtype:
        shadow = g.shadows[i] = torch.empty(tuple(p.shape), dtype=p.dtype, device=p.device)
    return shadow


def _library_grad(g, i, grad):
    """The gradient the library reads for g.params[i]: `grad` itself where it is
    contiguous, else a copy of it in g.staged[i]."""
    if grad.is_contiguous():
        g.staged[i] = None
        return grad
    staged = g.staged[i]
    if staged is None or staged.shape != grad.shape or staged.dtype != grad.dtype:
        staged = g.staged[i] = torch.empty(tuple(grad.shape), dtype=grad.dtype,
                                           device=grad.device)
    staged.copy_(grad)
    return staged


def _local(t):
    """The local tensor of a DTensor-like tensor, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _like_param(buf, p):
    """A local momentum buffer as the param is: a DTensor with the param's mesh and
    placements for a DTensor param (so torch.distributed.checkpoint can reshard
    it), else the tensor itself."""
    if not hasattr(p, "device_mesh") or not callable(getattr(p, "to_local", None)):
        return buf
    return type(p).from_local(buf.to(p.to_local().device), p.device_mesh, p.placements,
                              shape=p.shape, stride=p.stride())


class _Group:
    """The library optimizer of one param group and what it is bound to."""

    __slots__ = ("opt", "params", "index", "ids", "grads", "param_ptrs", "rebuild_key",
                 "pushed", "zeros", "shadows", "staged", "normuon")

    def __init__(self, opt, indexed, rebuild_key, normuon=False):
        self.opt = opt
        self.normuon = normuon      # NorMuon: the library keeps second moments
        self.index = [i for i, _ in indexed]  # each one's index in the param group
        self.params = [p for _, p in indexed]  # the group's matrices when built
        self.ids = []               # library id of each (None: not registered on this rank)
        self.grads = []             # the grad tensor bound for each (None: unbound)
        self.param_ptrs = []        # the param storage bound for each
        self.rebuild_key = rebuild_key
        self.pushed = None          # (lr, weight_decay, momentum) the library has
        self.zeros = {}             # distributed: zero grads bound for params without one
        # Single process: the library reads and writes contiguous memory only. A
        # parameter that is not contiguous is registered as a contiguous copy
        # (shadows[i]), refreshed from it before each step and copied back after;
        # a gradient that is not contiguous is copied into staged[i] at each step.
        self.shadows = []
        self.staged = []


class Muon(torch.optim.Optimizer):
    """Muon (torch.optim.Muon's update rule and signature) stepped by libmuon.

    Muon(params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
         ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
         adjust_lr_fn=None, distributed_config=None, *, ns_dtype="bf16",
         adamw_lr=None, adamw_betas=(0.95, 0.95), adamw_eps=1e-8, adamw_wd=0.0,
         extra_scale_factor=1.0, cautious_wd=False, normuon=False, normuon_beta2=0.95,
         normuon_eps=1e-8, ns_algorithm="standard", gram_restarts=(2,),
         skip_nonfinite_updates=False)

    params: parameters, or param groups (dicts) with their own values of the
    options. Matrices (2 or more dims; for a sharded parameter, its global
    tensor's) are stepped by Muon in libmuon; the others (biases, norms, scalars)
    by torch.optim.AdamW inside this optimizer, with lr adamw_lr (None: the
    group's lr), betas adamw_betas, eps adamw_eps and weight decay adamw_wd, so
    one optimizer takes model.parameters(). Their AdamW state (step, exp_avg,
    exp_avg_sq) is in state_dict() in torch's format. A param group with
    "adamw": True sends its matrices to AdamW too (embeddings and output heads,
    as Muon recipes do: {"params": [emb.weight, head.weight], "adamw": True}).
    adjust_lr_fn:
    None or "original" (lr * sqrt(max(1, rows / cols))), "match_rms_adamw"
    (lr * 0.2 * sqrt(max(rows, cols))) or "spectral_unclamped" (lr * sqrt(rows /
    cols)), as torch. ns_dtype: "bf16" (Newton-Schulz as
    torch.optim.Muon computes it) or "fp32". ns_coefficients may also be a
    list of (a, b, c) rows, one per iteration, or a preset: "polar_express",
    "cans", "deepseekv4" (ns_steps=10), "cubic5" (ns_steps=5; c = 0, one
    product less per iteration) or "aol" (ns_steps=4; AOL's pre-scaling
    instead of the Frobenius division); muon.h lists their values.
    extra_scale_factor multiplies every Muon update after adjust_lr_fn
    (Emerging-Optimizers' name; weight decay keeps the plain lr): an update
    RMS target such as DeepSeek-V4's 0.18 is "match_rms_adamw" (0.2) with 0.9.
    cautious_wd=True decays a matrix element only where its update and its
    value have the same sign (cautious weight decay, arXiv 2510.12402; the
    AdamW-stepped params keep torch's AdamW decay).
    normuon=True is NorMuon (arXiv 2510.05491, as Dion ships it): each
    matrix's owner keeps a second moment per row of its orthogonalized update
    (decay normuon_beta2) and normalizes the rows by its root (+ normuon_eps),
    keeping the update's Frobenius norm; adjust_lr_fn and extra_scale_factor
    apply after it. The moments are in state_dict() as
    "normuon_second_moment" (fp32, the matrices' rows) without a
    distributed_config (with one, state_dict() refuses: the moments live on
    each matrix's owner; checkpoint with the library's state blobs). CPU only
    so far.
    ns_algorithm="gram" runs Gram Newton-Schulz (Dao-AILab's, restarting at
    the iterations in gram_restarts); ns_dtype="fp16" computes in fp16 after
    normalizing in fp32. CPU only so far.
    skip_nonfinite_updates=True: a NaN guard; no parameter changes on any
    rank when an orthogonalized update holds a non-finite value.

    Hyper-parameters are read from each param group before every step, so
    LR schedulers work. A parameter whose .grad is None is skipped, as torch
    does; a .grad that torch replaced (zero_grad(set_to_none=True) then
    backward) is rebound, never copied. A parameter that is not contiguous (a
    transposed view, a strided slice) is stepped through a contiguous copy,
    refreshed from it before each step and copied back after (so is a
    gradient that is not contiguous, copied in); a complex matrix raises
    RuntimeError at step() once it has a gradient, as torch does. The momentum
    buffers live in the library: state_dict() copies them out in torch's
    format, and load_state_dict() copies them back (state_dict() ->
    load_state_dict() -> state_dict() is the identity); `self.state` holds
    them only while those calls run. copy.deepcopy() and pickle copy the
    optimizer as torch copies one (its param groups, with deep copies of the
    parameters, and its state; no hooks): the copy builds its own library
    optimizers at its first step. An optimizer with a distributed_config
    refuses to be copied (TypeError).

    distributed_config: a muon.DistributedConfig (the design's: assign_fn,
    gather_fn, redistribute_fn, state), what a create_*_config helper returns,
    or any object with `_options()` (extra muon.Optimizer arguments) and
    `_attach(optimizer, named_params)` (sets the world, adds groups and
    registers every (name, param), see docs/python_api.md); every rank then
    steps every parameter (a missing gradient counts as zero).
    """

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=_DEFAULT_COEFFICIENTS, eps=1e-7, ns_steps=5,
                 adjust_lr_fn=None, distributed_config=None, *, ns_dtype="bf16",
                 adamw_lr=None, adamw_betas=(0.95, 0.95), adamw_eps=1e-8, adamw_wd=0.0,
                 extra_scale_factor=1.0, cautious_wd=False, normuon=False,
                 normuon_beta2=0.95, normuon_eps=1e-8, ns_algorithm="standard",
                 gram_restarts=(2,), skip_nonfinite_updates=False):
        if distributed_config is not None and not (
                callable(getattr(distributed_config, "_attach", None))
                and callable(getattr(distributed_config, "_options", None))):
            raise TypeError("muon.Muon: distributed_config must provide _options() and "
                            "_attach(optimizer, named_params), got %s"
                            % type(distributed_config).__name__)
        self._init_bookkeeping(distributed_config)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype, adamw_lr=adamw_lr,
                        adamw_betas=adamw_betas, adamw_eps=adamw_eps, adamw_wd=adamw_wd,
                        extra_scale_factor=extra_scale_factor, cautious_wd=cautious_wd,
                        normuon=normuon, normuon_beta2=normuon_beta2, normuon_eps=normuon_eps,
                        ns_algorithm=ns_algorithm, gram_restarts=tuple(gram_restarts),
                        skip_nonfinite_updates=skip_nonfinite_updates)
        _check_group(defaults)
        super().__init__(params, defaults)
        for gi, group in self._numbered():
            for _, p in self._members(gi, group):
                if getattr(p, "use_muon", False):
                    # DeepSpeed orthogonalizes the gradient of a parameter so
                    # flagged itself when the optimizer's class name says Muon:
                    # Newton-Schulz would run twice, with no error.
                    raise ValueError(
                        "muon.Muon: a parameter of size %s has DeepSpeed's use_muon flag set; "
                        "DeepSpeed would orthogonalize its gradient itself before muon.Muon "
                        "does (twice, silently): leave use_muon unset (del p.use_muon) and let "
                        "muon.Muon choose the matrices" % (tuple(p.shape),))
        if self._config is None:
            # What each group held when built: a wrapper that swaps its matrices
            # for flat 1-D partitions (DeepSpeed ZeRO) is refused at step().
            self._built_matrices = {gi: len(self._matrices(gi, group))
                                    for gi, group in self._numbered()}
            self._built_ids = {id(p) for gi, group in self._numbered()
                               for _, p in self._members(gi, group)}
        order = getattr(self._config, "_set_param_order", None)
        if order is not None:
            order([p for gi, group in self._numbered() for _, p in self._members(gi, group)])
        self._prepare_config()

    def _init_bookkeeping(self, config):
        """What this class keeps beside torch.optim.Optimizer's attributes, empty."""
        self._config = config
        self._flat = {}        # id(param) -> (param, its FlatBuffer or None for a plain one)
        self._numbers = {}     # id(param group dict) -> (the dict, its number)
        self._by_number = {}   # number -> param group dict
        self._groups = {}      # param group number -> _Group, once it stepped
        self._has_state = {}   # id(param) -> True once it has a momentum buffer (torch's state)
        self._pending = {}     # id(param) -> momentum to set at build (None: zero)
        self._pending_moments = {}  # id(param) -> NorMuon moments to set at build
        self._qk = []          # register_qk's layers: (q param, k param, library arguments)
        self._qk_ids = {}      # (id(_Group), handle) -> the layer's id in that library optimizer
        self._adamw = None     # torch.optim.AdamW over the non-matrix params, sharing self.state
        self._adamw_key = None
        self._built_matrices = {}  # param group number -> its matrices when built (single process)
        self._built_ids = set()    # id(param) of every param it was built with

    def _prepare_config(self):
        """Lets the config see every matrix once (the design's assign_fn runs there)."""
        prepare = getattr(self._config, "_prepare", None)
        if prepare is not None:
            prepare([(self._name(gi, i), p) for gi, group in self._numbered()
                     for i, p in self._matrices(gi, group)])

    def _numbered(self):
        """(number, group) of the current param groups. A group keeps its number
        (its position when first seen) while its dict lives, so a host that
        steps one group at a time (DeepSpeed's ZeRO sets param_groups to
        [group] around each step()) reaches the same library optimizer."""
        out = []
        for group in self.param_groups:
            entry = self._numbers.get(id(group))
            if entry is None or entry[0] is not group:
                entry = self._numbers[id(group)] = (group, len(self._by_number))
                self._by_number[entry[1]] = group
            out.append((entry[1], group))
        return out

    # -- flat buffers (FSDP1's FlatParameter, ZeRO partitions) -----------------------

    def _flat_segments(self, name, p):
        """The segments of a flat buffer (muon._flat), or None for a plain param:
        what the config's table says (framework adapters), else FSDP1's own
        metadata."""
        if self._config is None:
            return None
        table = getattr(self._config, "_flat_segments", None)
        segments = table(name, p) if table is not None else None
        return segments if segments is not None else fsdp1_segments(p)

    def _flat_of(self, gi, i, p):
        """p's FlatBuffer, or None for a plain param (asked once per param object:
        a host may put flat buffers into param_groups after construction, as
        DeepSpeed's ZeRO and Megatron's distributed optimizer do)."""
        entry = self._flat.get(id(p))
        if entry is None or entry[0] is not p:
            segments = self._flat_segments(self._name(gi, i), p)
            fb = None if segments is None else FlatBuffer(
                self._name(gi, i), p, segments,
                grad_attr=getattr(self._config, "_flat_grad_attr", "grad"))
            entry = self._flat[id(p)] = (p, fb)
        return entry[1]

    def _members(self, gi, group):
        """(key, tensor) of what the group steps: a plain param as itself (key: its
        index), a flat buffer as the views of its segments (key: (index, k))."""
        out = []
        for i, p in enumerate(group["params"]):
            fb = self._flat_of(gi, i, p)
            if fb is None:
                out.append((i, p))
            else:
                out.extend(((i, k), v) for k, v in enumerate(fb.views))
        return out

    def _flat_buffers(self):
        """The FlatBuffers of the current param groups."""
        return [fb for gi, group in self._numbered()
                for i, p in enumerate(group["params"])
                for fb in (self._flat_of(gi, i, p),) if fb is not None]

    # -- param groups ----------------------------------------------------------

    def add_param_group(self, param_group):
        count = len(self.param_groups)
        super().add_param_group(param_group)
        try:
            group = self.param_groups[-1]
            _check_group(group)
            gi = [n for n, g in self._numbered() if g is group][0]
            for i, p in self._members(gi, group):
                if self._is_matrix(gi, i, p):
                    _check_param(p, self._config is not None)
        except BaseException:
            for group in self.param_groups[count:]:  # nothing half-added
                for p in group["params"]:
                    self._flat.pop(id(p), None)
                entry = self._numbers.pop(id(group), None)
                if entry is not None and entry[0] is group:
                    self._by_number.pop(entry[1], None)
            del self.param_groups[count:]
            raise

    # -- the library optimizers ---------------------------------------------------

    @staticmethod
    def _rebuild_key(group):
        return (bool(group["nesterov"]), _coefficients_key(group["ns_coefficients"]),
                _real("eps", group["eps"]), operator.index(group["ns_steps"]),
                group["adjust_lr_fn"], _ns_dtype(group["ns_dtype"]),
                tuple(sorted(_variant(group).items())), _group_split(group))

    def _name(self, gi, i):
        if isinstance(i, tuple):  # a segment of a flat buffer
            i, k = i
            fb = self._flat[id(self._by_number[gi]["params"][i])][1]
            return "group%d.param%d.%s" % (gi, i, fb.segments[k].name)
        return "group%d.param%d" % (gi, i)

    def _is_matrix(self, gi, i, p):
        """Muon's (a matrix, globally, in a group that does not ask for AdamW) or
        AdamW's."""
        group = self._by_number.get(gi)
        if group is not None and group.get("adamw", False):
            return False
        segment = getattr(p, "_muon_segment", None)
        if segment is not None:
            return len(segment.shape) >= 2
        if self._config is not None and hasattr(self._config, "_global_ndim"):
            return self._config._global_ndim(self._name(gi, i), p) >= 2
        return p.ndim >= 2

    def _matrices(self, gi, group):
        """(key in the group, param) of the group's matrices."""
        return [(i, p) for i, p in self._members(gi, group) if self._is_matrix(gi, i, p)]

    def _build(self, gi, group, indexed):
        kwargs = _lowlevel_kwargs(group)
        if self._config is not None:
            kwargs.update(self._config._options() or {})
        opt = _optimizer.Optimizer(**kwargs)
        try:
            g = _Group(opt, indexed, self._rebuild_key(group), kwargs["normuon"])
            if self._config is None:
                self._register_single(g, gi)
            else:
                self._register_distributed(g, gi)
            self._apply_pending(g)
        except BaseException:
            opt.close()
            raise
        self._groups[gi] = g
        return g

    def _register_single(self, g, gi):
        params = g.params
        placeholders = []
        for i, p in enumerate(params):
            g.shadows.append(None)
            g.staged.append(None)
            target = _library_param(g, i, p)
            if target is not p:
                target.copy_(p)
            grad = p.grad
            if grad is None or grad.is_sparse:
                # The library wants a gradient at registration: an empty one,
                # unbound right after (the parameter is then skipped).
                grad = torch.empty_like(target, memory_format=torch.contiguous_format)
                placeholders.append(i)
            else:
                grad = _library_grad(g, i, grad)
            split = _group_split(self._by_number[gi])
            g.ids.append(g.opt.register(target, grad, name=self._name(gi, g.index[i]),
                                        split_sizes=split and split[1],
                                        split_dim=split[0] if split else 0))
            g.grads.append(grad)
            g.param_ptrs.append(target.data_ptr())
        for i in placeholders:
            target = params[i] if g.shadows[i] is None else g.shadows[i]
            g.opt.rebind(g.ids[i], target, None)
            g.grads[i] = None

    def _register_distributed(self, g, gi):
        named = [(self._name(gi, i), p) for i, p in zip(g.index, g.params)]
        split = _group_split(self._by_number[gi])
        for name, _ in named:
            if split is not None:
                g.opt.set_split(name, split[1], split[0])
        self._config._attach(g.opt, named)
        if split is not None:
            missed = [name for name, _ in named if name not in g.opt._splits_used]
            if missed:  # the same on every rank: the same groups, the same config
                raise ValueError(
                    "muon.Muon: param group %d's split_sizes did not reach %s: this "
                    "distributed config registers them without it; register them as "
                    "whole matrices (no split_sizes) or through a muon config "
                    "(create_processgroup_config, create_megatron_config)"
                    % (gi, ", ".join(repr(n) for n in missed)))
        records = g.opt._params
        by_object = {id(r.param.obj): k for k, r in enumerate(records)}
        by_name = {r.name: k for k, r in enumerate(records)}
        by_pointer = {r.param.data_ptr: k for k, r in enumerate(records) if r.param.data_ptr}
        for name, p in named:
            k = by_object.get(id(p))
            if k is None:
                k = by_name.get(name)
            if k is None:
                local = _local(p)
                k = by_pointer.get(local.data_ptr()) if local.numel() else None
            g.ids.append(k)
            g.grads.append(records[k].grad.obj if k is not None else None)
            g.param_ptrs.append(records[k].param.data_ptr if k is not None else 0)

    def _state_dtype(self, g, pid):
        return _DTYPES[g.opt.state_dtype(pid)]

    @staticmethod
    def _local_state(g, pid):
        """A copy of a param's momentum, or None where another rank keeps it (a
        ZeRO-2 parameter this rank does not own: each rank's state_dict holds the
        momentum it owns, as a sharded optimizer's does)."""
        try:
            return g.opt.get_state(pid)
        except _optimizer.MuonError as e:
            if e.status != "FAILED_PRECONDITION":
                raise
            return None

    def _apply_pending(self, g):
        for p, pid in zip(g.params, g.ids):
            if pid is None or id(p) not in self._pending:
                continue
            value = self._pending.pop(id(p))
            dtype = self._state_dtype(g, pid)
            shape = tuple(g.opt._params[pid].param.obj.shape)
            restore = value is not None
            if value is None:
                value = torch.zeros(shape, dtype=dtype)
            else:
                value = _local(value).detach().to(device="cpu", dtype=dtype).contiguous()
            try:
                g.opt.set_state(pid, value)
            except _optimizer.MuonError as e:
                # Nothing to restore for a ZeRO-2 param another rank owns.
                if restore or e.status != "FAILED_PRECONDITION":
                    raise
        for p, pid in zip(g.params, g.ids):
            moments = self._pending_moments.pop(id(p), None)
            if pid is not None and moments is not None and g.normuon:
                g.opt.set_moments(pid, moments.detach().to(device="cpu", dtype=torch.float32)
                                  .contiguous())

    def _group_for_step(self, gi, group, indexed):
        g = self._groups.get(gi)
        if g is not None:
            same_params = len(g.params) == len(indexed) and all(
                a is b for a, (_, b) in zip(g.params, indexed))
            if not same_params or g.rebuild_key != self._rebuild_key(group):
                self._rebuild(gi, g)
                g = None
        if g is None:
            g = self._build(gi, group, indexed)
        return g

    def _rebuild(self, gi, g):
        """A group whose params or fixed options changed: a new library optimizer,
        with the momentum buffers carried over."""
        for p, pid in zip(g.params, g.ids):
            if pid is not None and self._has_state.get(id(p)):
                self._pending[id(p)] = self._local_state(g, pid)
                if g.normuon and self._config is None:
                    self._pending_moments[id(p)] = g.opt.get_moments(pid)
        g.opt.close()
        del self._groups[gi]

    def _push_hyper(self, g, group):
        values = (_real("lr", group["lr"]), _real("weight_decay", group["weight_decay"]),
                  _real("momentum", group["momentum"]))
        if values != g.pushed:
            g.opt.lr, g.opt.weight_decay, g.opt.momentum = values
            g.pushed = values

    # -- binding gradients --------------------------------------------------------------

    def _bind_single(self, g, params):
        """Rebinds what torch replaced and refreshes the contiguous copies;
        returns the params that have a gradient."""
        active = []
        for i, p in enumerate(params):
            grad = p.grad
            _check_step_param(p, grad)
            target = _library_param(g, i, p)
            moved = target.data_ptr() != g.param_ptrs[i]
            if grad is None:
                if g.grads[i] is not None or moved:
                    g.opt.rebind(g.ids[i], target, None)
                    g.grads[i], g.param_ptrs[i] = None, target.data_ptr()
                continue
            if target is not p:
                target.copy_(p)  # the host may have written p since the last step
            bound = _library_grad(g, i, grad)
            if moved or bound is not g.grads[i]:
                g.opt.rebind(g.ids[i], target, bound)
                g.grads[i], g.param_ptrs[i] = bound, target.data_ptr()
            active.append(p)
        return active

    # -- QK-Clip -------------------------------------------------------------------

    def _matrix_position(self, p):
        """(group number, its position among the group's matrices) of matrix `p`."""
        for gi, group in self._numbered():
            for k, (_, q) in enumerate(self._matrices(gi, group)):
                if q is p:
                    return gi, k
        return None

    def register_qk(self, q_param, k_param=None, *, num_heads, alpha=0.5, **rows):
        """MuonClip's QK-Clip (Kimi K2) for one attention layer; returns the
        layer's handle for qk_clip. q_param holds the query heads, k_param
        (default: q_param, a fused QKV projection) the key heads, as rows of
        their global matrices: query head h is rows [q_first_row + h *
        q_head_stride, + q_head_rows), key head g the same with the k_ fields.
        num_kv_heads for GQA, q_rotary_rows for MLA (the last rows of each
        query head). Zeros (the defaults) split the rows evenly over the heads.
        Both must be matrices this optimizer steps with Muon, in one param
        group. See muon_qk_clip in include/libmuon/muon.h for the formulas."""
        k_param = q_param if k_param is None else k_param
        where = []
        for which, p in (("q_param", q_param), ("k_param", k_param)):
            found = self._matrix_position(p)
            if found is None:
                raise ValueError("muon.Muon.register_qk: %s is not a matrix this optimizer "
                                 "steps with Muon (QK-Clip scales Muon-stepped query and key "
                                 "projections)" % which)
            where.append(found)
        if where[0][0] != where[1][0]:
            raise ValueError("muon.Muon.register_qk: q_param and k_param are in different "
                             "param groups (%d and %d); put them in one" % (where[0][0],
                                                                          where[1][0]))
        unknown = set(rows) - set(_optimizer.Optimizer._QK_FIELDS)
        if unknown:
            raise TypeError("muon.Muon.register_qk got unknown arguments %s" % sorted(unknown))
        self._qk.append((q_param, k_param, dict(num_heads=num_heads, alpha=alpha, **rows)))
        return len(self._qk) - 1

    @torch.no_grad()
    def qk_clip(self, max_logits, tau):
        """QK-Clip after a step: `max_logits` maps each register_qk handle to
        that layer's largest attention logit per query head (or is a sequence
        in handle order), the same on every rank; heads above `tau` shrink.
        Returns the number of heads clipped (on this rank's layers)."""
        items = (max_logits.items() if isinstance(max_logits, dict)
                 else enumerate(max_logits))
        clipped = 0
        for handle, logits in items:
            if not 0 <= handle < len(self._qk):
                raise ValueError("muon.Muon.qk_clip: %r is not a register_qk handle" % (handle,))
            q, k, kwargs = self._qk[handle]
            gi, qpos = self._matrix_position(q)
            kpos = self._matrix_position(k)[1]
            g = self._groups.get(gi)
            if g is None:
                raise RuntimeError("muon.Muon.qk_clip: call it after a step (it scales the "
                                   "weights a step produced)")
            qid, kid = g.ids[qpos], g.ids[kpos]
            if qid is None or kid is None:
                continue  # this rank holds no piece of them
            layer = self._qk_ids.get((id(g), handle))
            if layer is None:
                layer = self._qk_ids[(id(g), handle)] = g.opt.register_qk_clip(qid, kid,
                                                                              **kwargs)
            for pos in {qpos, kpos}:  # a contiguous copy: refreshed, clipped, written back
                if g.shadows[pos] is not None:
                    g.shadows[pos].copy_(g.params[pos])
            clipped += g.opt.qk_clip(layer, torch.as_tensor(logits, dtype=torch.float32)
                                     .reshape(-1), tau)
            for pos in {qpos, kpos}:
                if g.shadows[pos] is not None:
                    g.params[pos].copy_(g.shadows[pos])
        return clipped

    @staticmethod
    def _write_back(g):
        """Copies the stepped contiguous copies into their parameters."""
        for p, shadow, grad in zip(g.params, g.shadows, g.grads):
            if shadow is not None and grad is not None:
                p.copy_(shadow)

    def _bind_distributed(self, g, params):
        """Every rank steps every parameter: a missing gradient is bound as zeros."""
        stepped = []
        for i, p in enumerate(params):
            pid = g.ids[i]
            if pid is None:
                continue
            record = g.opt._params[pid]
            registered = record.param.obj
            current = p if registered is p else _local(p)
            moved = current.data_ptr() != g.param_ptrs[i]
            grad = p.grad
            if grad is not None:
                grad = grad if registered is p else _local(grad)
            else:
                grad = g.zeros.get(i)
                if grad is None:
                    grad = g.zeros[i] = torch.zeros_like(
                        current, memory_format=torch.contiguous_format)
            if moved or record.grad is None or grad.data_ptr() != record.grad.data_ptr:
                g.opt.rebind(pid, current if moved else registered, grad)
                g.param_ptrs[i] = current.data_ptr()
            g.grads[i] = grad
            stepped.append(p)
        return stepped

    def _unbind_missing_grads(self):
        for g in self._groups.values():
            for i, p in enumerate(g.params):
                if g.grads[i] is not None and p.grad is None:
                    # Unbound now, so the dropped gradient's memory can be freed.
                    target = _library_param(g, i, p)
                    g.opt.rebind(g.ids[i], target, None)
                    g.grads[i], g.param_ptrs[i] = None, target.data_ptr()

    # -- torch.optim.Optimizer ---------------------------------------------------------

    def zero_grad(self, *args, **kwargs):
        super().zero_grad(*args, **kwargs)
        if self._config is None:
            self._unbind_missing_grads()

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step for every param group; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for fb in self._flat_buffers():
            fb.sync()
        self._prepare_config()
        skip_empty = getattr(self._config, "_skip_empty_groups", False)
        for gi, group in self._numbered():
            if skip_empty and not group["params"]:
                continue  # ZeRO-3 steps its sub-groups one at a time (muon.deepspeed)
            indexed = self._matrices(gi, group)
            if not indexed and self._config is None:
                self._check_not_flattened(gi, group)
                continue  # (distributed: stepped anyway, the step is collective)
            for _, p in indexed:  # before the library sees them, as torch's _init_group
                if self._config is None:
                    if p.grad is not None:
                        _check_step_param(p, p.grad)
                elif torch.is_complex(p):
                    _check_step_param(p, None)
            if self._config is None:
                # A complex matrix without a gradient is skipped, as torch skips it
                # (with one, _check_step_param refused it).
                indexed = [(i, p) for i, p in indexed if not torch.is_complex(p)]
            g = self._group_for_step(gi, group, indexed)
            self._push_hyper(g, group)
            if self._config is None:
                stepped = self._bind_single(g, g.params)
                if not stepped:
                    continue  # torch does nothing for a group without gradients
            else:
                stepped = self._bind_distributed(g, g.params)
            try:
                g.opt.step()
            except _optimizer.MuonError as e:
                # A group of AdamW params only (on every rank: the library's verdict
                # is the job's), distributed: nothing for Muon to do.
                if g.params or e.status != "FAILED_PRECONDITION" or \
                        g.opt.stats()["matrices_total"] != 0:
                    raise
            if self._config is None:
                self._write_back(g)
            for p in stepped:
                self._has_state[id(p)] = True
                if _increment_version is not None:
                    _increment_version(p)  # updated in place, as torch's optimizers do
        self._step_adamw()
        after = getattr(self._config, "_after_step", None)
        if after is not None:
            after()  # e.g. Megatron's DDP all-gathers the ranges just updated
        return loss

    def push_hyperparameters(self, stream=None):
        """Before each replay of a step captured into a CUDA graph: writes every
        group's current lr, weight_decay and momentum where the captured kernels
        read them, so that the replays follow an LR scheduler (a replay runs no
        Python; without this it keeps the values of the step that was captured).
        On `stream` (default: torch's current stream). Harmless elsewhere."""
        for gi, group in self._numbered():
            g = self._groups.get(gi)
            if g is not None:
                self._push_hyper(g, group)
                g.opt.push_hyperparameters(stream)

    def _check_not_flattened(self, gi, group):
        """A group built with matrices that now holds only 1-D tensors it was not
        built with: a wrapper replaced the matrices with flat partitions (DeepSpeed
        ZeRO hands the client optimizer one per group), which would be stepped as
        AdamW, silently. Refused, naming the wiring that steps them as Muon."""
        had = self._built_matrices.get(gi, 0)
        new = [p for _, p in self._members(gi, group) if id(p) not in self._built_ids]
        if had and new and all(p.ndim < 2 for p in new):
            raise RuntimeError(
                "muon.Muon: param group %d was built with %d matri%s and now holds only flat "
                "1-D tensors it was not built with (sizes %s): a wrapper replaced its "
                "parameters with flat partitions (DeepSpeed ZeRO does), which would be stepped "
                "as AdamW, not Muon. Under DeepSpeed build muon.Muon with distributed_config="
                "muon.deepspeed.create_deepspeed_config() and call muon.deepspeed.initialize"
                % (gi, had, "x" if had == 1 else "ces", [tuple(p.shape) for p in new[:3]]))

    def _step_adamw(self):
        """torch.optim.AdamW over every group's non-matrix params, with the group's
        adamw_* values; its state is this optimizer's (self.state)."""
        groups, key = [], []
        for gi, group in self._numbered():
            matrices = {id(p) for _, p in self._matrices(gi, group)}
            others = [p for _, p in self._members(gi, group) if id(p) not in matrices]
            if not others:
                continue
            lr = group["adamw_lr"] if group["adamw_lr"] is not None else group["lr"]
            groups.append(dict(params=others, lr=lr, betas=tuple(group["adamw_betas"]),
                               eps=group["adamw_eps"], weight_decay=group["adamw_wd"]))
            key.append(tuple(id(p) for p in others))
        if not groups:
            return
        if self._adamw is None or self._adamw_key != key:
            self._adamw = torch.optim.AdamW(groups)
            self._adamw_key = key
        else:
            for mine, values in zip(self._adamw.param_groups, groups):
                mine.update({k: v for k, v in values.items() if k != "params"})
        self._adamw.state = self.state  # (load_state_dict replaces self.state)
        self._adamw.step()

    def stats(self):
        """What moved and what was computed in the last step on this rank, summed
        over the param groups (the library's muon_get_stats)."""
        total = {}
        for g in getattr(self, "_groups", {}).values():
            if getattr(g, "opt", None) is None:
                continue
            for k, v in g.opt.stats().items():
                if k == "steps":
                    total[k] = max(total.get(k, 0), v)
                else:
                    total[k] = total.get(k, 0) + v
        return total

    def _momentum_buffers(self):
        """(member, a copy of its momentum buffer) for each member that has one
        (held by the library, or pending for a group not built yet)."""
        out = []
        for gi, group in self._numbered():
            g = self._groups.get(gi)
            position = {id(q): k for k, q in enumerate(g.params)} if g is not None else {}
            for _, p in self._members(gi, group):
                buf = None
                k = position.get(id(p))
                if id(p) in self._pending:
                    buf = self._pending[id(p)]
                    buf = None if buf is None else buf.clone()
                elif (g is not None and self._has_state.get(id(p)) and k is not None
                      and k < len(g.ids) and g.ids[k] is not None):
                    buf = self._local_state(g, g.ids[k])
                if buf is not None:
                    out.append((p, buf))
        return out

    def _moments(self):
        """{id(member): a copy of its NorMuon second moments} for each member
        that has them (held by the library, or pending for a group not built)."""
        out = {}
        for gi, group in self._numbered():
            if not _variant(group)["normuon"]:
                continue
            g = self._groups.get(gi)
            position = {id(q): k for k, q in enumerate(g.params)} if g is not None else {}
            for _, p in self._members(gi, group):
                k = position.get(id(p))
                if id(p) in self._pending_moments:
                    out[id(p)] = self._pending_moments[id(p)].clone()
                elif (g is not None and g.normuon and self._has_state.get(id(p))
                      and k is not None and k < len(g.ids) and g.ids[k] is not None):
                    if self._config is not None:
                        raise NotImplementedError(
                            "muon.Muon: with normuon=True and a distributed_config, NorMuon's "
                            "second moments live on each matrix's owner rank, and state_dict() "
                            "cannot carry them yet; checkpoint through the library's state "
                            "blobs (muon.Optimizer.state_bytes / load_states_bytes) or train "
                            "without normuon")
                    out[id(p)] = g.opt.get_moments(g.ids[k])
        return out

    def _take_momentum_from_state(self):
        """Moves the momentum buffers (and NorMuon moments) self.state holds
        (just loaded or copied) to where the next build gives them to the
        library."""
        for gi, group in self._numbered():
            normuon = _variant(group)["normuon"] and self._config is None
            for _, p in self._members(gi, group):
                entry = self.state.get(p)
                moments = entry.pop("normuon_second_moment", None) if entry is not None else None
                # A state without them (torch's, or saved without normuon) starts
                # them at zero, as the library's state blobs do.
                if normuon and moments is None and p.ndim >= 1:
                    moments = torch.zeros((p.shape[0],), dtype=torch.float32)
                if normuon:
                    self._pending_moments[id(p)] = moments
                else:
                    self._pending_moments.pop(id(p), None)
                buf = entry.pop("momentum_buffer", None) if entry is not None else None
                if entry is not None and not entry:
                    del self.state[p]
                self._pending[id(p)] = buf
                if buf is None:
                    self._has_state.pop(id(p), None)
                else:
                    self._has_state[id(p)] = True

    def state_dict(self):
        added = []  # (tensor, what self.state held for it before)

        def put(t, entry):
            added.append((t, self.state.get(t)))
            if entry is None:
                self.state.pop(t, None)
            else:
                self.state[t] = entry

        moments = self._moments()
        for p, buf in self._momentum_buffers():
            extra = {"normuon_second_moment": moments[id(p)]} if id(p) in moments else {}
            put(p, dict(self.state.get(p) or {}, momentum_buffer=_like_param(buf, p), **extra))
        # A flat buffer's state is the buffer's: its segments' folded into
        # buffer-shaped tensors (torch's format for the param the host gave).
        for fb in self._flat_buffers():
            folded = fb.fold({v: self.state.get(v) for v in fb.views})
            for v in fb.views:
                if v in self.state:
                    put(v, None)
            if folded:
                put(fb.param, folded)
        try:
            return super().state_dict()
        finally:
            # The dict returned keeps the copies; the library has the live buffers.
            for t, before in reversed(added):
                if before is None:
                    self.state.pop(t, None)
                else:
                    self.state[t] = before

    def load_state_dict(self, state_dict):
        numbered = self._numbered()
        super().load_state_dict(state_dict)
        # torch made new group dicts, in the same order: they keep the numbers,
        # and a group's split blocks when the checkpoint's group names none
        # (a checkpoint of torch.optim.Muon, or from before the split).
        for (n, old), group in zip(numbered, self.param_groups):
            self._numbers[id(group)] = (group, n)
            self._by_number[n] = group
            for key in ("split_sizes", "split_dim"):
                if key in old and key not in group:
                    group[key] = old[key]
        for group in self.param_groups:
            # A checkpoint of torch.optim.Muon has no ns_dtype: the constructor's
            # applies. Only this optimizer's options: torch's __setstate__ put
            # "differentiable" into self.defaults, and no param group holds it.
            for key in _GROUP_KEYS:
                if key not in group:
                    group[key] = self.defaults[key]
            _check_group(group)
        self._unfold_flat_state()
        self._take_momentum_from_state()
        for g in self._groups.values():
            self._apply_pending(g)

    # -- copy.deepcopy and pickle ------------------------------------------------------

    def __getstate__(self):
        """torch.optim.Optimizer's copy (defaults, state, param_groups; hooks are
        not copied), with the momentum buffers the library holds put into the
        state. The library's handles are not part of it: the copy builds its
        own at its first step, from its param groups and this state, as
        load_state_dict does. So a deepcopy of the optimizer deep-copies its
        parameters, as torch's does, and steps them like the original."""
        if self._config is not None:
            raise TypeError("muon.Muon: an optimizer with a distributed_config cannot be copied "
                            "or pickled (its communicators and process groups belong to this "
                            "process); save state_dict() and load it into a new optimizer")
        state = collections.defaultdict(dict)
        for p, entry in self.state.items():
            state[p] = dict(entry)
        moments = self._moments()
        for p, buf in self._momentum_buffers():
            state[p]["momentum_buffer"] = buf
            if id(p) in moments:
                state[p]["normuon_second_moment"] = moments[id(p)]
        return {"defaults": self.defaults, "state": state, "param_groups": self.param_groups,
                _COPY_MARK: True}

    def __setstate__(self, state):
        if not state.get(_COPY_MARK):
            # torch.optim.Optimizer.load_state_dict sets its state and groups this way.
            super().__setstate__(state)
            return
        state = {k: v for k, v in state.items() if k != _COPY_MARK}
        self._init_bookkeeping(None)
        super().__setstate__(state)
        self._take_momentum_from_state()

    def _unfold_flat_state(self):
        """A flat buffer's loaded state back onto its segments: momentum for the
        matrices', AdamW's entries for the others'."""
        matrices = {id(p) for gi, group in self._numbered()
                    for _, p in self._matrices(gi, group)}

        for fb in self._flat_buffers():
            entry = self.state.pop(fb.param, None)
            for v in fb.views:
                self.state.pop(v, None)
            if not entry:
                continue
            adamw_keys = tuple(k for k in entry if k != "momentum_buffer")
            for v, values in fb.unfold(entry, lambda view: ("momentum_buffer",)
                                       if id(view) in matrices else adamw_keys).items():
                self.state[v] = values

    def __del__(self):
        for g in getattr(self, "_groups", {}).values():
            if g is not None:
                try:
                    g.opt.close()
                except Exception:
                    pass
