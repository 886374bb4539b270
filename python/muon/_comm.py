"""Placements and communicators for the distributed engine (include/libmuon/muon.h,
"Distributed layouts" and "Communicators").

- Shard / FlatRange / Replicate describe how a global tensor is cut down to
  this rank's piece, each over a group id (from Optimizer.set_world or
  Optimizer.add_group; the communicator object given there is accepted too).
- Communicator is the base class of a communicator written in Python: the
  library calls its methods through ctypes trampolines, on numpy uint8 arrays
  that view the library's own buffers (no copies).
- InProcessWorld hands out the library's in-process communicators (ranks as
  threads of one process).
"""

from __future__ import annotations

import ctypes
import operator
import threading
from typing import TYPE_CHECKING, Any, Sequence, Union

from . import _lib
from ._errors import MuonError, callback_failed, check

if TYPE_CHECKING:
    import numpy

_lib_handle = _lib.lib

# ---------------------------------------------------------------------------
# Placements
# ---------------------------------------------------------------------------

_SPLITS = {"even": _lib.SPLIT_EVEN, "chunk": _lib.SPLIT_CHUNK}


class _Placement:
    __slots__ = ("group",)

    def _resolve_group(self, resolve):
        return resolve(self.group) if resolve is not None else _group_id(self.group)

    def _fill(self, c, resolve):
        """Writes the muon_placement_t `c`; returns what must stay alive (or None)."""
        raise NotImplementedError(type(self).__name__)

    def _key(self):
        raise NotImplementedError(type(self).__name__)

    def __eq__(self, other):
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        return hash((type(self).__name__,) + self._key())


def _group_id(group):
    try:
        return operator.index(group)
    except TypeError:
        raise TypeError("muon: a placement's group is a group id (an int from set_world or "
                        "add_group), got %s" % type(group).__name__) from None


class Shard(_Placement):
    """Splits dimension `dim` of the current tensor over the group's ranks.

    split: "even" (the size divides by the group size), "chunk" (torch.chunk:
    ceil(size / n) per rank, the tail short or empty) or a list of per-rank
    sizes (one per group rank).
    """

    __slots__ = ("dim", "split")
    split: str | tuple[int, ...]  # "even", "chunk" or the per-rank sizes

    def __init__(self, group: Any, dim: int, split: str | Sequence[int] = "even") -> None:
        self.group = group
        self.dim = operator.index(dim)
        if isinstance(split, str):
            if split.lower() not in _SPLITS:
                raise ValueError("muon: unknown Shard split %r; use 'even', 'chunk' or a list "
                                 "of per-rank sizes" % split)
            self.split = split.lower()
        else:
            try:
                self.split = tuple(operator.index(s) for s in split)
            except TypeError:
                raise TypeError("muon: Shard split is 'even', 'chunk' or a list of per-rank "
                                "sizes (ints), got %r" % (split,)) from None

    def _key(self):
        return (self.group, self.dim, self.split)

    def _fill(self, c, resolve):
        c.kind = _lib.PLACEMENT_SHARD
        c.group = self._resolve_group(resolve)
        c.dim = self.dim
        if isinstance(self.split, str):
            c.split = _SPLITS[self.split]
            return None
        sizes = (ctypes.c_int64 * max(len(self.split), 1))(*self.split)
        c.split = _lib.SPLIT_SIZES
        c.sizes = ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int64))
        return sizes  # the library copies group-size entries; alive through the call

    def __repr__(self):
        return "Shard(group=%r, dim=%d, split=%r)" % (
            self.group, self.dim, self.split if isinstance(self.split, str) else list(self.split))


class FlatRange(_Placement):
    """This rank holds elements [start, start + length) of the current tensor's
    row-major flattening (ZeRO, FSDP1 flat parameters); the ranks' ranges tile it."""

    __slots__ = ("start", "length")

    def __init__(self, group: Any, start: int, length: int) -> None:
        self.group = group
        self.start = operator.index(start)
        self.length = operator.index(length)

    def _key(self):
        return (self.group, self.start, self.length)

    def _fill(self, c, resolve):
        c.kind = _lib.PLACEMENT_FLAT_RANGE
        c.group = self._resolve_group(resolve)
        c.start = self.start
        c.length = self.length
        return None

    def __repr__(self):
        return "FlatRange(group=%r, start=%d, length=%d)" % (self.group, self.start, self.length)


