"""Megatron-core's mixture of experts (a transformer layer with an MoE MLP of
SequentialMLP experts, Megatron's local spec, groups from parallel_state's
initialize_model_parallel with expert parallel and an expert tensor-parallel
size) on 4 processes (gloo on CPU), stepped by muon.Muon with
muon.megatron.create_megatron_config(model=layer): after every step each
rank's pieces are, bit for bit, the pieces of single-process muon.Muon run on
the whole matrices with the same gradients. The reference is put together
here from Megatron's own layout, read independently of the adapter: a
param under mlp.experts.local_experts.<i> is expert ep_rank * local + i,
averaged over the expert data-parallel group and split over the expert
tensor-parallel group along its partition_dim; every other param averaged
over data parallel and split over TP. Each matrix is orthogonalized once per
step in the whole job.

The same under Megatron's DistributedDataParallel with the distributed
optimizer's layout (create_megatron_config(ddp=ddp)): the experts' ranges of
its expert-parallel buffers and the dense ranges, from the gradients Megatron
reduce-scatters.

Four layouts of the 4 ranks, TP 2 throughout: expert parallel 2 with the
experts split over TP as the dense params (expert TP 2, expert DP 1); expert
parallel 2 with whole experts (expert TP 1, expert DP 2); no expert parallel
with whole experts (expert TP 1, expert DP 4), where Megatron marks the
experts as ordinary (allreduce=True) params while their TP attributes refer
to the expert TP group: read as dense TP pieces they would be put together
into the wrong matrices, which the generic helper (given TP and DP only)
refuses; two pipeline stages, each its own MoE layer, with expert parallel 2
and whole experts; and the same with a dense first stage, whose ranks hold
no expert yet take part in reading the experts' layout.
"""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
import muon.megatron  # noqa: E402
from dist_harness import allgather_tensor, bits_equal, launch, max_abs_diff, ordered_mean, whole_over  # noqa: E402,E501

TP, WORLD, EXPERTS = 2, 4, 6
STEPS = 4
RESUME_AT = 2  # a checkpoint (params and opt.state_dict()) taken before this step
HP = dict(lr=0.02, weight_decay=0.1, momentum=0.95, ns_dtype="fp32")
LAYOUTS = {"ep2_etp2": (2, 2), "ep2_etp1": (2, 1), "ep1_etp1": (1, 1),  # (EP, expert TP)
           "pp2_ep2_etp1": (2, 1), "pp2_dense_then_moe": (2, 1)}
STAGES = {"pp2_ep2_etp1": 2, "pp2_dense_then_moe": 2}  # pipeline stages (1 elsewhere)
DENSE_FIRST = {"pp2_dense_then_moe"}  # stage 0 a dense layer, no experts on its ranks


def _moe_layer(key):
    """This rank's transformer layer (one per pipeline stage): an MoE layer,
    or a dense one on the first stage of a DENSE_FIRST layout."""
    ep, etp = LAYOUTS[key]
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    pp = ps.get_pipeline_model_parallel_world_size()
    config = TransformerConfig(num_layers=pp, pipeline_model_parallel_size=pp,
                               pipeline_dtype=torch.float32,
                               hidden_size=32, num_attention_heads=4,
                               tensor_model_parallel_size=TP, expert_model_parallel_size=ep,
                               expert_tensor_parallel_size=etp, num_moe_experts=EXPERTS,
                               moe_ffn_hidden_size=24, moe_router_topk=2, add_bias_linear=False,
                               gated_linear_unit=True,
                               use_cpu_initialization=True, params_dtype=torch.float32)
    torch.manual_seed(0)
    if key in DENSE_FIRST and ps.get_pipeline_model_parallel_rank() == 0:
        config.num_moe_experts = None
        spec = get_gpt_layer_local_spec()
    else:
        spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False)
    return build_module(spec, config=config,
                        layer_number=ps.get_pipeline_model_parallel_rank() + 1)


