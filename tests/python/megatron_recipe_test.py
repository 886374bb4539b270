"""Megatron-core's own Muon recipe through muon.Muon: a GPTModel (local spec,
grouped-query attention, separate embedding and output layer) on 2 processes
(TP 2, gloo on CPU), its hyper-parameters from Megatron's OptimizerConfig
(muon.megatron.muon_kwargs), its param groups Megatron's own cut as
get_megatron_muon_optimizer cuts them (muon.megatron.param_groups), and its
lr and weight decay set every step by Megatron's OptimizerParamScheduler
(warmup, cosine decay; weight decay 0 on biases and norms by Megatron's
wd_mult).

The reference is Megatron-core's Muon written here in float64 from its
source (megatron.core.optimizer.muon with Emerging-Optimizers'
OrthogonalizedOptimizer): decoupled weight decay, momentum as an
exponential moving average (lerp by 1 - momentum), Nesterov as a lerp,
the quintic Newton-Schulz on the whole matrix (TP pieces put together,
muon_tp_mode "duplicated"), the fused QKV split per query group, each
block scaled by get_muon_scale_factor's "spectral" sqrt(max(rows, cols))
times muon_extra_scale_factor; the embedding, the output layer, biases and
norms with Adam (decoupled weight decay, Megatron's adam_beta1, adam_beta2,
adam_eps). After every step each rank's pieces are within 1e-5 of it
(libmuon's fp32 Newton-Schulz, torch's momentum sum: the same direction as
the average, 1 - momentum apart, which the normalization takes out). The
same on 4 processes (TP 2 x DP 2) under Megatron's DistributedDataParallel
with the distributed optimizer's layout.
"""

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import muon  # noqa: E402
import muon.megatron  # noqa: E402
from dist_harness import allgather_tensor, launch, ordered_mean, whole_over  # noqa: E402

TP = 2
STEPS = 5
QUINTIC = (3.4445, -4.7750, 2.0315)  # Megatron's "quintic" coefficient type


def _model(groups=2, tp=TP, **extra):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                            num_query_groups=groups, tensor_model_parallel_size=tp,
                            use_cpu_initialization=True, params_dtype=torch.float32, **extra)
    torch.manual_seed(0)
    return GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=64, max_sequence_length=16,
                    share_embeddings_and_output_weights=False)


def _optimizer_config(scale_mode):
    from megatron.core.optimizer import OptimizerConfig
    return OptimizerConfig(optimizer="muon", lr=2e-3, min_lr=2e-4, weight_decay=0.1,
                           adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8,
                           muon_momentum=0.9, muon_use_nesterov=True, muon_num_ns_steps=5,
                           muon_scale_mode=scale_mode, muon_extra_scale_factor=0.2,
                           muon_fp32_matmul_prec="highest", muon_tp_mode="duplicated")


def _newton_schulz(g, steps=5, eps=1e-7):
    """The quintic iteration in float64 on the whole block."""
    x = g.double()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    a, b, c = QUINTIC
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def _megatron_update(m, name, config, groups):
    """Megatron-core's orthogonalized, scaled update of momentum `m` (whole):
    a fused QKV split per query group into queries, keys and values."""
    extra = config.muon_extra_scale_factor
    if not name.endswith("linear_qkv.weight"):
        return _newton_schulz(m) * math.sqrt(max(m.shape)) * extra
    kv = 8  # hidden 32 / 4 heads
    sizes = [2 * kv, kv, kv]  # 4 heads // 2 groups queries, one key, one value per group
    blocks = torch.split(m.view(groups, sum(sizes), -1), sizes, dim=1)
    out = []
    for blk in blocks:
        flat = blk.reshape(-1, m.shape[-1])
        upd = _newton_schulz(flat) * math.sqrt(max(flat.shape)) * extra
        out.append(upd.view(groups, -1, m.shape[-1]))
    return torch.cat(out, dim=1).view(m.shape)


