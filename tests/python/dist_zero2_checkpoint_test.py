"""ZeRO-2 mode (replicated_mode="zero2") on 4 gloo processes: state_dict()
works on every rank and holds the momentum of the parameters that rank owns
(1/N of the state, as a sharded optimizer's does); a fresh optimizer that
loads each rank's dict continues bit for bit like an uninterrupted run."""

import copy

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 8
SHAPES = [(6, 4), (6, 4), (6, 4), (5, 3), (6, 4)]


def _grads(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(*s, generator=g) for s in SHAPES]


def _run(params, steps, first_step, state=None):
    opt = muon.Muon(params, lr=0.02, distributed_config=muon.create_processgroup_config(
        dp_pg=dist.group.WORLD, replicated_mode="zero2"))
    if state is not None:
        opt.load_state_dict(state)
    for step in range(first_step, first_step + steps):
        for p, g in zip(params, _grads(dist.get_rank(), step)):
            p.grad = g
        opt.step()
    return opt


def _worker(rank, world):
    g = torch.Generator().manual_seed(7)
    init = [torch.randn(*s, generator=g) for s in SHAPES]
    straight = [torch.nn.Parameter(t.clone()) for t in init]
    _run(straight, STEPS, 0)
    first = [torch.nn.Parameter(t.clone()) for t in init]
    opt = _run(first, STEPS // 2, 0)
    saved = copy.deepcopy(opt.state_dict())
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    _run(resumed, STEPS - STEPS // 2, STEPS // 2, state=saved)
    return {"owned": len(saved["state"]),
            "same": all(torch.equal(a, b) for a, b in zip(resumed, straight)),
            "moved": not all(torch.equal(a, t) for a, t in zip(straight, init))}


def test_zero2_state_dict_is_sharded_and_resumes_bit_for_bit():
    results = launch(_worker, WORLD)
    assert all(r["moved"] for r in results), results
    assert [r["same"] for r in results] == [True] * WORLD, results
    # Every parameter's momentum is on exactly one rank.
    assert sum(r["owned"] for r in results) == len(SHAPES), results
