"""muon.Muon's state in torch's format: state_dict() and load_state_dict()
(the momentum buffers and NorMuon moments the library holds copied out and
back, flat buffers' state folded buffer-shaped), and copy.deepcopy / pickle
(__getstate__, __setstate__). Muon inherits these methods (TorchState)."""

from __future__ import annotations

import collections
import weakref
from typing import TYPE_CHECKING, Any

import torch

from ._comm import gather_objects
from ._group_options import GROUP_KEYS, check_group, variants_of

# What __getstate__ returns carries this key; torch's load_state_dict calls
# __setstate__ with a dict without it.
_COPY_MARK = "_muon_copy"


def _on_mesh(p):
    """Whether p is a DTensor (a device mesh and a local tensor)."""
    return hasattr(p, "device_mesh") and callable(getattr(p, "to_local", None))


def _like_param(buf, p):
    """A local momentum buffer as the param is: a DTensor with the param's mesh and
    placements for a DTensor param (so torch.distributed.checkpoint can reshard
    it), else the tensor itself."""
    if not _on_mesh(p):
        return buf
    return type(p).from_local(buf.to(p.to_local().device), p.device_mesh, p.placements,
                              shape=p.shape, stride=p.stride())


def _replicated_like(t, p):
    """Moments of a whole matrix for a DTensor param: a DTensor replicated over
    the param's mesh (torch.distributed.checkpoint saves it once and loads it
    at any layout), else the tensor itself."""
    if not _on_mesh(p):
        return t
    from torch.distributed.tensor import Replicate
    return type(p).from_local(t.to(p.to_local().device), p.device_mesh,
                              [Replicate()] * p.device_mesh.ndim, run_check=False)


class _State(collections.defaultdict):
    """muon.Muon's `state`: torch's mapping of param -> its state (AdamW's, and
    momentum only while state_dict / load_state_dict run: the library holds
    it), true once any param has state in the library. torch's
    get_optimizer_state_dict and torchtitan's checkpointer take a false
    `optimizer.state` for "never stepped" and run a zero-gradient step at lr
    0 to make some, which would decay every momentum buffer by `momentum`."""

    def __init__(self, library_has_state, items=()):
        super().__init__(dict, items)
        self._library_has_state = library_has_state

    def __bool__(self):
        return len(self) > 0 or self._library_has_state()

    def __reduce__(self):  # pickled and copied as torch's defaultdict(dict)
        return collections.defaultdict, (dict,), None, None, iter(self.items())


# What TorchState's methods find on muon.Muon, for the type checker.
if TYPE_CHECKING:
    _MuonBase = torch.optim.Optimizer
else:
    _MuonBase = object


