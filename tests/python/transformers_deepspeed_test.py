"""muon.transformers.Muon under Hugging Face's Trainer with DeepSpeed
(TrainingArguments(deepspeed=ds_config)): transformers 5.24's Trainer,
Accelerate 1.15's DeepSpeed prepare and DeepSpeed 0.19's engine and ZeRO
optimizers, 2 gloo processes on the CPU.

- ZeRO stages 0 to 3 (ZeRO-3 also with the model built under zero.Init, as
  the Trainer's from_pretrained builds it: every param empty, its shape in
  ds_shape), and ZeRO-2 with the optimizer offloaded: the engine's
  client optimizer is muon.Muon (under offload Accelerate would have swapped
  in DeepSpeed's CPU Adam, had the factory not settled the config), each
  matrix is orthogonalized once in the job, both ranks end bit for bit
  alike, and the fp32 weights end within 1e-6 of the same Trainer with
  muon.transformers.Muon in one process.
- With NorMuon at ZeRO-2 and ZeRO-3: within 1e-6 of one process as well,
  and the Trainer's checkpoints (engine.save_checkpoint) resumed by a new
  Trainer bit for bit as the uninterrupted run. The Trainer loads the
  checkpoint before any callback runs, so the factory's config binds itself
  at that load (before that fix, ZeRO-2's momentum stayed unmapped and the
  run went elsewhere, and ZeRO-3's load emptied the partitions it was
  loading); NorMuon's moments are whole-matrix state, kept in a flat
  buffer's state by segment name (before, saving failed on a size
  mismatch).
- Refusals: the factory called outside a Trainer under DeepSpeed, config_for
  under DeepSpeed, and the settings that would drop muon.Muon or its state.

What the CPU cannot show: Accelerate starts no process group of its own on
the CPU under DeepSpeed (its state reads one process), so it does not split
the data; each rank trains on the same batches, which DeepSpeed averages over
its 2 data-parallel ranks: one process on those batches is the reference.
transformers refuses bf16 without a GPU: DeepSpeed's bf16 optimizers around
muon.Muon are deepspeed_test.py's. A ds_config with an "optimizer" section
makes the Trainer use DeepSpeed's optimizer and never call the factory,
which therefore cannot refuse it (docs/distributed.md says so)."""

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("deepspeed")

from deepspeed_test import _full, _join  # noqa: E402
from dist_harness import bits_equal, launch  # noqa: E402
from transformers_test import KWARGS, _assert_close, _model, _params, _train  # noqa: E402

import muon  # noqa: E402
from muon import transformers as muon_hf  # noqa: E402

MATRICES = 14  # the Llama's 16 matrices less the embeddings and the head


def _ds_config(stage, offload):
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "zero_optimization": {"stage": stage}}
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return config


def _zero_init_model(out, stage):
    """_model() built as transformers builds a model under ZeRO-3 (zero.Init:
    each param partitioned as it is made), then given _model()'s weights."""
    import deepspeed
    args = transformers.TrainingArguments(output_dir=out, use_cpu=False, report_to=[],
                                          deepspeed=_ds_config(stage, False))
    start = dict(_model().named_parameters())
    model = transformers.LlamaForCausalLM._from_config(_model().config)
    del args
    for n, p in model.named_parameters():
        assert p.numel() == 0 and len(p.ds_shape) >= 1, n  # (partitioned)
        with deepspeed.zero.GatheredParameters(p, modifier_rank=0):
            p.data.copy_(start[n].data)
    return model


def _worker(rank, world, out, stage, offload, resume, zero_init=False, normuon=False):
    _join(rank, world)
    refusals = {}
    if stage == 1 and resume is None:
        # Under Accelerate's DeepSpeed state, outside a Trainer: refused.
        from accelerate import Accelerator
        Accelerator(deepspeed_plugin=_plugin(stage, offload))
        for name, call in (("factory", lambda: muon_hf.Muon()(_model(), **KWARGS)),
                           ("config_for", lambda: muon_hf.config_for(()))):
            try:
                call()
            except ValueError as err:
                refusals[name] = str(err)
        from accelerate.state import AcceleratorState
        AcceleratorState._reset_state(True)
    model = _zero_init_model(out, stage) if zero_init else _model()
    trainer = _train(model, muon_hf.Muon, out, kwargs=dict(KWARGS, normuon=normuon),
                     resume=resume, per_device_train_batch_size=2,
                     use_cpu=False, deepspeed=_ds_config(stage, offload),
                     save_strategy="steps", save_steps=2)
    engine = trainer.model_wrapped
    client = engine.optimizer if stage == 0 else engine.optimizer.optimizer
    return {"params": {n: _full(p) for n, p in engine.module.named_parameters()},
            "engine": type(engine).__name__, "client": type(client).__module__ + "." +
            type(client).__name__,
            "orthogonalized": getattr(client, "stats", dict)().get("matrices_orthogonalized"),
            "refusals": refusals}


