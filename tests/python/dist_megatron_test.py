"""A Megatron-style model (column- and row-parallel linears over a TP group, data
parallel over a DP group) trained on 4 processes (TP 2 x DP 2, gloo) with
muon.Muon + create_processgroup_config gives, parameter for parameter, the
bits of the same model trained in one process with muon.Muon(distributed_config=None).

The forward is tensor parallel for real: a column-parallel linear multiplies by
this rank's rows of the weight, a row-parallel one by its columns, and the
partial outputs are summed over the TP group (all_gather, then a sum in rank
order, so every TP rank gets the same bits). The host averages gradients over
DP in a fixed order (all_gather, rank-order sum, divide), as DDP would but
deterministically. The single-process reference runs the very same arithmetic
per (DP, TP) coordinate on slices of the full weights, so gradients agree bit
for bit and any difference in the parameters would come from the optimizer.
"""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import (allgather_tensor, batch, bits_equal, launch, max_abs_diff,  # noqa: E402
                          mesh_groups, ordered_mean)

TP, DP = 2, 2
HIDDEN, OUT, ROWS = 8, 4, 6
# (name, full shape, kind): "col" = column-parallel (Shard 0 over TP), "row" =
# row-parallel (Shard 1 over TP), "rep" = replicated over TP.
PARAMS = [
    ("block0.up", (16, HIDDEN), "col"),
    ("block0.down", (HIDDEN, 16), "row"),
    ("block1.up", (12, HIDDEN), "col"),
    ("block1.down", (HIDDEN, 12), "row"),
    ("head", (OUT, HIDDEN), "rep"),
]
HP = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
STEPS = 50
SETTINGS_STEPS = 4
SETTINGS = [(p, a) for p in (0, 1, 2) for a in (True, False)]


def full_init():
    g = torch.Generator().manual_seed(1234)
    return {name: torch.randn(*shape, generator=g) * 0.3 for name, shape, _ in PARAMS}


def tp_slice(name, full, t):
    kind = dict((n, k) for n, _, k in PARAMS)[name]
    if kind == "col":
        return full.chunk(TP, 0)[t]
    if kind == "row":
        return full.chunk(TP, 1)[t]
    return full


def block_partial(h, up, down):
    """One TP rank's share of a parallel MLP block: column-parallel up (its
    rows), row-parallel down (its columns); the partial output still has to be
    summed over the TP group."""
    return torch.tanh(h @ up.t()) @ down.t()


def ordered_sum(parts):
    acc = parts[0].clone()
    for q in parts[1:]:
        acc += q
    return acc


class _TpSum(torch.autograd.Function):
    """The row-parallel all-reduce: forward sums the TP ranks' partials in rank
    order; backward hands the output gradient to the local partial unchanged."""

    @staticmethod
    def forward(ctx, partial, gather):
        return ordered_sum(gather(partial.detach()))

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def tp_rank_loss(x, y, local, gather_for_block):
    """The loss as TP rank sees it, from its local weights; gather_for_block(b, h)
    returns a function giving every TP rank's partial of block b (rank order)."""
    h = x
    for b in range(2):
        partial = block_partial(h, local["block%d.up" % b], local["block%d.down" % b])
        h = h + _TpSum.apply(partial, gather_for_block(b, h))
    return torch.nn.functional.mse_loss(h @ local["head"].t(), y)


def names_in_order():
    return [name for name, _, _ in PARAMS]


# ---------------------------------------------------------------------------
# Single-process reference
# ---------------------------------------------------------------------------


def reference_grads(full, step):
    """Full-size gradients, averaged over DP as the distributed run does."""
    per_tp = []  # per TP rank: {name: DP-averaged local grad}
    for t in range(TP):
        per_dp = []
        for d in range(DP):
            x, y = batch(step, d, ROWS, HIDDEN, OUT)
            local = {n: tp_slice(n, full[n], t).detach().contiguous().clone().requires_grad_()
                     for n in names_in_order()}

            def gather_for_block(b, h, t=t):
                def gather(own):
                    up, down = "block%d.up" % b, "block%d.down" % b
                    # What TP rank s computes from its (contiguous) pieces.
                    parts = [block_partial(h.detach(), tp_slice(up, full[up], s).contiguous(),
                                           tp_slice(down, full[down], s).contiguous()).detach()
                             for s in range(TP)]
                    parts[t] = own
                    return parts
                return gather

            loss = tp_rank_loss(x, y, local, gather_for_block)
            grads = torch.autograd.grad(loss, [local[n] for n in names_in_order()])
            per_dp.append(dict(zip(names_in_order(), grads)))
        per_tp.append({n: ordered_mean([per_dp[d][n] for d in range(DP)])
                       for n in names_in_order()})
    out = {}
    for name, _, kind in PARAMS:
        if kind == "col":
            out[name] = torch.cat([per_tp[t][name] for t in range(TP)], 0)
        elif kind == "row":
            out[name] = torch.cat([per_tp[t][name] for t in range(TP)], 1)
        else:
            assert all(bits_equal(per_tp[t][name], per_tp[0][name]) for t in range(TP))
            out[name] = per_tp[0][name]
    return out


