"""muon.Optimizer's state and QK-Clip: each parameter's momentum buffer and
NorMuon moments, the whole state as bytes (state blobs), and QK-Clip's
layers. Optimizer inherits these methods (OptimizerState)."""

from __future__ import annotations

import ctypes
import operator
from typing import TYPE_CHECKING, Any, Iterable, Sequence, Union

from . import _lib
from ._errors import check
from ._tensor import TensorView, is_torch

if TYPE_CHECKING:
    from ._tensor import Tensor

    Blob = Union[bytes, bytearray, memoryview]  # what state_bytes() returned

_lib_handle = _lib.lib


class OptimizerState:
    """muon.Optimizer's methods over the library's state (self._h(): the handle;
    self._params: the registered parameters)."""

    if TYPE_CHECKING:  # muon.Optimizer's
        _params: list[Any]

        def _h(self) -> ctypes.c_void_p: ...

        def _stream_of(self, stream: Any) -> Any: ...

    def state_dtype(self, param_id: int) -> str:
        """The dtype of a parameter's momentum buffer: "float32", "bfloat16" or "float16"."""
        dt = _lib.DLDataType()
        check(_lib_handle.muon_get_state_dtype(self._h(), int(param_id), ctypes.byref(dt)))
        return {(_lib.kDLFloat, 32): "float32", (_lib.kDLFloat, 16): "float16",
                (_lib.kDLBfloat, 16): "bfloat16"}[(dt.code, dt.bits)]

    def get_state(self, param_id: int, out: Tensor | None = None) -> Any:
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

    def set_state(self, param_id: int, value: Tensor) -> None:
        """Overwrites a parameter's momentum buffer (shape and state dtype must match)."""
        view = TensorView(value)
        check(_lib_handle.muon_set_state(self._h(), int(param_id), view.ref))

    def _moments_buffer(self, param_id):
        rec = self._params[int(param_id)] if 0 <= int(param_id) < len(self._params) else None
        shape = rec.moments_shape if rec is not None else (0,)
        if rec is not None and is_torch(rec.param.obj):
            import torch
            return torch.empty(shape, dtype=torch.float32)
        import numpy
        return numpy.empty(shape, dtype="float32")

    def get_moments(self, param_id: int) -> Any:
        """A copy of a parameter's NorMuon second moments (float32, one per row:
        shape (rows,), or (batch, rows) for a batched view), a torch tensor for
        torch parameters, else a numpy array. Before the first step, what was
        set or loaded (zeros when nothing); after it, only on the rank that owns
        every matrix of the parameter (muon_get_moments)."""
        out = self._moments_buffer(param_id)
        view = TensorView(out)
        check(_lib_handle.muon_get_moments(self._h(), int(param_id), view.ref))
        return out

    def get_owned_moments(self, param_id: int) -> tuple[Any, list[bool]]:
        """(moments, owned): the moments as get_moments gives them, of the
        matrices whose values this rank gives (owned[k]; after the first step
        exactly one rank owns each matrix), zeros for the others
        (muon_get_owned_moments). Taking matrix k from a rank that owns it
        gives the whole moments."""
        import numpy
        out = self._moments_buffer(param_id)
        count = int(out.shape[0]) if len(out.shape) == 2 else 1  # the matrices
        flags = numpy.zeros(max(count, 1), dtype="uint8")
        view = TensorView(out)
        check(_lib_handle.muon_get_owned_moments(
            self._h(), int(param_id), view.ref,
            flags.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), count))
        return out, [bool(f) for f in flags[:count]]

    def set_owned_moments(self, param_id: int, value: Tensor) -> None:
        """Given the whole moments on every rank that holds the parameter,
        keeps the matrices this rank owns (before the first step: all, as
        set_moments; muon_set_owned_moments)."""
        view = TensorView(value)
        check(_lib_handle.muon_set_owned_moments(self._h(), int(param_id), view.ref))

    def set_moments(self, param_id: int, value: Tensor) -> None:
        """Overwrites a parameter's NorMuon second moments (float32, one per row
        of each matrix; muon_set_moments)."""
        view = TensorView(value)
        check(_lib_handle.muon_set_moments(self._h(), int(param_id), view.ref))

    # -- QK-Clip ------------------------------------------------------------------

    _QK_FIELDS = ("num_kv_heads", "q_first_row", "q_head_stride", "q_head_rows",
                  "q_rotary_rows", "k_first_row", "k_head_stride", "k_head_rows")

    def register_qk_clip(self, q_param_id: int, k_param_id: int, num_heads: int,
                         alpha: float = 0.5, **rows: int) -> int:
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

    def qk_clip(self, layer_id: int, max_logits: Sequence[float] | Tensor, tau: float,
                stream: Any = None) -> int:
        """QK-Clip of a registered layer (muon_qk_clip_on_stream): `max_logits`
        holds the layer's largest attention logit of each query head (a
        sequence, numpy array or tensor), the same on every rank; returns how
        many heads were clipped. Scales this rank's pieces of the layer's
        parameters; on a GPU on `stream` (default: torch's current stream on
        the parameters' device, as step's), without waiting."""
        values = [float(v) for v in (max_logits.tolist() if hasattr(max_logits, "tolist")
                                     else max_logits)]
        array = (ctypes.c_float * max(len(values), 1))(*values)
        clipped = ctypes.c_int32()
        check(_lib_handle.muon_qk_clip_on_stream(self._h(), int(layer_id), array, len(values),
                                                 float(tau), self._stream_of(stream),
                                                 ctypes.byref(clipped)))
        return clipped.value

    def state_bytes(self) -> bytes:
        """The whole optimizer state (step count and momentum buffers) as bytes."""
        h = self._h()
        size = ctypes.c_size_t()
        check(_lib_handle.muon_save_state(h, None, 0, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(max(size.value, 1))
        check(_lib_handle.muon_save_state(h, buf, size.value, ctypes.byref(size)))
        return buf.raw[:size.value]

    def load_state_bytes(self, data: Blob) -> None:
        """Restores state written by state_bytes() into an optimizer with the same
        parameters registered in the same order. Hyper-parameters are not restored."""
        data = bytes(data)
        check(_lib_handle.muon_load_state(self._h(), data, len(data)))

    def load_states_bytes(self, blobs: Iterable[Blob]) -> None:
        """Restores this rank's state from several ranks' state_bytes() (e.g.
        every blob of a checkpoint saved at another world size or layout:
        muon_load_states). Each param's elements are found by name and global
        coordinates in whichever blob holds them. Refused while a custom-path
        parameter is registered (load this rank's own blob with
        load_state_bytes)."""
        held = [bytes(b) for b in blobs]
        n = len(held)
        buffers = (ctypes.c_void_p * max(n, 1))(
            *[ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p) for b in held])
        sizes = (ctypes.c_size_t * max(n, 1))(*[len(b) for b in held])
        check(_lib_handle.muon_load_states(self._h(), buffers, sizes, n))  # held: alive
