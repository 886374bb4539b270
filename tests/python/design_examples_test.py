"""The design documents' user-facing examples, as written, on 4 gloo
processes (CPU). Two substitutions only, the same for every example: the
imports (`from torch.optim import Muon` and `from torch.optim.muon import
...` become `muon.Muon` and `muon....`: libmuon serves the API from its own
package) and the device ("cuda" becomes "cpu"). Each example's optimizer is
built with the exact arguments the document writes and trains a few steps;
where the document says what the result must be, that is checked too.

docs/design_examples.md lists the examples, where each one is tested, and
the one that does not run as written (and why).
"""

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
        self.up = torch.nn.Linear(12, 16)
        self.down = torch.nn.Linear(16, 12)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class MyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.head = torch.nn.Linear(12, 4)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


MATRICES = 5


def _data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)


def _loss(model, step, rank):
    x, y = _data(step, rank)
    return torch.nn.functional.mse_loss(model(x), y)


def _fsdp1(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
                device_id=torch.device("cpu"))


def _full_fsdp1(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    with FSDP.summon_full_params(model):
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _run(model, optimizer, rank, data_rank=None):
    """STEPS training steps; what the checks need."""
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = _loss(model, step, rank if data_rank is None else data_rank)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "orthogonalized": optimizer.stats()["matrices_orthogonalized"]}


# -- 000, Quick Start, Example 1: FSDP Training ---------------------------------------


def example_1_fsdp(rank):
    torch.manual_seed(0)
    model = MyModel()
    model = _fsdp1(model)
    optimizer = muon.Muon(
        model.parameters(),
        lr=0.02,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        distributed_config=muon.create_processgroup_config(
            fsdp_pg=model.process_group,
        )
    )
    before = _full_fsdp1(model)
    out = _run(model, optimizer, rank)
    after = _full_fsdp1(model)
    out["moved"] = sorted(n for n in before if not torch.equal(before[n], after[n]))
    out["names"] = sorted(before)
    return out


# -- 000, Correctness Validation for Users -------------------------------------------


def validation_for_users(rank):
    # 1. Single-GPU reference (every rank runs it; it sees every rank's data,
    #    which is what the distributed job's averaged gradient is made of).
    torch.manual_seed(0)
    model_ref = MyModel()
    optimizer_ref = muon.Muon(model_ref.parameters(), lr=0.02)
    for step in range(STEPS):
        optimizer_ref.zero_grad()
        loss = sum(_loss(model_ref, step, r) for r in range(WORLD)) / WORLD
        loss.backward()
        optimizer_ref.step()
    # 2. Multi-GPU distributed
    torch.manual_seed(0)
    model_dist = MyModel()  # Same initialization as model_ref
    model_dist = _fsdp1(model_dist)
    optimizer_dist = muon.Muon(
        model_dist.parameters(),
        lr=0.02,
        distributed_config=muon.create_processgroup_config(fsdp_pg=model_dist.process_group)
    )
    _run(model_dist, optimizer_dist, rank)
    # 3. Compare (on every rank): "Should match within tolerance" -- the
    #    document's FP32 tolerance.
    got = _full_fsdp1(model_dist)
    worst = {}
    for n, p in model_ref.named_parameters():
        torch.testing.assert_close(got[n], p.detach(), rtol=1e-5, atol=1e-5)
        worst[n] = (got[n] - p.detach()).abs().max().item()
    return {"worst": max(worst.values())}


# -- 003, Example Usage: default, debug and high-memory pipelines ----------------------


def example_usage_pipelines(rank):
    results = {}
    for mode, prefetch, parallel in (("default", 1, True), ("debug", 0, False),
                                     ("fast", 2, True)):
        torch.manual_seed(0)
        model = _fsdp1(MyModel())
        optimizer = muon.Muon(
            model.parameters(),
            lr=0.02,
            distributed_config=muon.create_processgroup_config(
                fsdp_pg=model.process_group,
                prefetch_count=prefetch,
                async_gpu_parallelism=parallel
            )
        )
        _run(model, optimizer, rank)
        results[mode] = _full_fsdp1(model)
    return {"same": {mode: all(torch.equal(results[mode][n], results["default"][n])
                               for n in results["default"]) for mode in results}}


# -- 000, Example 2: FSDP + Tensor Parallel --------------------------------------------


