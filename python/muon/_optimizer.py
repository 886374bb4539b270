"""Optimizer: one libmuon optimizer handle, driven from Python."""

import ctypes
import operator

from . import _comm, _lib
from ._errors import MuonError, callback_failed, check, describe, error
from ._tensor import TensorView, is_numpy, is_torch

_lib_handle = _lib.lib


def version():
    """The loaded library's version as (major, minor, patch)."""
    parts = [ctypes.c_int32() for _ in range(3)]
    _lib_handle.muon_get_version(*[ctypes.byref(p) for p in parts])
    return tuple(p.value for p in parts)


_ADJUST_LR = {
    "original": _lib.ADJUST_LR_ORIGINAL,
    "match_rms_adamw": _lib.ADJUST_LR_MATCH_RMS_ADAMW,
    "none": _lib.ADJUST_LR_NONE,
    "spectral_unclamped": _lib.ADJUST_LR_SPECTRAL_UNCLAMPED,
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
_MATRIX_VIEW = {
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
_REPLICATED_MODE = {
    "host_averaged": _lib.REPLICATED_HOST_AVERAGED,
    "zero2": _lib.REPLICATED_ZERO2,
}
_STAT_FIELDS = tuple(name for name, _ in _lib.muon_stats_t._fields_ if name != "struct_size")


def _choice(kind, value, table):
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


def _set_coefficients(o, spec):
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


def _prod(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _float_matrix(x):
    """What a gather_fn returned, as a float32 C-contiguous 2-D numpy array
    (no copy when it already is one)."""
    import numpy

    if is_torch(x):
        if x.device.type != "cpu":
            raise TypeError("gather_fn returned a tensor on %s; the library reads host memory"
                            % x.device)
        import torch
        x = x.detach().to(torch.float32).contiguous().numpy()  # the array keeps the tensor alive
    arr = numpy.ascontiguousarray(x, dtype=numpy.float32)
    if arr.ndim != 2:
        raise ValueError("gather_fn must return a (rows, cols) matrix, got shape %s"
                         % (tuple(arr.shape),))
    return arr


class _Registered:
    __slots__ = ("name", "param", "grad", "track_torch_grad", "moments_shape")

    def __init__(self, name, param, grad, track_torch_grad, moments_shape=None):
        self.name = name
        self.param = param
        self.grad = grad
        self.track_torch_grad = track_torch_grad
        # NorMuon's moments: (rows,) of one matrix, (batch, rows) of several.
        self.moments_shape = moments_shape


def _moments_shape(shape, view, split=None):
    """The shape of NorMuon's moments of a global `shape` seen as `view`: a
    moment per row of each matrix (of each block, with column blocks)."""
    blocks = len(split[1]) if split is not None and split[0] == 1 else 1
    if view == _MATRIX_VIEW["batched_leading"] and len(shape) >= 3:
        return (int(shape[0]), int(shape[1]) * blocks)
    return (int(shape[0]) * blocks,) if shape else (0,)


def _split_spec(split_sizes, split_dim, who):
    """(dim, sizes) from register()'s arguments, or None."""
    if split_sizes is None:
        return None
    sizes = tuple(operator.index(v) for v in split_sizes)
    if not sizes:
        raise ValueError("muon: %s: split_sizes is empty; give None for no split" % who)
    return (operator.index(split_dim), sizes)


def _fill_split(po, split, keep):
    """Writes a (dim, sizes) split into muon_param_options_t `po`."""
    if split is None:
        return
    array = (ctypes.c_int64 * len(split[1]))(*split[1])
    keep.append(array)
    po.split_dim = split[0]
    po.num_split_sizes = len(split[1])
    po.split_sizes = ctypes.cast(array, ctypes.POINTER(ctypes.c_int64))


def _tracks(param, grad):
    """Whether step() should check that param.grad is still `grad` (torch swaps
    a parameter's .grad after zero_grad(set_to_none=True))."""
    return grad is not None and is_torch(param) and getattr(param, "grad", None) is grad


class Optimizer:
    """The Muon optimizer over host-owned matrices: one libmuon handle.

    This is the low-level interface (register arrays, step); it works with numpy
    alone. With torch, register a parameter itself (an nn.Parameter, rather
    than p.data) with its .grad: step() then also checks that p.grad is still
    the registered tensor (autograd swaps it after zero_grad(set_to_none=True));
    rebind() points the library at the new one.

    Parameters and gradients (numpy arrays or torch CPU tensors, float32,
    bfloat16 or float16, row-major contiguous) are registered once and then
    borrowed: the library keeps their data pointers, reads the gradients at
    every step() and updates the parameters in place. This object keeps a
    reference to every registered array, every communicator it was given and
    every ctypes callback the library calls, so they live as long as it does.

    Arguments left as None take the library's defaults (include/libmuon/muon.h): lr 1e-3,
    weight_decay 0.1, momentum 0.95, nesterov True, ns_steps 5,
    ns_coefficients (3.4445, -4.7750, 2.0315), eps 1e-7, adjust_lr "original",
    ns_dtype "bf16", momentum_fp32 False, assignment "balanced",
    prefetch_count 1, async_parallelism True, round_bytes 0 (256 MiB).

    ns_coefficients: an (a, b, c) tuple for every iteration, a list of (a, b, c)
    rows (row i for iteration i, the last row reused after the end), or
    "polar_express". adjust_lr: "original", "match_rms_adamw", "spectral_unclamped", or None / "none"
    (no adjustment). ns_dtype: "bf16" (as torch.optim.Muon) or "fp32".

    Distributed engine (with set_world): assignment is "balanced",
    "round_robin", "spread" (balanced, then levelled within a pipeline stage
    by handing matrices to ranks that hold none of them: MUON_ASSIGNMENT_SPREAD
    in include/libmuon/muon.h), "split" (spread, then a matrix that bounds its stage
    orthogonalized by several ranks together: MUON_ASSIGNMENT_SPLIT; CPU only
    so far) or a callable that receives one dict per matrix of the job
    ({param_name, index, rows, cols, ns_flops, holders}, in the library's
    order: by parameter name, then index) and returns the owner's world rank
    for each, the same on every rank. prefetch_count, async_parallelism and
    round_bytes tune the exchange pipeline (results are bit-identical).
    skip_nonfinite: skip a step on every rank when any rank's gradient holds a
    NaN or Inf (nothing changes; stats()["steps_skipped"] counts them).
    update_in_grad: keep each update in its gradient's memory instead of a
    buffer per parameter in the Newton-Schulz dtype (2 bytes per element less
    with ns_dtype "bf16", 4 with "fp32"; the gradients then hold the
    orthogonalized updates after step; see muon_options_t).
    update_scale: multiplies every Muon update after the lr adjustment
    (Emerging-Optimizers' extra_scale_factor; weight decay keeps the plain lr).
    cautious_wd: decay an element only where its update and its value have
    the same sign (cautious weight decay, arXiv 2510.12402).
    skip_nonfinite_updates: no parameter changes on any rank when an
    orthogonalized update holds a non-finite value (a NaN guard).
    ns_algorithm: "standard" or "gram" (Gram Newton-Schulz: the iterations on
    the m x m Gram matrix, restarting at the iterations in gram_restarts,
    default (2,)). ns_dtype also takes "fp16".
    normuon, normuon_beta2, normuon_eps: NorMuon (arXiv 2510.05491): each
    matrix's owner normalizes the rows of its orthogonalized update by a
    second moment it keeps (see muon_options_t).

    Not thread-safe: use one optimizer from one thread at a time (ranks run as
    threads each use their own).
    """

    def __init__(self, lr=None, weight_decay=None, momentum=None, nesterov=None, ns_steps=None,
                 ns_coefficients=None, eps=None, adjust_lr="original", ns_dtype=None,
                 momentum_fp32=None, assignment=None, prefetch_count=None,
                 async_parallelism=None, round_bytes=None, skip_nonfinite=None,
                 update_in_grad=None, update_scale=None, cautious_wd=None, normuon=None,
                 normuon_beta2=None, normuon_eps=None, ns_algorithm=None, gram_restarts=None,
                 skip_nonfinite_updates=None):
        self._handle = None
        self._params = []
        self._comms = []        # communicator objects given to set_world / add_group
        self._group_ids = {}    # id(communicator object) -> group id
        self._keep = []         # ctypes callbacks and arrays the library calls or reads
        self._callback_errors = []  # (where, exception) raised by Python callbacks
        self._splits = {}       # name -> (split_dim, split_sizes) for register() to apply
        self._splits_used = set()  # the names of _splits a registration took
        self._world = None      # (rank, size) of the world communicator
        self._destroy = _lib_handle.muon_destroy  # usable even during interpreter shutdown

        o = _lib.muon_options_t()
        check(_lib_handle.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)))
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
        o.adjust_lr = _choice("adjust_lr", "none" if adjust_lr is None else adjust_lr,
                              _ADJUST_LR)
        if ns_dtype is not None:
            o.ns_dtype = _choice("ns_dtype", ns_dtype, _NS_DTYPE)
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
            o.ns_algorithm = _choice("ns_algorithm", ns_algorithm, _NS_ALGORITHM)
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
                callback = self._assignment_trampoline(assignment)
                o.assign_fn = callback
                self._keep.append(callback)
            else:
                o.assignment = _choice("assignment", assignment, _ASSIGNMENT)
        if prefetch_count is not None:
            o.prefetch_count = operator.index(prefetch_count)
        if async_parallelism is not None:
            o.async_parallelism = 1 if async_parallelism else 0
        if round_bytes is not None:
            o.round_bytes = operator.index(round_bytes)
        table = None
        if ns_coefficients is not None:
            table = _set_coefficients(o, ns_coefficients)
        handle = _lib.opt_p()
        check(_lib_handle.muon_create(ctypes.byref(o), ctypes.byref(handle)))
        del table  # copied by muon_create
        self._handle = handle

    # -- lifetime ----------------------------------------------------------

    def close(self):
        """Destroys the optimizer and releases the registered arrays, communicators
        and callbacks. Idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._destroy(handle)
        # Only once the library is gone: it may call or read these until then.
        self._params = []
        self._comms = []
        self._group_ids = {}
        self._keep = []

    def __del__(self):
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self):
        return not self._handle

    def _h(self):
        if not self._handle:
            raise ValueError("muon: the optimizer is closed")
        return self._handle

    # -- hyper-parameters -----------------------------------------------------

    def options(self):
        """The current options as a dict (ns_table and assign_fn are not handed out)."""
        o = _lib.muon_options_t()
        check(_lib_handle.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)))
        check(_lib_handle.muon_get_options(self._h(), ctypes.byref(o)))
        return {name: getattr(o, name) for name, _ in o._fields_
                if name not in ("struct_size", "ns_table", "reserved0", "reserved1",
                                "assign_fn", "assign_state")}

    @property
    def lr(self):
        return self.options()["lr"]

    @lr.setter
    def lr(self, value):
        check(_lib_handle.muon_set_lr(self._h(), float(value)))

    @property
    def weight_decay(self):
        return self.options()["weight_decay"]

    @weight_decay.setter
    def weight_decay(self, value):
        check(_lib_handle.muon_set_weight_decay(self._h(), float(value)))

    @property
    def momentum(self):
        return self.options()["momentum"]

    @momentum.setter
    def momentum(self, value):
        check(_lib_handle.muon_set_momentum(self._h(), float(value)))

    # -- communicators -----------------------------------------------------------

    @staticmethod
    def _table_of(comm):
        if isinstance(comm, _lib.muon_comm_t):
            return comm  # a raw table: the library takes over its release
        table = getattr(comm, "table", None)
        if not isinstance(table, _lib.muon_comm_t):
            raise TypeError("muon: expected a communicator (a muon.Communicator, an "
                            "InProcessWorld.comm(...) or an object with a muon_comm_t .table), "
                            "got %s" % type(comm).__name__)
        return table

    def set_world(self, comm):
        """Sets the world communicator (every rank taking part in step()); returns its
        group id, usable in placements. Set once, before registering parameters."""
        h = self._h()
        table = self._table_of(comm)
        gid = ctypes.c_int32()
        check(_lib_handle.muon_set_world(h, ctypes.byref(table), ctypes.byref(gid)))
        self._adopt(comm, gid.value)
        self._world = (table.rank, table.size)
        return gid.value

    def add_group(self, comm):
        """Adds a group (TP, FSDP, DP, ...) for placements; returns its id. Every rank
        adds its groups in the same order."""
        h = self._h()
        table = self._table_of(comm)
        gid = ctypes.c_int32()
        check(_lib_handle.muon_add_group(h, ctypes.byref(table), ctypes.byref(gid)))
        self._adopt(comm, gid.value)
        return gid.value

    def _adopt(self, comm, gid):
        self._comms.append(comm)  # its callbacks and context stay alive with this optimizer
        if not isinstance(comm, _lib.muon_comm_t):
            self._group_ids.setdefault(id(comm), gid)

    def _resolve_group(self, group):
        try:
            return operator.index(group)
        except TypeError:
            pass
        gid = self._group_ids.get(id(group))
        if gid is None:
            raise TypeError("muon: a placement's group must be a group id or a communicator "
                            "given to this optimizer's set_world/add_group; got %r" % (group,))
        return gid

    @property
    def world_rank(self):
        """This rank in the world (None without a world)."""
        return self._world[0] if self._world else None

    @property
    def world_size(self):
        """Ranks in the world (None without a world)."""
        return self._world[1] if self._world else None

    # -- parameters -------------------------------------------------------------

    def _param_options(self, name):
        po = _lib.muon_param_options_t()
        check(_lib_handle.muon_param_options_init(ctypes.byref(po), ctypes.sizeof(po)))
        if name is not None:
            po.name = str(name).encode("utf-8")
        return po

    def _views(self, param, grad, name):
        if is_numpy(param) and not param.flags.writeable:
            raise ValueError("muon: param %r is a read-only array; the optimizer updates "
                             "parameters in place" % (name or "?"))
        return TensorView(param), TensorView(grad)

    def register(self, param, grad, name=None, matrix_view="2d", global_shape=None,
                 placements=None, replicated_mode="host_averaged", lr_scale=None,
                 weight_decay_scale=None, split_sizes=None, split_dim=0, _split_name=None):
        """Registers a parameter and its gradient; returns the parameter's id.

        matrix_view: "2d" (default), "flatten_trailing" ((d0, d1, ...) as one
        d0 x (d1*...) matrix) or "batched_leading" ((n, d1, d2, ...) as n
        matrices d1 x (d2*...)). Registration closes at the first step().

        Distributed (after set_world): `param` and `grad` are this rank's piece
        of the global tensor of shape `global_shape`, cut out by `placements`
        (muon.Shard / muon.FlatRange / muon.Replicate, outermost first, each
        over a group id). `name` is the parameter's identity across ranks.
        replicated_mode: "host_averaged" (the host averaged the gradients, DDP)
        or "zero2" (placements are exactly one Replicate; each rank passes its
        own gradient; the engine averages them and keeps 1/N of the momentum).
        lr_scale, weight_decay_scale: this parameter's multipliers of lr and
        weight decay (Megatron's lr_mult, wd_mult; default 1).
        split_sizes, split_dim: orthogonalize each matrix as independent
        blocks: along split_dim (0 rows, 1 columns) the sizes repeat with
        period sum(split_sizes); block j gathers the j-th piece of every
        period (a fused QKV: [q, k, v]; Megatron's GQA layout:
        [q_per_group * head_dim, head_dim, head_dim]). Each block is
        normalized (NorMuon) and lr-adjusted for its own shape. Default (None):
        what set_split() gave this name, else the whole matrix.
        """
        h = self._h()
        self._check_comms_take(param, name)
        pv, gv = self._views(param, grad, name)
        po = self._param_options(name)
        po.matrix_view = _choice("matrix_view", matrix_view, _MATRIX_VIEW) \
            if not isinstance(matrix_view, int) else matrix_view
        po.replicated_mode = _choice("replicated_mode", replicated_mode, _REPLICATED_MODE) \
            if not isinstance(replicated_mode, int) else replicated_mode
        if lr_scale is not None:
            po.lr_scale = float(lr_scale)
        if weight_decay_scale is not None:
            po.weight_decay_scale = float(weight_decay_scale)
        keep = []
        split = _split_spec(split_sizes, split_dim, "param %r" % (name,)) \
            if split_sizes is not None else self._take_split(name if _split_name is None
                                                             else _split_name)
        _fill_split(po, split, keep)
        if global_shape is not None:
            shape = [operator.index(d) for d in global_shape]
            array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            keep.append(array)
            po.global_ndim = len(shape)
            po.global_shape = ctypes.cast(array, ctypes.POINTER(ctypes.c_int64))
        if placements:
            placements = list(placements)
            array = (_lib.muon_placement_t * len(placements))()
            for i, pl in enumerate(placements):
                if not hasattr(pl, "_fill"):
                    raise TypeError("muon: placement %d is %r; use muon.Shard, muon.FlatRange or "
                                    "muon.Replicate" % (i, pl))
                keep.append(pl._fill(array[i], self._resolve_group))
            keep.append(array)
            po.num_placements = len(placements)
            po.placements = ctypes.cast(array, ctypes.POINTER(_lib.muon_placement_t))
        pid = ctypes.c_int64()
        check(_lib_handle.muon_register_param(h, pv.ref, gv.ref, ctypes.byref(po),
                                               ctypes.byref(pid)))
        del keep  # copied by the library
        shape = global_shape if global_shape is not None else tuple(param.shape)
        self._params.append(_Registered(name if name is not None else "param%d" % pid.value,
                                        pv, gv, _tracks(param, grad),
                                        _moments_shape(tuple(shape), po.matrix_view, split)))
        return pid.value

    def register_custom(self, param, grad, name, rows, cols, assign_fn, gather_fn,
                        redistribute_fn, lr_scale=None, weight_decay_scale=None,
                        split_sizes=None, split_dim=0):
        """Registers a parameter on the custom path: one rows x cols matrix of which
        this rank holds `param` (its gradient `grad`), moved by the host's callables.
        Needs a world; every rank holding a piece registers it under `name`.

          assign_fn(name, world_size) -> int: the world rank that orthogonalizes
            the matrix (one holding a piece; the same on every holder). Called
            once, at the first step.
          gather_fn(local, owner) -> full or None: `local` is a float32 view of
            this rank's update values (the param's shape; read it, do not write
            it). On the rank `owner`,
            return the whole (rows, cols) float32 matrix (C-contiguous; a torch
            CPU tensor or anything numpy converts is accepted), kept alive here
            until redistribute_fn has run; elsewhere return None.
          redistribute_fn(full_or_None, owner, local_out) -> None: `full` is the
            orthogonalized (rows, cols) matrix on the owner (to read), None
            elsewhere; fill the float32 view `local_out` with this rank's values.

        gather_fn and redistribute_fn are collective among the holders (the host's
        own communication). An exception raised in them fails the step with the
        exception's type and text in the message. lr_scale, weight_decay_scale,
        split_sizes, split_dim: as register()'s.
        """
        h = self._h()

        pv, gv = self._views(param, grad, name)
        po = self._param_options(name)
        if lr_scale is not None:
            po.lr_scale = float(lr_scale)
        if weight_decay_scale is not None:
            po.weight_decay_scale = float(weight_decay_scale)
        split = _split_spec(split_sizes, split_dim, "param %r" % (name,)) \
            if split_sizes is not None else self._take_split(name)
        _fill_split(po, split, self._keep)
        shape = tuple(int(s) for s in getattr(param, "shape", ()))
        numel = _prod(shape)
        sink = self._callback_errors
        label = "param '%s'" % name
        held = [None]  # the owner's gathered matrix, until redistribute_fn returns

        def local_shape(n):
            return shape if n == numel else (int(n),)

        def c_assign(state, param_name, world_size):
            try:
                owner = operator.index(assign_fn(name, int(world_size)))
                return owner if -2 ** 31 <= owner < 2 ** 31 else -1
            except BaseException as e:  # noqa: B902 - reported as an invalid owner
                sink.append(("assign_fn of %s" % label, e))
                return -1

        def c_gather(state, local, n, owner, out, stream):
            try:
                full = gather_fn(_comm.view(local, local_shape(n), "<f4"),
                                 int(owner))
                held[0] = None
                if full is not None:
                    arr = _float_matrix(full)
                    held[0] = arr
                    out[0].data = arr.ctypes.data
                    out[0].rows, out[0].cols = arr.shape
                return 0
            except BaseException as e:  # noqa: B902 - turned into a status
                return callback_failed(e, "gather_fn of %s" % label, sink)

        def c_redistribute(state, full, rows, cols, owner, local, n, stream):
            try:
                matrix = _comm.view(full, (rows, cols), "<f4") if full else None
                redistribute_fn(matrix, int(owner),
                                _comm.view(local, local_shape(n), "<f4"))
                return 0
            except BaseException as e:  # noqa: B902 - turned into a status
                return callback_failed(e, "redistribute_fn of %s" % label, sink)
            finally:
                held[0] = None

        layout = _lib.muon_custom_layout_t()
        layout.struct_size = ctypes.sizeof(layout)
        layout.state = None
        layout.global_rows = operator.index(rows)
        layout.global_cols = operator.index(cols)
        callbacks = (_lib.CUSTOM_ASSIGN_FN(c_assign), _lib.CUSTOM_GATHER_FN(c_gather),
                     _lib.CUSTOM_REDISTRIBUTE_FN(c_redistribute))
        layout.assign_fn, layout.gather_fn, layout.redistribute_fn = callbacks
        pid = ctypes.c_int64()
        check(_lib_handle.muon_register_param_custom(h, pv.ref, gv.ref, ctypes.byref(po),
                                                      ctypes.byref(layout), ctypes.byref(pid)))
        self._keep.append(callbacks)
        self._params.append(_Registered(str(name), pv, gv, _tracks(param, grad),
                                        _moments_shape((operator.index(rows),), 0, split)))
        return pid.value

    def set_split(self, name, split_sizes, split_dim=0):
        """The split blocks (see register()) that the registration of `name` takes
        when it gives none: a distributed config registers the parameters, and
        muon.Muon says the split of each beforehand. split_sizes None: none."""
        if split_sizes is None:
            self._splits.pop(name, None)
        else:
            self._splits[name] = _split_spec(split_sizes, split_dim, "param %r" % (name,))

    def _take_split(self, name):
        split = self._splits.get(name)
        if split is not None:
            self._splits_used.add(name)
        return split

    def rebind(self, param_id, param, grad):
        """Points a registered parameter at new storage between steps (same shape
        and dtype as registered). `grad` None (single process only): the
        parameter is skipped by the next steps, as torch skips parameters
        without a gradient, until a gradient is bound again."""
        h = self._h()
        pid = operator.index(param_id)
        name = self._params[pid].name if 0 <= pid < len(self._params) else None
        pv = TensorView(param)
        if is_numpy(param) and not param.flags.writeable:
            raise ValueError("muon: param %r is a read-only array; the optimizer updates "
                             "parameters in place" % (name or "?"))
        gv = TensorView(grad) if grad is not None else None
        check(_lib_handle.muon_rebind_param(h, pid, pv.ref, gv.ref if gv is not None else None))
        record = self._params[pid]  # the id is valid: the call succeeded
        record.param = pv
        record.grad = gv  # an unbound gradient is never read again: let it go
        record.track_torch_grad = _tracks(param, grad)

    @property
    def num_params(self):
        n = ctypes.c_size_t()
        check(_lib_handle.muon_num_params(self._h(), ctypes.byref(n)))
        return n.value

    def __len__(self):
        return self.num_params

    def param_name(self, param_id):
        """The name a parameter was registered under."""
        return self._params[operator.index(param_id)].name

    # -- stepping ---------------------------------------------------------------

    def _assignment_trampoline(self, fn):
        sink = self._callback_errors

        def c_assign(state, count, matrices, owners):
            try:
                table = []
                for i in range(count):
                    m = matrices[i]
                    table.append({
                        "param_name": m.param_name.decode("utf-8", "replace"),
                        "index": m.index,
                        "rows": m.rows,
                        "cols": m.cols,
                        "ns_flops": m.ns_flops,
                        "holders": [m.holders[j] for j in range(m.num_holders)],
                    })
                chosen = list(fn(table))
                if len(chosen) != count:
                    raise ValueError("the assignment returned %d owners for %d matrices"
                                     % (len(chosen), count))
                ranks = [operator.index(r) for r in chosen]
                for i, r in enumerate(ranks):
                    owners[i] = r
                return 0
            except BaseException as e:  # noqa: B902 - turned into a status
                return callback_failed(e, "the assignment callable", sink)

        return _lib.ASSIGN_FN(c_assign)

    def _check_torch_storage(self):
        for r in self._params:
            p = r.param.obj
            if is_torch(p) and p.data_ptr() != r.param.data_ptr:
                raise MuonError("FAILED_PRECONDITION",
                                "param '%s': its storage moved since registration (was "
                                "param.data reassigned?); the library updates the registered "
                                "storage (rebind() points it at the new one)" % r.name)
            if r.track_torch_grad:
                g = p.grad
                if g is None or g.data_ptr() != r.grad.data_ptr:
                    raise MuonError("FAILED_PRECONDITION",
                                    "param '%s': its .grad is no longer the registered tensor "
                                    "(set to None or replaced); zero gradients in place, e.g. "
                                    "p.grad.zero_() or zero_grad(set_to_none=False), or "
                                    "rebind() the new one" % r.name)

    def _take_callback_errors(self):
        taken = list(self._callback_errors)
        del self._callback_errors[:len(taken)]
        for comm in self._comms:
            take = getattr(comm, "_muon_take_errors", None)
            if take is not None:
                taken.extend(take())
        return taken

    def _check_comms_take(self, param, name):
        """A communicator written in Python reads the library's buffers as host
        memory: refuse GPU tensors with it before the library could hand it
        device pointers."""
        if not (is_torch(param) and param.is_cuda):
            return
        for comm in self._comms:
            if isinstance(comm, _comm.Communicator):
                raise TypeError(
                    "muon: param %r is a CUDA tensor, but communicator %s is written in Python "
                    "and moves host memory only; use muon.InProcessWorld or an NCCL "
                    "communicator (muon_comm_from_nccl) with GPU tensors"
                    % (name, type(comm).__name__))

    def _stream_of(self, stream):
        """The cudaStream_t value muon_step gets: `stream` as given (an int, or
        an object with .cuda_stream such as torch.cuda.Stream), else for CUDA
        torch tensors torch's current stream on their device, else NULL."""
        if stream is not None:
            return getattr(stream, "cuda_stream", stream) or None
        for r in self._params:
            p = r.param.obj
            if is_torch(p) and p.is_cuda:
                import torch
                return torch.cuda.current_stream(p.device).cuda_stream or None
        return None

    def orthogonalize(self, x, out=None, matrix_view="2d", stream=None):
        """Newton-Schulz alone (muon_orthogonalize) with this optimizer's options:
        every matrix of `x` (a torch tensor or numpy array, seen through
        `matrix_view`) orthogonalized into `out` (default: a new array like x;
        `out` may be x itself). For CUDA tensors the work runs on `stream`
        (default: torch's current stream). Returns out."""
        if out is None:
            out = x.clone() if is_torch(x) else x.copy()
        xv, ov = TensorView(x), TensorView(out)
        view = _choice("matrix_view", matrix_view, _MATRIX_VIEW) \
            if not isinstance(matrix_view, int) else matrix_view
        if stream is None and is_torch(x) and x.is_cuda:
            import torch
            stream = torch.cuda.current_stream(x.device).cuda_stream or None
        else:
            stream = getattr(stream, "cuda_stream", stream) or None
        check(_lib_handle.muon_orthogonalize(self._h(), xv.ref, ov.ref, view, stream))
        return out

    def step(self, stream=None):
        """One Muon step over every registered parameter (collective with a world).

        For CUDA tensors the work is enqueued on `stream` (default: torch's
        current stream of their device) and the call does not wait for the GPU.
        A failure raises MuonError; one caused by a Python callback (a
        Communicator method, a custom-path callable, the assignment) has that
        exception as its __cause__."""
        h = self._h()
        self._check_torch_storage()
        status = _lib_handle.muon_step(h, self._stream_of(stream))
        raised = self._take_callback_errors()
        if status != 0:
            err = error(status)
            if not raised:
                raise err
            missing = ["%s (in %s)" % (describe(e), where) for where, e in raised
                       if describe(e) not in err.message]
            if missing:
                err = MuonError(err.code, "%s; Python callback raised %s"
                                % (err.message, "; ".join(missing)))
            raise err from raised[0][1]

    def push_hyperparameters(self, stream=None):
        """Writes the current lr, weight_decay and momentum where the step's
        kernels read them, ordered on `stream` (default as for step): before
        each replay of a step captured into a CUDA graph, so that the replays
        follow a schedule (muon_push_hyperparameters)."""
        check(_lib_handle.muon_push_hyperparameters(self._h(), self._stream_of(stream)))

    @property
    def step_count(self):
        n = ctypes.c_int64()
        check(_lib_handle.muon_step_count(self._h(), ctypes.byref(n)))
        return n.value

    def stats(self):
        """What moved and what was computed on this rank (muon_get_stats): steps;
        for the last step bytes_sent, bytes_received, collectives, rounds,
        matrices_orthogonalized, ns_flops, nonfinite_grads (non-finite gradient
        elements; on a GPU read once the last step ended); planned:
        matrices_total, matrices_owned; in all: steps_skipped (skip_nonfinite);
        now: memory_bytes (the optimizer's own memory on its device), of which
        momentum_bytes, param_elements (of the pieces this rank holds) and
        bytes_per_param."""
        s = _lib.muon_stats_t()
        check(_lib_handle.muon_stats_init(ctypes.byref(s), ctypes.sizeof(s)))
        check(_lib_handle.muon_get_stats(self._h(), ctypes.byref(s)))
        return {name: getattr(s, name) for name in _STAT_FIELDS}

    # -- state ---------------------------------------------------------------------

    def state_dtype(self, param_id):
        """The dtype of a parameter's momentum buffer: "float32", "bfloat16" or "float16"."""
        dt = _lib.DLDataType()
        check(_lib_handle.muon_get_state_dtype(self._h(), int(param_id), ctypes.byref(dt)))
        return {(_lib.kDLFloat, 32): "float32", (_lib.kDLFloat, 16): "float16",
                (_lib.kDLBfloat, 16): "bfloat16"}[(dt.code, dt.bits)]

    def get_state(self, param_id, out=None):
        """A copy of a parameter's momentum buffer.

        A torch tensor for torch parameters, a numpy array for numpy ones, of the
        parameter's shape and the state dtype (the gradient's, or float32 with
        momentum_fp32). With `out`, fills and returns that array instead.
        """
        h = self._h()
        if out is None:
            dt = _lib.DLDataType()
            check(_lib_handle.muon_get_state_dtype(h, int(param_id), ctypes.byref(dt)))
            like = self._params[int(param_id)].param.obj  # the id is valid: the call succeeded
            if is_torch(like):
                import torch
                dtype = {(_lib.kDLFloat, 32): torch.float32, (_lib.kDLFloat, 16): torch.float16,
                         (_lib.kDLBfloat, 16): torch.bfloat16}[(dt.code, dt.bits)]
                out = torch.empty(tuple(like.shape), dtype=dtype)
            else:
                import numpy
                if dt.code != _lib.kDLFloat:
                    raise TypeError("muon: state dtype bfloat16 cannot be held by numpy")
                out = numpy.empty(like.shape, dtype="float%d" % dt.bits)
        view = TensorView(out)
        check(_lib_handle.muon_get_state(h, int(param_id), view.ref))
        return out

    def set_state(self, param_id, value):
        """Overwrites a parameter's momentum buffer (shape and state dtype must match)."""
        view = TensorView(value)
        check(_lib_handle.muon_set_state(self._h(), int(param_id), view.ref))

    def get_moments(self, param_id):
        """A copy of a parameter's NorMuon second moments (float32, one per row:
        shape (rows,), or (batch, rows) for a batched view), a torch tensor for
        torch parameters, else a numpy array. Before the first step, what was
        set or loaded (zeros when nothing); after it, only on the rank that owns
        every matrix of the parameter (muon_get_moments)."""
        rec = self._params[int(param_id)] if 0 <= int(param_id) < len(self._params) else None
        shape = rec.moments_shape if rec is not None else (0,)
        if rec is not None and is_torch(rec.param.obj):
            import torch
            out = torch.empty(shape, dtype=torch.float32)
        else:
            import numpy
            out = numpy.empty(shape, dtype="float32")
        view = TensorView(out)
        check(_lib_handle.muon_get_moments(self._h(), int(param_id), view.ref))
        return out

    def set_moments(self, param_id, value):
        """Overwrites a parameter's NorMuon second moments (float32, one per row
        of each matrix; muon_set_moments)."""
        view = TensorView(value)
        check(_lib_handle.muon_set_moments(self._h(), int(param_id), view.ref))

    # -- QK-Clip ------------------------------------------------------------------

    _QK_FIELDS = ("num_kv_heads", "q_first_row", "q_head_stride", "q_head_rows",
                  "q_rotary_rows", "k_first_row", "k_head_stride", "k_head_rows")

    def register_qk_clip(self, q_param_id, k_param_id, num_heads, alpha=0.5, **rows):
        """Registers an attention layer for qk_clip (muon_register_qk_clip):
        query head h is rows [q_first_row + h * q_head_stride, + q_head_rows)
        of parameter q_param_id's global matrix, key head g the same of
        k_param_id's with the k_ fields; num_kv_heads for GQA; q_rotary_rows
        for MLA. Zeros (the defaults) ask for heads splitting the rows evenly.
        Returns the layer's id."""
        unknown = set(rows) - set(self._QK_FIELDS)
        if unknown:
            raise TypeError("muon: register_qk_clip got unknown arguments %s; it takes %s"
                            % (sorted(unknown), ", ".join(self._QK_FIELDS)))
        layer = _lib.muon_qk_clip_layer_t()
        check(_lib_handle.muon_qk_clip_layer_init(ctypes.byref(layer), ctypes.sizeof(layer)))
        layer.q_param, layer.k_param = operator.index(q_param_id), operator.index(k_param_id)
        layer.num_heads = operator.index(num_heads)
        layer.alpha = float(alpha)
        for name, value in rows.items():
            setattr(layer, name, operator.index(value if value is not None else 0))
        out = ctypes.c_int64()
        check(_lib_handle.muon_register_qk_clip(self._h(), ctypes.byref(layer), ctypes.byref(out)))
        return out.value

    def qk_clip(self, layer_id, max_logits, tau):
        """QK-Clip of a registered layer (muon_qk_clip): `max_logits` holds the
        layer's largest attention logit of each query head (a sequence, numpy
        array or tensor), the same on every rank; returns how many heads were
        clipped. Scales this rank's pieces of the layer's parameters."""
        values = [float(v) for v in (max_logits.tolist() if hasattr(max_logits, "tolist")
                                     else max_logits)]
        array = (ctypes.c_float * max(len(values), 1))(*values)
        clipped = ctypes.c_int32()
        check(_lib_handle.muon_qk_clip(self._h(), int(layer_id), array, len(values), float(tau),
                                       ctypes.byref(clipped)))
        return clipped.value

    def state_bytes(self):
        """The whole optimizer state (step count and momentum buffers) as bytes."""
        h = self._h()
        size = ctypes.c_size_t()
        check(_lib_handle.muon_save_state(h, None, 0, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(max(size.value, 1))
        check(_lib_handle.muon_save_state(h, buf, size.value, ctypes.byref(size)))
        return buf.raw[:size.value]

    def load_state_bytes(self, data):
        """Restores state written by state_bytes() into an optimizer with the same
        parameters registered in the same order. Hyper-parameters are not restored."""
        data = bytes(data)
        check(_lib_handle.muon_load_state(self._h(), data, len(data)))

    def load_states_bytes(self, blobs):
        """Restores this rank's state from several ranks' state_bytes() (e.g.
        every blob of a checkpoint saved at another world size or layout:
        muon_load_states). Each param's elements are found by name and global
        coordinates in whichever blob holds them. Refused while a custom-path
        parameter is registered (load this rank's own blob with
        load_state_bytes)."""
        blobs = [bytes(b) for b in blobs]
        n = len(blobs)
        buffers = (ctypes.c_void_p * max(n, 1))(
            *[ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p) for b in blobs])
        sizes = (ctypes.c_size_t * max(n, 1))(*[len(b) for b in blobs])
        check(_lib_handle.muon_load_states(self._h(), buffers, sizes, n))  # blobs: alive

    def __repr__(self):
        if self.closed:
            return "<muon.Optimizer (closed)>"
        return "<muon.Optimizer: %d params, %d steps, lr=%g>" % (
            self.num_params, self.step_count, self.lr)
