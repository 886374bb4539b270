"""Optimizer: one libmuon optimizer handle, driven from Python (registration,
stepping; the communicator methods in _optimizer_comms.py, the state and
QK-Clip methods in _optimizer_state.py, the options' C structs in
_options.py, the C callbacks in _callbacks.py)."""

from __future__ import annotations

import ctypes
import operator
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence, TypeVar, cast

from . import _lib
from ._callbacks import allocator_callbacks, assignment_callback, custom_layout
from ._comm import fill_placement
from ._errors import MuonError, check, describe, error
from ._optimizer_comms import OptimizerComms
from ._optimizer_pending import PendingRegistrations
from ._optimizer_state import OptimizerState
from ._options import (MATRIX_VIEW, REPLICATED_MODE, choice, fill_options, fill_split,
                       moments_shape, split_spec)
from ._tensor import TensorView, is_numpy, is_torch

if TYPE_CHECKING:
    import numpy
    import torch

    from ._comm import Placement
    from ._options import Coefficients
    from ._tensor import Tensor

_lib_handle = _lib.lib
_T = TypeVar("_T", bound=Any)  # orthogonalize's array: numpy in, numpy out; torch in, torch out


def version() -> tuple[int, int, int]:
    """The loaded library's version as (major, minor, patch)."""
    parts = [ctypes.c_int32() for _ in range(3)]
    _lib_handle.muon_get_version(*[ctypes.byref(p) for p in parts])
    return (parts[0].value, parts[1].value, parts[2].value)


_STAT_FIELDS = tuple(field[0] for field in _lib.muon_stats_t._fields_
                     if field[0] != "struct_size")


class _Registered:
    __slots__ = ("name", "param", "grad", "track_torch_grad", "moments_shape")

    def __init__(self, name, param, grad, track_torch_grad, moments_shape=None):
        self.name = name
        self.param = param
        self.grad = grad
        self.track_torch_grad = track_torch_grad
        # NorMuon's moments: (rows,) of one matrix, (batch, rows) of several.
        self.moments_shape = moments_shape


def _tracks(param, grad):
    """Whether step() should check that param.grad is still `grad` (torch swaps
    a parameter's .grad after zero_grad(set_to_none=True))."""
    return grad is not None and is_torch(param) and getattr(param, "grad", None) is grad