class Replicate(_Placement):
    """Every rank of the group holds the whole current tensor (DDP, CP, HSDP's
    replicate dimension); group rank 0's copy is the one sent."""

    __slots__ = ()

    def __init__(self, group: Any) -> None:
        self.group = group

    def _key(self):
        return (self.group,)

    def _fill(self, c, resolve):
        c.kind = _lib.PLACEMENT_REPLICATE
        c.group = self._resolve_group(resolve)
        return None

    def __repr__(self):
        return "Replicate(group=%r)" % (self.group,)


# A placement: how a global tensor is cut down to this rank's piece. Each one's
# group is a group id (an int) or the communicator given to set_world/add_group.
Placement = Union[Shard, FlatRange, Replicate]


def fill_placement(placement: Any, c: Any, resolve: Any, index: int) -> Any:
    """Writes placement number `index` (a muon.Shard, FlatRange or Replicate)
    into the muon_placement_t `c`, its group through resolve(group); returns
    what must stay alive while the library reads it (or None)."""
    if not isinstance(placement, _Placement):
        raise TypeError("muon: placement %d is %r; use muon.Shard, muon.FlatRange or "
                        "muon.Replicate" % (index, placement))
    return placement._fill(c, resolve)


# ---------------------------------------------------------------------------
# Views of the library's buffers
# ---------------------------------------------------------------------------


