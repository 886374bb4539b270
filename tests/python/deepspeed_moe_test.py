"""muon.Muon under DeepSpeed's MoE (deepspeed.moe.layer.MoE, 4 experts, expert
parallelism 2, so expert data parallelism 2) on 4 gloo processes, at ZeRO
stages 0, 1 and 2 (DeepSpeed has no MoE at stage 3). DeepSpeed averages each
expert's gradient over its expert-data-parallel group and partitions it
there, the dense params over all 4 ranks.

The reference is single-process muon.Muon over every matrix and vector of the
job, fed the gradients DeepSpeed handed the client optimizer at each step
(averaged, clipped: taken inside step() from every rank and put together by
name), from the weights the run started from. Every expert and dense weight
after the run equals it within 1e-6 while the weights moved by far more; each
of the 7 matrices (3 dense, 4 experts) is orthogonalized once per step in the
job; the 4 experts, initialized alike by DeepSpeed, end apart; and a
DeepSpeed checkpoint (engine.save_checkpoint, with its MoE expert files)
resumed in a fresh engine continues bit for bit. Experts of two
expert-parallel sizes are refused, naming them."""

import math

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("deepspeed")

import muon  # noqa: E402
from deepspeed_test import _batch, _ds_config, _join  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 3
RESUME_AT = 1
EXPERTS = 4
MATRICES = 3 + EXPERTS  # up, the gate, out; the experts


class MoENet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.up = torch.nn.Linear(10, 12)
        # No token dropped (capacity for every token), so each expert's gradient
        # is what its routed tokens give.
        self.moe = MoE(hidden_size=12, expert=torch.nn.Linear(12, 12), num_experts=EXPERTS,
                       ep_size=2, k=1, capacity_factor=4.0, min_capacity=0, drop_tokens=False)
        self.out = torch.nn.Linear(12, 3, bias=False)

    def forward(self, x):
        h, _, _ = self.moe(torch.tanh(self.up(x)))
        return self.out(h)


def _names(model, config):
    """{id(param): its global name} (experts by global id)."""
    experts = config._experts.names if config._experts else {}
    return {id(p): experts.get(id(p), n) for n, p in model.named_parameters()}


def _named_tensors(model, config):
    """{global name: fp32 value} of this rank's params."""
    names = _names(model, config)
    return {names[id(p)]: p.detach().float().clone() for p in model.parameters()}


def _pieces(flat, segments):
    """{global name: [(start, values)]}: the ranges `flat` (a partition, or
    its gradient) holds of each param."""
    flat = flat.detach().reshape(-1)
    return {seg.name: [(seg.start, flat[seg.offset:seg.offset + seg.length].clone())]
            for seg in segments if seg.length}