def train_reference(steps):
    with torch.no_grad():
        params = {n: torch.nn.Parameter(t) for n, t in full_init().items()}
    opt = muon.Muon([params[n] for n in names_in_order()], distributed_config=None, **HP)
    for step in range(steps):
        grads = reference_grads({n: p.detach() for n, p in params.items()}, step)
        for n, p in params.items():
            p.grad = grads[n]
        opt.step()
    return {n: p.detach().clone() for n, p in params.items()}


# ---------------------------------------------------------------------------
# The distributed run (rank = dp * TP + tp)
# ---------------------------------------------------------------------------


def train_distributed(rank, tp_group, dp_group, t, steps, prefetch_count, async_on,
                      distributed=True):
    full = full_init()
    with torch.no_grad():
        local = {n: torch.nn.Parameter(tp_slice(n, full[n], t).contiguous().clone())
                 for n in full}
    order = names_in_order()
    config = muon.create_processgroup_config(
        tp_pg=tp_group, dp_pg=dp_group,
        tp_dims={local[n]: (0 if k == "col" else 1) for n, _, k in PARAMS if k != "rep"},
        async_gpu_parallelism=async_on, prefetch_count=prefetch_count)
    opt = muon.Muon([local[n] for n in order],
                    distributed_config=config if distributed else None, **HP)
    d = rank // TP
    for step in range(steps):
        x, y = batch(step, d, ROWS, HIDDEN, OUT)

        def gather_for_block(b, h):
            return lambda own: allgather_tensor(own, tp_group)

        loss = tp_rank_loss(x, y, local, gather_for_block)
        grads = torch.autograd.grad(loss, [local[n] for n in order])
        for n, g in zip(order, grads):
            local[n].grad = ordered_mean(allgather_tensor(g, dp_group))  # DDP's all-reduce
        opt.step()
    out = {n: p.detach().clone() for n, p in local.items()}
    out["stats"] = opt._groups[0].opt.stats()  # the library optimizer of param group 0
    return out


def _worker(rank, world):
    (d, t), (dp_group, tp_group) = mesh_groups((DP, TP))
    assert rank == d * TP + t
    out = {"main": train_distributed(rank, tp_group, dp_group, t, STEPS, 1, True)}
    for prefetch, async_on in SETTINGS:
        out[(prefetch, async_on)] = train_distributed(rank, tp_group, dp_group, t,
                                                      SETTINGS_STEPS, prefetch, async_on)
    # Control: each rank orthogonalizing only its own pieces (no config) must differ.
    out["local_only"] = train_distributed(rank, tp_group, dp_group, t, SETTINGS_STEPS, 1, True,
                                          distributed=False)
    return out


@pytest.fixture(scope="module")
def runs():
    torch.set_num_threads(1)
    return launch(_worker, TP * DP)


def _compare(results, key, reference):
    worst = 0.0
    for rank, res in enumerate(results):
        t = rank % TP
        for name in names_in_order():
            want = tp_slice(name, reference[name], t).contiguous()
            got = res[key][name]
            worst = max(worst, max_abs_diff(got, want))
            assert bits_equal(got, want), (
                "rank %d (tp %d) param %s after %s: differs from single-process Muon by up to "
                "%g" % (rank, t, name, key, max_abs_diff(got, want)))
    return worst


def test_tp2_dp2_fifty_steps_bit_identical(runs):
    torch.set_num_threads(1)
    reference = train_reference(STEPS)
    start = full_init()
    assert any(not torch.equal(reference[n], start[n]) for n in start), "nothing trained"
    worst = _compare(runs, "main", reference)
    stats = [res["main"]["stats"] for res in runs]
    assert all(s["matrices_total"] == len(PARAMS) for s in stats)
    assert sum(s["matrices_orthogonalized"] for s in stats) == len(PARAMS), (
        "each matrix is orthogonalized exactly once in the whole job: %s" % stats)
    assert all(s["steps"] == STEPS for s in stats)
    print("\nMegatron TP2 x DP2, %d steps: largest difference from single-process Muon: %g"
          % (STEPS, worst))
    assert worst == 0.0


def test_prefetch_and_async_settings_are_bit_identical(runs):
    torch.set_num_threads(1)
    reference = train_reference(SETTINGS_STEPS)
    worst = 0.0
    for key in SETTINGS:
        worst = max(worst, _compare(runs, key, reference))
    print("\nprefetch_count 0/1/2 x async on/off, %d steps: largest difference %g"
          % (SETTINGS_STEPS, worst))
    assert worst == 0.0


def test_control_without_config_differs(runs):
    """The comparison has teeth: orthogonalizing each rank's pieces on their own
    (no distributed config) does not give single-process Muon."""
    torch.set_num_threads(1)
    reference = train_reference(SETTINGS_STEPS)
    differ = [name for name, _, kind in PARAMS if kind != "rep" and not all(
        bits_equal(res["local_only"][name], tp_slice(name, reference[name], rank % TP))
        for rank, res in enumerate(runs))]
    assert differ == [n for n, _, k in PARAMS if k != "rep"], differ
