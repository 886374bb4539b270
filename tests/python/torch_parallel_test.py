"""muon.Muon under torch's own parallelism on 4 gloo processes (CPU): FSDP2
(fully_shard), tensor parallel (parallelize_module) then FSDP2 on a 2-D
DeviceMesh (the strided placements real recipes produce), DDP, and DDP with
torch's ZeroRedundancyOptimizer around muon.Muon (ZeRO-1: each rank steps
its share of whole params). Each rank also steps a single-process muon.Muon
on the full tensors with the very same gradients (gathered from the
DTensors, or DDP's averaged ones); after every step both must agree bit for
bit (fp32 Newton-Schulz), matrices through Muon and biases through AdamW,
and every matrix is orthogonalized once per step in the whole job. The
same holds when one of create_dtensor_config's functions is replaced (the
design's "create the config, then override one function"): the custom path
then runs them. And the design's Example 2 as written
(create_devicemesh_config(device_mesh=mesh, mesh_dim_names=["dp", "tp"])
over FSDP2 + TP), on a "cpu" mesh."""

import copy

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 3


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 24)
        self.down = torch.nn.Linear(24, 16)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Linear(16, 6, bias=False)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def _batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 6, generator=g)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train(model, config, rank, batch_of, opt=None):
    """STEPS steps of muon.Muon under `config` (or of `opt`, a wrapper of
    muon.Muon) against a single-process muon.Muon on the same gradients."""
    reference = copy.deepcopy(_plain_copy(model))
    if opt is None:
        opt = muon.Muon(model.parameters(), lr=0.02, ns_dtype="fp32", distributed_config=config)
    ref_opt = muon.Muon(reference.parameters(), lr=0.02, ns_dtype="fp32")
    worst, exact = 0.0, True
    for step in range(STEPS):
        x, y = batch_of(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            q.grad = _full(p.grad).detach().clone()
        opt.step()
        ref_opt.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            got = _full(p.detach())
            worst = max(worst, (got - q.detach()).abs().max().item())
            exact = exact and torch.equal(got, q.detach())
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer's local optimizer
    return {"exact": exact, "worst": worst,
            "orthogonalized": inner.stats()["matrices_orthogonalized"],
            "moved": not torch.equal(_full(model.head.weight.detach()), _full_init_head())}


_INIT = {}


def _full_init_head():
    return _INIT["head"]


def _plain_copy(model):
    """A single-process model with the full values of `model`'s parameters."""
    torch.manual_seed(0)
    plain = Net()
    with torch.no_grad():
        for p, q in zip(model.parameters(), plain.parameters()):
            q.copy_(_full(p.detach()))
    return plain


def _fsdp2_model(root=True):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Net()
    _INIT["head"] = model.head.weight.detach().clone()
    mesh = init_device_mesh("cpu", (WORLD,))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    if root:
        fully_shard(model, mesh=mesh)
    return model


def _fsdp2_plain_head(rank):
    """The design's mixed case: the blocks are DTensors, the head a plain tensor,
    whole on every rank (the same batch everywhere keeps its copies equal)."""
    model = _fsdp2_model(root=False)
    assert not hasattr(model.head.weight, "device_mesh")
    return _train(model, muon.create_dtensor_config(), rank, lambda step, r: _batch(step, 0))


def _fsdp2(rank):
    return _train(_fsdp2_model(), muon.create_dtensor_config(), rank, _batch)


def _fsdp2_own_assignment(rank):
    """The design's "create the config, then override one function": the custom
    path runs the config's own gather_fn and redistribute_fn."""
    config = muon.create_dtensor_config()
    assert isinstance(config, muon.DistributedConfig)
    config.assign_fn = lambda params, state: {i: (i + 1) % WORLD for i in range(len(params))}
    return _train(_fsdp2_model(), config, rank, _batch)


def _tp_fsdp2(rank, override_gather=False, devicemesh=False):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    model = Net()
    _INIT["head"] = model.head.weight.detach().clone()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for b in model.blocks:
        parallelize_module(b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(b, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    placements = {n: str(p.placements) for n, p in model.named_parameters()}
    if devicemesh:
        # The design's Example 2, as written but on "cpu" (2 x 2): the config of
        # the mesh, whose DTensor params then describe their own layout.
        config = muon.create_devicemesh_config(device_mesh=mesh, mesh_dim_names=["dp", "tp"])
        out = _train(model, config, rank, lambda step, r: _batch(step, r // 2))
        out["config_type"] = type(config).__name__
        return out
    config = muon.create_dtensor_config()
    if override_gather:
        native_gather = config.gather_fn
        calls = []
        config.gather_fn = lambda shard, owner, state: calls.append(owner) or native_gather(
            shard, owner, state)
    # Both TP ranks of a DP rank see the same batch, as TP requires.
    out = _train(model, config, rank, lambda step, r: _batch(step, r // 2))
    out["placements"] = placements
    out["own_gathers"] = len(calls) if override_gather else None
    return out


def _ddp_wrapped():
    torch.manual_seed(0)
    model = Net()
    _INIT["head"] = model.head.weight.detach().clone()
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    class Wrapped(torch.nn.Module):  # the DDP module, seen with Net's parameter names
        def __init__(self):
            super().__init__()
            self.ddp = ddp
            self.head = model.head

        def forward(self, x):
            return self.ddp(x)

        def parameters(self, recurse=True):
            return model.parameters()
    return Wrapped()


def _ddp(rank):
    return _train(_ddp_wrapped(), muon.create_processgroup_config(dp_pg=dist.group.WORLD), rank,
                  _batch)


def _zero_redundancy(rank):
    """torch's own ZeRO-1 over DDP: ZeroRedundancyOptimizer gives each rank a
    plain muon.Muon over its share of the (whole) params, then broadcasts
    them; no distributed_config is needed, each matrix is whole where it is
    stepped."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = _ddp_wrapped()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=muon.Muon, lr=0.02,
                                  ns_dtype="fp32")
    return _train(model, None, rank, _batch, opt=opt)


def _worker(rank, world):
    torch.set_num_threads(1)
    return {"fsdp2": _fsdp2(rank), "tp_fsdp2": _tp_fsdp2(rank), "ddp": _ddp(rank),
            "fsdp2_own_assignment": _fsdp2_own_assignment(rank),
            "tp_fsdp2_own_gather": _tp_fsdp2(rank, override_gather=True),
            "tp_fsdp2_devicemesh": _tp_fsdp2(rank, devicemesh=True),
            "fsdp2_plain_head": _fsdp2_plain_head(rank),
            "zero_redundancy": _zero_redundancy(rank)}


@pytest.fixture(scope="module")
def runs():
    return launch(_worker, WORLD)


MATRICES = 5  # 2 blocks x (up, down) + head


@pytest.mark.parametrize("layout", ["fsdp2", "tp_fsdp2", "ddp", "fsdp2_own_assignment",
                                    "tp_fsdp2_own_gather", "tp_fsdp2_devicemesh",
                                    "fsdp2_plain_head", "zero_redundancy"])
def test_bit_for_bit_with_single_process_muon_on_the_same_gradients(runs, layout):
    for rank, res in enumerate(runs):
        out = res[layout]
        assert out["moved"], (layout, rank)
        assert out["exact"], "%s rank %d: differs by up to %g" % (layout, rank, out["worst"])
    assert sum(r[layout]["orthogonalized"] for r in runs) == MATRICES
    print("\n%s: %d steps, largest difference %g" % (layout, STEPS,
                                                      max(r[layout]["worst"] for r in runs)))


def test_the_replaced_function_really_ran(runs):
    # Every matrix gathered on every rank, every step, through the user's function.
    assert [r["tp_fsdp2_own_gather"]["own_gathers"] for r in runs] == [MATRICES * STEPS] * WORLD


def test_tp_then_fsdp2_really_produced_strided_shards(runs):
    placements = runs[0]["tp_fsdp2"]["placements"]
    assert "_StridedShard" in placements["blocks.0.up.weight"], placements
    assert "Shard(dim=1)" in placements["blocks.0.down.weight"], placements
