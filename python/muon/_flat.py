"""Flat buffers: one 1-D tensor that holds ranges of several parameters.

FSDP1's FlatParameter (the parameters of one FSDP unit, flattened, joined and
split over the FSDP group), DeepSpeed ZeRO-1/2's partitions and Megatron's
distributed-optimizer shards are such buffers. muon.Muon steps each range as
a piece of its own parameter: a `Segment` says which parameter (name, whole
shape) and which elements of its row-major flattening ([start, start +
length)) sit at `offset` of the buffer. The matrices' ranges go to the
library as FlatRange pieces, the other parameters' ranges to AdamW, and the
buffer's optimizer state stays buffer-shaped (torch's format for the
parameter the host gave, which FSDP1's optim_state_dict understands).

This module reads segments (FSDP1's own metadata, or a table a framework
adapter gives) and keeps the views; it imports nothing of muon, and torch
only where a FlatBuffer needs it (the process-group configs import it, and
`import muon` stays free of torch).
"""

from __future__ import annotations

import math
from typing import Sequence


class Segment:
    """One parameter's range in a flat buffer: elements [start, start + length)
    of the row-major flattening of a tensor of `shape`, at `offset` of the
    buffer. `name` identifies the parameter on every rank."""

    __slots__ = ("name", "shape", "start", "length", "offset")

    name: str
    shape: tuple[int, ...]
    start: int
    length: int
    offset: int

    def __init__(self, name: str, shape: Sequence[int], start: int, length: int,
                 offset: int) -> None:
        self.name = str(name)
        self.shape = tuple(int(d) for d in shape)
        self.start = int(start)
        self.length = int(length)
        self.offset = int(offset)
        numel = math.prod(self.shape)
        if self.length < 0 or self.start < 0 or self.start + self.length > numel:
            raise ValueError("flat buffer: segment '%s' [%d, %d) is outside its parameter "
                             "of shape %s (%d elements)" % (self.name, self.start,
                                                            self.start + self.length,
                                                            self.shape, numel))

    def __repr__(self):
        return "Segment(%r, shape=%s, start=%d, length=%d, offset=%d)" % (
            self.name, self.shape, self.start, self.length, self.offset)


def fsdp1_segments(param):
    """The segments of an FSDP1 FlatParameter (use_orig_params=False, the
    default: model.parameters() yields these), read from its own metadata; None
    for any other tensor. Every parameter of the FSDP unit has a segment on
    every rank, empty where this rank's shard holds none of it."""
    if not getattr(param, "_is_flat_param", False):
        return None
    infos = getattr(param, "_shard_param_infos", None)
    fqns = getattr(param, "_fqns", None)
    shapes = getattr(param, "_shapes", None)
    if infos is None or fqns is None or shapes is None or \
            not len(infos) == len(fqns) == len(shapes):
        import torch
        raise ValueError("muon: an FSDP1 FlatParameter without the metadata of this torch "
                         "(_shard_param_infos, _fqns, _shapes); torch %s is not supported "
                         "for FSDP1 flat parameters" % torch.__version__)
    out = []
    for fqn, shape, info in zip(fqns, shapes, infos):
        if info.in_shard:
            out.append(Segment(fqn, shape, info.intra_param_start_idx, info.numel_in_shard,
                               info.offset_in_shard))
        else:
            out.append(Segment(fqn, shape, 0, 0, 0))
    return out


