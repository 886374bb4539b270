"""The design's DistributedConfig, as its documents write it, on 4 gloo
processes: assign_fn(params, state) -> {rank: [param_idx, ...]} (or
{param_idx: rank}) called once in muon.Muon's __init__,
gather_fn(momentum_buffer_shard, rank, state) and
redistribute_fn(update, rank, state) with state["current_param_idx"] set.
Every rank holds a row shard of every matrix (FSDP-style); the result must
equal single-process Muon bit for bit, each matrix orthogonalized once; a bad
assignment is a ValueError naming the parameter, at construction."""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 4
SHAPES = [(8, 6), (4, 12), (12, 4), (8, 8), (16, 5)]


def _full(step=None):
    g = torch.Generator().manual_seed(11 if step is None else 100 + step)
    return [torch.randn(*s, generator=g) for s in SHAPES]


def assign_round_robin(params, state):
    n = dist.get_world_size()
    return {r: [i for i in range(len(params)) if i % n == r] for r in range(n)}


def assign_per_param(params, state):
    return {i: (len(params) - 1 - i) % dist.get_world_size() for i in range(len(params))}


def gather_fn(momentum_buffer_shard, rank, state):
    state["seen"].append(state["current_param_idx"])
    parts = [torch.empty_like(momentum_buffer_shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, momentum_buffer_shard.contiguous())
    return torch.cat(parts, 0)


def redistribute_fn(update, rank, state):
    shape = SHAPES[state["current_param_idx"]]
    full = update.clone() if update is not None else torch.empty(shape)
    dist.broadcast(full, src=rank)
    return full.chunk(dist.get_world_size(), 0)[state["rank"]].clone()


def _train(assign_fn):
    rank = dist.get_rank()
    params = [torch.nn.Parameter(t.chunk(WORLD, 0)[rank].clone()) for t in _full()]
    state = {"seen": []}
    config = muon.DistributedConfig(assign_fn, gather_fn, redistribute_fn, state)
    opt = muon.Muon(params, lr=0.02, ns_dtype="fp32", distributed_config=config)
    assigned_at_init = state.get("assignments")
    for step in range(STEPS):
        for p, g in zip(params, _full(step)):
            p.grad = g.chunk(WORLD, 0)[rank].clone()
        opt.step()
    return {"params": [p.detach() for p in params], "assignments": assigned_at_init,
            "rank": state["rank"], "seen": sorted(set(state["seen"])),
            "orthogonalized": opt.stats()["matrices_orthogonalized"]}


def _catch(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def _bad_assignments():
    params = [torch.nn.Parameter(torch.zeros(2, 3)) for _ in range(3)]

    def config(answer):
        return muon.DistributedConfig(lambda ps, s: answer, gather_fn, redistribute_fn)
    return {
        "missing": _catch(lambda: muon.Muon(params, distributed_config=config({0: [0, 1]}))),
        "twice": _catch(lambda: muon.Muon(params, distributed_config=config({0: [0, 1],
                                                                              1: [1, 2]}))),
        "rank": _catch(lambda: muon.Muon(params, distributed_config=config({0: 0, 1: 9,
                                                                             2: 1}))),
    }


def _worker(rank, world):
    return {"lists": _train(assign_round_robin), "ints": _train(assign_per_param),
            "bad": _bad_assignments()}


@pytest.fixture(scope="module")
def runs():
    torch.set_num_threads(1)
    return launch(_worker, WORLD)


def _reference():
    params = [torch.nn.Parameter(t.clone()) for t in _full()]
    opt = muon.Muon(params, lr=0.02, ns_dtype="fp32")
    for step in range(STEPS):
        for p, g in zip(params, _full(step)):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("form", ["lists", "ints"])
def test_design_config_equals_single_process(runs, form):
    torch.set_num_threads(1)
    ref = _reference()
    for rank, res in enumerate(runs):
        out = res[form]
        assert out["rank"] == rank
        assert out["assignments"] is not None, "assign_fn did not run in __init__"
        assert out["seen"] == list(range(len(SHAPES)))  # current_param_idx for every param
        for k, got in enumerate(out["params"]):
            assert torch.equal(got, ref[k].chunk(WORLD, 0)[rank]), (form, rank, k)
    assert sum(r[form]["orthogonalized"] for r in runs) == len(SHAPES)


def test_bad_assignments_name_the_parameter(runs):
    for res in runs:
        bad = res["bad"]
        assert "did not assign param 'group0.param2' (index 2)" in bad["missing"], bad
        assert "assigned param 'group0.param1' (index 1) twice (to ranks 0 and 1)" \
            in bad["twice"], bad
        assert "assigned param 'group0.param1' (index 1) to rank 9, outside the world of 4" \
            in bad["rank"], bad
