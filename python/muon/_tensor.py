"""Borrowed DLTensor views of numpy arrays and torch tensors (no copies).

A view describes the array's memory as it is: data pointer, shape, strides in
elements and dtype. Layout checks (contiguity, dtype support, device) are the
library's job, so its error messages reach the user unchanged.
"""

from __future__ import annotations

import ctypes
import sys
from typing import TYPE_CHECKING, Union

from . import _lib

if TYPE_CHECKING:
    from typing import Any, TypeGuard

    import numpy
    import torch

    # What the low level takes as a parameter, a gradient or a state: a numpy
    # array or a torch tensor (type checkers only).
    Tensor = Union[numpy.ndarray, torch.Tensor]


def is_torch(x: Any) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")  # not loaded: x cannot be a tensor
    return torch is not None and isinstance(x, torch.Tensor)


def is_numpy(x: Any) -> TypeGuard[numpy.ndarray]:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(x, numpy.ndarray)


class TensorView:
    """A DLTensor over `obj`'s memory, with everything it points to kept alive."""

    __slots__ = ("obj", "dl", "_shape", "_strides")

    def __init__(self, obj):
        if is_torch(obj):
            data, device, dtype = _torch_describe(obj)
            shape, strides = tuple(obj.shape), tuple(obj.stride())
        elif is_numpy(obj):
            data, device, dtype = _numpy_describe(obj)
            shape = obj.shape
            itemsize = obj.dtype.itemsize
            if any(s % itemsize for s in obj.strides):
                raise ValueError("muon: array strides %s (bytes) are not a multiple of the "
                                 "element size %d" % (obj.strides, itemsize))
            strides = tuple(s // itemsize for s in obj.strides)
        else:
            raise TypeError("muon: expected a numpy.ndarray or a torch.Tensor, got %s"
                            % type(obj).__name__)
        ndim = len(shape)
        self.obj = obj
        self._shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
        self._strides = (ctypes.c_int64 * max(ndim, 1))(*strides)
        self.dl = _lib.DLTensor(
            data=data,
            device=_lib.DLDevice(*device),
            ndim=ndim,
            dtype=_lib.DLDataType(*dtype),
            shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)),
            byte_offset=0,
        )

    @property
    def ref(self):
        return ctypes.byref(self.dl)

    @property
    def data_ptr(self):
        return self.dl.data or 0


def _torch_describe(t):
    import torch

    table = {
        torch.float32: (_lib.kDLFloat, 32, 1),
        torch.float16: (_lib.kDLFloat, 16, 1),
        torch.bfloat16: (_lib.kDLBfloat, 16, 1),
        torch.float64: (_lib.kDLFloat, 64, 1),
        torch.int8: (_lib.kDLInt, 8, 1),
        torch.int16: (_lib.kDLInt, 16, 1),
        torch.int32: (_lib.kDLInt, 32, 1),
        torch.int64: (_lib.kDLInt, 64, 1),
        torch.uint8: (_lib.kDLUInt, 8, 1),
    }
    if t.dtype not in table:
        raise TypeError("muon: torch dtype %s has no DLPack description here; Muon takes "
                        "float32, bfloat16 or float16" % t.dtype)
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError("muon: only dense (strided) torch tensors are accepted")
    if t.device.type == "cpu":
        device = (_lib.kDLCPU, 0)
    elif t.device.type == "cuda":
        device = (_lib.kDLCUDA, t.device.index or 0)
    else:
        raise TypeError("muon: torch device %s has no DLPack description here" % t.device)
    return t.data_ptr(), device, table[t.dtype]


def _numpy_describe(a):
    dt = a.dtype
    if not dt.isnative:
        raise TypeError("muon: array dtype %s is not in native byte order" % dt)
    codes = {"f": _lib.kDLFloat, "i": _lib.kDLInt, "u": _lib.kDLUInt}
    if dt.kind not in codes:
        raise TypeError("muon: numpy dtype %s has no DLPack description here; Muon takes "
                        "float32 or float16 (bfloat16 via torch)" % dt)
    return a.ctypes.data, (_lib.kDLCPU, 0), (codes[dt.kind], dt.itemsize * 8, 1)
