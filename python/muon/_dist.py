"""TorchDistComm: a muon.Communicator over a torch.distributed process group.

The library calls the methods below with numpy uint8 arrays that view its own
buffers; they are wrapped with torch.from_numpy (no copy) and handed to
torch.distributed. Written for gloo on CPU tensors (torch 1.13 and later):

  all_gather      dist.all_gather into a list of views of `recv`
  all_to_all_v    dist.all_to_all_single with byte split sizes (packed through
                  a scratch buffer only when the library's offsets are not in
                  rank order)
  broadcast       dist.broadcast from the group rank `root`
  reduce_scatter  deterministic, whatever the backend: every rank receives
                  block `rank` of every rank (all_to_all), sums them in rank
                  order 0..n-1 in float32 and rounds once to the element type,
                  as the library's C adapters do (a backend's own reduction
                  order is unspecified, and gloo in torch 1.13 has no
                  reduce_scatter at all)
  barrier         dist.barrier

rank and size are this process's rank in the group and the group's size.

The tensors handed to torch.distributed are kept referenced for two more
collectives: gloo's worker thread drops its own references to a finished
collective's tensors a moment after the caller resumes, and if it held the
last one it would need the GIL to free the Python tensor, which at interpreter
exit aborts the process (torch 1.13: "terminate called without an active
exception"). With ours still held, it only lowers a reference count.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from ._comm import Communicator

if TYPE_CHECKING:
    import numpy

_REDUCE_DTYPES = ("float32", "bfloat16", "float16")


def _torch():
    import torch
    import torch.distributed as dist
    return torch, dist


def _group_ranks(group, size):
    """The world ranks of the group's members, in group-rank order."""
    torch, dist = _torch()
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    get = getattr(dist, "get_process_group_ranks", None)  # torch >= 2.0
    if get is not None:
        return list(get(group))
    c10d = dist.distributed_c10d
    mapping = getattr(c10d, "_pg_group_ranks", {}).get(group)  # torch 1.x: world -> group rank
    if mapping:
        ranks = [0] * size
        for world_rank, group_rank in mapping.items():
            ranks[group_rank] = world_rank
        return ranks
    return [c10d._get_global_rank(group, r) for r in range(size)]


