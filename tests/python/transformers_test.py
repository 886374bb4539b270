"""muon.transformers against Hugging Face's own parts: transformers 5.24's
Trainer (its optimizer factories, LR scheduler, gradient clipping and
checkpoints) and Accelerate 1.15's prepare (DDP, and FSDP2 swapping the
optimizer's params for DTensors after the optimizer is built).

- One process: the Trainer with muon.transformers.Muon trains a Llama and a
  GPT-2 (tied embeddings, position embeddings, Conv1D matrices, biases) as
  the same Trainer with a reference written here: torch.optim.Muon over every
  matrix but the embeddings and the head, torch.optim.AdamW over the rest,
  weight decay on matrices only. The Trainer's default grouping (every
  matrix to Muon, embeddings too) lands elsewhere.
- A Trainer checkpoint (optimizer.pt, scheduler.pt) resumed by a new
  Trainer ends bit for bit where the uninterrupted run ends.
- 2 ranks under the Trainer's DDP (Accelerate's MULTI_CPU, gloo) end as one
  process on the same global batch, each matrix orthogonalized once in the
  job; its checkpoint, which the Trainer saves from rank 0 alone, resumes
  bit for bit with NorMuon's owner-held moments in it; under Accelerate's
  FSDP2 prepare, bit for bit as one process.
- Refusals: FSDP2's DTensors in a muon.Muon built without a
  distributed_config, on every rank, naming create_dtensor_config.

Newton-Schulz runs in fp32 on both sides (real_torch_muon_test's fixture).
Accelerate enables FSDP only on accelerator devices; its FSDP2 prepare
(fully_shard, the param swap) is device-agnostic, so the FSDP2 test sets the
distributed type to FSDP on the CPU state it built (what it cannot see:
Accelerate's device placement on a GPU)."""

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from dist_harness import bits_equal, launch  # noqa: E402
from real_torch_muon_test import fp32_torch_ns  # noqa: E402,F401 (a fixture)

import muon  # noqa: E402
from muon import transformers as muon_hf  # noqa: E402

LR, ADAMW_LR, WD, STEPS, SEQ = 0.02, 3e-3, 0.1, 4, 12
KWARGS = dict(lr=LR, adamw_lr=ADAMW_LR, weight_decay=WD, ns_dtype="fp32")


def _model(kind="llama"):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
            tie_word_embeddings=False)
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


class _Data(torch.utils.data.Dataset):
    def __init__(self, rows=16):
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, 64, (rows, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(out, **more):
    values = dict(output_dir=out, per_device_train_batch_size=4, max_steps=STEPS,
                  lr_scheduler_type="linear", warmup_steps=1, use_cpu=True, report_to=[],
                  save_strategy="no", logging_strategy="no", seed=0, max_grad_norm=1.0,
                  disable_tqdm=True)
    values.update(more)
    return transformers.TrainingArguments(**values)


def _train(model, factory, out, kwargs=KWARGS, resume=None, **more):
    trainer = transformers.Trainer(model=model, args=_args(out, **more), train_dataset=_Data(),
                                   optimizer_cls_and_kwargs=(factory, dict(kwargs)))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class _Reference(torch.optim.Optimizer):
    """torch.optim.Muon over the hidden matrices, torch.optim.AdamW (muon.Muon's
    AdamW betas and eps) over the embeddings, the head and every vector; decay
    on matrices only; one param_groups list for the Trainer's scheduler."""

    def __init__(self, model, lr, adamw_lr, weight_decay, **_):
        embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding)
                      for p in m.parameters()}
        embeddings |= {id(p) for p in model.get_output_embeddings().parameters()}
        hidden, matrices, vectors = [], [], []
        for p in model.parameters():
            (vectors if p.ndim < 2 else matrices if id(p) in embeddings else hidden).append(p)
        self.parts = [
            torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay),
            torch.optim.AdamW([dict(params=matrices, weight_decay=weight_decay),
                               dict(params=vectors, weight_decay=0.0)],
                              lr=adamw_lr, betas=(0.95, 0.95), eps=1e-8)]
        super().__init__(list(model.parameters()), {})
        self.param_groups = [g for o in self.parts for g in o.param_groups]

    def step(self, closure=None):
        # Accelerate's prepare reloads the state dict, which replaces the group
        # dicts: the scheduler's lr reaches the parts from here.
        for mine, part in zip(self.param_groups, [g for o in self.parts for g in o.param_groups]):
            part["lr"] = mine["lr"]
        for o in self.parts:
            o.step()


