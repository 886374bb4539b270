"""muon.torchtitan against torchtitan 0.3.0 itself: its llama3 "debugmodel"
(6 layers, fused QKV projections), its OptimizersContainer built from its
Config as its Trainer builds it, its flat FQN-keyed optimizer state dict
(init_optim_state's zero step included) through torch.distributed.checkpoint.

- One process: the LibMuon group steps every matrix as torch.optim.Muon steps
  it, each fused QKV as three matrices (the queries of every KV group, the
  keys, the values), the embeddings and output head with torchtitan's AdamW
  and the norms with AdamW; without the split the fused QKV moves elsewhere.
- 2 ranks under FSDP2 (torchtitan's apply_fsdp_to_decoder) end bit for bit
  where one process ends, and so do 2 ranks parallelized by torchtitan's own
  parallelize_llama (TP 2: the fused QKV split by rows over the ranks) and
  parallelize_deepseekv3 (EP 2: the experts over the ranks, its meshes views
  of a 1-D world mesh), with spmd_backend "partial_dtensor" and (TP) with its
  default "spmd_types", whose FSDP step makes the params DTensors.
  Module.parallelize alone under "spmd_types" leaves each TP shard a plain
  tensor: refused on every rank, naming the setting.
- A checkpoint saved through the container's state_dict at 2 ranks resumes at
  1 rank and continues bit for bit like the uninterrupted run; the model
  restored without the optimizer differs.
- torchtitan's GroupedExperts (deepseek_v3's stacked experts, (E, m, n)) step
  as E matrices.

Newton-Schulz runs in fp32 on both sides (torch.optim.Muon's iteration
monkeypatched to fp32, as real_torch_muon_test.py does: bf16 products sum in
another order on each side). Gradients are made up (torchtitan's flex
attention has no backward on the CPU); they are the same on every rank, as
after a data-parallel reduction."""

import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from dist_harness import launch  # noqa: E402
from real_torch_muon_test import fp32_torch_ns  # noqa: E402,F401 (a fixture)

from muon import torchtitan as muon_torchtitan  # noqa: E402

LR, ADAMW_LR, SAVED_AT, STEPS = 0.02, 3e-3, 2, 4


def _model(flavor="llama3"):
    if flavor == "llama3":
        from torchtitan.models.llama3 import llama3_configs
        config = llama3_configs["debugmodel"](attn_backend="flex")
    else:
        from torchtitan.models.deepseek_v3 import deepseekv3_configs
        config = deepseekv3_configs["debugmodel"](attn_backend="flex",
                                                  moe_comm_backend="standard")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    model.init_states()
    return model


def _grads(model, step):
    g = torch.Generator().manual_seed(1000 + step)
    return {n: torch.randn(tuple(p.shape), generator=g) * 0.01
            for n, p in sorted(model.named_parameters())}


def _set_grads(model, grads):
    from torch.distributed.tensor import DTensor, distribute_tensor
    for n, p in model.named_parameters():
        g = grads[n]
        p.grad = distribute_tensor(g, p.device_mesh, p.placements) \
            if isinstance(p, DTensor) else g.clone()


def _full(model):
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _container(model, **factory):
    config = muon_torchtitan.OptimizersContainer.Config(
        param_groups=muon_torchtitan.param_groups(lr=LR, adamw_lr=ADAMW_LR, ns_dtype="fp32"),
        implementation="for-loop",
        optimizer_factory_kwargs_by_name={muon_torchtitan.NAME: factory} if factory else {})
    return config.build(model_parts=model if isinstance(model, list) else [model])


def _train(model, opt, steps):
    for step in steps:
        _set_grads(model, _grads(model, step))
        opt.step()
        opt.zero_grad()