class TorchState(_MuonBase):
    """muon.Muon's state_dict, load_state_dict, __getstate__ and __setstate__."""

    @property  # type: ignore[override]
    def state(self) -> collections.defaultdict:
        d = self.__dict__
        if "state" in d:  # torch's __setstate__ updates __dict__ directly
            self.state = d.pop("state")
        return d["_state"]

    @state.setter
    def state(self, value: Any) -> None:
        owner = weakref.ref(self)  # (no cycle: the optimizer is freed as torch's is)
        self.__dict__["_state"] = _State(
            lambda: bool(getattr(owner(), "_has_state", None)), value)

    if TYPE_CHECKING:  # muon.Muon's
        _numbers: dict[int, tuple[dict[str, Any], int]]
        _by_number: dict[int, dict[str, Any]]
        _groups: dict[int, Any]

        def _numbered(self) -> list[tuple[int, dict[str, Any]]]: ...
        def _flat_buffers(self) -> list[Any]: ...
        def _apply_pending(self, group: Any) -> None: ...

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

    def _moments(self, cached=True):
        """{id(member): a copy of its NorMuon second moments} for each member
        that has them (held by the library, or pending for a group not built).
        Under a distributed config each matrix's moments live on its owner
        rank: every rank gives those it owns and gathers the others' (a
        collective over the world, as torch's get_optimizer_state_dict is),
        unless the last step gathered them already (_cache_moments; `cached`
        False: gather now)."""
        out = {}
        owned = {}   # (group number, registered name, matrix) -> this rank's values
        wanted = []  # (member, group number, registered name, shape): assembled below
        comm = None
        for gi, group in self._numbered():
            if not variants_of(group)["normuon"]:
                continue
            g = self._groups.get(gi)
            if g is not None and g.normuon and comm is None:
                comm = g.opt.world_comm
            position = {id(q): k for k, q in enumerate(g.params)} if g is not None else {}
            for _, p in self._members(gi, group):
                k = position.get(id(p))
                if id(p) in self._pending_moments:
                    pending = self._pending_moments[id(p)]
                    if pending is not self.ZERO_MOMENTS:
                        out[id(p)] = pending.clone()
                elif (g is not None and g.normuon and self._has_state.get(id(p))
                      and k is not None and k < len(g.ids) and g.ids[k] is not None):
                    if self._config is None:
                        out[id(p)] = g.opt.get_moments(g.ids[k])
                        continue
                    values, flags = g.opt.get_owned_moments(g.ids[k])
                    name = g.opt.param_name(g.ids[k])
                    rows = values.reshape(len(flags), -1)
                    for m, mine in enumerate(flags):
                        if mine:
                            owned[(gi, name, m)] = rows[m].clone()
                    wanted.append((p, gi, name, tuple(values.shape)))
        if self._config is not None and comm is not None:
            cache = self._moments_cache if cached else None
            if cache is not None and all(id(p) in cache for p, _, _, _ in wanted):
                out.update((id(p), cache[id(p)].clone()) for p, _, _, _ in wanted)
            else:
                out.update(self._gather_moments(comm, owned, wanted))
        return out

    def _cache_moments(self):
        """At the end of each step under a distributed config with NorMuon, on
        every rank (collective, as the step is): the moments gathered, so that
        state_dict() called on one rank alone needs no collective (Hugging
        Face's Trainer saves a DDP job's optimizer from rank 0 only; a gather
        there would wait for ranks that went on). A world of C functions
        cannot gather: state_dict() tries then, and says why it cannot."""
        self._moments_cache = None
        if self._config is None:
            return
        try:  # (no NorMuon group: nothing gathered, an empty cache)
            self._moments_cache = self._moments(cached=False)
        except NotImplementedError:
            pass

    @staticmethod
    def _gather_moments(comm, owned, wanted):
        """The whole moments of each wanted member, each matrix from the rank
        that owns it."""
        try:
            everyone = gather_objects(comm, owned)
        except TypeError:
            raise NotImplementedError(
                "muon.Muon: with normuon=True, NorMuon's second moments live on each "
                "matrix's owner rank, and state_dict() gathers them through the world "
                "communicator, which must be a muon.Communicator (a torch.distributed group, "
                "or one written in Python); this world's collectives are C functions. "
                "Checkpoint through the library's state blobs (muon.Optimizer.state_bytes / "
                "load_states_bytes) instead") from None
        found = {}
        for part in everyone:
            found.update(part)
        out = {}
        for p, gi, name, shape in wanted:
            whole = torch.zeros(shape, dtype=torch.float32)
            rows = whole.view(shape[0] if len(shape) == 2 else 1, -1)  # a row per matrix
            for m in range(rows.shape[0]):
                values = found.get((gi, name, m))
                if values is None:
                    raise RuntimeError("muon.Muon: no rank gave the NorMuon moments of matrix "
                                       "%d of '%s'" % (m, name))
                rows[m].copy_(values)
            out[id(p)] = whole
        return out

    def _take_momentum_from_state(self):
        """Moves the momentum buffers (and NorMuon moments) self.state holds
        (just loaded or copied) to where the next build gives them to the
        library."""
        for gi, group in self._numbered():
            normuon = variants_of(group)["normuon"]
            for _, p in self._members(gi, group):
                entry = self.state.get(p)
                moments = entry.pop("normuon_second_moment", None) if entry is not None else None
                if moments is not None and callable(getattr(moments, "full_tensor", None)):
                    moments = moments.full_tensor()  # replicated over the param's mesh
                # A state without them (torch's, or saved without normuon) starts
                # them at zero, as the library's state blobs do (under a config
                # p is this rank's piece: zeros of the whole matrices' shape
                # when the group is built, self.ZERO_MOMENTS until then).
                if normuon and moments is None and p.ndim >= 1:
                    moments = (self.ZERO_MOMENTS if self._config is not None
                               else torch.zeros((p.shape[0],), dtype=torch.float32))
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

    def state_dict(self) -> dict[str, Any]:
        added = []  # (tensor, what self.state held for it before)

        def put(t, entry):
            added.append((t, self.state.get(t)))
            if entry is None:
                self.state.pop(t, None)
            else:
                self.state[t] = entry

        moments = self._moments()
        for p, buf in self._momentum_buffers():
            extra = ({"normuon_second_moment": _replicated_like(moments[id(p)], p)}
                     if id(p) in moments else {})
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

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The flat buffers first: a config that cannot map them yet (DeepSpeed's,
        # unbound) refuses before anything changes.
        self._flat_buffers()
        self._moments_cache = None
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
            for key in GROUP_KEYS:
                if key not in group:
                    group[key] = self.defaults[key]
            check_group(group)
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
            matrix_keys = ("momentum_buffer", "normuon_second_moment")
            adamw_keys = tuple(k for k in entry if k not in matrix_keys)
            for v, values in fb.unfold(entry, lambda view: matrix_keys
                                       if id(view) in matrices else adamw_keys).items():
                self.state[v] = values
