"""A reshardable checkpoint through torch.distributed.checkpoint: muon.Muon's
state_dict() hands the momentum of a DTensor parameter out as a DTensor with
the parameter's placements (and AdamW's state as torch keeps it), so a
checkpoint saved by 4 ranks under FSDP2 loads into 2 ranks under FSDP2 (other
shard boundaries) and continues bit for bit like the uninterrupted run, or
into 2 ranks under tensor parallel, where it continues within the last bits
(tensor parallel's row-parallel layers sum partial products in another order,
so the gradients themselves differ there). A control that restores the model
but not the optimizer differs far more."""

import tempfile

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402
from torch_parallel_test import Net  # noqa: E402

SAVED_AT, STEPS = 3, 6


def _batch(step):
    # The same batch on every rank: the gradients do not depend on the layout.
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 6, generator=g)


def _build(world, layout, normuon=False):
    from torch.distributed.device_mesh import init_device_mesh
    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (world,))
    if layout == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        for b in model.blocks:
            parallelize_module(b, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        parallelize_module(model, mesh, {"head": ColwiseParallel(use_local_output=False)})
    opt = muon.Muon(model.parameters(), lr=0.02, ns_dtype="fp32", adamw_lr=3e-3,
                    normuon=normuon, distributed_config=muon.create_dtensor_config())
    return model, opt


def _train(model, opt, steps):
    for step in steps:
        x, y = _batch(step)
        opt.zero_grad()
        out = model(x)
        out = out.full_tensor() if hasattr(out, "full_tensor") else out
        torch.nn.functional.mse_loss(out, y).backward()
        opt.step()


def _full(model):
    return {n: p.full_tensor().detach() for n, p in model.named_parameters()}


def _save(rank, world, path, normuon=False):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict)
    model, opt = _build(world, "fsdp2", normuon)
    _train(model, opt, range(SAVED_AT))
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    kinds = sorted({type(v.get("momentum_buffer")).__name__
                    for v in state["optim"]["state"].values() if "momentum_buffer" in v})
    moments = {k: v["normuon_second_moment"].full_tensor().clone()
               for k, v in state["optim"]["state"].items() if "normuon_second_moment" in v}
    dcp.save(state, checkpoint_id=path)
    _train(model, opt, range(SAVED_AT, STEPS))
    return {"params": _full(model), "momentum_types": kinds, "moments": moments}


def _resume(rank, world, path, layout, with_optimizer, normuon=False, drop_moments=False):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    model, opt = _build(world, layout, normuon)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    if drop_moments:
        for v in state["optim"]["state"].values():
            v.pop("normuon_second_moment", None)
    if with_optimizer:
        set_optimizer_state_dict(model, opt, state["optim"])
    _train(model, opt, range(SAVED_AT, STEPS))
    return _full(model)


def _relative(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_saved_at_4_ranks_fsdp2_continues_at_2_ranks():
    with tempfile.TemporaryDirectory(prefix="muon_dcp_") as path:
        saved = launch(_save, 4, path)
        fsdp2 = launch(_resume, 2, path, "fsdp2", True)
        tp = launch(_resume, 2, path, "tp", True)
        control = launch(_resume, 2, path, "fsdp2", False)
    assert saved[0]["momentum_types"] == ["DTensor"], saved[0]["momentum_types"]
    straight = saved[0]["params"]
    for rank, got in enumerate(fsdp2):
        for name, want in straight.items():
            assert torch.equal(got[name], want), (rank, name, (got[name] - want).abs().max())
    tp_worst = max(_relative(got[n], straight[n]) for got in tp for n in straight)
    control_worst = max(_relative(control[0][n], straight[n]) for n in straight)
    print("\nresumed under TP: largest relative difference %.2e; without the optimizer's "
          "state: %.2e" % (tp_worst, control_worst))
    assert tp_worst < 1e-6
    assert control_worst > 1e-3, "restoring the optimizer made no difference: the test cannot tell"


def test_normuon_moments_saved_at_4_ranks_continue_at_2_ranks():
    """NorMuon's moments live on each matrix's owner: state_dict() gathers
    them whole (a DTensor replicated over the mesh), DCP saves them once, and
    a job of another size and layout resumes bit for bit (FSDP2) or within
    the last bits (TP). A resume that drops only the moments differs."""
    with tempfile.TemporaryDirectory(prefix="muon_dcp_normuon_") as path:
        saved = launch(_save, 4, path, True)
        fsdp2 = launch(_resume, 2, path, "fsdp2", True, True)
        tp = launch(_resume, 2, path, "tp", True, True)
        dropped = launch(_resume, 2, path, "fsdp2", True, True, True)
    # Every rank gathered the same whole moments, and they are not zeros.
    assert saved[0]["moments"], "state_dict() carried no NorMuon moments"
    for got in saved[1:]:
        for key, want in saved[0]["moments"].items():
            assert torch.equal(got["moments"][key], want), key
    assert all(m.abs().sum() > 0 for m in saved[0]["moments"].values())
    straight = saved[0]["params"]
    for rank, got in enumerate(fsdp2):
        for name, want in straight.items():
            assert torch.equal(got[name], want), (rank, name, (got[name] - want).abs().max())
    tp_worst = max(_relative(got[n], straight[n]) for got in tp for n in straight)
    dropped_worst = max(_relative(dropped[0][n], straight[n]) for n in straight)
    print("\nNorMuon resumed under TP: largest relative difference %.2e; without the "
          "moments: %.2e" % (tp_worst, dropped_worst))
    assert tp_worst < 1e-6
    assert dropped_worst > 1e-4, "restoring the moments made no difference: the test cannot tell"


def test_torch_state_dict_calls_leave_a_muon_only_optimizer_alone():
    # torch's get_optimizer_state_dict (and torchtitan's checkpointer) run a
    # zero-gradient step at lr 0 when `optimizer.state` is empty, to make
    # state; muon.Muon's momentum lives in the library, so its `state` must
    # say it has some, or each such call decays every momentum buffer by
    # `momentum` (here a Muon-only optimizer: no AdamW param to fill `state`).
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)
    opt = muon.Muon(model.parameters(), lr=0.02)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    assert opt.state  # the library holds a momentum buffer
    first = get_optimizer_state_dict(model, opt)["state"]
    second = get_optimizer_state_dict(model, opt)["state"]
    key = next(iter(first))
    buf = first[key]["momentum_buffer"]
    assert buf.abs().max().item() > 0
    assert torch.equal(second[key]["momentum_buffer"], buf)
    assert not muon.Muon(torch.nn.Linear(8, 8, bias=False).parameters()).state  # never stepped