def _train(rank, scale_mode, adjust_override=None, ddp=False):
    """STEPS steps of the recipe against the reference. ddp: the model under
    Megatron's DistributedDataParallel with the distributed optimizer's
    layout (use_distributed_optimizer=True), the gradients reduce-scattered
    by Megatron (each rank's scaled by 1 / the DP size, summed over DP)."""
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    tp_group, dp_group = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
    model = _model()
    config = _optimizer_config(scale_mode)
    names = {id(p): n for n, p in model.named_parameters()}
    if ddp:
        from megatron.core.distributed import (DistributedDataParallel,
                                               DistributedDataParallelConfig)
        model = DistributedDataParallel(model.config, DistributedDataParallelConfig(
            use_distributed_optimizer=True), model)
        layout = muon.megatron.create_megatron_config(ddp=model, split_qkv=config.muon_split_qkv)
    else:
        layout = muon.megatron.create_megatron_config(model=model,
                                                      split_qkv=config.muon_split_qkv)
    groups = muon.megatron.param_groups(model, config)
    kwargs = muon.megatron.muon_kwargs(config)
    if adjust_override is not None:
        kwargs["adjust_lr_fn"] = adjust_override
    opt = muon.Muon(groups, distributed_config=layout, **kwargs)
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=config.lr, min_lr=config.min_lr,
                                    lr_warmup_steps=2, lr_decay_steps=STEPS,
                                    lr_decay_style="cosine", start_wd=config.weight_decay,
                                    end_wd=config.weight_decay, wd_incr_steps=STEPS,
                                    wd_incr_style="constant")
    # The reference's state, whole, in float64.
    ref = {}
    for gi, group in enumerate(opt.param_groups):
        for p in group["params"]:
            d = muon.megatron.megatron_tp_dim(p)
            ref[id(p)] = {"w": whole_over(p, d, tp_group).double(), "dim": d, "group": gi,
                          "m": None, "v": None, "t": 0}
    cut = {names[id(p)]: bool(g["adamw"]) for g in opt.param_groups for p in g["params"]}
    worst, lrs = 0.0, []
    scale = 1.0 / dist.get_world_size(dp_group)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        if ddp:
            model.zero_grad_buffer()
        grads = {}
        for p in model.parameters():
            g = torch.randn(p.shape, generator=gen)
            if muon.megatron.megatron_tp_dim(p) is None:  # replicated over TP: one gradient
                g = ordered_mean(allgather_tensor(g, tp_group))
            if ddp:
                p.main_grad.copy_(g)
                grads[id(p)] = sum(x * scale for x in allgather_tensor(g, dp_group))
            else:
                p.grad = grads[id(p)] = g
        if ddp:
            model.finish_grad_sync()
        hp = [(g["lr"], g["weight_decay"]) for g in opt.param_groups]
        lrs.append(hp[0])
        opt.step()
        sched.step(increment=1)
        for group in opt.param_groups:
            for p in group["params"]:
                r = ref[id(p)]
                lr, wd = hp[r["group"]]
                grad = whole_over(grads[id(p)], r["dim"], tp_group).double()
                w = r["w"]
                w.mul_(1.0 - lr * wd)
                if group["adamw"]:  # Adam with decoupled weight decay
                    b1, b2 = config.adam_beta1, config.adam_beta2
                    r["t"] += 1
                    r["m"] = grad * (1 - b1) if r["m"] is None else r["m"] * b1 + grad * (1 - b1)
                    r["v"] = grad * grad * (1 - b2) if r["v"] is None else \
                        r["v"] * b2 + grad * grad * (1 - b2)
                    mhat = r["m"] / (1 - b1 ** r["t"])
                    vhat = r["v"] / (1 - b2 ** r["t"])
                    w.sub_(lr * mhat / (vhat.sqrt() + config.adam_eps))
                else:  # Megatron's Muon: the EMA momentum, Nesterov as a lerp
                    beta = config.muon_momentum
                    r["m"] = torch.zeros_like(grad) if r["m"] is None else r["m"]
                    r["m"].lerp_(grad, 1 - beta)
                    u = grad.lerp(r["m"], beta) if config.muon_use_nesterov else r["m"]
                    w.sub_(lr * _megatron_update(u, names[id(p)], config, 2))
                got = whole_over(p, r["dim"], tp_group).double()
                worst = max(worst, float((got - w).abs().max()))
    return {"worst": worst, "cut": cut, "lrs": lrs,
            "kwargs": {k: v for k, v in kwargs.items() if k != "adamw_betas"}}


TAU = 10.0
LOGITS = [5.0, 20.0, 40.0, 8.0]  # each query head's max logit over the step; TAU clips two


