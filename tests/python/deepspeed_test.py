"""muon.Muon as DeepSpeed's client optimizer under ZeRO stages 1, 2 and 3, on 4
gloo processes (CPU): DeepSpeed's real engine and ZeRO optimizer, which hand
muon.Muon one flat fp32 partition per param group (ranges of several weights
and biases, split rows, padding; under ZeRO-3 each param's own even piece).
Checked against single-process muon.Muon on the whole batch (the 4 ranks'
batches together, so the same averaged gradient up to the order of
DeepSpeed's sums): every weight within 1e-5 after the run while the weights
moved by far more, every matrix orthogonalized once per step in the job,
ZeRO-1, 2 and 3 alike (ZeRO-3 also under zero.Init and with accumulated
micro-batches; ZeRO-2 and 3 also with the optimizer offloaded to the CPU),
with two param groups (weight decay on matrices only) and gradient
clipping; and a DeepSpeed checkpoint (engine.save_checkpoint /
load_checkpoint) resumed in a fresh engine continues bit for bit. bf16 at
ZeRO-1, 2 and 3: Newton-Schulz counted once per step, and the master weights
single-process Muon's on the averaged bf16 gradients, to the bit."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("deepspeed")

import muon  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD = 4
STEPS = 4
RESUME_AT = 2
MATRICES = 4  # up, mid, down, out


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(10, 13)
        self.mid = torch.nn.Linear(13, 13)
        self.norm = torch.nn.LayerNorm(13)
        self.down = torch.nn.Linear(13, 5)
        self.out = torch.nn.Linear(5, 3, bias=False)

    def forward(self, x):
        return self.out(self.down(self.norm(torch.tanh(self.mid(torch.tanh(self.up(x)))))))


def _batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 10, generator=g), torch.randn(4, 3, generator=g)


def _groups(model):
    # Two param groups, as training recipes have them: decayed matrices, the rest.
    # Under deepspeed.zero.Init a param is empty; its shape is in ds_shape.
    ndim = {p: len(getattr(p, "ds_shape", p.shape)) for p in model.parameters()}
    matrices = [p for p in model.parameters() if ndim[p] == 2]
    others = [p for p in model.parameters() if ndim[p] < 2]
    return [{"params": matrices}, {"params": others, "weight_decay": 0.0}]


def _ds_config(stage, offload=False):
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 5.0,
              "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 6}
    if offload:  # the optimizer's partitions on the host (any optimizer but DeepSpeed's CPU Adam)
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _muon(model):
    """muon.Muon over the model's two param groups, wired to DeepSpeed."""
    return muon.Muon(_groups(model), lr=0.02, ns_dtype="fp32",
                     distributed_config=muon.deepspeed.create_deepspeed_config())


def _engine(stage, offload=False):
    torch.manual_seed(0)
    model = Net()
    opt = _muon(model)
    engine, zero, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt,
                                                   config=_ds_config(stage, offload))
    return model, opt, engine, zero


def _train(engine, rank, steps):
    for step in steps:
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()


def _reference(clip_norm=5.0):
    """Single-process muon.Muon on every rank's batch at once, with DeepSpeed's
    clipping (the global norm of the averaged gradient)."""
    torch.manual_seed(0)
    model = Net()
    opt = muon.Muon(_groups(model), lr=0.02, ns_dtype="fp32")
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(_batch(step, r)[0]), _batch(step, r)[1])
                   for r in range(WORLD)) / WORLD
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        opt.step()
    return start, {n: p.detach().clone() for n, p in model.named_parameters()}


def _full(p):
    """DeepSpeed's fp32 copy of p, whole (gathered under ZeRO-3); p itself at
    stage 0, where the engine steps the model's params."""
    from deepspeed.utils import safe_get_full_fp32_param
    full = safe_get_full_fp32_param(p)
    return (p if full is None else full).detach().clone()


