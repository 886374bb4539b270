"""Misuse of the distributed configs on 4 processes (gloo): every rank raises a
Python exception whose message says what is wrong (never a hang, never a
silently wrong result). The configs register at the first step(), so that is
where layout errors surface."""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch, mesh_groups  # noqa: E402

WORLD = 4


def _params(shapes, seed=5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _step(params, config, steps=1):
    opt = muon.Muon(params, lr=0.01, distributed_config=config)
    for p in params:
        p.grad = torch.ones_like(p)
    for _ in range(steps):
        opt.step()
    return opt


def _adamw_difference(params, config):
    """Steps `params` with muon.Muon and copies of them with torch.optim.AdamW (the
    same values as muon.Muon's adamw_* defaults); the largest difference."""
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    _step(params, config, steps=2)
    ref = torch.optim.AdamW(copies, lr=0.01, betas=(0.95, 0.95), eps=1e-8, weight_decay=0.0)
    for _ in range(2):
        for p in copies:
            p.grad = torch.ones_like(p)
        ref.step()
    return max((a - b).abs().max().item() for a, b in zip(params, copies))


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return (type(e).__name__, str(e), getattr(e, "status", None))
    return None


def _raising_gather(local, param, owner, state):
    raise RuntimeError("boom from the user's gather")


def _gather_to_owner(local, param, owner, state):
    parts = [torch.empty_like(local) for _ in range(WORLD)] if state["rank"] == owner else None
    dist.gather(local.contiguous(), parts, dst=owner)
    return torch.cat(parts, 0) if parts is not None else None


def _wrong_size_redistribute(full, param, owner, state):
    buf = full.clone() if full is not None else torch.empty(state["shape"])
    dist.broadcast(buf, src=owner)
    return buf  # the whole matrix instead of this rank's rows


def _rows_redistribute(full, param, owner, state):
    buf = full.clone() if full is not None else torch.empty(state["shape"])
    dist.broadcast(buf, src=owner)
    return buf.chunk(WORLD, 0)[state["rank"]]


def _worker(rank, world):
    (d, t), (dp, tp) = mesh_groups((2, 2))
    out = {}

    # Group sizes that do not multiply to the world: DP given as the whole world.
    out["group_sizes"] = _catch(lambda: _step(
        _params([(4, 3)]), muon.create_processgroup_config(tp_pg=tp, dp_pg=dist.group.WORLD)))

    # A TP-sharded (row-parallel) param missing from tp_dims: declared replicated
    # over TP, but the TP ranks hold different values.
    full = _params([(6, 4), (4, 6)])
    local = [torch.nn.Parameter(full[0].detach().chunk(2, 0)[t].clone()),
             torch.nn.Parameter(full[1].detach().chunk(2, 1)[t].clone())]
    out["not_covered"] = _catch(lambda: _step(
        local, muon.create_processgroup_config(tp_pg=tp, dp_pg=dp, tp_dims={local[0]: 0})))

    # 1-D params (a replicated 1-D param, and a flat shard declared with a 1-D
    # global shape) are not Muon's: muon.Muon steps them with torch's AdamW.
    one = _params([(5,)])
    out["one_d"] = _adamw_difference(one, muon.create_processgroup_config(
        dp_pg=dist.group.WORLD))
    flat = _params([(1, 3)])
    out["one_d_global"] = _adamw_difference(flat, muon.create_processgroup_config(
        fsdp_pg=dist.group.WORLD, fsdp_mode="flat", global_shapes={flat[0]: (12,)}))

    # create_auto_config: a replicated param that tp_dim_per_param does not list
    # is read as TP-sharded on dim 0 (the design's default); its TP ranks hold the
    # same values, so every rank says how to state it.
    same = _params([(4, 3), (2, 6)])
    out["tp_default"] = _catch(lambda: _step(same, muon.create_auto_config(
        tp_process_group=tp, ddp_process_group=dp, tp_dim_per_param={1: None})))

    # names= that misses a param.
    two = _params([(3, 3), (2, 3)])
    out["names_missing"] = _catch(lambda: _step(two, muon.create_processgroup_config(
        dp_pg=dist.group.WORLD, names={two[0]: "a"})))

    # Experts with the same name on both EP ranks (no names=): taken for
    # replicas, whose values differ.
    experts = _params([(4, 4)], seed=10 + t)
    out["ep_names"] = _catch(lambda: _step(experts, muon.create_processgroup_config(
        dp_pg=dp, ep_pg=tp)))

    # A param that only some DP replicas have.
    some = _params([(3, 3), (2, 2)] if d == 0 else [(3, 3)])
    out["dp_missing"] = _catch(lambda: _step(some, muon.create_processgroup_config(
        dp_pg=dp, tp_pg=tp)))

    # Ranks that disagree on a global shape: the library's handshake.
    w = _params([(1, 24)])
    out["global_shape_mismatch"] = _catch(lambda: _step(w, muon.create_processgroup_config(
        fsdp_pg=dist.group.WORLD, fsdp_mode="flat",
        global_shapes={w[0]: (12, 8) if rank == 0 else (8, 12)})))

    # A user callback that raises (on every rank), then a step after the failure.
    rows = _params([(2, 3)])
    state = {"rank": rank, "shape": (8, 3), "global_shapes": {rows[0]: (8, 3)}}

    def callback_raises():
        opt = muon.Muon(rows, lr=0.01, distributed_config=muon.DistributedConfig(
            lambda p, s, n: 1, _raising_gather, _rows_redistribute, state=state))
        rows[0].grad = torch.ones_like(rows[0])
        return _catch(opt.step), _catch(opt.step)
    out["callback_raises"] = callback_raises()

    # redistribute_fn returning the wrong number of elements.
    out["redistribute_size"] = _catch(lambda: _step(rows, muon.DistributedConfig(
        lambda p, s, n: 0, _gather_to_owner, _wrong_size_redistribute, state=state)))

    # assign_fn answers that differ between ranks.
    out["assign_differs"] = _catch(lambda: _step(rows, muon.DistributedConfig(
        lambda p, s, n: s["rank"], _gather_to_owner, _rows_redistribute, state=state)))

    # After all that, a correct config on the same process groups still works.
    ok = _params([(8, 3)])
    _step(ok, muon.create_processgroup_config(dp_pg=dist.group.WORLD), steps=2)
    out["after"] = "ok"
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(_worker, WORLD)


def _same_everywhere(runs, key):
    got = [r[key] for r in runs]
    assert all(g is not None for g in got), "%s: some rank did not raise: %s" % (key, got)
    assert len({g[0] for g in got}) == 1, got
    return got


CASES = {
    # key: (exception type, substrings of every rank's message)
    "group_sizes": ("ValueError", ["every rank raises this", "multiply to 8",
                                   "the world has 4 ranks"]),
    "not_covered": ("ValueError", ["group0.param1", "tensor-parallel", "differ",
                                   "missing from tp_dims"]),
    "names_missing": ("ValueError", ["group0.param1", "no entry in `names`"]),
    "tp_default": ("ValueError", ["group0.param0", "read as TP-sharded on dim 0",
                                  "tp_dim_per_param={0: None}"]),
    "ep_names": ("ValueError", ["expert-parallel", "distinct names"]),
    "dp_missing": ("ValueError", ["group0.param1", "data-parallel", "do not have it"]),
    "global_shape_mismatch": ("MuonError", ["group0.param0"]),
    "redistribute_size": ("MuonError", ["redistribute_fn returned 24 elements",
                                        "this rank holds 6"]),
    "assign_differs": ("MuonError", ["group0.param0"]),
}


@pytest.mark.parametrize("key", list(CASES))
def test_misuse_raises_on_every_rank(runs, key):
    kind, parts = CASES[key]
    for rank, (name, message, _) in enumerate(_same_everywhere(runs, key)):
        assert name == kind, (rank, name, message)
        for part in parts:
            assert part in message, "rank %d, %s: %r not in %r" % (rank, key, part, message)


def test_one_d_params_are_stepped_by_adamw_on_every_rank(runs):
    for rank, res in enumerate(runs):
        assert res["one_d"] == 0.0, (rank, res["one_d"])
        assert res["one_d_global"] == 0.0, (rank, res["one_d_global"])


def test_callback_exception_names_param_and_cause(runs):
    for rank, res in enumerate(runs):
        first, second = res["callback_raises"]
        assert first is not None and first[0] == "MuonError", (rank, first)
        assert "group0.param0" in first[1] and "boom from the user's gather" in first[1], first
        assert "RuntimeError" in first[1], first
        assert second is not None and second[2] == "FAILED_PRECONDITION", (rank, second)


def test_a_correct_config_works_after_the_failures(runs):
    assert [r["after"] for r in runs] == ["ok"] * WORLD
