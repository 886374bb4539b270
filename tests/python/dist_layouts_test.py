"""Every layout create_processgroup_config / create_auto_config describes, and a
user-written muon.DistributedConfig, on 4 processes (gloo): the parameters
after training are bit-identical to muon.Muon(distributed_config=None) in one
process, and every matrix is orthogonalized exactly once per step in the job.

Each rank holds only its pieces. For the forward it rebuilds the full weights
(an all_gather of the pieces: exact copies), computes the gradient of its own
batch shard, and the host averages the gradients in a fixed order (all_gather,
rank-order sum, divide), as DDP/FSDP would but deterministically; the rank
keeps its piece of the average. The reference computes the same per-shard
gradients from the same full weights and averages them in the same order.
"""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import (batch, bits_equal, launch, max_abs_diff, mesh_groups,  # noqa: E402
                          ordered_mean)

WORLD = 4
STEPS = 20
IN, OUT, ROWS = 8, 5, 6
DENSE = [("w0", (3, 3)), ("w1", (12, IN)), ("w2", (IN, 12)), ("w3", (OUT, IN))]
EXPERTS = [("experts.%d" % k, (IN, IN)) for k in range(4)]
HP = dict(lr=0.03, weight_decay=0.05, momentum=0.9)


def model_params(with_experts):
    return DENSE + (EXPERTS if with_experts else [])


def full_init(with_experts):
    g = torch.Generator().manual_seed(99)
    return {n: torch.randn(*s, generator=g) * 0.3 for n, s in model_params(with_experts)}


def batch_grads(full, shard, step):
    """The gradient of one batch shard's loss, from full weights."""
    x, y = batch(step, shard, ROWS, IN, OUT)
    leaves = {n: t.detach().clone().requires_grad_() for n, t in full.items()}
    z = torch.tanh(x @ leaves["w1"].t()) @ leaves["w2"].t()
    for name in sorted(n for n in leaves if n.startswith("experts.")):
        z = z + 0.5 * torch.tanh(z @ leaves[name].t())
    loss = torch.nn.functional.mse_loss(z @ leaves["w3"].t(), y)
    loss = loss + torch.nn.functional.mse_loss(x[:, :3] @ leaves["w0"].t(), y[:, :3])
    names = list(leaves)
    return dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))


# ---------------------------------------------------------------------------
# Layouts: which piece of which param each rank holds
# ---------------------------------------------------------------------------


