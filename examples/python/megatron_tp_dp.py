"""Megatron-style tensor parallel x data parallel training with libmuon's Muon,
on 4 processes (TP 2 x DP 2, gloo on CPU). Each rank holds only its slice of the
column-parallel (rows) and row-parallel (columns) weights; Muon orthogonalizes
every whole matrix exactly once in the job and hands each rank its slice.

    PYTHONPATH=python .venv/bin/python examples/python/megatron_tp_dp.py

(.venv: torch and the rest, made by tools/deps.sh; a system python3 has no torch)
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import muon

TP, DP = 2, 2


class SumOverTP(torch.autograd.Function):
    """The row-parallel all-reduce (backward: the gradient passes through)."""

    @staticmethod
    def forward(ctx, partial, group):
        out = partial.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def train(rank, world, port):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    tp_groups = [dist.new_group([d * TP + t for t in range(TP)]) for d in range(DP)]
    dp_groups = [dist.new_group([d * TP + t for d in range(DP)]) for t in range(TP)]
    d, t = divmod(rank, TP)
    tp, dp = tp_groups[d], dp_groups[t]

    torch.manual_seed(0)  # the same full weights and data on every rank
    up, down, head = torch.randn(64, 16) / 4, torch.randn(16, 64) / 8, torch.randn(4, 16) / 4
    w_up = torch.nn.Parameter(up.chunk(TP, 0)[t].clone())        # column-parallel: rows
    w_down = torch.nn.Parameter(down.chunk(TP, 1)[t].clone())    # row-parallel: columns
    w_head = torch.nn.Parameter(head)                            # replicated
    x = torch.randn(256, 16)
    y = torch.sin(x[:, :4] * 2)
    x, y = x.chunk(DP)[d], y.chunk(DP)[d]                        # this DP rank's batch

    config = muon.create_processgroup_config(tp_pg=tp, dp_pg=dp,
                                             tp_dims={w_up: 0, w_down: 1})
    opt = muon.Muon([w_up, w_down, w_head], lr=0.05, weight_decay=0.0,
                    distributed_config=config)
    losses = []
    for step in range(40):
        h = torch.tanh(x @ w_up.t())
        z = SumOverTP.apply(h @ w_down.t(), tp)
        loss = torch.nn.functional.mse_loss(z @ w_head.t(), y)
        opt.zero_grad()
        loss.backward()
        for p in (w_up, w_down, w_head):                         # what DDP does
            dist.all_reduce(p.grad, group=dp)
            p.grad /= DP
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
    mp.spawn(train, args=(TP * DP, port), nprocs=TP * DP)
    print("megatron_tp_dp: OK")