def _layout(name, param, ep):
    """(replica group, TP group, TP dim, expert id or None) of a param, from
    Megatron's naming and parallel_state (not from the adapter)."""
    from megatron.core import parallel_state as ps
    dim = int(param.partition_dim) if getattr(param, "tensor_model_parallel", False) else None
    marker = "mlp.experts.local_experts."
    if marker in name:
        local = int(name[len(marker) + name.index(marker):].split(".")[0])
        expert = ps.get_expert_model_parallel_rank() * (EXPERTS // ep) + local
        return (ps.get_expert_data_parallel_group(), ps.get_expert_tensor_parallel_group(),
                dim, expert)
    return (ps.get_data_parallel_group(with_context_parallel=True),
            ps.get_tensor_model_parallel_group(), dim, None)


def _reference(layer, named, layouts, split_qkv):
    """The whole matrices of this rank's pieces (put together over their TP
    groups) and single-process muon.Muon over them, the fused QKV split as
    Megatron-core's muon_split_qkv splits it."""
    whole = [torch.nn.Parameter(whole_over(p, d, tp))
             for (_, p), (_, tp, d, _) in zip(named, layouts)]
    cfg = layer.config
    kv = cfg.kv_channels
    groups = [{"params": [w]} for w in whole]
    for (n, _), g in zip(named, groups):
        if split_qkv and n.endswith("linear_qkv.weight"):
            g["split_sizes"] = [cfg.num_attention_heads // cfg.num_query_groups * kv, kv, kv]
    return whole, muon.Muon(groups, **HP)


def _train(rank, key, control=False):
    """`STEPS` steps of the layer's matrices by muon.Muon over the adapter (or,
    control: the generic helper given only TP and DP, which reads Megatron's
    TP attributes but knows nothing of experts) against single-process
    muon.Muon on the whole matrices."""
    from megatron.core import parallel_state as ps
    ep = LAYOUTS[key][0]
    layer = _moe_layer(key)
    named = [(n, p) for n, p in layer.named_parameters() if p.dim() == 2]
    params = [p for _, p in named]
    layouts = [_layout(n, p, ep) for n, p in named]
    if control:
        config = muon.create_processgroup_config(
            tp_pg=ps.get_tensor_model_parallel_group(),
            dp_pg=ps.get_data_parallel_group(with_context_parallel=True))
    else:
        config = muon.megatron.create_megatron_config(model=layer)
    opt = muon.Muon(params, distributed_config=config, **HP)
    whole, ref = _reference(layer, named, layouts, split_qkv=not control)
    worst, exact, where = 0.0, True, None
    saved, later = None, []  # the checkpoint at RESUME_AT, the gradients after it
    for step in range(STEPS):
        if step == RESUME_AT:
            saved = (copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params])
        gen = torch.Generator().manual_seed(1000 * step + rank)
        for p, q, (replicas, tp, d, _) in zip(params, whole, layouts):
            p.grad = ordered_mean(allgather_tensor(torch.randn(p.shape, generator=gen),
                                                   replicas))
            if d is None:  # replicated over TP as well (the router): the same gradient
                p.grad = ordered_mean(allgather_tensor(p.grad, tp))
            q.grad = whole_over(p.grad, d, tp)
        if step >= RESUME_AT:
            later.append([p.grad.clone() for p in params])
        opt.step()
        ref.step()
        for (n, p), q, (_, tp, d, _) in zip(named, whole, layouts):
            got = whole_over(p, d, tp)
            diff = max_abs_diff(got, q) if got.shape == q.shape else float("inf")
            if diff > worst:
                worst, where = diff, n
            exact = exact and bits_equal(got, q)
    experts = sorted({x for (_, _, _, x) in layouts if x is not None})
    resumed = None if control else _resume(key, saved, later, params)
    return {"exact": exact, "worst": worst, "where": where, "experts": experts,
            "stage": ps.get_pipeline_model_parallel_rank(),
            "resumed": resumed,
            "dense": sum(1 for (_, _, _, x) in layouts if x is None),
            "allreduce": sorted({getattr(p, "allreduce", True)
                                 for p, (_, _, _, x) in zip(params, layouts) if x is not None}),
            "orthogonalized": opt.stats().get("matrices_orthogonalized"),
            "names": sorted(n for n in muon.megatron.megatron_experts(layer).values()
                            if n.endswith("linear_fc1.weight"))}


def _resume(key, saved, later, params):
    """A fresh layer and optimizer from the checkpoint taken at RESUME_AT (the
    params and opt.state_dict()), stepped on the same later gradients:
    whether every param ends bit for bit as the uninterrupted run's."""
    state, values = saved
    layer = _moe_layer(key)
    fresh = [p for p in layer.parameters() if p.dim() == 2]
    with torch.no_grad():
        for p, v in zip(fresh, values):
            p.copy_(v)
    opt = muon.Muon(fresh, distributed_config=muon.megatron.create_megatron_config(model=layer),
                    **HP)
    opt.load_state_dict(state)
    for grads in later:
        for p, g in zip(fresh, grads):
            p.grad = g.clone()
        opt.step()
    return all(bits_equal(p, q) for p, q in zip(fresh, params))


def _train_distopt(rank, key):
    """The layer under Megatron's DistributedDataParallel with the distributed
    optimizer's layout (use_distributed_optimizer=True): muon.Muon over
    create_megatron_config(ddp=ddp) steps each rank's ranges of the dense
    buffers (split over DP) and of the expert-parallel buffers (split over
    expert DP) from the reduce-scattered main_grad, against single-process
    muon.Muon on the whole matrices with the gradients reduced as Megatron's
    DDP reduces them (each rank's scaled by 1 / the DP size, summed over the
    replica group: DP for dense params, expert DP for experts)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    ep = LAYOUTS[key][0]
    layer = _moe_layer(key)
    ddp = DistributedDataParallel(layer.config, DistributedDataParallelConfig(
        use_distributed_optimizer=True), layer)
    everything = list(ddp.module.named_parameters())
    named = [(n, p) for n, p in everything if p.dim() == 2]
    params = [p for _, p in named]
    layouts = [_layout(n, p, ep) for n, p in named]
    opt = muon.Muon(params, distributed_config=muon.megatron.create_megatron_config(ddp=ddp),
                    **HP)
    whole, ref = _reference(layer, named, layouts, split_qkv=True)
    scale = 1.0 / dist.get_world_size(ps.get_data_parallel_group(with_context_parallel=True))
    worst, exact, where = 0.0, True, None
    for step in range(STEPS):
        ddp.zero_grad_buffer()
        gen = torch.Generator().manual_seed(1000 * step + rank)
        for (n, p), (replicas, tp, d, _), q in zip(named, layouts, whole):
            g = torch.randn(p.shape, generator=gen)
            if d is None:  # replicated over TP as well (the router): the same gradient
                g = ordered_mean(allgather_tensor(g, tp))
            p.main_grad.copy_(g)
            q.grad = whole_over(sum(x * scale for x in allgather_tensor(g, replicas)), d, tp)
        ddp.finish_grad_sync()
        opt.step()
        ref.step()
        for (n, p), q, (_, tp, d, _) in zip(named, whole, layouts):
            got = whole_over(p, d, tp)
            diff = max_abs_diff(got, q)
            if diff > worst:
                worst, where = diff, n
            exact = exact and bits_equal(got, q)
    ranges = muon.megatron.megatron_flat_ranges(ddp)
    return {"exact": exact, "worst": worst, "where": where,
            "orthogonalized": opt.stats().get("matrices_orthogonalized"),
            "expert_buffers": len(ddp.expert_parallel_buffers),
            "split_experts": sum(1 for (n, p), x in zip(named, layouts)
                                 if x[3] is not None and 0 < ranges[p][1] < p.numel())}


def _refused_without_model():
    try:
        muon.megatron.create_megatron_config()
    except ValueError as err:
        return str(err)
    return None


def _unreached_expert_refused(key):
    """model= given a module without the experts (the attention): their
    params (allreduce=False under expert parallel) refused at the first step."""
    layer = _moe_layer(key)
    params = [p for p in layer.parameters() if p.dim() == 2]
    config = muon.megatron.create_megatron_config(model=layer.self_attention)
    opt = muon.Muon(params, distributed_config=config, **HP)
    for p in params:
        p.grad = torch.zeros_like(p)
    before = [p.detach().clone() for p in params]
    try:
        opt.step()
    except ValueError as err:
        return {"error": str(err),
                "kept": all(torch.equal(p, b) for p, b in zip(params, before))}
    return {"error": None}


def _worker(rank, world):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    torch.cuda.current_device = lambda: torch.device("cpu")  # Megatron's DDP buffers
    from megatron.core import parallel_state as ps
    out = {}
    for key, (ep, etp) in LAYOUTS.items():
        ps.initialize_model_parallel(tensor_model_parallel_size=TP,
                                     pipeline_model_parallel_size=STAGES.get(key, 1),
                                     expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=etp)
        out[key] = _train(rank, key)
        out[key]["refused"] = _refused_without_model()
        if ep > 1:
            out[key]["distopt"] = _train_distopt(rank, key)
        if key == "ep2_etp1":
            out[key]["unreached"] = _unreached_expert_refused(key)
        if key == "ep1_etp1":
            try:
                out[key]["control"] = _train(rank, key, control=True)
            except ValueError as err:
                out[key]["control"] = {"error": str(err)}
        ps.destroy_model_parallel()
    return out


def _expected_total(runs, key):
    """The matrices the job orthogonalizes per step: each stage's dense ones
    (read on its first rank; linear_qkv's three split blocks count once) and
    two per expert where the stage has experts."""
    total = 0
    for stage in range(STAGES.get(key, 1)):
        r = next(res[key] for res in runs if res[key]["stage"] == stage)
        total += r["dense"] + (2 * EXPERTS if _has_experts(key, stage) else 0)
    return total


def _has_experts(key, stage):
    return not (key in DENSE_FIRST and stage == 0)


@pytest.fixture(scope="module")
def runs():
    import megatron.core  # noqa: F401  (tools/python-requirements.txt pins it: no skip)
    return launch(_worker, WORLD)


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_experts_step_bit_for_bit_as_one_process(runs, key):
    ep, etp = LAYOUTS[key]
    for rank, res in enumerate(runs):
        r = res[key]
        assert r["exact"], "%s: rank %d differs by up to %g (%s)" % (key, rank, r["worst"],
                                                                   r["where"])
        # Resumed from opt.state_dict() in a fresh layer and optimizer: the same bits.
        assert r["resumed"], (key, rank)
        assert len(r["experts"]) == (EXPERTS // ep if _has_experts(key, r["stage"]) else 0), \
            (key, rank, r["experts"])
        # The global ids number the experts as Megatron's checkpoints do.
        assert r["names"] == ["mlp.experts.local_experts.%d.linear_fc1.weight" % x
                              for x in r["experts"]], r["names"]
    # Megatron marks experts allreduce=False only under expert parallel.
    assert runs[-1][key]["allreduce"] == [ep == 1]
    # Every global expert is held somewhere, each once per EP rank.
    held = sorted({x for res in runs for x in res[key]["experts"]})
    assert held == list(range(EXPERTS))
    # Each matrix once per step in the job: the dense ones (linear_qkv as
    # Megatron's three split blocks counts once), and two per expert.
    total = sum(res[key]["orthogonalized"] for res in runs)
    assert total == _expected_total(runs, key), (key, total)
    print("\nMegatron MoE (%s), TP %d x PP %d x EP %d, expert TP %d: %d steps, largest "
          "difference %g, %d matrices orthogonalized per step in the job"
          % (key, TP, STAGES.get(key, 1), ep, etp, STEPS,
             max(res[key]["worst"] for res in runs), total))


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_without_the_model_the_config_is_refused_naming_model(runs, key):
    # The experts' layout differs from the dense one in every case here.
    for res in runs:
        assert res[key]["refused"] is not None and "model=" in res[key]["refused"], \
            res[key]["refused"]


def test_the_generic_helper_refuses_to_read_experts_as_dense_tp_pieces(runs):
    # The generic helper given TP and DP only, reading Megatron's TP attributes,
    # on whole experts (expert TP 1) that carry them: it would put two copies
    # of an expert together as one matrix. Refused on every rank, naming the
    # adapter.
    for rank, res in enumerate(runs):
        control = res["ep1_etp1"]["control"]
        assert "error" in control, (rank, control)
        assert "every rank raises" in control["error"], control["error"]
        assert "create_megatron_config(model=model)" in control["error"], control["error"]


def test_an_expert_the_model_does_not_reach_is_refused_naming_it(runs):
    for rank, res in enumerate(runs):
        got = res["ep2_etp1"]["unreached"]
        assert got["error"] is not None, rank
        assert "every rank raises" in got["error"] and "allreduce=False" in got["error"], \
            got["error"]
        assert "pass the model holding it as model=" in got["error"], got["error"]
        assert got["kept"], rank


@pytest.mark.parametrize("key", ["ep2_etp1", "ep2_etp2", "pp2_ep2_etp1", "pp2_dense_then_moe"])
def test_the_distributed_optimizers_expert_ranges_step_bit_for_bit(runs, key):
    # Megatron's DDP with use_distributed_optimizer=True: the experts' ranges
    # (its expert-parallel buffers over expert DP) and the dense ranges, each
    # rank bit for bit as one process, each matrix once per step in the job.
    ep, etp = LAYOUTS[key]
    for rank, res in enumerate(runs):
        r = res[key]["distopt"]
        assert (r["expert_buffers"] >= 1) == _has_experts(key, res[key]["stage"]), (rank, r)
        assert r["exact"], "%s: rank %d differs by up to %g (%s)" % (key, rank, r["worst"],
                                                                   r["where"])
    # Expert DP 2 (expert TP 1, one stage) splits some experts' flat ranges over
    # two ranks.
    expert_dp = WORLD // (STAGES.get(key, 1) * ep * etp)
    assert (sum(res[key]["distopt"]["split_experts"] for res in runs) > 0) == (expert_dp > 1)
    total = sum(res[key]["distopt"]["orthogonalized"] for res in runs)
    assert total == _expected_total(runs, key), (key, total)
    print("\nMegatron MoE (%s) under its distributed optimizer, TP %d x PP %d x EP %d, expert "
          "TP %d: largest difference %g" % (key, TP, STAGES.get(key, 1), ep, etp,
                                            max(res[key]["distopt"]["worst"] for res in runs)))
