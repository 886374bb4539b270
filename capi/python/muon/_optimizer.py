"""Optimizer: one libmuon optimizer handle, driven from Python."""

import ctypes

from . import _lib
from ._tensor import TensorView, is_numpy, is_torch

_lib_handle = _lib.lib


class MuonError(RuntimeError):
    """A libmuon call failed.

    `status` is the status name ("INVALID_ARGUMENT", "FAILED_PRECONDITION", ...),
    `code` its number (absl::StatusCode numbering), `message` the library's
    detail (muon_last_error_message), which names the parameter and the cause.
    """

    def __init__(self, status, message=""):
        if isinstance(status, str):
            code = _lib.STATUS_CODES.get(status, 2)
            name = status
        else:
            code = int(status)
            name = _lib.STATUS_NAMES.get(code, "UNRECOGNIZED_STATUS(%d)" % code)
        super().__init__(name, message)
        self.status = name
        self.code = code
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.status, self.message) if self.message else self.status


def _check(status):
    if status != 0:
        message = _lib_handle.muon_last_error_message()
        raise MuonError(status, message.decode("utf-8", "replace") if message else "")


def version():
    """The loaded library's version as (major, minor, patch)."""
    parts = [ctypes.c_int32() for _ in range(3)]
    _lib_handle.muon_get_version(*[ctypes.byref(p) for p in parts])
    return tuple(p.value for p in parts)


_ADJUST_LR = {
    "original": _lib.ADJUST_LR_ORIGINAL,
    "match_rms_adamw": _lib.ADJUST_LR_MATCH_RMS_ADAMW,
    "none": _lib.ADJUST_LR_NONE,
}
_NS_DTYPE = {
    "bf16": _lib.NS_DTYPE_BF16,
    "bfloat16": _lib.NS_DTYPE_BF16,
    "fp32": _lib.NS_DTYPE_FP32,
    "float32": _lib.NS_DTYPE_FP32,
}
_MATRIX_VIEW = {
    "2d": _lib.MATRIX_VIEW_2D,
    "flatten_trailing": _lib.MATRIX_VIEW_FLATTEN_TRAILING,
    "batched_leading": _lib.MATRIX_VIEW_BATCHED_LEADING,
}


def _choice(kind, value, table):
    key = str(value).lower().replace("-", "_")
    if key.startswith("torch."):  # torch.bfloat16 / torch.float32 for ns_dtype
        key = key[len("torch."):]
    if key not in table:
        raise ValueError("muon: unknown %s %r; use one of %s" % (kind, value, sorted(table)))
    return table[key]


def _set_coefficients(o, spec):
    """Fills the coefficient fields of `o`; returns the ctypes table to keep alive."""
    if isinstance(spec, str):
        if spec.lower().replace("-", "_") != "polar_express":
            raise ValueError("muon: unknown ns_coefficients preset %r; use 'polar_express', "
                             "an (a, b, c) tuple or a list of them" % spec)
        o.ns_coefficients = _lib.NS_COEFFICIENTS_POLAR_EXPRESS
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


class _Registered:
    __slots__ = ("name", "param", "grad", "track_torch_grad")

    def __init__(self, name, param, grad, track_torch_grad):
        self.name = name
        self.param = param
        self.grad = grad
        self.track_torch_grad = track_torch_grad


