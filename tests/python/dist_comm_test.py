"""muon.TorchDistComm: every collective, called the way the library calls it
(numpy uint8 views), on 3 processes over gloo; reduce_scatter checked bit for
bit against the rank-order float32 sum of the C adapters."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 3


def _reduce_input(rank, count, dtype):
    g = torch.Generator().manual_seed(100 + rank)
    return (torch.randn(WORLD * count, generator=g) * (10.0 ** (rank - 1))).to(dtype)


def _expected_reduce(rank, count, dtype):
    acc = None
    for r in range(WORLD):
        block = _reduce_input(r, count, dtype).view(WORLD, count)[rank].to(torch.float32)
        acc = block.clone() if acc is None else acc + block
    return acc.to(dtype)


def _worker(rank, world):
    comm = muon.TorchDistComm()
    assert (comm.rank, comm.size, comm.ranks) == (rank, world, list(range(world)))
    assert isinstance(comm, muon.Communicator)
    assert comm.table.size == world and comm.table.rank == rank

    # all_gather
    send = (np.arange(5, dtype=np.uint8) + 10 * rank).astype(np.uint8)
    recv = np.zeros(5 * world, dtype=np.uint8)
    comm.all_gather(send, recv)
    assert recv.tolist() == [10 * r + i for r in range(world) for i in range(5)]

    # all_to_all_v: rank r sends r + p + 1 bytes (value 16 r + p) to rank p, some
    # zero; once packed in rank order, once with the blocks in reverse order.
    def counts(src, dst):
        return 0 if (src + dst) == 2 else src + dst + 1

    for reverse in (False, True):
        sc = [counts(rank, p) for p in range(world)]
        rc = [counts(p, rank) for p in range(world)]

        def offsets(cs):
            order = list(range(world))[::-1] if reverse else list(range(world))
            out, pos = [0] * world, 3  # a gap before the first block
            for p in order:
                out[p] = pos
                pos += cs[p] + (2 if reverse else 0)
            return out, pos

        so, send_len = offsets(sc)
        ro, recv_len = offsets(rc)
        send = np.full(send_len, 255, dtype=np.uint8)
        for p in range(world):
            send[so[p]:so[p] + sc[p]] = 16 * rank + p
        recv = np.full(recv_len, 254, dtype=np.uint8)
        comm.all_to_all_v(send, sc, so, recv, rc, ro)
        for p in range(world):
            assert recv[ro[p]:ro[p] + rc[p]].tolist() == [16 * p + rank] * rc[p], (reverse, p)
        untouched = np.ones(recv_len, dtype=bool)
        for p in range(world):
            untouched[ro[p]:ro[p] + rc[p]] = False
        assert (recv[untouched] == 254).all(), "bytes outside the blocks were written"

    # broadcast over the world and over a subgroup whose group rank 1 is world rank 2
    buf = np.full(7, rank, dtype=np.uint8)
    comm.broadcast(buf, 2)
    assert buf.tolist() == [2] * 7
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        sc_ = muon.TorchDistComm(sub)
        assert (sc_.rank, sc_.size, sc_.ranks) == (rank - 1, 2, [1, 2])
        buf = np.full(4, 40 + rank, dtype=np.uint8)
        sc_.broadcast(buf, 1)
        assert buf.tolist() == [42] * 4
    else:
        with pytest.raises(ValueError, match="not a member"):
            muon.TorchDistComm(sub)

    # reduce_scatter: rank-order float32 sum, one rounding
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                        ("float16", torch.float16)):
        count = 37
        data = _reduce_input(rank, count, dtype)
        send = data.view(torch.uint8).numpy().copy()
        recv = np.zeros(count * data.element_size(), dtype=np.uint8)
        comm.reduce_scatter(send, recv, count, name)
        got = torch.from_numpy(recv).view(dtype)
        want = _expected_reduce(rank, count, dtype)
        assert torch.equal(got.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           want.view(torch.int16 if dtype != torch.float32 else torch.int32)), name

    comm.barrier()
    return "ok"


def test_collectives_on_three_processes():
    assert launch(_worker, WORLD) == ["ok"] * WORLD


def test_needs_an_initialized_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        muon.TorchDistComm()