class _Memory:
    """Exposes (address, bytes) to numpy through the array interface."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address, shape, typestr, readonly):
        self.__array_interface__ = {
            "data": (address, readonly),
            "shape": shape,
            "typestr": typestr,
            "version": 3,
        }


def view(address, shape, typestr="|u1", readonly=False):
    """A numpy array over memory the library owns (valid during the callback only).
    Empty buffers may come as NULL; they give an empty array."""
    import numpy

    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    count = 1
    for s in shape:
        count *= s
    if count == 0 or not address:
        if count:
            raise MuonError("INVALID_ARGUMENT", "a NULL buffer of %d elements" % count)
        return numpy.empty(shape, dtype=numpy.dtype(typestr))
    return numpy.asarray(_Memory(address, shape, typestr, readonly))


# ---------------------------------------------------------------------------
# Communicators
# ---------------------------------------------------------------------------

_DTYPES = {
    _lib.DTYPE_FLOAT32: ("float32", 4),
    _lib.DTYPE_BFLOAT16: ("bfloat16", 2),
    _lib.DTYPE_FLOAT16: ("float16", 2),
}


class Communicator:
    """Base class of a communicator written in Python (a muon_comm_t whose
    collectives are this object's methods).

    A subclass sets `rank` (this rank's position in the group) and `size` (the
    group's ranks) and implements the collectives below. Each receives numpy
    uint8 arrays that view the library's buffers for the duration of the call:
    fill the receive buffers in place, and never write to the send buffers.
    Every collective is called on every rank of the group, in the same order.

      all_gather(send, recv)                recv[r*len(send):(r+1)*len(send)] <- rank r's send
      all_to_all_v(send, send_counts, send_offsets, recv, recv_counts, recv_offsets)
                                            send[send_offsets[p]:+send_counts[p]] goes to rank p,
                                            recv[recv_offsets[p]:+recv_counts[p]] comes from p
                                            (counts and offsets: lists of `size` ints, bytes)
      broadcast(buf, root)                  buf <- rank root's buf (a root outside the group
                                            is refused before the method is called)
      reduce_scatter(send, recv, count, dtype)
                                            send holds `size` blocks of `count` elements of
                                            dtype ("float32", "bfloat16", "float16"); recv
                                            <- the sum over ranks of block `rank`, summed in
                                            rank order in float32 and rounded once
      barrier()

    An exception raised in a method becomes a failed status carrying the
    exception's type and text (the library's error then names the parameter
    and the operation); step() raises muon.MuonError with the exception as its
    __cause__.

    `.table` is the muon_comm_t (built once); the object keeps its ctypes
    callbacks alive, so keep the object alive as long as the table is in use
    (muon.Optimizer does that for the communicators it is given). The table
    has no `release`: the library never owns a Python communicator.

    The library may call the collectives from a helper thread of the optimizer
    (prefetch_count > 0), never two at once on one group.
    """

    rank: int | None = None
    size: int | None = None

    # -- the collectives (override) ---------------------------------------------

    def all_gather(self, send: numpy.ndarray, recv: numpy.ndarray) -> None:
        raise NotImplementedError("%s.all_gather" % type(self).__name__)

    def all_to_all_v(self, send: numpy.ndarray, send_counts: list[int], send_offsets: list[int],
                     recv: numpy.ndarray, recv_counts: list[int],
                     recv_offsets: list[int]) -> None:
        raise NotImplementedError("%s.all_to_all_v" % type(self).__name__)

    def broadcast(self, buf: numpy.ndarray, root: int) -> None:
        raise NotImplementedError("%s.broadcast" % type(self).__name__)

    def reduce_scatter(self, send: numpy.ndarray, recv: numpy.ndarray, count: int,
                       dtype: str) -> None:
        raise NotImplementedError("%s.reduce_scatter" % type(self).__name__)

    def barrier(self) -> None:
        raise NotImplementedError("%s.barrier" % type(self).__name__)

    # -- the table ----------------------------------------------------------------

    @property
    def table(self) -> _lib.muon_comm_t:
        built = self.__dict__.get("_muon_table")
        if built is None:
            with _TABLE_LOCK:
                built = self.__dict__.get("_muon_table")
                if built is None:
                    built = self._muon_build_table()
                    self.__dict__["_muon_table"] = built
        return built

    def _muon_take_errors(self):
        """The exceptions raised by this communicator's methods since the last call
        (take_errors)."""
        errors = self.__dict__.get("_muon_errors")
        if not errors:
            return []
        taken = list(errors)
        del errors[:len(taken)]
        return taken

    def _muon_build_table(self):
        try:
            rank, size = operator.index(self.rank), operator.index(self.size)
        except TypeError:
            raise TypeError("muon: %s must set integer `rank` and `size` before its table is "
                            "used (got rank=%r, size=%r)"
                            % (type(self).__name__, self.rank, self.size)) from None
        if size < 1 or not 0 <= rank < size:
            raise ValueError("muon: %s has rank %d and size %d; 0 <= rank < size is required"
                             % (type(self).__name__, rank, size))
        errors = self.__dict__.setdefault("_muon_errors", [])
        name = type(self).__name__

        def run(method, body):
            try:
                body()
                return 0
            except BaseException as e:  # noqa: B902 - turned into a status
                return callback_failed(e, "%s.%s" % (name, method), errors)

        def all_gather(ctx, send, recv, nbytes, stream):
            return run("all_gather", lambda: self.all_gather(
                view(send, nbytes), view(recv, nbytes * size)))

        def all_to_all_v(ctx, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets,
                         stream):
            def body():
                sc = [send_bytes[p] for p in range(size)]
                so = [send_offsets[p] for p in range(size)]
                rc = [recv_bytes[p] for p in range(size)]
                ro = [recv_offsets[p] for p in range(size)]
                send_len = max([o + c for o, c in zip(so, sc) if c] or [0])
                recv_len = max([o + c for o, c in zip(ro, rc) if c] or [0])
                self.all_to_all_v(view(send, send_len), sc, so, view(recv, recv_len), rc, ro)

            return run("all_to_all_v", body)

        def broadcast(ctx, buf, nbytes, root, stream):
            def body():
                if not 0 <= root < size:  # as every adapter refuses it, before any traffic
                    raise MuonError("INVALID_ARGUMENT", "broadcast root %d is outside the group "
                                    "of %d" % (root, size))
                self.broadcast(view(buf, nbytes), int(root))

            return run("broadcast", body)

        def reduce_scatter(ctx, send, recv, count, dtype, stream):
            def body():
                if dtype not in _DTYPES:
                    raise MuonError("INVALID_ARGUMENT", "unknown reduce_scatter dtype %d" % dtype)
                dname, itemsize = _DTYPES[dtype]
                self.reduce_scatter(view(send, size * count * itemsize),
                                    view(recv, count * itemsize), int(count), dname)

            return run("reduce_scatter", body)

        def barrier(ctx, stream):
            return run("barrier", self.barrier)

        t = _lib.muon_comm_t()
        t.struct_size = ctypes.sizeof(t)
        t.ctx = None
        t.rank = rank
        t.size = size
        callbacks = (
            _lib.COMM_ALL_GATHER_FN(all_gather),
            _lib.COMM_ALL_TO_ALL_V_FN(all_to_all_v),
            _lib.COMM_BROADCAST_FN(broadcast),
            _lib.COMM_REDUCE_SCATTER_FN(reduce_scatter),
            _lib.COMM_BARRIER_FN(barrier),
        )
        (t.all_gather, t.all_to_all_v, t.broadcast, t.reduce_scatter, t.barrier) = callbacks
        self.__dict__["_muon_callbacks"] = callbacks  # alive as long as this object
        return t


_TABLE_LOCK = threading.Lock()


def take_errors(comm: Any) -> list[Any]:
    """The exceptions a muon.Communicator's methods raised since the last call
    ([] for any other communicator: the library reports its own)."""
    return comm._muon_take_errors() if isinstance(comm, Communicator) else []


def gather_objects(comm: Any, obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, through a Python
    communicator's all_gather (a collective: every rank of `comm` calls it).
    The peers are the ranks of one job, trusted as torch's all_gather_object
    trusts them. TypeError for a communicator that is not a muon.Communicator
    (a muon_comm_t's collectives are not callable from Python)."""
    import pickle

    import numpy
    if not isinstance(comm, Communicator) or comm.size is None:
        raise TypeError("muon: gathering needs a muon.Communicator (TorchDistComm, or one "
                        "written in Python) that set its size; this world is %r" % (comm,))
    payload = numpy.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),
                               dtype=numpy.uint8)
    size = int(comm.size)
    lengths = numpy.zeros(8 * size, dtype=numpy.uint8)
    comm.all_gather(numpy.frombuffer(numpy.int64(payload.size).tobytes(), dtype=numpy.uint8)
                    .copy(), lengths)
    each = lengths.view(numpy.int64)
    width = int(each.max()) if size else 0
    send = numpy.zeros(width, dtype=numpy.uint8)
    send[:payload.size] = payload
    recv = numpy.zeros(width * size, dtype=numpy.uint8)
    comm.all_gather(send, recv)
    return [pickle.loads(recv[r * width:r * width + int(each[r])].tobytes())
            for r in range(size)]