def check_segments(name, buffer, segments):
    """ValueError naming the buffer (1-D) when segments overlap or leave it."""
    seen = set()
    spans = []
    for s in segments:
        if s.name in seen:
            raise ValueError("muon: flat buffer '%s' names parameter '%s' twice"
                             % (name, s.name))
        seen.add(s.name)
        if s.offset < 0 or s.offset + s.length > buffer.numel():
            raise ValueError("muon: flat buffer '%s': segment '%s' at [%d, %d) is outside the "
                             "buffer's %d elements" % (name, s.name, s.offset,
                                                       s.offset + s.length, buffer.numel()))
        if s.length:
            spans.append((s.offset, s.offset + s.length, s.name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError("muon: flat buffer '%s': segments '%s' and '%s' overlap"
                             % (name, a, b))


class FlatBuffer:
    """A flat buffer the host gave muon.Muon (1-D, or any contiguous tensor read
    as its row-major flattening), and one leaf tensor per segment that views
    its range (the parameter's piece, 1-D) with a .grad that views the
    buffer's gradient (`grad_attr`: "grad", or "main_grad" where Megatron's
    DDP keeps it)."""

    __slots__ = ("param", "segments", "views", "grad_attr", "_data_ptr")

    def __init__(self, name, param, segments, grad_attr="grad"):
        import torch
        if not param.is_contiguous():
            raise ValueError("muon: flat buffer '%s' is not contiguous (strides %s)"
                             % (name, param.stride()))
        check_segments(name, param.detach().reshape(-1), segments)
        self.param = param
        self.segments = list(segments)
        self.grad_attr = grad_attr
        self.views = [torch.nn.Parameter(self._slice(param.data, s), requires_grad=False)
                      for s in self.segments]
        for view, s in zip(self.views, self.segments):
            view._muon_segment = s
            view._muon_buffer = param
        self._data_ptr = param.data_ptr()

    @staticmethod
    def _slice(t, s):
        return t.detach().view(-1).narrow(0, s.offset, s.length)

    def sync(self):
        """Points the views at the buffer's current storage and gradient (a host
        may swap either between steps); a view's .grad is None when the
        buffer's is."""
        p = self.param
        if p.data_ptr() != self._data_ptr:
            for view, s in zip(self.views, self.segments):
                view.data = self._slice(p.data, s)
            self._data_ptr = p.data_ptr()
        grad = getattr(p, self.grad_attr, None)
        for view, s in zip(self.views, self.segments):
            view.grad = None if grad is None else self._slice(grad, s)

    # State of a whole matrix rather than of its elements (NorMuon's per-row
    # second moments, as large as the matrix's rows wherever its range lies):
    # kept in the buffer's state as {segment name: value}.
    PER_MATRIX_KEYS = ("normuon_second_moment",)

    def fold(self, per_view_state):
        """One buffer-shaped state (torch's format for the buffer) from the views'
        states: each tensor state covers the whole buffer, zeros outside the
        views that have it; scalars (AdamW's step) are shared; a per-matrix
        state is a dict by segment name."""
        import torch
        out = {}
        for view, s in zip(self.views, self.segments):
            for key, value in (per_view_state.get(view) or {}).items():
                if key in self.PER_MATRIX_KEYS:
                    out.setdefault(key, {})[s.name] = value.clone()
                elif isinstance(value, torch.Tensor) and value.ndim >= 1:
                    full = out.get(key)
                    if full is None:
                        full = out[key] = torch.zeros(self.param.shape, dtype=value.dtype)
                    full.view(-1).narrow(0, s.offset, s.length).copy_(value.reshape(-1))
                else:
                    out[key] = value.clone() if isinstance(value, torch.Tensor) else value
        return out

    def unfold(self, state, keys_of_view):
        """The inverse of fold: {view: {key: its range of the buffer-shaped value}}
        for the keys keys_of_view(view) names (scalars shared)."""
        import torch
        out = {}
        for view, s in zip(self.views, self.segments):
            mine = {}
            for key in keys_of_view(view):
                if key not in state:
                    continue
                value = state[key]
                if key in self.PER_MATRIX_KEYS:
                    if not isinstance(value, dict):
                        raise ValueError("muon: state '%s' of a flat buffer is a %s, not a "
                                         "dict by segment name" % (key, type(value).__name__))
                    if s.name in value:
                        mine[key] = value[s.name].clone()
                elif isinstance(value, torch.Tensor) and value.ndim >= 1:
                    if value.numel() != self.param.numel():
                        raise ValueError("muon: state '%s' of a flat buffer has %d elements, "
                                         "the buffer %d" % (key, value.numel(),
                                                            self.param.numel()))
                    mine[key] = value.reshape(-1).narrow(0, s.offset, s.length).clone()
                else:
                    mine[key] = value.clone() if isinstance(value, torch.Tensor) else value
            if mine:
                out[view] = mine
        return out


def segment_of(t):
    """The Segment a view of muon.Muon's stands for, or None for a plain tensor."""
    return getattr(t, "_muon_segment", None)
