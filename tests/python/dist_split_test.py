"""muon.Muon over 4 processes (gloo) with a config's assignment="split": a
matrix that bounds the step is orthogonalized by the 4 ranks together (each a
block of its columns, summing its norm, grams and, with NorMuon, its rows'
squares over the ranks). The parameters after training agree with one
process's muon.Muon within fp32 rounding of those sums' order, and
state_dict() gathers the NorMuon moments of the split matrix once (its first
member gives them) equal to one process's within the same rounding.
"""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 6
SHAPES = [("big", (16, 96))] + [("small%d" % i, (8, 8)) for i in range(15)]
HP = dict(lr=0.02, weight_decay=0.05, momentum=0.9, ns_dtype="fp32")


def init():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(*s, generator=g) * 0.3 for _, s in SHAPES]


def grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g) for _, s in SHAPES]


def train(params, opt):
    for step in range(STEPS):
        for p, g in zip(params, grads(step)):
            p.grad = g
        opt.step()


def moments_of(opt, params):
    state = opt.state_dict()["state"]
    return [state[k]["normuon_second_moment"].clone() for k in range(len(params))]


def _worker(rank, world, normuon):
    params = [torch.nn.Parameter(t) for t in init()]
    config = muon.create_processgroup_config(dp_pg=dist.group.WORLD)
    config.assignment = "split"
    opt = muon.Muon(params, normuon=normuon, distributed_config=config, **HP)
    train(params, opt)
    stats = opt._groups[0].opt.stats()
    moments = moments_of(opt, params) if normuon else None
    return [p.detach().clone() for p in params], stats["matrices_orthogonalized"], moments


@pytest.mark.parametrize("normuon", [False, True])
def test_split_assignment_matches_one_process(normuon):
    params = [torch.nn.Parameter(t) for t in init()]
    opt = muon.Muon(params, normuon=normuon, **HP)
    train(params, opt)
    want = [p.detach() for p in params]
    want_moments = moments_of(opt, params) if normuon else None
    results = launch(_worker, WORLD, normuon)
    # Each small matrix once in the job, "big" once per member.
    assert sum(r[1] for r in results) == len(SHAPES) - 1 + WORLD
    worst = 0.0
    for got, _, moments in results:
        for name_shape, g, w in zip(SHAPES, got, want):
            worst = max(worst, ((g - w).abs().max() / w.abs().max()).item())
        if normuon:
            for g, w in zip(moments, want_moments):
                assert (w > 0).all()
                assert ((g - w).abs() <= 1e-5 * w).all(), (g, w)
    print("split over %d processes, normuon %s: largest difference %.3g of the largest value"
          % (WORLD, normuon, worst))
    assert worst <= 1e-5


def _one_rank_saves(rank, world):
    params = [torch.nn.Parameter(t) for t in init()]
    config = muon.create_processgroup_config(dp_pg=dist.group.WORLD)
    config.assignment = "split"
    opt = muon.Muon(params, normuon=True, distributed_config=config, **HP)
    train(params, opt)
    # One rank alone, as Hugging Face's Trainer saves a DDP job's optimizer:
    # the moments were gathered by the step, no collective now.
    return moments_of(opt, params) if rank == 1 else None


def test_state_dict_on_one_rank_alone_has_every_moment():
    params = [torch.nn.Parameter(t) for t in init()]
    opt = muon.Muon(params, normuon=True, **HP)
    train(params, opt)
    want = moments_of(opt, params)
    results = launch(_one_rank_saves, WORLD, timeout=120)
    assert [r is None for r in results] == [True, False, True, True]
    for g, w in zip(results[1], want):
        assert (w > 0).all()
        assert ((g - w).abs() <= 1e-5 * w).all(), (g, w)