def _fsdp2(model, world):
    """torchtitan's own FSDP2 wrapping (every block, then the root)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32,
                          pp_enabled=False)
    return model


def _qkv_layout(model):
    """{fqn of a fused QKV weight: (rows per KV group, query rows per group, head_dim)}."""
    out = {}
    for name, module in model.named_modules():
        if type(module).__name__ == "FusedQKVLinear":
            hd, per_kv = module.head_dim, module.heads_per_kv
            out[name + ".wqkv.weight"] = ((per_kv + 2) * hd, per_kv * hd, hd)
    return out


def _reference(model, steps):
    """torch.optim.Muon over every matrix but the embeddings and head (each fused
    QKV as its queries, keys and values), torch's AdamW over the rest."""
    start = _full(model)
    qkv = _qkv_layout(model)
    muon_params, adamw_head, adamw_norms, pieces = {}, [], [], {}
    for n, w in start.items():
        if n in qkv:
            period, q, hd = qkv[n]
            groups = w.reshape(-1, period, w.shape[1])
            for part, rows in (("q", slice(0, q)), ("k", slice(q, q + hd)),
                               ("v", slice(q + hd, q + 2 * hd))):
                pieces[(n, part)] = (rows, period)
                muon_params[(n, part)] = torch.nn.Parameter(
                    groups[:, rows].reshape(-1, w.shape[1]).clone())
        elif w.ndim == 2 and ("tok_embeddings" in n or "lm_head" in n):
            adamw_head.append((n, torch.nn.Parameter(w.clone())))
        elif w.ndim == 2:
            muon_params[(n, None)] = torch.nn.Parameter(w.clone())
        else:
            adamw_norms.append((n, torch.nn.Parameter(w.clone())))
    opts = [torch.optim.Muon(list(muon_params.values()), lr=LR),
            torch.optim.AdamW([p for _, p in adamw_head], lr=ADAMW_LR, betas=(0.9, 0.95),
                              eps=1e-8, weight_decay=0.1),
            torch.optim.AdamW([p for _, p in adamw_norms], lr=ADAMW_LR, betas=(0.9, 0.95),
                              eps=1e-8, weight_decay=0.0)]
    for step in steps:
        grads = _grads(model, step)
        for (n, part), p in muon_params.items():
            g = grads[n]
            if part is not None:
                rows, period = pieces[(n, part)]
                g = g.reshape(-1, period, g.shape[1])[:, rows].reshape(-1, g.shape[1])
            p.grad = g.clone()
        for n, p in adamw_head + adamw_norms:
            p.grad = grads[n].clone()
        for o in opts:
            o.step()
    out = {n: p.detach() for n, p in adamw_head + adamw_norms}
    for n, w in start.items():
        if n in qkv:
            period, _, _ = qkv[n]
            whole = w.clone().reshape(-1, period, w.shape[1])
            for part in "qkv":
                rows, _ = pieces[(n, part)]
                whole[:, rows] = muon_params[(n, part)].detach().reshape(
                    whole.shape[0], -1, w.shape[1])
            out[n] = whole.reshape(w.shape)
        elif (n, None) in muon_params:
            out[n] = muon_params[(n, None)].detach()
    return out


def _one_process(**factory):
    model = _model()
    opt = _container(model, **factory)
    _train(model, opt, range(STEPS))
    return _full(model), opt


def test_one_process_steps_each_matrix_as_torch_optim_muon(fp32_torch_ns):
    got, opt = _one_process()
    assert [type(o).__name__ for o in opt.optimizers] == ["AdamW", "Muon"]
    libmuon = opt.optimizers[1]
    assert libmuon.distributed_config is None
    assert sum(1 for g in libmuon.param_groups if "split_sizes" in g) == 1
    want = _reference(_model(), range(STEPS))
    assert set(got) == set(want)
    qkv = [n for n in got if n.endswith("wqkv.weight")]
    assert len(qkv) == 6
    start = _full(_model())
    for n in sorted(got):
        moved = (want[n] - start[n]).abs().max().item()
        assert moved > 1e-4, n  # every param stepped
        assert (got[n] - want[n]).abs().max().item() <= 1e-6, n
    # Orthogonalized whole, the fused QKV moves elsewhere: the split is what matched.
    whole, _ = _one_process(split_qkv=False)
    assert max((whole[n] - want[n]).abs().max().item() for n in qkv) > 1e-3