def _no_shm_build():
    # DeepSpeed compiles a shared-memory collective (for inference) with g++ the
    # first time its communication backend starts, 1-2 minutes; training never
    # uses it. The test skips the build.
    import deepspeed.comm.torch  # noqa: F401
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def _join(rank, world):
    """This process as rank `rank` of `world` for DeepSpeed on the CPU."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _no_shm_build()


def _worker(rank, world, stage, ckpt_dir, offload=False):
    _join(rank, world)
    import deepspeed  # noqa: F401
    model, opt, engine, zero = _engine(stage, offload)
    _train(engine, rank, range(RESUME_AT))
    engine.save_checkpoint(ckpt_dir, tag="mid")
    _train(engine, rank, range(RESUME_AT, STEPS))
    full = {n: _full(p) for n, p in model.named_parameters()}
    orthogonalized = opt.stats()["matrices_orthogonalized"]
    # The flat fp32 partitions DeepSpeed hands the optimizer to step.
    flat = zero.fp32_partitioned_groups_flat if stage == 3 else \
        [g["params"][0] for g in opt.param_groups]
    partitions = [tuple(t.shape) for t in flat]
    if stage == 0:  # whole params, replicated over the data-parallel ranks
        partitions = [[tuple(p.shape) for p in g["params"]] for g in opt.param_groups]

    # A fresh engine from the checkpoint, the rest of the run again.
    model2, opt2, engine2, _ = _engine(stage, offload)
    engine2.load_checkpoint(ckpt_dir, tag="mid")
    _train(engine2, rank, range(RESUME_AT, STEPS))
    resumed = {n: _full(p)
               for n, p in model2.named_parameters()}
    return {"full": full, "orthogonalized": orthogonalized, "partitions": partitions,
            "zero": type(zero).__name__,
            "resumed_equal": all(torch.equal(resumed[n], full[n]) for n in full)}


@pytest.fixture(scope="module")
def reference():
    return _reference()


@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (2, False), (3, False),
                                           (2, True), (3, True)])
def test_zero_stage_equals_single_process_muon(stage, offload, reference, tmp_path):
    runs = launch(_worker, WORLD, stage, str(tmp_path), offload, timeout=400)
    start, want = reference
    for rank, r in enumerate(runs):
        assert r["zero"] == {0: "Muon", 3: "DeepSpeedZeroOptimizer_Stage3"}.get(
            stage, "DeepSpeedZeroOptimizer"), r["zero"]
        if stage == 0:  # the model's own params, whole
            assert r["partitions"] == [[(13, 10), (13, 13), (5, 13), (3, 5)],
                                       [(13,), (13,), (13,), (13,), (5,)]], r["partitions"]
        else:  # one flat partition per param group, as DeepSpeed hands them over
            assert len(r["partitions"]) == 2 and all(len(s) == 1 for s in r["partitions"])
        for n, w in want.items():
            moved = (w - start[n]).abs().max().item()
            err = (r["full"][n] - w).abs().max().item()
            assert moved > 1e-2, (n, moved)
            assert err <= 1e-5, "stage %d rank %d %s: %g off" % (stage, rank, n, err)
        assert r["resumed_equal"], rank
    assert sum(r["orthogonalized"] for r in runs) == MATRICES
    print("\nZeRO-%d%s, %d ranks: largest difference from single-process Muon %g" % (
        stage, " with the optimizer offloaded to the CPU" if offload else "", WORLD,
        max((r["full"][n] - w).abs().max().item() for r in runs for n, w in want.items())))


def _stage3_worker(rank, world, variant):
    """ZeRO-3 as its users run it: the model built under deepspeed.zero.Init
    (muon.Muon then sees empty, partitioned params with ds_shape), or two
    micro-batches of 2 accumulated into each step (gradient_accumulation_steps
    2, the same samples as the reference's batch of 4). Per optimizer step:
    the library's step count and the matrices orthogonalized on this rank."""
    _join(rank, world)
    import deepspeed
    config = _ds_config(3)
    torch.manual_seed(0)
    if variant == "zero_init":
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = Net()
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        assert all(s == (0,) for s in shapes.values()), shapes  # partitioned at birth
    else:
        model = Net()
        config.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2)
    opt = _muon(model)
    engine, _, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt, config=config)
    per_step = []
    for step in range(STEPS):
        x, y = _batch(step, rank)
        micro = [(x, y)] if variant == "zero_init" else [(x[:2], y[:2]), (x[2:], y[2:])]
        for mx, my in micro:
            engine.backward(torch.nn.functional.mse_loss(engine(mx), my))
            engine.step()
        stats = opt.stats()
        per_step.append((stats["steps"], stats["matrices_orthogonalized"]))
    full = {n: _full(p) for n, p in model.named_parameters()}
    return {"full": full, "per_step": per_step}


@pytest.mark.parametrize("variant", ["zero_init", "accumulate"])
def test_zero3_variants_equal_single_process_muon(variant, reference):
    runs = launch(_stage3_worker, WORLD, variant, timeout=400)
    start, want = reference
    for rank, r in enumerate(runs):
        # One library step per optimizer step, micro-batches or not.
        assert [s for s, _ in r["per_step"]] == list(range(1, STEPS + 1)), r["per_step"]
        for n, w in want.items():
            assert (w - start[n]).abs().max().item() > 1e-2, n
            err = (r["full"][n] - w).abs().max().item()
            assert err <= 1e-5, "%s rank %d %s: %g off" % (variant, rank, n, err)
    for step in range(STEPS):  # each matrix orthogonalized once per step in the job
        assert sum(r["per_step"][step][1] for r in runs) == MATRICES, step