def chunk_sizes(total, n):
    step = -(-total // n)
    return [max(0, min(step, total - r * step)) for r in range(n)]


def piece(shape, ops):
    """The flat indices (shaped as the local tensor) of a piece: ops go from the
    global tensor down, ("shard", dim, rank, n, "even" | "chunk") or
    ("flat", rank, n) (elements [r*c, r*c + c) of the flattening, c = ceil(numel / n))."""
    t = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    for op in ops:
        if op[0] == "shard":
            _, dim, r, n, split = op
            size = t.shape[dim]
            sizes = [size // n] * n if split == "even" else chunk_sizes(size, n)
            t = t.split(sizes, dim)[r] if size else t
        else:
            _, r, n = op
            flat = t.reshape(-1)
            total = flat.numel()
            step = -(-total // n)
            start = min(r * step, total)
            t = flat[start:start + max(0, min(step, total - start))]
    return t.contiguous()


# name -> (mesh dims, layout(coords) -> {param: ops or None (not held)},
#          batch shard of coords, number of shards)
def _zero_flat(c):
    return {n: [("flat", c[0], 4)] for n, _ in DENSE}


def _tp_fsdp(c):  # mesh (FSDP 2, TP 2): the design's order, FSDP splits the whole matrix
    f, t = c
    fs = ("shard", 0, f, 2, "chunk")
    return {"w0": [fs], "w1": [fs, ("shard", 0, t, 2, "even")],
            "w2": [fs, ("shard", 1, t, 2, "even")], "w3": [fs]}


def _fsdp_tp(c):  # mesh (FSDP 2, TP 2): FSDP splits each TP piece (TP applied first)
    f, t = c
    fs = ("shard", 0, f, 2, "chunk")
    return {"w0": [fs], "w1": [("shard", 0, t, 2, "even"), fs],
            "w2": [("shard", 1, t, 2, "even"), fs], "w3": [fs]}


def _replicated(c):
    return {n: [] for n, _ in DENSE}


def _ep(c):  # mesh (DP 2, EP 2): EP rank e holds experts 2e and 2e + 1
    out = {n: [] for n, _ in DENSE}
    for k, (name, _) in enumerate(EXPERTS):
        out[name] = [] if k // 2 == c[1] else None
    return out


def _pp(c):  # mesh (DP 2, PP 2): stage 0 holds w0, w1; stage 1 holds w2, w3
    return {n: ([] if (n in ("w0", "w1")) == (c[1] == 0) else None) for n, _ in DENSE}


def _hsdp(c):  # mesh (DP 2, FSDP 2): replicate over DP, chunk rows over FSDP
    return {n: [("shard", 0, c[1], 2, "chunk")] for n, _ in DENSE}


def _tp_flat(c):  # mesh (DP 2, TP 2): Megatron's distributed optimizer
    d, t = c
    fl = ("flat", d, 2)
    return {"w0": [fl], "w1": [("shard", 0, t, 2, "even"), fl],
            "w2": [("shard", 1, t, 2, "even"), fl], "w3": [fl]}


def _custom(c):
    return {"w0": [], "w1": [("shard", 0, c[0], 4, "even")],
            "w2": [("shard", 0, c[0], 4, "even")], "w3": []}


def _rank(c, dims):
    r = 0
    for x, d in zip(c, dims):
        r = r * d + x
    return r


SCENARIOS = {
    # name: (mesh, layout, batch shard of coords, shards, experts?)
    "zero_flat": ((4,), _zero_flat, lambda c: c[0], 4, False),
    "tp_fsdp_auto": ((2, 2), _tp_fsdp, lambda c: c[0], 2, False),
    "fsdp_tp_order": ((2, 2), _fsdp_tp, lambda c: c[0], 2, False),
    "tp_fsdp_replaced": ((2, 2), _tp_fsdp, lambda c: c[0], 2, False),
    "ddp_cp": ((2, 2), _replicated, lambda c: _rank(c, (2, 2)), 4, False),
    "zero2": ((4,), _replicated, lambda c: c[0], 4, False),
    "ep": ((2, 2), _ep, lambda c: _rank(c, (2, 2)), 4, True),
    "ep_auto": ((2, 2), _ep, lambda c: _rank(c, (2, 2)), 4, True),
    "hsdp": ((2, 2), _hsdp, lambda c: _rank(c, (2, 2)), 4, False),
    "tp_flat": ((2, 2), _tp_flat, lambda c: c[0], 2, False),
    "pp": ((2, 2), _pp, lambda c: c[0], 2, False),
    "tp_flat_replaced": ((2, 2), _tp_flat, lambda c: c[0], 2, False),
    "custom": ((4,), _custom, lambda c: c[0], 4, False),
}
# Scenarios where a helper's config has one of its functions replaced: the
# custom path then runs the helper's other functions over the same layout.
REPLACED = ("tp_fsdp_replaced", "tp_flat_replaced")


def coords_of(rank, dims):
    c = []
    for d in reversed(dims):
        c.append(rank % d)
        rank //= d
    return tuple(reversed(c))


# ---------------------------------------------------------------------------
# The user-written DistributedConfig of the "custom" scenario: w1 and w2 split
# by rows over the 4 ranks, w0 and w3 replicated; owners round robin.
# ---------------------------------------------------------------------------


def user_assign(param, state, world_size):
    return state["index"][param] % world_size


def user_gather(local, param, owner, state):
    if state["kind"][param] == "replicated":
        return local.clone() if state["rank"] == owner else None
    parts = [torch.empty_like(local) for _ in range(state["n"])] \
        if state["rank"] == owner else None
    dist.gather(local.contiguous(), parts, dst=owner)  # only the owner receives
    return torch.cat(parts, 0) if parts is not None else None


def user_redistribute(full, param, owner, state):
    shape = state["global_shapes"][param]
    if state["kind"][param] == "replicated":
        buf = full.clone() if full is not None else torch.empty(shape)
        dist.broadcast(buf, src=owner)
        return buf
    out = torch.empty(shape[0] // state["n"], *shape[1:])
    dist.scatter(out, list(full.chunk(state["n"], 0)) if full is not None else None, src=owner)
    return out


# ---------------------------------------------------------------------------
# The distributed run
# ---------------------------------------------------------------------------


def reversed_round_robin(params, state):
    """A design-form assign_fn: param_idx i to rank n - 1 - i (mod n)."""
    n = dist.get_world_size()
    return {i: (n - 1 - i) % n for i in range(len(params))}


def counted(fn, keep=False):
    """fn, counting its calls in state["calls"]; with keep, the first whole
    matrix it returns on the assigned rank, per param_idx, in state["gathered"]."""
    def wrapper(tensor, rank, state):
        state["calls"] = state.get("calls", 0) + 1
        out = fn(tensor, rank, state)
        if keep and rank == state["rank"]:
            state.setdefault("gathered", {}).setdefault(state["current_param_idx"],
                                                        out.detach().clone())
        return out
    return wrapper


def gathered_in_place(gathered, avg_grad, shapes):
    """Whether every whole matrix a gather_fn returned at the first step has
    each element where it belongs: then it is the averaged gradient times
    1 - momentum^2 (torch's Nesterov update from a zero buffer). Muon cannot
    tell: rows or columns in another order give the same update, moved."""
    scale = 1 - HP["momentum"] ** 2
    names = [n for n, _ in DENSE]
    return all(torch.allclose(full, scale * avg_grad[names[i]].reshape(shapes[names[i]]),
                              rtol=1e-5, atol=1e-8) for i, full in gathered.items())


def make_config(scenario, groups, coords, local, names_of):
    if scenario == "tp_fsdp_replaced":
        cfg = make_config("tp_fsdp_auto", groups, coords, local, names_of)
        cfg.assign_fn = reversed_round_robin
        cfg.gather_fn = counted(cfg.gather_fn, keep=True)
        return cfg
    if scenario == "tp_flat_replaced":
        cfg = make_config("tp_flat", groups, coords, local, names_of)
        cfg.redistribute_fn = counted(cfg.redistribute_fn)
        return cfg
    if scenario == "zero_flat":
        return muon.create_processgroup_config(
            fsdp_pg=groups[0], fsdp_mode="flat",
            global_shapes={local[n]: s for n, s in DENSE})
    if scenario == "tp_fsdp_auto":
        # Param order w0, w1, w2, w3: w1 column-parallel, w2 row-parallel; w0 and
        # w3 replicated over TP (unlisted params would be TP-sharded on dim 0).
        # The design's nesting: FSDP splits the whole matrix, TP each FSDP piece.
        return muon.create_auto_config(fsdp_process_group=groups[0],
                                       tp_process_group=groups[1],
                                       tp_dim_per_param={0: None, 1: 0, 2: 1, 3: None})
    if scenario == "fsdp_tp_order":
        return muon.create_processgroup_config(
            fsdp_pg=groups[0], tp_pg=groups[1], tp_dims={local["w1"]: 0, local["w2"]: 1},
            gather_order=("fsdp", "tp"))
    if scenario == "ddp_cp":
        return muon.create_processgroup_config(dp_pg=groups[0], cp_pg=groups[1])
    if scenario == "zero2":
        return muon.create_processgroup_config(dp_pg=groups[0], replicated_mode="zero2")
    if scenario == "ep":
        return muon.create_processgroup_config(dp_pg=groups[0], ep_pg=groups[1],
                                               names={p: n for n, p in local.items()})
    if scenario == "ep_auto":
        # Local params: w0..w3, then this EP rank's experts 2e and 2e + 1.
        e = coords[1]
        return muon.create_auto_config(ddp_process_group=groups[0],
                                       ep_process_group=groups[1],
                                       expert_assignments={4: 2 * e, 5: 2 * e + 1})
    if scenario == "hsdp":
        return muon.create_processgroup_config(dp_pg=groups[0], fsdp_pg=groups[1])
    if scenario == "tp_flat":
        return muon.create_processgroup_config(
            dp_pg=None, tp_pg=groups[1], fsdp_pg=groups[0], fsdp_mode="flat",
            tp_dims={local["w1"]: 0, local["w2"]: 1},
            global_shapes={local[n]: s for n, s in DENSE})
    if scenario == "pp":
        return muon.create_processgroup_config(dp_pg=groups[0], pp_pg=groups[1])
    if scenario == "custom":
        state = {"rank": coords[0], "n": WORLD, "kind": {}, "index": {}, "global_shapes": {}}
        for i, (n, s) in enumerate(DENSE):
            p = local[n]
            state["kind"][p] = "sharded" if n in ("w1", "w2") else "replicated"
            state["index"][p] = i
            state["global_shapes"][p] = s
        return muon.DistributedConfig(user_assign, user_gather, user_redistribute, state=state,
                                      prefetch_count=2)
    raise AssertionError(scenario)


def run_scenario(rank, scenario, groups, coords):
    dims, layout, shard_of, shards, experts = SCENARIOS[scenario]
    shapes = dict(model_params(experts))
    full0 = full_init(experts)
    layouts = [layout(coords_of(r, dims)) for r in range(WORLD)]
    pieces = [{n: piece(shapes[n], ops) for n, ops in lay.items() if ops is not None}
              for lay in layouts]
    mine = pieces[rank]
    with torch.no_grad():
        local = {n: torch.nn.Parameter(full0[n].reshape(-1)[idx.reshape(-1)]
                                       .reshape(idx.shape).clone())
                 for n, idx in mine.items()}
    if any(op[0] == "flat" for ops in layouts[rank].values() if ops for op in ops):
        # Flat shards as the 1-D tensors ZeRO and FSDP1 hold.
        with torch.no_grad():
            local = {n: torch.nn.Parameter(p.detach().reshape(-1).clone())
                     for n, p in local.items()}
    config = make_config(scenario, groups, coords, local, None)
    opt = muon.Muon(list(local.values()), distributed_config=config, **HP)
    order = list(local)
    # Who holds which elements, to rebuild full weights from everyone's pieces.
    widest = max(sum(int(i.numel()) for i in p.values()) for p in pieces)
    for step in range(STEPS):
        flat = torch.cat([local[n].detach().reshape(-1) for n in order] +
                         [torch.zeros(widest - sum(local[n].numel() for n in order))])
        everyone = [torch.empty(widest) for _ in range(WORLD)]
        dist.all_gather(everyone, flat)
        full = {n: torch.full(s, float("nan")) for n, s in shapes.items()}
        for r in range(WORLD):
            pos = 0
            for n in pieces[r]:
                idx = pieces[r][n].reshape(-1)
                full[n].view(-1)[idx] = everyone[r][pos:pos + idx.numel()]
                pos += idx.numel()
        assert all(not torch.isnan(t).any() for t in full.values()), "a piece is missing"
        grads = batch_grads(full, shard_of(coords), step)
        names = list(shapes)
        mine_flat = torch.cat([grads[n].reshape(-1) for n in names])
        all_grads = [torch.empty_like(mine_flat) for _ in range(WORLD)]
        dist.all_gather(all_grads, mine_flat)
        first_rank_of_shard = {}
        for r in range(WORLD):
            first_rank_of_shard.setdefault(shard_of(coords_of(r, dims)), r)
        if scenario == "zero2":
            use = mine_flat  # ZeRO-2: each rank hands its own gradient; the library averages
        else:
            use = ordered_mean([all_grads[first_rank_of_shard[s]] for s in range(shards)])
        pos, avg = 0, {}
        for n in names:
            size = shapes[n][0] * shapes[n][1]
            avg[n] = use[pos:pos + size]
            if n in local:
                g = use[pos:pos + size].reshape(-1)[mine[n].reshape(-1)]
                local[n].grad = g.reshape(local[n].shape).clone()
            pos += size
        opt.step()
        if step == 0 and scenario in REPLACED:
            placed = gathered_in_place(config.state.get("gathered", {}), avg, shapes)
    stats = opt._groups[0].opt.stats()
    calls = config.state.get("calls", 0) if isinstance(config.state, dict) else 0
    return {"params": {n: p.detach().clone() for n, p in local.items()}, "stats": stats,
            "calls": calls, "gathered": len(config.state.get("gathered", {}))
            if scenario in REPLACED else 0, "in_place": placed if scenario in REPLACED else None}


def _worker(rank, world):
    assert world == WORLD
    meshes = {}
    for dims in sorted({s[0] for s in SCENARIOS.values()}):
        meshes[dims] = mesh_groups(dims)  # every rank creates every group, in this order
    out = {}
    for scenario in SCENARIOS:
        coords, groups = meshes[SCENARIOS[scenario][0]]
        out[scenario] = run_scenario(rank, scenario, groups, coords)
    return out


# ---------------------------------------------------------------------------
# The reference and the checks
# ---------------------------------------------------------------------------


def reference(scenario):
    _, _, _, shards, experts = SCENARIOS[scenario]
    with torch.no_grad():
        params = {n: torch.nn.Parameter(t) for n, t in full_init(experts).items()}
    opt = muon.Muon(list(params.values()), **HP)
    for step in range(STEPS):
        per_shard = [batch_grads({n: p.detach() for n, p in params.items()}, s, step)
                     for s in range(shards)]
        for n, p in params.items():
            p.grad = ordered_mean([g[n] for g in per_shard])
        opt.step()
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.fixture(scope="module")
def runs():
    torch.set_num_threads(1)
    return launch(_worker, WORLD)


WORST = {}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_bit_identical_to_single_process(runs, scenario):
    torch.set_num_threads(1)
    dims, layout, _, _, experts = SCENARIOS[scenario]
    shapes = dict(model_params(experts))
    ref = reference(scenario)
    start = full_init(experts)
    assert all(not torch.equal(ref[n], start[n]) for n in ref), "nothing trained"
    worst = 0.0
    held = {n: 0 for n in shapes}
    for rank, res in enumerate(runs):
        lay = layout(coords_of(rank, dims))
        got_names = set(res[scenario]["params"])
        assert got_names == {n for n, ops in lay.items() if ops is not None}
        for n, got in res[scenario]["params"].items():
            idx = piece(shapes[n], lay[n])
            want = ref[n].reshape(-1)[idx.reshape(-1)]
            got = got.reshape(-1)
            held[n] += 1
            worst = max(worst, max_abs_diff(got, want))
            assert bits_equal(got, want), (
                "%s: rank %d param %s differs from single-process Muon by up to %g"
                % (scenario, rank, n, max_abs_diff(got, want)))
    assert all(held.values()), held
    stats = [res[scenario]["stats"] for res in runs]
    total = len(shapes)
    if scenario != "zero2":  # ZeRO-2 blocks are stepped outside the planned exchange
        assert [s["matrices_total"] for s in stats] == [total] * WORLD, (scenario, stats)
    assert sum(s["matrices_orthogonalized"] for s in stats) == total, (
        "%s: each matrix must be orthogonalized exactly once per step: %s" % (scenario, stats))
    # The replaced function ran for every matrix at every step on every rank;
    # a helper's config left whole never calls its functions.
    want_calls = STEPS * total if scenario in REPLACED else 0
    if scenario != "custom":
        assert [res[scenario]["calls"] for res in runs] == [want_calls] * WORLD, scenario
    if scenario == "tp_fsdp_replaced":  # gather_fn's whole matrices, element by element
        assert sum(res[scenario]["gathered"] for res in runs) == total
        assert all(res[scenario]["in_place"] for res in runs), scenario
    print("\n%s: %d steps, largest difference from single-process Muon: %g"
          % (scenario, STEPS, worst))
    assert worst == 0.0