def _sharded(rank, world):
    model = _fsdp2(_model(), world)
    opt = _container(model)
    assert opt.optimizers[1].distributed_config is not None
    _train(model, opt, range(STEPS))
    return _full(model)


def test_fsdp2_two_ranks_match_one_process_bit_for_bit():
    want, _ = _one_process()
    for got in launch(_sharded, 2):
        for n in want:
            assert torch.equal(got[n], want[n]), n


def _weights(model):
    # The params themselves (DTensors): torch's get_model_state_dict does not
    # follow the state-dict hooks of torchtitan's fused QKV.
    return {n: p.detach() for n, p in model.named_parameters()}


def _parallelized(world, flavor, tp=1, ep=1, backend="partial_dtensor"):
    """torchtitan's model parallelized by torchtitan's own function for it
    (parallelize_llama, parallelize_deepseekv3: its TP and EP plans, then its
    FSDP2 over the rest of the ranks), from its ParallelismConfig."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    parallel_dims.device_type = "cpu"  # (torchtitan's default without a GPU is "cuda")
    parallelism = ParallelismConfig(spmd_backend=backend, tensor_parallel_degree=tp,
                                    expert_parallel_degree=ep,
                                    data_parallel_shard_degree=world // tp)
    dims = ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    if flavor == "llama3":
        from torchtitan.models.llama3 import llama3_configs
        from torchtitan.models.llama3.parallelize import parallelize_llama as parallelize
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config
        config = llama3_configs["debugmodel"](attn_backend="flex")
        set_llama3_sharding_config(config, enable_sp=False)
    else:
        from torchtitan.models.deepseek_v3 import deepseekv3_configs
        from torchtitan.models.deepseek_v3.parallelize import (
            parallelize_deepseekv3 as parallelize)
        from torchtitan.models.deepseek_v3.sharding import set_deepseek_v3_sharding_config
        config = deepseekv3_configs["debugmodel"](attn_backend="flex",
                                                  moe_comm_backend="standard")
        set_deepseek_v3_sharding_config(config, enable_sp=False, enable_ep=ep > 1)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    model.init_states()
    parallelize(model, parallel_dims=dims, training=TrainingConfig(), parallelism=parallelism,
                compile_config=CompileConfig(), ac_config=None, dump_folder=".")
    return model


def _parallel_run(rank, world, flavor, tp, ep, backend="partial_dtensor"):
    model = _parallelized(world, flavor, tp, ep, backend)
    placements = {n: str(p.placements) for n, p in model.named_parameters()}
    opt = _container(model)
    _train(model, opt, range(STEPS))
    return _full(model), placements


def _spmd_types_shards_run(rank, world):
    """Module.parallelize alone (TP without torchtitan's FSDP step after it)
    under spmd_types: each rank's TP shard stays a plain tensor."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3 import llama3_configs
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config
    parallel_dims.device_type = "cpu"
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=world, pp=1, ep=1,
                        world_size=world, spmd_backend="spmd_types")
    dims.build_mesh()
    config = llama3_configs["debugmodel"](attn_backend="flex")
    set_llama3_sharding_config(config, enable_sp=False)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    model.init_states()
    model.parallelize(dims)
    try:
        _container(model)  # (refused as muon.Muon is built)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("backend", ["partial_dtensor", "spmd_types"])
