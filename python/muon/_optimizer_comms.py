"""muon.Optimizer's communicators: set_world and add_group, the group ids a
placement may name by its communicator, the exceptions a communicator written
in Python raised, and the refusal of GPU tensors with one (it moves host
memory). Optimizer inherits these methods (OptimizerComms)."""

from __future__ import annotations

import ctypes
import operator
from typing import TYPE_CHECKING, Any

from . import _comm, _lib
from ._errors import check
from ._tensor import is_torch

_lib_handle = _lib.lib


class OptimizerComms:
    """muon.Optimizer's methods over its communicators (self._comms, in the
    order given; self._group_ids: id(communicator) -> group id)."""

    if TYPE_CHECKING:  # muon.Optimizer's
        _comms: list[Any]
        _group_ids: dict[int, int]
        _world: tuple[int, int] | None
        _world_comm: Any
        _callback_errors: list[tuple[str, BaseException]]

        def _h(self) -> ctypes.c_void_p: ...

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

    def set_world(self, comm: Any) -> int:
        """Sets the world communicator (every rank taking part in step()); returns its
        group id, usable in placements. Set once, before registering parameters."""
        h = self._h()
        table = self._table_of(comm)
        gid = ctypes.c_int32()
        check(_lib_handle.muon_set_world(h, ctypes.byref(table), ctypes.byref(gid)))
        self._adopt(comm, gid.value)
        self._world = (table.rank, table.size)
        self._world_comm = comm
        return gid.value

    def add_group(self, comm: Any) -> int:
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
    def world_comm(self) -> Any:
        """The communicator given to set_world (None before it)."""
        return self._world_comm

    @property
    def world_rank(self) -> int | None:
        """This rank in the world (None without a world)."""
        return self._world[0] if self._world else None

    @property
    def world_size(self) -> int | None:
        """Ranks in the world (None without a world)."""
        return self._world[1] if self._world else None

    def _take_callback_errors(self):
        taken = list(self._callback_errors)
        del self._callback_errors[:len(taken)]
        for comm in self._comms:
            taken.extend(_comm.take_errors(comm))
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