def test_an_unbound_config_says_how_to_bind():
    cfg = muon.deepspeed.create_deepspeed_config()
    with pytest.raises(RuntimeError, match=r"config.bind\(engine\) after deepspeed.initialize"):
        cfg._attach(None, [])


def test_initialize_wants_a_deepspeed_config():
    opt = muon.Muon([torch.nn.Parameter(torch.zeros(3, 3))], lr=0.02)
    with pytest.raises(TypeError, match="create_deepspeed_config"):
        muon.deepspeed.initialize(model=torch.nn.Linear(3, 3), optimizer=opt, config={})


def test_deepspeeds_use_muon_flag_is_refused():
    # DeepSpeed orthogonalizes such a gradient itself when the optimizer's class
    # name says Muon: with ours, Newton-Schulz would run twice, silently.
    w = torch.nn.Parameter(torch.zeros(4, 3))
    w.use_muon = True
    with pytest.raises(ValueError, match=r"use_muon flag set.*leave use_muon unset"):
        muon.Muon([w], lr=0.02)


def _plain_worker(rank, world, stage):
    """muon.Muon without a distributed_config handed to deepspeed.initialize
    itself (ZeRO-2 or 3): DeepSpeed gives it flat 1-D partitions in place of the
    matrices, which would be stepped as AdamW. step() refuses, naming the fix."""
    _join(rank, world)
    import deepspeed
    torch.manual_seed(0)
    model = Net()
    opt = muon.Muon(_groups(model), lr=0.02, ns_dtype="fp32")
    config = dict(_ds_config(stage), zero_allow_untested_optimizer=True)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    def master():  # DeepSpeed's fp32 weights, whole (gathered under ZeRO-3)
        return {n: _full(p)
                for n, p in model.named_parameters()}

    before = master()
    x, y = _batch(0, rank)
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    try:
        engine.step()
    except RuntimeError as e:
        after = master()
        unchanged = all(torch.equal(after[n], before[n]) for n in before)
        return {"error": str(e), "unchanged": unchanged}
    return {"error": None, "unchanged": False}


@pytest.mark.parametrize("stage", [2, 3])
def test_muon_without_its_config_under_zero_is_refused_not_adamw(stage):
    runs = launch(_plain_worker, 2, stage, timeout=300)
    for rank, r in enumerate(runs):
        assert r["error"] is not None, "rank %d stepped the flat partitions" % rank
        assert "would be stepped as AdamW" in r["error"], r["error"]
        assert "muon.deepspeed.create_deepspeed_config()" in r["error"], r["error"]
        assert r["unchanged"], rank


def _unbound_load_worker(rank, world, stage, ckpt_dir):
    """A checkpoint saved by a bound muon.Muon, loaded by a new engine from
    deepspeed.initialize whose config was not bound: the exception's message
    and how many params' state the optimizer took before it."""
    _join(rank, world)
    import deepspeed
    _, _, engine, _ = _engine(stage)
    _train(engine, rank, range(1))
    engine.save_checkpoint(ckpt_dir, tag="one")
    torch.manual_seed(0)
    model = Net()
    opt = _muon(model)
    config = dict(_ds_config(stage), zero_allow_untested_optimizer=True)
    engine2, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    try:
        engine2.load_checkpoint(ckpt_dir, tag="one")
    except RuntimeError as e:
        return {"error": str(e), "state": len(opt.state)}
    return {"error": None, "state": len(opt.state)}


@pytest.mark.parametrize("stage", [2, 3])
def test_a_checkpoint_loaded_before_bind_is_refused(stage, tmp_path):
    # Unbound, the config cannot tell ZeRO's partitions from plain params: the
    # loaded momentum would stay keyed by the partitions, unmapped (ZeRO-2: the
    # run went on with the momentum lost). Refused, naming the order.
    for rank, r in enumerate(launch(_unbound_load_worker, 2, stage, str(tmp_path),
                                    timeout=300)):
        assert r["error"] is not None, "rank %d loaded before bind" % rank
        assert "before the first step or checkpoint load" in r["error"], r["error"]
        assert r["state"] == 0, "rank %d kept part of the checkpoint" % rank