class Optimizer:
    """The Muon optimizer over host-owned matrices: one libmuon handle.

    This is the low-level interface (register arrays, step); it works with numpy
    alone. With torch, register a parameter itself (an nn.Parameter, rather
    than p.data) with its .grad: step() then also checks that p.grad is still
    the registered tensor (autograd swaps it after zero_grad(set_to_none=True)).

    Parameters and gradients (numpy arrays or torch CPU tensors, float32,
    bfloat16 or float16, row-major contiguous) are registered once and then
    borrowed: the library keeps their data pointers, reads the gradients at
    every step() and updates the parameters in place. This object keeps a
    reference to every registered array, so they live as long as it does.

    Arguments left as None take the library's defaults (capi/muon.h): lr 1e-3,
    weight_decay 0.1, momentum 0.95, nesterov True, ns_steps 5,
    ns_coefficients (3.4445, -4.7750, 2.0315), eps 1e-7, adjust_lr "original",
    ns_dtype "bf16", momentum_fp32 False.

    ns_coefficients: an (a, b, c) tuple for every iteration, a list of (a, b, c)
    rows (row i for iteration i, the last row reused after the end), or
    "polar_express". adjust_lr: "original", "match_rms_adamw", or None / "none"
    (no adjustment). ns_dtype: "bf16" (as torch.optim.Muon) or "fp32".

    Not thread-safe: use one optimizer from one thread at a time.
    """

    def __init__(self, lr=None, weight_decay=None, momentum=None, nesterov=None, ns_steps=None,
                 ns_coefficients=None, eps=None, adjust_lr="original", ns_dtype=None,
                 momentum_fp32=None):
        self._handle = None
        self._params = []
        self._destroy = _lib_handle.muon_destroy  # usable even during interpreter shutdown

        o = _lib.muon_options_t()
        _check(_lib_handle.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)))
        if lr is not None:
            o.lr = float(lr)
        if weight_decay is not None:
            o.weight_decay = float(weight_decay)
        if momentum is not None:
            o.momentum = float(momentum)
        if nesterov is not None:
            o.nesterov = 1 if nesterov else 0
        if ns_steps is not None:
            o.ns_steps = int(ns_steps)
        if eps is not None:
            o.eps = float(eps)
        o.adjust_lr = _choice("adjust_lr", "none" if adjust_lr is None else adjust_lr,
                              _ADJUST_LR)
        if ns_dtype is not None:
            o.ns_dtype = _choice("ns_dtype", ns_dtype, _NS_DTYPE)
        if momentum_fp32 is not None:
            o.momentum_fp32 = 1 if momentum_fp32 else 0
        table = None
        if ns_coefficients is not None:
            table = _set_coefficients(o, ns_coefficients)
        handle = _lib.opt_p()
        _check(_lib_handle.muon_create(ctypes.byref(o), ctypes.byref(handle)))
        del table  # copied by muon_create
        self._handle = handle

    # -- lifetime ----------------------------------------------------------

    def close(self):
        """Destroys the optimizer and releases the registered arrays. Idempotent."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._destroy(handle)
        self._params = []

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
        """The current options as a dict (ns_table itself is not handed out)."""
        o = _lib.muon_options_t()
        _check(_lib_handle.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)))
        _check(_lib_handle.muon_get_options(self._h(), ctypes.byref(o)))
        return {name: getattr(o, name) for name, _ in o._fields_
                if name not in ("struct_size", "ns_table", "reserved0")}

    @property
    def lr(self):
        return self.options()["lr"]

    @lr.setter
    def lr(self, value):
        _check(_lib_handle.muon_set_lr(self._h(), float(value)))

    @property
    def weight_decay(self):
        return self.options()["weight_decay"]

    @weight_decay.setter
    def weight_decay(self, value):
        _check(_lib_handle.muon_set_weight_decay(self._h(), float(value)))

    @property
    def momentum(self):
        return self.options()["momentum"]

    @momentum.setter
    def momentum(self, value):
        _check(_lib_handle.muon_set_momentum(self._h(), float(value)))

    # -- parameters -------------------------------------------------------------

    def register(self, param, grad, name=None, matrix_view="2d"):
        """Registers a parameter and its gradient; returns the parameter's id.

        matrix_view: "2d" (default), "flatten_trailing" ((d0, d1, ...) as one
        d0 x (d1*...) matrix) or "batched_leading" ((n, d1, d2, ...) as n
        matrices d1 x (d2*...)). Registration closes at the first step().
        """
        h = self._h()
        if is_numpy(param) and not param.flags.writeable:
            raise ValueError("muon: param %r is a read-only array; the optimizer updates "
                             "parameters in place" % (name or "?"))
        pv, gv = TensorView(param), TensorView(grad)
        po = _lib.muon_param_options_t()
        _check(_lib_handle.muon_param_options_init(ctypes.byref(po), ctypes.sizeof(po)))
        if name is not None:
            po.name = str(name).encode("utf-8")
        po.matrix_view = _choice("matrix_view", matrix_view, _MATRIX_VIEW) \
            if not isinstance(matrix_view, int) else matrix_view
        pid = ctypes.c_int64()
        _check(_lib_handle.muon_register_param(h, pv.ref, gv.ref, ctypes.byref(po),
                                               ctypes.byref(pid)))
        # torch autograd may swap a parameter's .grad for a new tensor (zero_grad with
        # set_to_none=True); then the library would read a stale buffer. Watch for it.
        track = is_torch(param) and getattr(param, "grad", None) is grad
        self._params.append(_Registered(name if name is not None else "param%d" % pid.value,
                                        pv, gv, track))
        return pid.value

    @property
    def num_params(self):
        n = ctypes.c_size_t()
        _check(_lib_handle.muon_num_params(self._h(), ctypes.byref(n)))
        return n.value

    def __len__(self):
        return self.num_params

    # -- stepping ---------------------------------------------------------------

    def _check_torch_storage(self):
        for r in self._params:
            p = r.param.obj
            if is_torch(p) and p.data_ptr() != r.param.data_ptr:
                raise MuonError("FAILED_PRECONDITION",
                                "param '%s': its storage moved since registration (was "
                                "param.data reassigned?); the library updates the registered "
                                "storage" % r.name)
            if r.track_torch_grad:
                g = p.grad
                if g is None or g.data_ptr() != r.grad.data_ptr:
                    raise MuonError("FAILED_PRECONDITION",
                                    "param '%s': its .grad is no longer the registered tensor "
                                    "(set to None or replaced); zero gradients in place, e.g. "
                                    "p.grad.zero_() or zero_grad(set_to_none=False)" % r.name)

    def step(self):
        """One Muon step over every registered parameter."""
        h = self._h()
        self._check_torch_storage()
        _check(_lib_handle.muon_step(h, None))

    @property
    def step_count(self):
        n = ctypes.c_int64()
        _check(_lib_handle.muon_step_count(self._h(), ctypes.byref(n)))
        return n.value

    # -- state ---------------------------------------------------------------------

    def get_state(self, param_id, out=None):
        """A copy of a parameter's momentum buffer.

        A torch tensor for torch parameters, a numpy array for numpy ones, of the
        parameter's shape and the state dtype (the gradient's, or float32 with
        momentum_fp32). With `out`, fills and returns that array instead.
        """
        h = self._h()
        if out is None:
            dt = _lib.DLDataType()
            _check(_lib_handle.muon_get_state_dtype(h, int(param_id), ctypes.byref(dt)))
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
        _check(_lib_handle.muon_get_state(h, int(param_id), view.ref))
        return out

    def set_state(self, param_id, value):
        """Overwrites a parameter's momentum buffer (shape and state dtype must match)."""
        view = TensorView(value)
        _check(_lib_handle.muon_set_state(self._h(), int(param_id), view.ref))

    def state_bytes(self):
        """The whole optimizer state (step count and momentum buffers) as bytes."""
        h = self._h()
        size = ctypes.c_size_t()
        _check(_lib_handle.muon_save_state(h, None, 0, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(max(size.value, 1))
        _check(_lib_handle.muon_save_state(h, buf, size.value, ctypes.byref(size)))
        return buf.raw[:size.value]

    def load_state_bytes(self, data):
        """Restores state written by state_bytes() into an optimizer with the same
        parameters registered in the same order. Hyper-parameters are not restored."""
        data = bytes(data)
        _check(_lib_handle.muon_load_state(self._h(), data, len(data)))

    def __repr__(self):
        if self.closed:
            return "<muon.Optimizer (closed)>"
        return "<muon.Optimizer: %d params, %d steps, lr=%g>" % (
            self.num_params, self.step_count, self.lr)