def test_torchtitan_tensor_parallel_two_ranks_match_one_process_bit_for_bit(backend):
    want, _ = _one_process()
    for got, placements in launch(_parallel_run, 2, "llama3", 2, 1, backend):
        # the fused QKV's rows over the TP ranks (FSDP's size-1 mesh dim before)
        assert placements["layers.0.attention.qkv_linear.wqkv.weight"].endswith(
            "Shard(dim=0))")
        assert placements["layers.0.attention.wo.weight"].endswith("Shard(dim=1))")
        for n in want:
            assert torch.equal(got[n], want[n]), n


def test_torchtitan_expert_parallel_two_ranks_match_one_process_bit_for_bit():
    model = _model("deepseek_v3")
    opt = _container(model)
    _train(model, opt, range(STEPS))
    want = _full(model)
    experts = [n for n, w in want.items() if w.ndim == 3]
    assert experts
    for got, placements in launch(_parallel_run, 2, "deepseek_v3", 1, 2):
        assert all("Shard(dim=0)" in placements[n] for n in experts)  # over the EP ranks
        for n in want:
            assert torch.equal(got[n], want[n]), n


def test_torchtitan_spmd_types_shards_are_refused_naming_the_setting():
    messages = launch(_spmd_types_shards_run, 2)
    assert messages[0] is not None and messages[0] == messages[1]
    assert "spmd_backend = 'partial_dtensor'" in messages[0]
    assert "this rank's piece" in messages[0]


def _save(rank, world, path):
    import torch.distributed.checkpoint as dcp
    model = _fsdp2(_model(), world)
    opt = _container(model)
    before = _full(model)
    opt.state_dict()
    # torchtitan's init_optim_state (a zero step at lr 0) left the params alone.
    assert all(torch.equal(v, before[n]) for n, v in _full(model).items())
    _train(model, opt, range(SAVED_AT))
    state = {"model": _weights(model), "optimizer": opt.state_dict()}
    dcp.save(state, checkpoint_id=path)
    _train(model, opt, range(SAVED_AT, STEPS))
    return _full(model)


def _resume(rank, world, path, with_optimizer):
    import torch.distributed.checkpoint as dcp
    model = _fsdp2(_model(), world)
    opt = _container(model)
    state = {"model": _weights(model), "optimizer": opt.state_dict()}
    dcp.load(state, checkpoint_id=path)  # the weights in place
    if with_optimizer:
        opt.load_state_dict(state["optimizer"])
    _train(model, opt, range(SAVED_AT, STEPS))
    return _full(model)


def test_checkpoint_saved_at_two_ranks_resumes_at_one_bit_for_bit():
    with tempfile.TemporaryDirectory() as path:
        uninterrupted = launch(_save, 2, path)[0]
        resumed = launch(_resume, 1, path, True)[0]
        control = launch(_resume, 1, path, False)[0]
    for n in uninterrupted:
        assert torch.equal(resumed[n], uninterrupted[n]), n
    assert max((control[n] - uninterrupted[n]).abs().max().item()
               for n in uninterrupted) > 1e-4


def test_grouped_experts_step_as_separate_matrices(fp32_torch_ns):
    model = _model("deepseek_v3")
    experts = {n: p for n, p in model.named_parameters() if p.ndim == 3}
    assert experts  # the MoE layers' stacked experts
    start = {n: p.detach().clone() for n, p in experts.items()}
    opt = _container(model)
    groups = opt.optimizers[1].param_groups
    assert any(g.get("matrix_view") == "batched_leading" for g in groups)
    _train(model, opt, range(2))
    name, w = sorted(experts.items())[0]
    slices = [torch.nn.Parameter(start[name][k].clone()) for k in range(w.shape[0])]
    ref = torch.optim.Muon(slices, lr=LR)
    for step in range(2):
        g = _grads(model, step)[name]
        for k, s in enumerate(slices):
            s.grad = g[k].clone()
        ref.step()
    want = torch.stack([s.detach() for s in slices])
    assert (want - start[name]).abs().max().item() > 1e-4
    assert (w.detach() - want).abs().max().item() <= 1e-6