def _qk_clip(groups, tp):
    """The attention's fused QKV after muon.megatron.QkClip and (at TP 1:
    Megatron-core 0.16's clip_qk fails under TP, reshaping a TP piece by the
    whole layer's projection size) after Megatron-core's own clip_qk, from the
    same weights and per-head max logits (set where TransformerEngine's
    attention records them, this TP rank's heads), put together over TP; and
    the weights before."""
    from megatron.core import parallel_state as ps
    tp_group = ps.get_tensor_model_parallel_group()
    ours, theirs = (_model(groups, tp, qk_clip=True, qk_clip_threshold=TAU, qk_clip_alpha=0.5)
                    for _ in range(2))
    config = _optimizer_config("spectral")
    still = [dict(g, lr=0.0, weight_decay=0.0)  # lr 0: the step leaves the weights
             for g in muon.megatron.param_groups(ours, config)]
    opt = muon.Muon(still, distributed_config=muon.megatron.create_megatron_config(model=ours),
                    **muon.megatron.muon_kwargs(config))
    clip = muon.megatron.QkClip(opt, ours)
    for p in ours.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # (QK-Clip scales a step's result)
    per_rank = len(LOGITS) // tp
    mine = LOGITS[ps.get_tensor_model_parallel_rank() * per_rank:][:per_rank]
    attn = [m.decoder.layers[0].self_attention for m in (ours, theirs)]
    before = whole_over(attn[0].linear_qkv.weight, 0, tp_group)
    for a in attn:
        a.core_attention.current_max_attn_logits = torch.tensor(mine)
    clipped = clip()
    if tp == 1:
        attn[1].clip_qk()
    return {"before": before, "clipped": clipped,
            "ours": whole_over(attn[0].linear_qkv.weight, 0, tp_group),
            "theirs": whole_over(attn[1].linear_qkv.weight, 0, tp_group) if tp == 1 else None,
            "reset": attn[0].core_attention.current_max_attn_logits is None}


def _worker(rank, world):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    out = {"spectral": _train(rank, "spectral"),
           "torch_default_scale": _train(rank, "spectral", adjust_override="original"),
           "qk_mha": _qk_clip(4, TP), "qk_gqa": _qk_clip(2, TP)}
    try:
        muon.megatron.muon_kwargs(_optimizer_config("spectrall"))
        out["bad_mode"] = None
    except ValueError as err:
        out["bad_mode"] = str(err)
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=1)  # Megatron's own clip_qk
    out.update(qk_mha_tp1=_qk_clip(4, 1), qk_gqa_tp1=_qk_clip(2, 1))
    ps.destroy_model_parallel()
    return out


def _ddp_worker(rank, world):
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    torch.cuda.current_device = lambda: torch.device("cpu")  # Megatron's DDP buffers
    from megatron.core import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    out = _train(rank, "spectral", ddp=True)
    ps.destroy_model_parallel()
    return out


@pytest.fixture(scope="module")
def runs():
    import megatron.core  # noqa: F401  (tools/python-requirements.txt pins it: no skip)
    return launch(_worker, TP)


def test_under_megatrons_distributed_optimizer_too():
    # TP 2 x DP 2, Megatron's DDP with use_distributed_optimizer=True: each rank
    # steps its ranges (Muon's and Adam's) from the reduce-scattered main_grad.
    runs = launch(_ddp_worker, 2 * TP)
    for rank, res in enumerate(runs):
        assert res["worst"] <= 1e-5, "rank %d is off Megatron-core's Muon by %g" % (
            rank, res["worst"])
    print("\nMegatron-core's recipe under its distributed optimizer, TP 2 x DP 2: largest "
          "difference from its Muon in float64 %g" % max(res["worst"] for res in runs))


def test_megatrons_recipe_steps_as_megatron_cores_muon(runs):
    for rank, res in enumerate(runs):
        r = res["spectral"]
        assert r["worst"] <= 1e-5, "rank %d is off Megatron-core's Muon by %g" % (rank,
                                                                                  r["worst"])
    print("\nMegatron-core's recipe (OptimizerConfig, its param groups and scheduler), TP 2, "
          "%d steps: largest difference from its Muon in float64 %g"
          % (STEPS, max(res["spectral"]["worst"] for res in runs)))


