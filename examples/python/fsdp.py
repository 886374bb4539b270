"""FSDP-style (FSDP2 / ZeRO-3) training with libmuon's Muon on 4 processes (gloo,
CPU): each rank keeps torch.chunk's piece of dim 0 of every weight (uneven and
all), gathers the full weights for its forward, and reduce-scatters the
gradients. Muon orthogonalizes each whole matrix on one rank and hands every
rank its rows of the update.

    PYTHONPATH=python .venv/bin/python examples/python/fsdp.py

(.venv: torch and the rest, made by tools/deps.sh; a system python3 has no torch)
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import muon

WORLD = 4


def my_rows(t, rank, n):
    """torch.chunk's piece of dim 0 for `rank` (ceil(rows / n) rows, the tail
    short or empty), as muon.Shard(group, 0, split="chunk") describes it."""
    step = -(-t.shape[0] // n)
    return t[rank * step:(rank + 1) * step]


class GatherRows(torch.autograd.Function):
    """Forward: the full weight from every rank's rows. Backward: the gradient
    averaged over ranks (an all_reduce standing in for reduce_scatter, which
    gloo lacks), this rank's rows of it."""

    @staticmethod
    def forward(ctx, piece, rows):
        n, r = dist.get_world_size(), dist.get_rank()
        step = -(-rows // n)  # torch.chunk's piece size
        padded = torch.zeros(step, *piece.shape[1:])
        padded[:piece.shape[0]] = piece
        parts = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(parts, padded)
        ctx.rows, ctx.rank, ctx.n = rows, r, n
        return torch.cat([p[:max(0, min(step, rows - i * step))] for i, p in enumerate(parts)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return my_rows(grad / ctx.n, ctx.rank, ctx.n).clone(), None


def train(rank, world, port):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    torch.manual_seed(0)  # the same full weights and data on every rank
    full = [torch.randn(30, 12) / 4, torch.randn(12, 30) / 6, torch.randn(5, 12) / 4]
    pieces = [torch.nn.Parameter(my_rows(w, rank, world).clone()) for w in full]
    x = torch.randn(256, 12)
    y = torch.cos(x[:, :5])
    x, y = x.chunk(world)[rank], y.chunk(world)[rank]            # this rank's batch

    config = muon.create_processgroup_config(fsdp_pg=dist.group.WORLD)  # Shard(0, chunk)
    opt = muon.Muon(pieces, lr=0.1, weight_decay=0.0, distributed_config=config)
    losses = []
    for step in range(40):
        w1, w2, w3 = (GatherRows.apply(p, w.shape[0]) for p, w in zip(pieces, full))
        loss = torch.nn.functional.mse_loss(torch.tanh(x @ w1.t()) @ w2.t() @ w3.t(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if rank == 0:
        print("loss %.4f -> %.4f" % (losses[0], losses[-1]))
    assert losses[-1] < 0.5 * losses[0], "rank %d: the loss did not go down" % rank
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(WORLD, port), nprocs=WORLD)
    print("fsdp: OK")
