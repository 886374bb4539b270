"""muon.torchtitan under torchtitan's own pipeline parallel (0.3.0's
pipeline_llm: the llama3 debugmodel split into stages, each stage then
parallelized by parallelize_llama), against one process of the whole model:

- 1F1B, PP 2 x TP 2 (4 ranks): each stage's params on a (fsdp, tp) mesh that
  is a view of torchtitan's 1-D world mesh (refused at the first step before:
  its other dims could not be told);
- Interleaved1F1B, PP 2 x FSDP 2 (4 ranks, two stages per rank): the middle
  stages hold neither the embeddings nor the head, so a pattern of the recipe
  matches nothing there (torchtitan's own ParamGroupConfig refuses that);
- GPipe, PP 2 with stages [embeddings] and [every layer, norm, head] (2
  ranks): the first rank holds no LibMuon param at all and still takes part
  in every step (one muon.Muon per rank, the same param groups on each).

Each rank ends with its stages' params bit for bit where one process ends.
A checkpoint saved through the container's state_dict under PP 2 x FSDP 2
resumes in one process bit for bit; without the optimizer state it does not.
Gradients are made up (the same on every rank, as after the data-parallel
reduction); the schedule itself is not run (flex attention has no backward
on the CPU).

Without torchtitan: torch's init_device_mesh with dims ("pp", "dp"), FSDP2
over mesh["dp"], each pp coordinate a stage with its own params: under
create_dtensor_config's default pipeline_dims ("pp",) each stage steps bit
for bit as one process; with pipeline_dims=() the pp dim is taken for copies
and the first step refuses the stages' different params on every rank.
Stages with different numbers of param groups are refused on every rank
(each group's step is collective: they would wait for each other)."""

import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from dist_harness import launch  # noqa: E402
from torchtitan_test import (SAVED_AT, STEPS, _container, _full, _grads,  # noqa: E402
                             _one_process, _resume, _weights)

from muon import Muon  # noqa: E402
from muon import torchtitan as muon_torchtitan  # noqa: E402

EMBEDDINGS_ALONE = [["tok_embeddings"], ["layers.%d" % i for i in range(6)] + ["norm", "lm_head"]]


