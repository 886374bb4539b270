"""muon.Muon as the client optimizer of DeepSpeed's pipeline engine
(deepspeed.pipe.PipelineModule, 2 stages x 2 data-parallel ranks, ZeRO-1,
two micro-batches per step, on 4 gloo processes): DeepSpeed's own schedule
runs the forward and backward passes, reduces the gradients over each
stage's data-parallel group and hands muon.Muon each stage's flat fp32
partitions; muon.deepspeed steps them over that group (the stage's world).

Checked against single-process muon.Muon on the whole model and every
micro-batch of every data-parallel rank at once: every weight within 1e-5
(DeepSpeed sums in another order) while the weights moved by far more, each
stage's matrices orthogonalized once per step by the stage's ranks together;
and a DeepSpeed checkpoint (engine.save_checkpoint / load_checkpoint, its
per-layer files and per-rank optimizer states) resumed in a fresh engine
continues bit for bit."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

import muon  # noqa: E402
from deepspeed_test import _full, _join  # noqa: E402
from dist_harness import launch  # noqa: E402

WORLD, STAGES, DP = 4, 2, 2
STEPS, RESUME_AT, MICRO = 3, 2, 2
STAGE_MATRICES = {0: 2, 1: 2}  # 0.weight, 2.weight | 4.weight, 5.weight


def _layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(10, 13), torch.nn.Tanh(), torch.nn.Linear(13, 13), torch.nn.Tanh(),
            torch.nn.Linear(13, 5), torch.nn.Linear(5, 3, bias=False)]


def _micro(step, dp, m):
    g = torch.Generator().manual_seed(1000 * step + 10 * dp + m)
    return torch.randn(4, 10, generator=g), torch.randn(4, 3, generator=g)


def _mse(out, y):
    return torch.nn.functional.mse_loss(out, y)


def _engine():
    import deepspeed
    from deepspeed.pipe import PipelineModule
    deepspeed.init_distributed(dist_backend="gloo")
    module = PipelineModule(layers=_layers(), num_stages=STAGES, loss_fn=_mse,
                            partition_method="uniform")
    opt = muon.Muon(list(module.parameters()), lr=0.02, ns_dtype="fp32",
                    distributed_config=muon.deepspeed.create_deepspeed_config())
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": MICRO,
              "zero_optimization": {"stage": 1}, "steps_per_print": 10 ** 6}
    engine, zero, _, _ = muon.deepspeed.initialize(model=module, optimizer=opt, config=config)
    return module, opt, engine, zero


def _train(engine, steps):
    dp = engine.grid.get_data_parallel_rank()
    for step in steps:
        engine.train_batch(iter([_micro(step, dp, m) for m in range(MICRO)]))


def _worker(rank, world, ckpt_dir):
    _join(rank, world)
    module, opt, engine, zero = _engine()
    _train(engine, range(RESUME_AT))
    engine.save_checkpoint(ckpt_dir, tag="mid")
    _train(engine, range(RESUME_AT, STEPS))
    full = {n: _full(p) for n, p in module.named_parameters()}
    orthogonalized = opt.stats()["matrices_orthogonalized"]
    module2, _, engine2, _ = _engine()
    engine2.load_checkpoint(ckpt_dir, tag="mid")
    _train(engine2, range(RESUME_AT, STEPS))
    resumed = {n: _full(p) for n, p in module2.named_parameters()}
    return {"stage": engine.stage_id, "zero": type(zero).__name__, "full": full,
            "orthogonalized": orthogonalized,
            "resumed_equal": all(torch.equal(resumed[n], full[n]) for n in full)}


def _reference():
    model = torch.nn.Sequential(*_layers())
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = muon.Muon(list(model.parameters()), lr=0.02, ns_dtype="fp32")
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(_mse(model(x), y) for d in range(DP) for m in range(MICRO)
                   for x, y in [_micro(step, d, m)]) / (DP * MICRO)
        loss.backward()
        opt.step()
    return start, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_pipeline_stages_equal_single_process_muon_and_resume_bit_for_bit(tmp_path):
    start, want = _reference()
    runs = launch(_worker, WORLD, str(tmp_path), timeout=600)
    seen = set()
    for rank, r in enumerate(runs):
        assert r["zero"] == "DeepSpeedZeroOptimizer", rank
        assert r["resumed_equal"], rank
        assert r["full"], rank
        for n, w in r["full"].items():
            assert (w - want[n]).abs().max().item() <= 1e-5, (rank, n)
            if w.ndim == 2:
                assert (want[n] - start[n]).abs().max().item() > 1e-3, n
        seen |= set(r["full"])
    assert seen == set(want)  # every layer is on one stage
    for stage, matrices in STAGE_MATRICES.items():
        # each matrix of the stage once per step, by one of the stage's ranks
        assert sum(r["orthogonalized"] for r in runs if r["stage"] == stage) == matrices