def _refusal_worker(rank, world, stage, bf16, zero_settings, extra=None, raw=False):
    """muon.deepspeed.initialize and one step under a config it should refuse
    (`bf16`: True or the precision's config key; `zero_settings`: added to
    zero_optimization; `extra`: added to the config; `raw`: deepspeed.initialize
    itself, then config.bind(engine)): the exception as "Type: message", or
    None when nothing was refused."""
    _join(rank, world)
    import deepspeed  # noqa: F401
    torch.manual_seed(0)
    model = Net()
    opt = _muon(model)
    config = _ds_config(stage)
    if bf16:
        config[bf16 if isinstance(bf16, str) else "bf16"] = {"enabled": True}
    config["zero_optimization"].update(zero_settings)
    config.update(extra or {})
    try:
        if raw:
            import deepspeed
            config["zero_allow_untested_optimizer"] = True
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
            opt.distributed_config.bind(engine)
        else:
            engine, _, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt, config=config)
        _train(engine, rank, range(1))
    except Exception as e:  # noqa: BLE001 - the test reads the message
        return "%s: %s" % (type(e).__name__, e)
    return None


@pytest.mark.parametrize("raw", [False, True])
def test_elastic_checkpoints_are_refused_before_they_drop_the_state(raw):
    # DeepSpeed's elastic checkpoints would save muon.Muon's state empty: refused
    # before the engine is built (settle_config), or at bind for an engine built
    # by deepspeed.initialize itself (raw), before any step or save, on every rank.
    elastic = {"elastic_checkpoint": True}
    for rank, error in enumerate(launch(_refusal_worker, 2, 2, False, elastic, None, raw,
                                        timeout=300)):
        assert error is not None, "rank %d accepted elastic_checkpoint" % rank
        assert error.startswith("ValueError: "), error
        assert '"elastic_checkpoint": false' in error, error


def test_zero3_sub_groups_that_split_a_param_group_are_refused():
    split = {"sub_group_size": 100}  # splits the matrices' group
    for rank, error in enumerate(launch(_refusal_worker, 2, 3, False, split, timeout=300)):
        assert error is not None, "rank %d accepted a split param group" % rank
        assert error.startswith("ValueError: "), error
        assert "sub_group_size" in error and "elements per rank" in error, error


def test_an_unknown_stage_is_refused_naming_it():
    for rank, error in enumerate(launch(_refusal_worker, 2, 4, False, {}, timeout=300)):
        assert error is not None, "rank %d accepted ZeRO stage 4" % rank
        assert "zero_optimization.stage is 4" in error, error


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_zero_stage0_in_half_precision_is_refused_before_deepspeed_steps(precision):
    # At stage 0 DeepSpeed wraps the client in FP16_UnfusedOptimizer, whose
    # constructor steps it once with zero gradients: weight decay would shrink
    # every weight before training starts.
    for rank, error in enumerate(launch(_refusal_worker, 2, 0, precision, {}, timeout=300)):
        assert error is not None, "rank %d accepted %s at stage 0" % (rank, precision)
        assert error.startswith("ValueError: ") and "zero gradients" in error, error
        assert "zero_optimization.stage 1" in error, error


def _bf16_reference(optimizer):
    """DeepSpeed's bf16 training done by hand in one process: each rank's batch
    through a bf16 copy of the model, the bf16 gradients averaged in fp32,
    clipped at 5.0, and `optimizer` ("muon": single-process muon.Muon; "adamw":
    torch's AdamW on the matrices, what a matrix stepped by AdamW would get)
    stepping the fp32 master weights (which start from the bf16 model's),
    copied back into the bf16 model."""
    torch.manual_seed(0)
    master = Net()
    model = Net().to(torch.bfloat16)
    model.load_state_dict(master.state_dict())
    # DeepSpeed's fp32 master weights start as the bf16 model's.
    master.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    params = dict(master.named_parameters())
    start = {n: p.detach().clone() for n, p in params.items()}
    if optimizer == "muon":
        opt = muon.Muon(_groups(master), lr=0.02, ns_dtype="fp32")
    else:
        opt = torch.optim.AdamW(_groups(master), lr=0.02)
    for step in range(STEPS):
        grads = {n: torch.zeros_like(p) for n, p in params.items()}
        for r in range(WORLD):
            model.zero_grad()
            x, y = _batch(step, r)
            torch.nn.functional.mse_loss(model(x.to(torch.bfloat16)).float(), y).backward()
            for n, p in model.named_parameters():
                grads[n] += p.grad.float()
        for n, p in params.items():
            # The engine averages the bf16 gradients into the bf16 .grad.
            p.grad = (grads[n] / WORLD).to(torch.bfloat16).float()
        torch.nn.utils.clip_grad_norm_(master.parameters(), 5.0)
        opt.step()
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(params[n])
    return start, {n: p.detach().clone() for n, p in params.items()}