def _stages(world, pp, schedule, tp=1, split=None):
    """torchtitan's pipeline_llm over its llama3 debugmodel: this rank's model
    parts, and the whole model they were cut from (for the gradients)."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models.llama3 import llama3_configs
    from torchtitan.models.llama3.parallelize import parallelize_llama
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config
    parallel_dims.device_type = "cpu"  # (torchtitan's default without a GPU is "cuda")
    parallelism = ParallelismConfig(spmd_backend="partial_dtensor", pipeline_parallel_degree=pp,
                                    pipeline_parallel_schedule=schedule,
                                    tensor_parallel_degree=tp,
                                    data_parallel_shard_degree=world // (pp * tp),
                                    module_fqns_per_model_part=split)
    dims = ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    config = llama3_configs["debugmodel"](attn_backend="flex")
    set_llama3_sharding_config(config, enable_sp=False)
    torch.manual_seed(0)
    with torch.device("meta"):
        whole = config.build()
    whole.to_empty(device="cpu")
    whole.init_states()
    _, parts, _, _ = pipeline_llm(whole, parallel_dims=dims, training=TrainingConfig(),
                                  parallelism=parallelism, compile_config=CompileConfig(),
                                  ac_config=None, dump_folder=".", device=torch.device("cpu"),
                                  model_config=config, parallelize_fn=parallelize_llama,
                                  loss_fn=cross_entropy_loss)
    return parts, whole


def _train(parts, whole, opt, steps):
    from torch.distributed.tensor import DTensor, distribute_tensor
    for step in steps:
        grads = _grads(whole, step)
        for part in parts:
            for n, p in part.named_parameters():
                p.grad = distribute_tensor(grads[n], p.device_mesh, p.placements) \
                    if isinstance(p, DTensor) else grads[n].clone()
        opt.step()
        opt.zero_grad()


def _pipelined(rank, world, pp, schedule, tp, split):
    parts, whole = _stages(world, pp, schedule, tp, split)
    opt = _container(parts)
    libmuon = [o for o in opt.optimizers if isinstance(o, Muon)]
    held = sum(len(g["params"]) for o in libmuon for g in o.param_groups)
    _train(parts, whole, opt, range(STEPS))
    out = {}
    for part in parts:
        out.update(_full(part))
    return out, len(parts), len(libmuon), held


CASES = {
    "1F1B_pp2_tp2": (4, 2, "1F1B", 2, None),
    "interleaved_pp2_fsdp2": (4, 2, "Interleaved1F1B", 1, None),
    "gpipe_embeddings_alone": (2, 2, "GPipe", 1, EMBEDDINGS_ALONE),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pipeline_stages_match_one_process_bit_for_bit(case):
    world, pp, schedule, tp, split = CASES[case]
    want, _ = _one_process()
    results = launch(_pipelined, world, pp, schedule, tp, split, timeout=600)
    seen = set()
    for rank, (got, parts, libmuon, held) in enumerate(results):
        assert parts == (2 if schedule == "Interleaved1F1B" else 1), rank
        assert libmuon == 1, rank  # one muon.Muon per rank, over all its stages
        if case == "gpipe_embeddings_alone":
            assert (held == 0) == (rank == 0), (rank, held)
        assert got, rank
        for n, w in got.items():
            assert torch.equal(w, want[n]), (rank, n)
        seen |= set(got)
    assert seen == set(want)  # every param of the model is on some stage


def _save_pipelined(rank, world, path):
    import torch.distributed.checkpoint as dcp
    parts, whole = _stages(world, 2, "1F1B")
    opt = _container(parts)
    _train(parts, whole, opt, range(SAVED_AT))
    weights = {}
    for part in parts:
        weights.update(_weights(part))
    dcp.save({"model": weights, "optimizer": opt.state_dict()}, checkpoint_id=path)
    return sorted(weights)


def test_checkpoint_saved_under_pipeline_resumes_in_one_process_bit_for_bit():
    want, _ = _one_process()  # (the uninterrupted run: STEPS steps in one process)
    with tempfile.TemporaryDirectory() as path:
        saved = launch(_save_pipelined, 4, path, timeout=600)
        resumed = launch(_resume, 1, path, True)[0]
        control = launch(_resume, 1, path, False)[0]
    assert set(saved[0]) != set(saved[2])  # the two stages saved different params
    for n in want:
        assert torch.equal(resumed[n], want[n]), n
    assert max((control[n] - want[n]).abs().max().item() for n in want) > 1e-4


def _stage_model(stage):
    torch.manual_seed(10 + stage)  # each stage its own layers
    return torch.nn.Sequential(torch.nn.Linear(16, 24, bias=False),
                               torch.nn.Linear(24, 12, bias=False))


def _stage_grads(model, stage):
    g = torch.Generator().manual_seed(50 + stage)
    return [torch.randn(tuple(p.shape), generator=g) for p in model.parameters()]


def _named_pp_mesh(rank, world, pipeline_dims, groups="one"):
    """torch's own init_device_mesh with dims ("pp", "dp") and FSDP2 over
    mesh["dp"]: each pp coordinate a stage with its own params."""
    import muon
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("pp", "dp"))
    stage = mesh.get_local_rank("pp")
    model = _stage_model(stage)
    fully_shard(model, mesh=mesh["dp"])
    names = {p: "stage%d.%s" % (stage, n) for n, p in model.named_parameters()}
    config = muon.create_dtensor_config(names=names, pipeline_dims=pipeline_dims)
    params = list(model.parameters())
    if groups == "one":
        param_groups = [{"params": params}]
    elif stage == 0:  # two groups on stage 0; stage 1 one ("uneven") or one and an empty one
        param_groups = [{"params": params[:1]}, {"params": params[1:]}]
    else:
        param_groups = [{"params": params}] + ([{"params": []}] if groups == "padded" else [])
    opt = muon.Muon(param_groups, lr=0.02, distributed_config=config)
    for p, g in zip(model.parameters(), _stage_grads(model, stage)):
        p.grad = distribute_tensor(g, p.device_mesh, p.placements)
    try:
        opt.step()
    except Exception as e:  # noqa: BLE001 (the refusal is the result)
        return stage, str(e)
    return stage, [p.full_tensor() for p in model.parameters()]


def test_a_pp_dim_of_a_named_mesh_holds_other_stages_not_copies():
    import muon
    want = {}
    for stage in (0, 1):
        model = _stage_model(stage)
        opt = muon.Muon(model.parameters(), lr=0.02)
        for p, g in zip(model.parameters(), _stage_grads(model, stage)):
            p.grad = g
        opt.step()
        want[stage] = [p.detach() for p in model.parameters()]
    for stage, got in launch(_named_pp_mesh, 4, ("pp",)):
        assert all(torch.equal(a, b) for a, b in zip(got, want[stage])), stage
    # Taken for copies (no pipeline dim), the stages' different params are refused.
    for stage, got in launch(_named_pp_mesh, 4, ()):
        assert isinstance(got, str) and "first step's setup failed" in got, (stage, got)


def test_stages_with_different_param_groups_are_refused_not_left_waiting():
    """Each param group steps collectively: stage 0 with two groups and stage 1
    with one would leave stage 0's second step waiting for a partner. Refused
    on every rank, naming the counts; with the missing group given empty, the
    stages step bit for bit as one process."""
    results = launch(_named_pp_mesh, 4, ("pp",), "uneven")
    for stage, got in results:
        assert isinstance(got, str) and "different numbers of param groups (2, 2, 1, 1" in got, \
            (stage, got)
    want = {}
    for stage, got in launch(_named_pp_mesh, 4, ("pp",), "one"):
        want.setdefault(stage, got)
    for stage, got in launch(_named_pp_mesh, 4, ("pp",), "padded"):
        assert all(torch.equal(a, b) for a, b in zip(got, want[stage])), stage