def test_the_config_maps_onto_muon_muons_options(runs):
    kw = runs[0]["spectral"]["kwargs"]
    assert kw["adjust_lr_fn"] == "spectral" and kw["extra_scale_factor"] == 0.2
    assert kw["momentum"] == 0.9 and kw["nesterov"] and kw["ns_steps"] == 5
    assert kw["ns_dtype"] == "fp32"  # muon_fp32_matmul_prec "highest"
    assert "spectrall" in runs[0]["bad_mode"] and "muon_scale_mode" in runs[0]["bad_mode"]


def test_the_groups_are_cut_as_megatrons_muon_cuts_them(runs):
    cut = runs[0]["spectral"]["cut"]
    # 2-D and not an embedding's or the output layer's: Muon; the rest: Adam.
    muon_params = sorted(n for n, adamw in cut.items() if not adamw)
    assert muon_params == ["decoder.layers.0.mlp.linear_fc1.weight",
                           "decoder.layers.0.mlp.linear_fc2.weight",
                           "decoder.layers.0.self_attention.linear_proj.weight",
                           "decoder.layers.0.self_attention.linear_qkv.weight",
                           "embedding.position_embeddings.weight"], muon_params
    assert cut["embedding.word_embeddings.weight"] and cut["output_layer.weight"]
    assert cut["decoder.final_layernorm.bias"]
    # Megatron's scheduler set the lr: a linear warmup from 0 over 2 steps.
    lrs = [lr for lr, _ in runs[0]["spectral"]["lrs"]]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(1e-3) and lrs[2] == pytest.approx(2e-3)


def test_torchs_default_scale_is_not_megatrons(runs):
    # The same run with muon.Muon's default adjust_lr_fn ("original", torch's):
    # the update is sqrt(max(rows, cols)) / max(1, sqrt(rows / cols)) smaller.
    worst = max(res["torch_default_scale"]["worst"] for res in runs)
    assert worst > 1e-3, worst


def _head_scales(res, groups):
    """Each query head's factor on its query rows times its key head's on the
    key rows (its logits' factor), read from the fused QKV before and after
    (rows per query group: its queries, one key, one value; kv_channels 8)."""
    heads, kv = 4, 8
    per = heads // groups
    out = {}
    for which in ("ours", "theirs"):
        if res[which] is None:
            continue
        before, after = res["before"].double(), res[which].double()
        ratio = (after / before).view(groups, per + 2, kv, -1)
        factors = []
        for h in range(heads):
            g, j = divmod(h, per)
            q, k = ratio[g, j], ratio[g, per]
            assert torch.allclose(q, q.flatten()[0], rtol=1e-5), (which, h)
            factors.append(float(q.flatten()[0] * k.flatten()[0]))
        out[which] = factors
    return out


def test_qk_clip_scales_each_heads_logits_by_kimis_gamma(runs):
    # Kimi K2: gamma_h = min(1, tau / S_h); every head's logits scale by it.
    gammas = [min(1.0, TAU / s) for s in LOGITS]
    for rank, run in enumerate(runs):
        for key, groups in (("qk_mha", 4), ("qk_gqa", 2), ("qk_mha_tp1", 4), ("qk_gqa_tp1", 2)):
            res = run[key]
            assert res["reset"] and res["clipped"] > 0, (rank, key)
            got = _head_scales(res, groups)["ours"]
            assert got == pytest.approx(gammas, rel=1e-5), (rank, key, got, gammas)


def test_qk_clip_is_megatron_cores_clip_qk_on_mha_and_exact_on_gqa(runs):
    # MHA: Megatron-core's own clip_qk gives the same weights. GQA: Megatron
    # scales a query group by its largest head's gamma (heads 0 and 1 share a
    # key: head 0, at 5 < tau, is clipped with head 1's 0.5); libmuon by each
    # head's own.
    mha = runs[0]["qk_mha_tp1"]
    assert torch.allclose(mha["ours"], mha["theirs"], rtol=1e-6, atol=0), \
        float((mha["ours"] - mha["theirs"]).abs().max())
    assert not torch.equal(mha["ours"], mha["before"])
    gqa = _head_scales(runs[0]["qk_gqa_tp1"], 2)
    assert gqa["theirs"][0] == pytest.approx(0.5, rel=1e-5)
    assert gqa["ours"][0] == pytest.approx(1.0, rel=1e-5)