class _ReferenceFactory:
    def __call__(self, model, **kwargs):
        return _Reference(model, **kwargs)


def _assert_close(got, want, start, tol=1e-6):
    assert set(got) == set(want)
    for n in sorted(got):
        assert (want[n] - start[n]).abs().max().item() > 1e-4, n  # every param stepped
        assert (got[n] - want[n]).abs().max().item() <= tol, n


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_trainer_steps_the_recipe_as_torch_muon_and_adamw(fp32_torch_ns, tmp_path, kind):
    start = _params(_model(kind))
    ours = _train(_model(kind), muon_hf.Muon, str(tmp_path / "ours"))
    opt = ours.optimizer.optimizer  # (Accelerate's AcceleratedOptimizer around it)
    assert type(opt) is muon.Muon and opt.distributed_config is None
    adamw = [g for g in opt.param_groups if g.get("adamw")]
    assert {g["lr"] for g in adamw} == {0.0}  # the Trainer's linear schedule reached them
    want = _params(_train(_model(kind), _ReferenceFactory, str(tmp_path / "ref")).model)
    _assert_close(_params(ours.model), want, start)
    # The Trainer's own grouping (its decay and no-decay groups, embeddings and
    # head among the matrices) orthogonalizes the embeddings: elsewhere.
    plain = _params(_train(_model(kind), muon.Muon, str(tmp_path / "plain"),
                           kwargs=dict(lr=LR, weight_decay=WD, ns_dtype="fp32")).model)
    emb = "model.embed_tokens.weight" if kind == "llama" else "transformer.wte.weight"
    assert (plain[emb] - want[emb]).abs().max().item() > 1e-3


def test_trainer_checkpoint_resumes_bit_for_bit(tmp_path):
    whole = _params(_train(_model(), muon_hf.Muon, str(tmp_path / "whole")).model)
    _train(_model(), muon_hf.Muon, str(tmp_path / "saved"), save_strategy="steps", save_steps=2)
    checkpoint = tmp_path / "saved" / "checkpoint-2"
    assert (checkpoint / "optimizer.pt").exists() and (checkpoint / "scheduler.pt").exists()
    resumed = _params(_train(_model(), muon_hf.Muon, str(tmp_path / "saved"),
                             resume=str(checkpoint)).model)
    assert all(bits_equal(resumed[n], whole[n]) for n in whole)
    # The same checkpoint without the optimizer's state (the Trainer then starts
    # a fresh one): elsewhere.
    (checkpoint / "optimizer.pt").unlink()
    fresh = _params(_train(_model(), muon_hf.Muon, str(tmp_path / "saved"),
                           resume=str(checkpoint)).model)
    assert any(not bits_equal(fresh[n], whole[n]) for n in whole)


def _env(rank, world):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))


def _ddp_trainer(rank, world, out):
    _env(rank, world)
    trainer = _train(_model(), muon_hf.Muon, out, per_device_train_batch_size=2)
    opt = trainer.optimizer.optimizer
    assert opt.distributed_config is not None
    return {"params": _params(getattr(trainer.model, "module", trainer.model)),
            "orthogonalized": opt.stats().get("matrices_orthogonalized"),
            "ddp": type(trainer.model_wrapped).__name__}


def test_trainer_ddp_two_ranks_as_one_process(fp32_torch_ns, tmp_path):
    runs = launch(_ddp_trainer, 2, str(tmp_path / "ddp"))
    assert [r["ddp"] for r in runs] == ["DistributedDataParallel"] * 2
    matrices = sum(1 for _, p in _model().named_parameters() if p.ndim == 2) - 2  # less emb, head
    assert sum(r["orthogonalized"] for r in runs) == matrices  # once in the job, last step
    assert all(bits_equal(runs[1]["params"][n], v) for n, v in runs[0]["params"].items())
    # One process on the same global batch (2 x 2 rows): the gradients' average
    # sums in another order, so close, not bit for bit.
    one = _params(_train(_model(), muon_hf.Muon, str(tmp_path / "one")).model)
    _assert_close(runs[0]["params"], one, _params(_model()), tol=1e-5)