def _plugin(stage, offload):
    from accelerate.utils import DeepSpeedPlugin
    config = _ds_config(stage, offload)
    config["train_micro_batch_size_per_gpu"] = 2
    config["gradient_accumulation_steps"] = 1
    config["gradient_clipping"] = 1.0
    return DeepSpeedPlugin(hf_ds_config=config)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The same Trainer in one process on the batches each rank trains on,
    {normuon: (start, end)}."""
    out = {}
    for normuon in (False, True):
        path = str(tmp_path_factory.mktemp("one"))
        out[normuon] = (_params(_model()), _params(_train(
            _model(), muon_hf.Muon, path, kwargs=dict(KWARGS, normuon=normuon),
            per_device_train_batch_size=2).model))
    return out


@pytest.mark.parametrize("stage,offload,zero_init,normuon", [
    (0, False, False, False), (1, False, False, False), (2, False, False, False),
    (3, False, False, False), (3, False, True, False), (2, True, False, False),
    (2, False, False, True), (3, False, False, True)])
def test_trainer_deepspeed_stage_as_one_process(stage, offload, zero_init, normuon, one_process,
                                                tmp_path):
    out = str(tmp_path / "run")
    runs = launch(_worker, 2, out, stage, offload, None, zero_init, normuon, timeout=300)
    for r in runs:
        assert r["engine"] == "DeepSpeedEngine"
        assert r["client"] == "muon._torch.Muon", r["client"]  # not DeepSpeed's CPU Adam
    assert sum(r["orthogonalized"] for r in runs) == MATRICES  # once in the job
    assert all(bits_equal(runs[1]["params"][n], v) for n, v in runs[0]["params"].items())
    start, want = one_process[normuon]
    _assert_close(runs[0]["params"], want, start, tol=1e-6)
    if stage == 1:
        refusals = runs[0]["refusals"]
        assert "called by a Trainer's create_optimizer" in refusals.get("factory", ""), refusals
        assert "muon.deepspeed.initialize" in refusals.get("config_for", ""), refusals
    if normuon:
        # The Trainer's checkpoint at step 2 (momentum and NorMuon's moments in
        # ZeRO's files), resumed by a new Trainer.
        checkpoint = os.path.join(out, "checkpoint-2")
        assert os.path.isdir(os.path.join(checkpoint, "global_step2"))
        resumed = launch(_worker, 2, out, stage, offload, checkpoint, zero_init, normuon,
                         timeout=300)
        for r, whole in zip(resumed, runs):
            assert all(bits_equal(r["params"][n], v) for n, v in whole["params"].items()), [
                n for n, v in whole["params"].items() if not bits_equal(r["params"][n], v)]


def test_settle_config_keeps_muon_and_its_state():
    settle = muon.deepspeed.settle_config
    config = settle({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    assert config["zero_force_ds_cpu_optimizer"] is False  # Accelerate keeps muon.Muon
    assert config["zero_allow_untested_optimizer"] is True
    assert settle({"zero_optimization": {"stage": 3}})["zero_optimization"][
        "sub_group_size"] == 10 ** 15
    refused = [
        ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
          "zero_force_ds_cpu_optimizer": True}, "CPU Adam"),
        ({"zero_optimization": {"stage": 2, "elastic_checkpoint": True}},
         '"elastic_checkpoint": false'),
        ({"zero_optimization": {"stage": 1}, "checkpoint": {"load_universal": True}},
         "universal checkpoints"),
        ({"zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}, "zero gradients"),
        ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage is 5")]
    for config, words in refused:
        with pytest.raises(ValueError, match=words):
            settle(config)