def _build(stage, bf16):
    """The model, muon.Muon wired to DeepSpeed, its config and the engine."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    torch.manual_seed(0)
    model = MoENet()
    groups = split_params_into_different_moe_groups_for_optimizer(
        [{"params": list(model.parameters()), "name": "model"}])
    config = muon.deepspeed.create_deepspeed_config()
    opt = muon.Muon(groups, lr=0.02, ns_dtype="fp32", distributed_config=config)
    ds_config = _ds_config(stage)
    if bf16:  # the client steps fp32 master partitions of the bf16 model
        ds_config["bf16"] = {"enabled": True}
    engine, _, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
    return model, opt, config, engine


def _train(engine, rank, steps, bf16, before_step=lambda: None):
    for step in steps:
        x, y = _batch(step, rank)
        out = engine(x.to(torch.bfloat16)).float() if bf16 else engine(x)
        engine.backward(torch.nn.functional.mse_loss(out, y))
        before_step()
        engine.step()


def _final(model, opt, config, stage):
    """This rank's fp32 values the client stepped, {global name: [(start,
    flat values)]}: its ranges (ZeRO-1/2) or its whole params."""
    if not stage:
        return {n: [(0, t.reshape(-1))] for n, t in _named_tensors(model, config).items()}
    final = {}
    for g, group in enumerate(opt.param_groups):
        final.update(_pieces(group["params"][0], config._segments[g]))
    return final


def _moe_worker(rank, world, stage, bf16, ckpt_dir):
    _join(rank, world)
    model, opt, config, engine = _build(stage, bf16)
    start = _named_tensors(model, config)
    names = _names(model, config)

    # The gradients DeepSpeed hands the client, by global name and range: one
    # dict per engine step (ZeRO-1/2 call step() once per param group, with
    # that group's partition alone in param_groups).
    grads = []
    real_step = opt.step

    def recording_step(*args, **kwargs):
        for group in opt.param_groups:
            for p in group["params"]:
                segments = config.flat_segments("", p) if stage else None
                grads[-1].update(_pieces(p.grad, segments) if segments is not None else
                                 {names[id(p)]: [(0, p.grad.detach().reshape(-1).clone())]})
        return real_step(*args, **kwargs)

    opt.step = recording_step
    _train(engine, rank, range(RESUME_AT), bf16, lambda: grads.append({}))
    engine.save_checkpoint(ckpt_dir, tag="mid")
    _train(engine, rank, range(RESUME_AT, STEPS), bf16, lambda: grads.append({}))
    final = _final(model, opt, config, stage)
    orthogonalized = opt.stats()["matrices_orthogonalized"]

    # A fresh engine from DeepSpeed's checkpoint (its MoE checkpoint files
    # included), the rest of the run again.
    model2, opt2, config2, engine2 = _build(stage, bf16)
    engine2.load_checkpoint(ckpt_dir, tag="mid")
    _train(engine2, rank, range(RESUME_AT, STEPS), bf16)
    resumed = _final(model2, opt2, config2, stage)
    return {"start": start, "grads": grads, "final": final, "orthogonalized": orthogonalized,
            "resumed_equal": sorted(resumed) == sorted(final) and all(
                torch.equal(resumed[n][0][1], final[n][0][1]) for n in final)}


def _assemble(pieces, shape):
    """A whole tensor of `shape` from (start, flat values) pieces covering it;
    pieces of the same range (replicas) must agree bit for bit."""
    whole = torch.full((math.prod(shape),), float("nan"))
    for start, values in pieces:
        at = whole[start:start + values.numel()]
        assert torch.isnan(at).all() or torch.equal(at, values), "replicas differ"
        at.copy_(values)
    assert not torch.isnan(whole).any(), "ranges do not cover the tensor"
    return whole.reshape(shape)


@pytest.mark.parametrize("stage,bf16", [(0, False), (1, False), (2, False), (1, True),
                                        (2, True)])
def test_moe_experts_and_dense_params_are_single_process_muon(stage, bf16, tmp_path):
    runs = launch(_moe_worker, WORLD, stage, bf16, str(tmp_path), timeout=400)
    assert all(r["resumed_equal"] for r in runs), [r["resumed_equal"] for r in runs]
    shapes = {}
    start = {}
    for r in runs:
        for n, t in r["start"].items():
            shapes[n] = tuple(t.shape)
            if n in start:  # the same param's replicas start alike
                assert torch.equal(start[n], t), n
            start[n] = t
    assert sum(".deepspeed_experts." in n and n.endswith("weight") for n in shapes) == EXPERTS

    # Single-process Muon on the gradients DeepSpeed handed over.
    params = {n: t.clone() for n, t in start.items()}
    reference = muon.Muon(list(params.values()), lr=0.02, ns_dtype="fp32")
    for step in range(STEPS):
        for n, p in params.items():
            p.grad = _assemble([q for r in runs for q in r["grads"][step].get(n, [])], shapes[n])
        reference.step()

    worst = 0.0
    for n, want in params.items():
        got = _assemble([p for r in runs for p in r["final"].get(n, [])], shapes[n])
        moved = (want - start[n]).abs().max().item()
        err = (got - want).abs().max().item()
        assert moved > 1e-3, (n, moved)
        assert err <= 1e-6, "stage %d %s: %g off (moved %g)" % (stage, n, err, moved)
        worst = max(worst, err)
    expert_weights = [params[n] for n in sorted(params)
                      if ".deepspeed_experts." in n and n.endswith("weight")]
    assert all(not torch.equal(expert_weights[0], w) for w in expert_weights[1:])
    assert sum(r["orthogonalized"] for r in runs) == MATRICES, [r["orthogonalized"] for r in runs]
    print("\nMoE at ZeRO-%d%s, %d ranks (EP 2 x EDP 2): largest difference from single-process "
          "Muon on DeepSpeed's gradients %g" % (stage, " bf16" if bf16 else "", WORLD, worst))


class TwoSizes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.a = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=4, ep_size=2,
                     min_capacity=0)
        self.b = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=4, ep_size=4,
                     min_capacity=0)


def _two_sizes_worker(rank, world, stage):
    _join(rank, world)
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    torch.manual_seed(0)
    model = TwoSizes()
    groups = split_params_into_different_moe_groups_for_optimizer(
        [{"params": list(model.parameters()), "name": "model"}])
    opt = muon.Muon(groups, lr=0.02, distributed_config=muon.deepspeed.create_deepspeed_config())
    try:
        muon.deepspeed.initialize(model=model, optimizer=opt, config={
            "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage}})
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("stage", [0, 2])
def test_experts_of_two_expert_parallel_sizes_are_refused_naming_them(stage):
    for message in launch(_two_sizes_worker, WORLD, stage, timeout=300):
        assert message is not None and "2 expert-parallel sizes (ep_size_2, ep_size_4)" in \
            message and "same ep_size" in message, message