class Optimizer(OptimizerComms, OptimizerState, PendingRegistrations):
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
    "polar_express". adjust_lr: "original", "match_rms_adamw", "spectral_unclamped",
    "spectral" (lr * sqrt(max(rows, cols))), or None / "none"
    (no adjustment). ns_dtype: "bf16" (as torch.optim.Muon) or "fp32".

    Distributed engine (with set_world): assignment is "balanced",
    "round_robin", "spread" (balanced, then levelled within a pipeline stage
    by handing matrices to ranks that hold none of them: MUON_ASSIGNMENT_SPREAD
    in include/libmuon/muon.h), "split" (spread, then a matrix that bounds its stage
    orthogonalized by several ranks together: MUON_ASSIGNMENT_SPLIT; CPU and
    CUDA, AOL on the CPU only so far) or a callable that receives one dict per matrix of the job
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
    allocator: the optimizer's own memory (momentum, update and exchange
    buffers, the Newton-Schulz workspace) from an object with
    allocate(nbytes, device_type, device_id, stream) -> address and
    release(address, nbytes, device_type, device_id, stream), called at
    registration, the first step and close (muon_options_t.allocate; blocks
    aligned to 64 bytes). muon.TorchAllocator serves it from torch's caching
    allocator on GPUs (what muon.Muon does for CUDA parameters) and torch's
    CPU allocator on the host. None (default): the library's own.

    Not thread-safe: use one optimizer from one thread at a time (ranks run as
    threads each use their own).
    """

    def __init__(self, lr: float | None = None, weight_decay: float | None = None,
                 momentum: float | None = None, nesterov: bool | None = None,
                 ns_steps: int | None = None, ns_coefficients: Coefficients | None = None,
                 eps: float | None = None, adjust_lr: str | None = "original",
                 ns_dtype: str | torch.dtype | None = None, momentum_fp32: bool | None = None,
                 assignment: str | Callable[[list[dict[str, Any]]], Sequence[int]] | None = None,
                 prefetch_count: int | None = None, async_parallelism: bool | None = None,
                 round_bytes: int | None = None, skip_nonfinite: bool | None = None,
                 update_in_grad: bool | None = None, update_scale: float | None = None,
                 cautious_wd: bool | None = None, normuon: bool | None = None,
                 normuon_beta2: float | None = None, normuon_eps: float | None = None,
                 ns_algorithm: str | None = None, gram_restarts: Iterable[int] | None = None,
                 skip_nonfinite_updates: bool | None = None, allocator: Any = None) -> None:
        self._handle = None
        self._params = []
        self._comms = []        # communicator objects given to set_world / add_group
        self._group_ids = {}    # id(communicator object) -> group id
        self._keep: list[Any] = []  # ctypes callbacks and arrays the library calls or reads
        self._callback_errors = []  # (where, exception) raised by Python callbacks
        self._init_pending()
        self._world = None      # (rank, size) of the world communicator
        self._world_comm = None  # the communicator given to set_world
        self._destroy = _lib_handle.muon_destroy  # usable even during interpreter shutdown

        o = _lib.muon_options_t()
        check(_lib_handle.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)))

        def keep_callback(fn):
            callback = assignment_callback(fn, self._callback_errors)
            self._keep.append(callback)
            return callback

        table = fill_options(
            o, keep_callback, lr=lr, weight_decay=weight_decay, momentum=momentum,
            nesterov=nesterov, ns_steps=ns_steps, ns_coefficients=ns_coefficients, eps=eps,
            adjust_lr=adjust_lr, ns_dtype=ns_dtype, momentum_fp32=momentum_fp32,
            assignment=assignment, prefetch_count=prefetch_count,
            async_parallelism=async_parallelism, round_bytes=round_bytes,
            skip_nonfinite=skip_nonfinite, update_in_grad=update_in_grad,
            update_scale=update_scale, cautious_wd=cautious_wd, normuon=normuon,
            normuon_beta2=normuon_beta2, normuon_eps=normuon_eps, ns_algorithm=ns_algorithm,
            gram_restarts=gram_restarts, skip_nonfinite_updates=skip_nonfinite_updates)
        if allocator is not None:
            if not (callable(getattr(allocator, "allocate", None))
                    and callable(getattr(allocator, "release", None))):
                raise TypeError("muon.Optimizer: allocator must have allocate(nbytes, "
                                "device_type, device_id, stream) and release(address, nbytes, "
                                "device_type, device_id, stream) (muon.TorchAllocator has)")
            o.allocate, o.release = allocator_callbacks(allocator, self._callback_errors)
            self._keep += [o.allocate, o.release, allocator]
        handle = _lib.opt_p()
        check(_lib_handle.muon_create(ctypes.byref(o), ctypes.byref(handle)))
        del table  # copied by muon_create
        self._handle = handle

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Destroys the optimizer and releases the registered arrays, communicators
        and callbacks. Idempotent. Raises MuonError (everything is released all
        the same) when an allocator's release raised while the library gave
        its memory back, naming what it raised."""
        handle, self._handle = getattr(self, "_handle", None), None
        sink = getattr(self, "_callback_errors", [])
        before = len(sink)
        if handle:
            self._destroy(handle)
        raised = sink[before:]  # what the callbacks raised while it was destroyed
        del sink[before:]
        # Only once the library is gone: it may call or read these until then.
        self._params = []
        self._comms = []
        self._group_ids = {}
        self._keep = []
        if raised:
            seen: dict[str, int] = {}
            for where, e in raised:
                text = "%s (in %s" % (describe(e), where)
                seen[text] = seen.get(text, 0) + 1
            raise MuonError("INTERNAL", "muon.Optimizer.close: the optimizer is destroyed, but a "
                            "Python callback raised %s" % "; ".join(
                                "%s, %d call%s)" % (t, n, "" if n == 1 else "s")
                                for t, n in seen.items())) from raised[0][1]

    def __del__(self):
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def __enter__(self) -> Optimizer:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    @property
    def closed(self) -> bool:
        return not self._handle

    def _h(self):
        if not self._handle:
            raise ValueError("muon: the optimizer is closed")
        return self._handle

    # -- hyper-parameters -----------------------------------------------------

    def options(self) -> dict[str, Any]:
        """The current options as a dict (ns_table and assign_fn are not handed out)."""
        o = _lib.muon_options_t()
        check(_lib_handle.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)))
        check(_lib_handle.muon_get_options(self._h(), ctypes.byref(o)))
        return {field[0]: getattr(o, field[0]) for field in o._fields_
                if field[0] not in ("struct_size", "ns_table", "reserved0", "reserved1",
                                    "assign_fn", "assign_state")}

    @property
    def lr(self) -> float:
        return self.options()["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        check(_lib_handle.muon_set_lr(self._h(), float(value)))

    @property
    def weight_decay(self) -> float:
        return self.options()["weight_decay"]

    @weight_decay.setter
    def weight_decay(self, value: float) -> None:
        check(_lib_handle.muon_set_weight_decay(self._h(), float(value)))

    @property
    def momentum(self) -> float:
        return self.options()["momentum"]

    @momentum.setter
    def momentum(self, value: float) -> None:
        check(_lib_handle.muon_set_momentum(self._h(), float(value)))

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

    def register(self, param: Tensor, grad: Tensor, name: str | None = None,
                 matrix_view: str | int | None = "2d", global_shape: Sequence[int] | None = None,
                 placements: Sequence[Placement] | None = None,
                 replicated_mode: str | int = "host_averaged", lr_scale: float | None = None,
                 weight_decay_scale: float | None = None,
                 split_sizes: Sequence[int] | None = None, split_dim: int = 0,
                 _split_name: str | None = None) -> int:
        """Registers a parameter and its gradient; returns the parameter's id.

        matrix_view: "2d" (default), "flatten_trailing" ((d0, d1, ...) as one
        d0 x (d1*...) matrix) or "batched_leading" ((n, d1, d2, ...) as n
        matrices d1 x (d2*...)); None: what set_view() gave this name, else
        "2d". Registration closes at the first step().

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
        if matrix_view is None:
            matrix_view = self._pending_view(name if _split_name is None else _split_name)
        po.matrix_view = choice("matrix_view", matrix_view, MATRIX_VIEW) \
            if not isinstance(matrix_view, int) else matrix_view
        po.replicated_mode = choice("replicated_mode", replicated_mode, REPLICATED_MODE) \
            if not isinstance(replicated_mode, int) else replicated_mode
        if lr_scale is not None:
            po.lr_scale = float(lr_scale)
        if weight_decay_scale is not None:
            po.weight_decay_scale = float(weight_decay_scale)
        keep: list[Any] = []
        split = split_spec(split_sizes, split_dim, "param %r" % (name,)) \
            if split_sizes is not None else self._take_split(name if _split_name is None
                                                             else _split_name)
        fill_split(po, split, keep)
        if global_shape is not None:
            shape = [operator.index(d) for d in global_shape]
            dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            keep.append(dims)
            po.global_ndim = len(shape)
            po.global_shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
        if placements:
            placements = list(placements)
            array = (_lib.muon_placement_t * len(placements))()
            for i, pl in enumerate(placements):
                keep.append(fill_placement(pl, array[i], self._resolve_group, i))
            keep.append(array)
            po.num_placements = len(placements)
            po.placements = ctypes.cast(array, ctypes.POINTER(_lib.muon_placement_t))
        pid = ctypes.c_int64()
        self._check_with_callbacks(_lib_handle.muon_register_param(
            h, pv.ref, gv.ref, ctypes.byref(po), ctypes.byref(pid)))
        del keep  # copied by the library
        whole = global_shape if global_shape is not None else tuple(param.shape)
        self._params.append(_Registered(name if name is not None else "param%d" % pid.value,
                                        pv, gv, _tracks(param, grad),
                                        moments_shape(tuple(whole), po.matrix_view, split)))
        return pid.value

    def register_custom(self, param: Tensor, grad: Tensor, name: str, rows: int, cols: int,
                        assign_fn: Callable[[str, int], int],
                        gather_fn: Callable[[numpy.ndarray, int], Any],
                        redistribute_fn: Callable[[numpy.ndarray | None, int, numpy.ndarray],
                                                  None],
                        lr_scale: float | None = None, weight_decay_scale: float | None = None,
                        split_sizes: Sequence[int] | None = None, split_dim: int = 0) -> int:
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
        split = split_spec(split_sizes, split_dim, "param %r" % (name,)) \
            if split_sizes is not None else self._take_split(name)
        fill_split(po, split, self._keep)
        layout, callbacks = custom_layout(
            name, tuple(int(s) for s in getattr(param, "shape", ())), rows, cols, assign_fn,
            gather_fn, redistribute_fn, self._callback_errors)
        pid = ctypes.c_int64()
        check(_lib_handle.muon_register_param_custom(h, pv.ref, gv.ref, ctypes.byref(po),
                                                      ctypes.byref(layout), ctypes.byref(pid)))
        self._keep.append(callbacks)
        self._params.append(_Registered(str(name), pv, gv, _tracks(param, grad),
                                        moments_shape((operator.index(rows),), 0, split)))
        return pid.value

    def rebind(self, param_id: int, param: Tensor, grad: Tensor | None) -> None:
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
    def num_params(self) -> int:
        n = ctypes.c_size_t()
        check(_lib_handle.muon_num_params(self._h(), ctypes.byref(n)))
        return n.value

    def __len__(self) -> int:
        return self.num_params

    def param_name(self, param_id: int) -> str:
        """The name a parameter was registered under."""
        return self._params[operator.index(param_id)].name

    def param_tensor(self, param_id: int) -> Tensor:
        """The tensor (or array) a parameter is registered or rebound with."""
        return self._params[operator.index(param_id)].param.obj

    def param_address(self, param_id: int) -> int:
        """The address of that tensor's data, as registered or rebound."""
        return self._params[operator.index(param_id)].param.data_ptr

    def grad_tensor(self, param_id: int) -> Tensor | None:
        """The gradient bound to a parameter; None while unbound (rebind)."""
        grad = self._params[operator.index(param_id)].grad
        return grad.obj if grad is not None else None

    def grad_address(self, param_id: int) -> int:
        """The address of that gradient's data; 0 while unbound."""
        grad = self._params[operator.index(param_id)].grad
        return grad.data_ptr if grad is not None else 0

    # -- stepping ---------------------------------------------------------------

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

    def orthogonalize(self, x: _T, out: _T | None = None, matrix_view: str | int = "2d",
                      stream: Any = None) -> _T:
        """Newton-Schulz alone (muon_orthogonalize) with this optimizer's options:
        every matrix of `x` (a torch tensor or numpy array, seen through
        `matrix_view`) orthogonalized into `out` (default: a new array like x;
        `out` may be x itself). For CUDA tensors the work runs on `stream`
        (default: torch's current stream). Returns out."""
        result: _T = out if out is not None else \
            cast(_T, x.clone() if is_torch(x) else x.copy())
        xv, ov = TensorView(x), TensorView(result)
        view = choice("matrix_view", matrix_view, MATRIX_VIEW) \
            if not isinstance(matrix_view, int) else matrix_view
        if stream is None and is_torch(x) and x.is_cuda:
            import torch
            stream = torch.cuda.current_stream(x.device).cuda_stream or None
        else:
            stream = getattr(stream, "cuda_stream", stream) or None
        check(_lib_handle.muon_orthogonalize(self._h(), xv.ref, ov.ref, view, stream))
        return result

    def step(self, stream: Any = None) -> None:
        """One Muon step over every registered parameter (collective with a world).

        For CUDA tensors the work is enqueued on `stream` (default: torch's
        current stream of their device) and the call does not wait for the GPU.
        A failure raises MuonError; one caused by a Python callback (a
        Communicator method, a custom-path callable, the assignment) has that
        exception as its __cause__."""
        h = self._h()
        self._check_torch_storage()
        self._check_with_callbacks(_lib_handle.muon_step(h, self._stream_of(stream)))

    def _check_with_callbacks(self, status):
        """Raises MuonError for a failed call, naming (and chaining) what its
        Python callbacks raised."""
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

    def push_hyperparameters(self, stream: Any = None) -> None:
        """Writes the current lr, weight_decay and momentum where the step's
        kernels read them, ordered on `stream` (default as for step): before
        each replay of a step captured into a CUDA graph, so that the replays
        follow a schedule (muon_push_hyperparameters)."""
        check(_lib_handle.muon_push_hyperparameters(self._h(), self._stream_of(stream)))

    @property
    def step_count(self) -> int:
        n = ctypes.c_int64()
        check(_lib_handle.muon_step_count(self._h(), ctypes.byref(n)))
        return n.value

    def stats(self) -> dict[str, int | float]:
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

    def __repr__(self):
        if self.closed:
            return "<muon.Optimizer (closed)>"
        return "<muon.Optimizer: %d params, %d steps, lr=%g>" % (
            self.num_params, self.step_count, self.lr)