def example_2_fsdp_tp(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    # Setup device mesh for combined parallelism
    device_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=["dp", "tp"])
    # Apply FSDP + TP to model...
    torch.manual_seed(0)
    model = MyModel()
    for b in model.blocks:
        parallelize_module(b, device_mesh["tp"],
                           {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(b, mesh=device_mesh["dp"])
    fully_shard(model, mesh=device_mesh["dp"])

    optimizer = muon.Muon(
        model.parameters(),
        lr=0.02,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        distributed_config=muon.create_devicemesh_config(
            device_mesh=device_mesh,
            mesh_dim_names=["dp", "tp"]
        )
    )
    before = {n: _full(p.detach()).clone() for n, p in model.named_parameters()}
    out = _run(model, optimizer, rank, data_rank=rank // 2)  # a TP pair sees one batch
    out["moved"] = sorted(n for n, p in model.named_parameters()
                          if not torch.equal(before[n], _full(p.detach())))
    out["names"] = sorted(before)
    return out


# -- 000, Example 3: DTensor-based Training --------------------------------------------


def example_3_dtensor(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = MyModel()
    mesh = init_device_mesh("cpu", (WORLD,))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # Model parameters are DTensors with placement specs
    optimizer = muon.Muon(
        model.parameters(),
        lr=0.02,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        distributed_config=muon.create_dtensor_config()
    )
    return _run(model, optimizer, rank)


# -- 001, Why create_auto_config(): FSDP + TP with tp_shard_dim=1 ----------------------


def auto_config_tp_shard_dim_1(rank):
    # A 2 x 2 job: TP pairs {0, 1} and {2, 3}, FSDP pairs {0, 2} and {1, 3}.
    tp_pg = fsdp_pg = None
    for ranks in ([0, 1], [2, 3]):
        g = dist.new_group(ranks)
        tp_pg = g if rank in ranks else tp_pg
    for ranks in ([0, 2], [1, 3]):
        g = dist.new_group(ranks)
        fsdp_pg = g if rank in ranks else fsdp_pg
    tp, fsdp = rank % 2, rank // 2
    g = torch.Generator().manual_seed(5)
    full = [torch.randn(8, 12, generator=g), torch.randn(6, 10, generator=g)]

    def piece(t):  # the design's order: FSDP splits the whole matrix, TP each FSDP piece
        return t.chunk(2, 0)[fsdp].chunk(2, 1)[tp].clone()

    params = [torch.nn.Parameter(piece(t)) for t in full]
    config = muon.create_auto_config(
        tp_process_group=tp_pg,
        fsdp_process_group=fsdp_pg,
        tp_shard_dim=1
    )
    optimizer = muon.Muon(params, lr=0.02, ns_dtype="fp32", distributed_config=config)
    reference = [torch.nn.Parameter(t.clone()) for t in full]
    ref_opt = muon.Muon(reference, lr=0.02, ns_dtype="fp32")
    exact = True
    for step in range(STEPS):
        grads = [torch.randn(t.shape, generator=g) for t in full]
        for p, q, gr in zip(params, reference, grads):
            p.grad, q.grad = piece(gr), gr.clone()
        optimizer.step()
        ref_opt.step()
        exact = exact and all(torch.equal(p.detach(), piece(q.detach()))
                              for p, q in zip(params, reference))
    return {"exact": exact, "orthogonalized": optimizer.stats()["matrices_orthogonalized"]}


# -- 002, assign_fn's return: {0: [0, 2], 1: [1, 3]} -------------------------------------


def assignment_example(rank):
    g = torch.Generator().manual_seed(9)
    full = [torch.randn(8, 6, generator=g) for _ in range(4)]
    params = [torch.nn.Parameter(t.chunk(WORLD, 0)[rank].clone()) for t in full]

    def assign_fn(params, state):
        # For 4 parameters and 2 ranks
        return {0: [0, 2], 1: [1, 3]}  # Rank 0 handles params 0,2; Rank 1 handles params 1,3

    def gather_fn(momentum_buffer_shard, rank, state):
        parts = [torch.empty_like(momentum_buffer_shard) for _ in range(WORLD)]
        dist.all_gather(parts, momentum_buffer_shard.contiguous())
        return torch.cat(parts, 0)

    def redistribute_fn(update, rank, state):
        full_update = update if update is not None else torch.empty(8, 6)
        dist.broadcast(full_update, src=rank)
        return full_update.chunk(WORLD, 0)[state["rank"]].clone()

    config = muon.DistributedConfig(assign_fn, gather_fn, redistribute_fn, state={})
    optimizer = muon.Muon(params, lr=0.02, ns_dtype="fp32", distributed_config=config)
    reference = [torch.nn.Parameter(t.clone()) for t in full]
    ref_opt = muon.Muon(reference, lr=0.02, ns_dtype="fp32")
    for step in range(STEPS):
        grads = [torch.randn(8, 6, generator=g) for _ in full]
        for p, q, gr in zip(params, reference, grads):
            p.grad, q.grad = gr.chunk(WORLD, 0)[rank].clone(), gr.clone()
        optimizer.step()
        ref_opt.step()
    return {"exact": all(torch.equal(p.detach(), q.detach().chunk(WORLD, 0)[rank])
                         for p, q in zip(params, reference)),
            "assignments": config.state["assignments"],
            "orthogonalized": optimizer.stats()["matrices_orthogonalized"]}


# -- 001, Context Parallel gather/redistribute ------------------------------------------


def context_parallel_functions(rank):
    # The document's functions, with one change: it broadcasts into
    # `ortho_update` on every rank, but its own contract (000's pseudocode:
    # "redistribute_fn receives None on non-src_rank") hands the other ranks
    # None, so they receive into a tensor of the update's shape instead.
    def cp_gather_fn(update, rank, state):
        return update.clone()

    def cp_redistribute_fn(ortho_update, rank, state):
        cp_pg = state["cp_process_group"]
        assignments = state["assignments"]
        param_idx = state["current_param_idx"]
        owner_rank = None
        for r, param_indices in assignments.items():
            if param_idx in param_indices:
                owner_rank = r
                break
        if ortho_update is None:  # (the change)
            ortho_update = torch.empty(state["shapes"][param_idx])
        dist.broadcast(ortho_update, src=owner_rank, group=cp_pg)
        return ortho_update

    g = torch.Generator().manual_seed(3)
    full = [torch.randn(s, generator=g) for s in ((6, 8), (8, 5), (4, 4), (7, 3))]
    params = [torch.nn.Parameter(t.clone()) for t in full]  # replicated over CP
    state = {"cp_process_group": dist.group.WORLD, "shapes": [t.shape for t in full]}
    config = muon.DistributedConfig(
        lambda params, state: {r: [i for i in range(len(params)) if i % WORLD == r]
                               for r in range(WORLD)},
        cp_gather_fn, cp_redistribute_fn, state)
    optimizer = muon.Muon(params, lr=0.02, ns_dtype="fp32", distributed_config=config)
    reference = [torch.nn.Parameter(t.clone()) for t in full]
    ref_opt = muon.Muon(reference, lr=0.02, ns_dtype="fp32")
    for step in range(STEPS):
        grads = [torch.randn(t.shape, generator=g) for t in full]  # identical on every rank
        for p, q, gr in zip(params, reference, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        optimizer.step()
        ref_opt.step()
    return {"exact": all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, reference)),
            "orthogonalized": optimizer.stats()["matrices_orthogonalized"]}


def _worker(rank, world):
    torch.set_num_threads(1)
    return {f.__name__: f(rank) for f in (
        example_1_fsdp, validation_for_users, example_usage_pipelines, example_2_fsdp_tp,
        example_3_dtensor, auto_config_tp_shard_dim_1, assignment_example,
        context_parallel_functions)}


@pytest.fixture(scope="module")
def runs():
    return launch(_worker, WORLD, timeout=400)


@pytest.mark.parametrize("example", ["example_1_fsdp", "example_2_fsdp_tp"])
def test_fsdp_examples_run_as_written_and_train_every_weight(runs, example):
    for rank, r in enumerate(runs):
        out = r[example]
        assert out["moved"] == out["names"], (rank, out["moved"])
        assert all(torch.isfinite(torch.tensor(out["losses"])))
    # Newton-Schulz once per matrix in the whole job, not once per rank.
    assert sum(r[example]["orthogonalized"] for r in runs) == MATRICES


def test_example_3_dtensor_runs_as_written(runs):
    assert sum(r["example_3_dtensor"]["orthogonalized"] for r in runs) == MATRICES
    for r in runs:
        losses = r["example_3_dtensor"]["losses"]
        assert all(torch.isfinite(torch.tensor(losses)))


def test_example_4_non_distributed_runs_as_written():
    torch.manual_seed(0)
    model = MyModel()
    # No distributed_config parameter - uses standard single-device behavior
    optimizer = muon.Muon(
        model.parameters(),
        lr=0.02,
        momentum=0.95,
        nesterov=True,
        ns_steps=5
    )
    before = [p.detach().clone() for p in model.parameters()]
    out = _run(model, optimizer, 0)
    assert out["orthogonalized"] == MATRICES
    assert all(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))


def test_validation_for_users_holds_the_documents_tolerance(runs):
    worst = max(r["validation_for_users"]["worst"] for r in runs)
    print("\nFSDP1 vs single-GPU reference (the document's check): largest difference %g"
          % worst)


def test_pipeline_modes_of_example_usage_give_the_same_bits(runs):
    for r in runs:
        assert r["example_usage_pipelines"]["same"] == {"default": True, "debug": True,
                                                        "fast": True}


@pytest.mark.parametrize("example", ["auto_config_tp_shard_dim_1", "assignment_example",
                                     "context_parallel_functions"])
def test_config_examples_equal_single_process_muon(runs, example):
    assert all(r[example]["exact"] for r in runs), example
    total = sum(r[example]["orthogonalized"] for r in runs)
    assert total == {"auto_config_tp_shard_dim_1": 2, "assignment_example": 4,
                     "context_parallel_functions": 4}[example]


def test_assignment_example_is_kept_in_state(runs):
    assert all(r["assignment_example"]["assignments"] == {0: [0, 2], 1: [1, 3]} for r in runs)