class InProcessWorld:
    """`size` ranks as threads of one process, over the library's in-process
    adapter (muon_inprocess_world_create).

    comm(rank, ranks=None) gives world rank `rank`'s communicator over the
    group of world ranks `ranks` (None: the whole world, in order). As with
    NCCL and MPI communicators, the k-th call a rank makes for a given rank
    list joins the k-th group over that list, so every member creates its
    groups in the same order.
    """

    def __init__(self, size: int) -> None:
        self._destroy = _lib_handle.muon_inprocess_world_destroy
        self._handle = None
        handle = _lib.world_p()
        check(_lib_handle.muon_inprocess_world_create(operator.index(size),
                                                       ctypes.byref(handle)))
        self._handle = handle
        self.size = operator.index(size)

    def comm(self, rank: int, ranks: Sequence[int] | None = None) -> InProcessComm:
        if not self._handle:
            raise ValueError("muon: the in-process world is closed")
        return InProcessComm(self, rank, ranks)

    def abort(self) -> None:
        """Releases every rank waiting in a collective for one that will never
        enter it, and fails every later collective (muon_inprocess_world_abort,
        as ncclCommAbort): for a host whose rank thread failed outside libmuon.
        Safe from any thread (a watchdog); irreversible."""
        if self._handle:
            _lib_handle.muon_inprocess_world_abort(self._handle)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            try:
                self._destroy(handle)  # freed once every table of it is released too
            except Exception:
                pass

    def __repr__(self):
        return "<muon.InProcessWorld of %d ranks>" % self.size


class InProcessComm:
    """One rank's in-process communicator (see InProcessWorld.comm).

    `.table` is the adapter's muon_comm_t with its `release` taken out: this
    object releases the adapter's context when it is garbage collected, and
    every muon.Optimizer given it keeps it alive, so one communicator may
    serve several optimizers (one per param group) in turn.
    """

    def __init__(self, world: InProcessWorld, rank: int,
                 ranks: Sequence[int] | None = None) -> None:
        self._ctx = None
        self._release = None
        self.world = world
        self.world_rank = operator.index(rank)
        if ranks is None:
            array, count = None, 0
            self.ranks = tuple(range(world.size))
        else:
            self.ranks = tuple(operator.index(r) for r in ranks)
            array = (ctypes.c_int32 * max(len(self.ranks), 1))(*self.ranks)
            count = len(self.ranks)
        table = _lib.muon_comm_t()
        check(_lib_handle.muon_inprocess_comm(world._handle, array, count, self.world_rank,
                                               ctypes.byref(table)))
        # A field read shares the struct's memory: copy the function's address.
        release = ctypes.cast(table.release, ctypes.c_void_p).value
        self._release = _lib.COMM_RELEASE_FN(release) if release else None
        self._ctx = table.ctx
        table.release = _lib.COMM_RELEASE_FN()  # NULL: released by this object, once
        self.table = table
        self.rank = table.rank
        self.size = table.size

    def __del__(self):
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx and self._release:
            try:
                self._release(ctx)
            except Exception:
                pass

    def __repr__(self):
        return "<muon.InProcessComm: world rank %d, rank %d of %d over %s>" % (
            self.world_rank, self.rank, self.size, list(self.ranks))
