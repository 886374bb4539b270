"""Ranks as Python threads, and a communicator written in Python over them
(threading barriers and shared numpy buffers), for the tests that need a
muon.Communicator the library calls through ctypes."""

import threading

import numpy
import pytest

import muon

TIMEOUT = 60  # seconds; a rank waiting longer means a hang, reported as a failure

# ---------------------------------------------------------------------------
# Ranks as threads
# ---------------------------------------------------------------------------


def run_ranks(n, body):
    """Runs body(rank) on n threads; returns (results, errors) per rank."""
    results, errors = [None] * n, [None] * n

    def wrap(rank):
        try:
            results[rank] = body(rank)
        except BaseException as e:  # noqa: B902 - reported by the test
            errors[rank] = e

    threads = [threading.Thread(target=wrap, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        pytest.fail("ranks %s did not finish within %d s" % (hung, TIMEOUT))
    return results, errors


# ---------------------------------------------------------------------------
# A communicator written in Python
# ---------------------------------------------------------------------------


class Hub:
    """What the members of one group share: a barrier and a slot per member."""

    def __init__(self, n):
        self.barrier = threading.Barrier(n, timeout=TIMEOUT)
        self.slots = [None] * n


def bf16_to_f32(u8):
    return (u8.view(numpy.uint16).astype(numpy.uint32) << 16).view(numpy.float32)


def f32_to_bf16(x):
    bits = x.astype(numpy.float32).view(numpy.uint32)
    rounded = (bits + numpy.uint32(0x7FFF) + ((bits >> 16) & numpy.uint32(1))) >> 16
    return rounded.astype(numpy.uint16).view(numpy.uint8)


_DECODE = {
    "float32": lambda b: b.view(numpy.float32),
    "float16": lambda b: b.view(numpy.float16).astype(numpy.float32),
    "bfloat16": bf16_to_f32,
}
_ENCODE = {
    "float32": lambda x: x.astype(numpy.float32).view(numpy.uint8),
    "float16": lambda x: x.astype(numpy.float16).view(numpy.uint8),
    "bfloat16": f32_to_bf16,
}


class ThreadComm(muon.Communicator):
    """Every collective: post the arguments, wait for all, copy from the others'
    buffers, wait again (so no buffer is read after its owner returned)."""

    def __init__(self, hub, rank):
        self.hub, self.rank, self.size = hub, rank, len(hub.slots)
        self.calls = {}

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def _post(self, item):
        self.hub.slots[self.rank] = item
        self.hub.barrier.wait()
        return list(self.hub.slots)

    def _done(self):
        self.hub.barrier.wait()

    def all_gather(self, send, recv):
        self._count("all_gather")
        assert send.dtype == numpy.uint8 and recv.size == send.size * self.size
        for r, s in enumerate(self._post(send)):
            recv[r * send.size:(r + 1) * send.size] = s
        self._done()

    def all_to_all_v(self, send, send_counts, send_offsets, recv, recv_counts, recv_offsets):
        self._count("all_to_all_v")
        posted = self._post((send, send_counts, send_offsets))
        for p, (s, counts, offsets) in enumerate(posted):
            n = recv_counts[p]
            assert counts[self.rank] == n
            a = offsets[self.rank]
            recv[recv_offsets[p]:recv_offsets[p] + n] = s[a:a + n]
        self._done()

    def broadcast(self, buf, root):
        self._count("broadcast")
        posted = self._post(buf)
        if self.rank != root:
            buf[:] = posted[root]
        self._done()

    def reduce_scatter(self, send, recv, count, dtype):
        self._count("reduce_scatter")
        posted = self._post(send)
        itemsize = recv.size // max(count, 1)
        mine = slice(self.rank * count * itemsize, (self.rank + 1) * count * itemsize)
        total = _DECODE[dtype](numpy.ascontiguousarray(posted[0][mine])).copy()
        for s in posted[1:]:  # rank order, in float32, rounded once
            total += _DECODE[dtype](numpy.ascontiguousarray(s[mine]))
        recv[:] = _ENCODE[dtype](total)
        self._done()

    def barrier(self):
        self._count("barrier")
        self.hub.barrier.wait()