def _ddp_saving(rank, world, out, resume):
    _env(rank, world)
    trainer = _train(_model(), muon_hf.Muon, out, kwargs=dict(KWARGS, normuon=True),
                     resume=resume, per_device_train_batch_size=2, save_strategy="steps",
                     save_steps=2)
    return _params(getattr(trainer.model, "module", trainer.model))


def test_trainer_ddp_checkpoint_with_normuon_resumes_bit_for_bit(tmp_path):
    """The Trainer saves a DDP job's optimizer from rank 0 alone; NorMuon's
    moments live on each matrix's owner, gathered by every step (a gather in
    state_dict() would wait for rank 1, gone on to its next step)."""
    out = str(tmp_path / "ddp")
    whole = launch(_ddp_saving, 2, out, None, timeout=180)
    saved = torch.load(os.path.join(out, "checkpoint-2", "optimizer.pt"), weights_only=True)
    moments = [e for e in saved["state"].values() if "normuon_second_moment" in e]
    assert len(moments) == 14  # every Muon matrix's (2 layers x 7)
    resumed = launch(_ddp_saving, 2, out, os.path.join(out, "checkpoint-2"), timeout=180)
    for r in (0, 1):
        assert all(bits_equal(resumed[r][n], whole[r][n]) for n in whole[r])


def _fsdp2_loop(rank, world, with_config):
    _env(rank, world)
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    acc = Accelerator(fsdp_plugin=plugin, cpu=True)
    acc.state.distributed_type = DistributedType.FSDP  # (see the module's docstring)
    acc.state.fsdp_plugin = plugin
    model = _model()
    groups = muon_hf.param_groups(model, lr=LR, adamw_lr=ADAMW_LR, weight_decay=WD)
    config = muon_hf.config_for(model.parameters()) if with_config else None
    opt = muon.Muon(groups, distributed_config=config, ns_dtype="fp32")
    model, opt = acc.prepare(model, opt)
    assert all(type(p).__name__ == "DTensor" for g in opt.param_groups for p in g["params"])
    return _loop(model, opt, acc)


def _loop(model, opt, acc=None):
    batch = _Data()[slice(0, 2)]
    for _ in range(STEPS):
        loss = model(**batch).loss
        (acc.backward(loss) if acc is not None else loss.backward())
        opt.step()
        opt.zero_grad()
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def test_accelerate_fsdp2_swapped_params_bit_for_bit():
    runs = launch(_fsdp2_loop, 2, True)
    model = _model()
    opt = muon.Muon(muon_hf.param_groups(model, lr=LR, adamw_lr=ADAMW_LR, weight_decay=WD),
                    ns_dtype="fp32")
    one = _loop(model, opt)
    for r in runs:
        assert set(r) == set(one)
        assert all(bits_equal(r[n], one[n]) for n in one), [
            n for n in one if not bits_equal(r[n], one[n])]


def _fsdp2_refused(rank, world):
    try:
        _fsdp2_loop(rank, world, False)
    except ValueError as err:
        text = str(err)
    else:
        return None
    # A plain matrix in a group before the DTensor's: refused before any group
    # steps (nothing half-done).
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh
    plain = torch.nn.Parameter(torch.ones(4, 4))
    sharded = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4),
                                                   init_device_mesh("cpu", (world,)), [Shard(0)]))
    plain.grad, sharded.grad = torch.ones(4, 4), torch.ones_like(sharded)
    opt = muon.Muon([{"params": [plain]}, {"params": [sharded]}], lr=0.1)
    try:
        opt.step()
    except ValueError as err:
        return text, str(err), bits_equal(plain.detach(), torch.ones(4, 4))
    return text, None, None


def test_accelerate_fsdp2_without_a_config_is_refused_on_every_rank():
    for result in launch(_fsdp2_refused, 2):
        assert result is not None
        text, mixed, untouched = result
        assert "is a DTensor" in text and "distributed_config=muon.create_dtensor_config()" in text
        assert mixed is not None and "param 'group1.param0' is a DTensor" in mixed, mixed
        assert untouched


def test_the_factory_refuses_an_unknown_distributed_config():
    with pytest.raises(ValueError, match="distributed_config must be"):
        muon_hf.Muon()(_model(), distributed_config="ddp")