class TorchDistComm(Communicator):
    """A muon.Communicator whose collectives run on a torch.distributed group.

    group: a process group from torch.distributed.new_group (None: the default
    world group). This process must be a member. The default process group
    must be initialized (torch.distributed.init_process_group); buffers are
    CPU memory, so use a backend that takes CPU tensors (gloo).
    """

    rank: int
    size: int

    def __init__(self, group: Any = None) -> None:
        torch, dist = _torch()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("muon.TorchDistComm: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first")
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError("muon.TorchDistComm: this process (world rank %d) is not a member "
                             "of the process group it was given" % dist.get_rank())
        self.group = group
        self.rank = int(rank)
        self.size = int(dist.get_world_size(group))
        self.ranks = _group_ranks(group, self.size)  # world rank of each group rank
        # The tensors of the last collectives.
        self._recent: collections.deque[Any] = collections.deque(maxlen=2)
        super().__init__()

    def _hold(self, *tensors):
        self._recent.append(tensors)

    def __repr__(self):
        return "<muon.TorchDistComm rank %d of %d, world ranks %s>" % (self.rank, self.size,
                                                                      self.ranks)

    # -- the collectives ------------------------------------------------------------

    def all_gather(self, send: numpy.ndarray, recv: numpy.ndarray) -> None:
        torch, dist = _torch()
        nbytes = send.size
        if recv.size < nbytes * self.size:
            raise ValueError("all_gather: recv has %d bytes, needs %d" %
                             (recv.size, nbytes * self.size))
        if nbytes == 0:
            return
        src = torch.from_numpy(send.reshape(-1)[:nbytes])
        dst = torch.from_numpy(recv.reshape(-1)[:nbytes * self.size])
        parts = list(dst.split(nbytes))  # gloo copies the input before writing outputs
        self._hold(src, dst, parts)
        dist.all_gather(parts, src, group=self.group)

    def all_to_all_v(self, send: numpy.ndarray, send_counts: list[int], send_offsets: list[int],
                     recv: numpy.ndarray, recv_counts: list[int],
                     recv_offsets: list[int]) -> None:
        torch, dist = _torch()
        n = self.size
        sc = [int(c) for c in send_counts[:n]]
        so = [int(o) for o in send_offsets[:n]]
        rc = [int(c) for c in recv_counts[:n]]
        ro = [int(o) for o in recv_offsets[:n]]
        send_flat, recv_flat = send.reshape(-1), recv.reshape(-1)
        for what, counts, offsets, buf in (("send", sc, so, send_flat),
                                           ("recv", rc, ro, recv_flat)):
            for p in range(n):
                if counts[p] and offsets[p] + counts[p] > buf.size:
                    raise ValueError("all_to_all_v: %s block for rank %d ([%d, %d)) is outside "
                                     "the %d-byte buffer" % (what, p, offsets[p],
                                                             offsets[p] + counts[p], buf.size))
        # Every rank takes part even with nothing to move: the others may.
        packed_send = _packed_base(sc, so)
        packed_recv = _packed_base(rc, ro)
        if packed_send is not None:
            base = packed_send
            src = torch.from_numpy(send_flat[base:base + sum(sc)])
        else:
            src = torch.empty(sum(sc), dtype=torch.uint8)
            pos = 0
            for p in range(n):
                if sc[p]:
                    src[pos:pos + sc[p]] = torch.from_numpy(send_flat[so[p]:so[p] + sc[p]])
                pos += sc[p]
        if packed_recv is not None:
            base = packed_recv
            dst = torch.from_numpy(recv_flat[base:base + sum(rc)])
        else:
            dst = torch.empty(sum(rc), dtype=torch.uint8)
        self._hold(src, dst)
        dist.all_to_all_single(dst, src, output_split_sizes=rc, input_split_sizes=sc,
                               group=self.group)
        if packed_recv is None:
            pos = 0
            for p in range(n):
                if rc[p]:
                    torch.from_numpy(recv_flat[ro[p]:ro[p] + rc[p]]).copy_(dst[pos:pos + rc[p]])
                pos += rc[p]

    def broadcast(self, buf: numpy.ndarray, root: int) -> None:
        torch, dist = _torch()
        root = int(root)
        if not 0 <= root < self.size:
            raise ValueError("broadcast: root %d is not a rank of this %d-rank group" %
                             (root, self.size))
        if buf.size == 0:
            return
        t = torch.from_numpy(buf.reshape(-1))
        self._hold(t)
        dist.broadcast(t, src=self.ranks[root], group=self.group)

    def reduce_scatter(self, send: numpy.ndarray, recv: numpy.ndarray, count: int,
                       dtype: str) -> None:
        torch, dist = _torch()
        if dtype not in _REDUCE_DTYPES:
            raise ValueError("reduce_scatter: dtype %r is not one of %s" % (dtype,
                                                                            _REDUCE_DTYPES))
        tdtype = getattr(torch, dtype)
        item = torch.empty((), dtype=tdtype).element_size()
        n, count = self.size, int(count)
        block = count * item
        if count == 0:
            return
        if send.size < n * block or recv.size < block:
            raise ValueError("reduce_scatter: send has %d bytes and recv %d, need %d and %d" %
                             (send.size, recv.size, n * block, block))
        src = torch.from_numpy(send.reshape(-1)[:n * block])
        # Block `rank` of every rank, in rank order.
        blocks = torch.empty(n * block, dtype=torch.uint8)
        self._hold(src, blocks)
        dist.all_to_all_single(blocks, src, group=self.group)
        values = blocks.view(tdtype).view(n, count)
        acc = values[0].to(torch.float32)  # a copy for float32 too (see below)
        if tdtype == torch.float32:
            acc = acc.clone()
        for r in range(1, n):
            acc += values[r].to(torch.float32)
        out = torch.from_numpy(recv.reshape(-1)[:block]).view(tdtype)
        out.copy_(acc.to(tdtype))  # one rounding, to nearest even

    def barrier(self) -> None:
        _, dist = _torch()
        dist.barrier(group=self.group)


def _packed_base(counts, offsets):
    """Where the blocks start when they lie back to back in rank order (then the
    buffer goes to all_to_all_single as it is), else None."""
    nonempty = [p for p, c in enumerate(counts) if c]
    if not nonempty:
        return 0
    base = pos = offsets[nonempty[0]]
    for p in nonempty:
        if offsets[p] != pos:
            return None
        pos += counts[p]
    return base