def _bf16_worker(rank, world, stage):
    """bf16 training at a ZeRO stage: per optimizer step the library's step
    count and the matrices orthogonalized on this rank; then DeepSpeed's fp32
    master weights, whole."""
    _join(rank, world)
    import deepspeed  # noqa: F401
    torch.manual_seed(0)
    model = Net()
    opt = _muon(model)
    config = dict(_ds_config(stage), bf16={"enabled": True}, communication_data_type="fp32")
    engine, _, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt, config=config)
    per_step = []
    for step in range(STEPS):
        x, y = _batch(step, rank)
        out = engine(x.to(torch.bfloat16)).float()
        engine.backward(torch.nn.functional.mse_loss(out, y))
        engine.step()
        stats = opt.stats()
        per_step.append((stats["steps"], stats["matrices_orthogonalized"]))
    return {"full": {n: _full(p).float() for n, p in model.named_parameters()},
            "per_step": per_step}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_at_each_zero_stage_is_muon_once_per_step(stage):
    """bf16 at ZeRO-1 (DeepSpeed's BF16_Optimizer), 2 and 3: Newton-Schulz runs
    once per matrix per optimizer step in the job (counted), and the master
    weights are single-process Muon's on the averaged bf16 gradients (the
    average rounded to bf16, as the engine keeps it) after 4 steps, to the
    bit in the runs so far (the bound leaves fp32 rounding). The gradients
    are averaged in fp32 (communication_data_type), so that the reference
    can sum them as the engine does; with bf16 sums in gloo's order no
    one-process reference can. AdamW's weights lie far outside the bound,
    so a matrix stepped by anything but Muon would fail it."""
    runs = launch(_bf16_worker, WORLD, stage, timeout=400)
    start, want = _bf16_reference("muon")
    _, adamw = _bf16_reference("adamw")
    worst = worst_adamw = 0.0
    for rank, r in enumerate(runs):
        assert [s for s, _ in r["per_step"]] == list(range(1, STEPS + 1)), r["per_step"]
        for n, w in want.items():
            moved = (w - start[n]).abs().max().item()
            assert moved > 1e-2, (n, moved)
            worst = max(worst, (r["full"][n] - w).abs().max().item() / moved)
            worst_adamw = max(worst_adamw, (r["full"][n] - adamw[n]).abs().max().item() / moved)
    for step in range(STEPS):
        assert sum(r["per_step"][step][1] for r in runs) == MATRICES, step
    print("\nbf16 ZeRO-%d: largest difference from single-process Muon %.2e of the weight "
          "change; from AdamW %.2e" % (stage, worst, worst_adamw))
    assert worst <= 1e-6, worst
    assert worst_adamw > 0.2, "Muon and AdamW agree here: the test cannot tell them apart"


def _universal_save_worker(rank, world, ckpt_dir):
    """ZeRO-2 at 4 ranks: a checkpoint after RESUME_AT steps."""
    _join(rank, world)
    import deepspeed  # noqa: F401
    _, _, engine, _ = _engine(2)
    _train(engine, rank, range(RESUME_AT))
    engine.save_checkpoint(ckpt_dir, tag="mid")
    return True


def test_universal_checkpoints_are_refused_before_they_drop_the_state(tmp_path):
    """DeepSpeed's universal checkpoints cannot carry muon.Muon's state: its
    converter (ds_to_universal) keeps Adam's exp_avg and exp_avg_sq only, and
    stops with a KeyError on a param group without them (here the matrices'
    group, whose state is momentum). So checkpoint.load_universal is refused
    before the engine is built (settle_config; bind refuses it too for engines
    built elsewhere), on every rank (ZeRO-1 and ZeRO-3 here: the check precedes the
    stage's own binding), naming the way to resume."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal
    saved = str(tmp_path / "saved")
    launch(_universal_save_worker, WORLD, saved, timeout=400)
    with pytest.raises(KeyError, match="exp_avg"):
        ds_to_universal.main(argparse.Namespace(
            input_folder=os.path.join(saved, "mid"),
            output_folder=str(tmp_path / "universal" / "mid"), num_extract_workers=1,
            num_merge_workers=1, keep_temp_folder=False, strict=True,
            inject_missing_state=True))
    universal = {"checkpoint": {"load_universal": True}}
    for stage, raw in ((1, False), (3, False), (1, True)):
        for rank, error in enumerate(launch(_refusal_worker, 2, stage, False, {}, universal,
                                            raw, timeout=300)):
            assert error is not None, "stage %d rank %d accepted load_universal" % (stage, rank)
            assert error.startswith("ValueError: "), error
            assert "universal checkpoints" in error and "opt.state_dict()" in error, error
