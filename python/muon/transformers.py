"""muon.Muon under Hugging Face's Trainer (transformers 5) and Accelerate.

    from muon import transformers as muon_hf
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data,
        optimizer_cls_and_kwargs=(muon_hf.Muon, dict(lr=0.02, adamw_lr=3e-4)))

muon_hf.Muon is an optimizer factory as the Trainer takes them (it calls
Muon() and then the result with the model and the kwargs): it builds a
muon.Muon over param_groups(model, ...), the usual Muon recipe, and picks its
distributed_config. The kwargs carry lr and weight_decay (the Trainer gives a
factory none of its TrainingArguments). Its LR scheduler drives every group,
Muon's and AdamW's alike, and its checkpoints save and load the optimizer's
state_dict as any torch optimizer's.

param_groups(model, ...) for a loop of your own (Accelerate's
accelerator.prepare(model, optimizer) included):

    opt = muon.Muon(muon_hf.param_groups(model, lr=0.02, adamw_lr=3e-4),
                    distributed_config=muon_hf.config_for(model.parameters()))

The recipe: every nn.Embedding's params (token and position embeddings), the
output head (model.get_output_embeddings(), tied to the input embeddings or
not), every param of fewer than 2 or more than 2 dims (norms, biases,
convolution kernels) with AdamW at adamw_lr; every other matrix with Muon at
lr. Weight decay as the Trainer applies it (Trainer.get_decay_parameter_names:
none on biases and norms), at weight_decay for Muon's matrices and
adamw_weight_decay (None: weight_decay) for AdamW's params. Only params that
require grad are given, as the Trainer gives them.

config_for(params): None in a one-rank job without DTensor params, else
create_dtensor_config(), which takes DTensor params (FSDP2, which
Accelerate swaps into the optimizer's param_groups after building it; tensor
parallel) and plain ones as whole on every rank (DDP: Accelerate's MULTI_CPU
and MULTI_GPU): each matrix orthogonalized once in the job, by its owner.
Under DeepSpeed (TrainingArguments(deepspeed=ds_config), ZeRO stages 0 to 3,
optimizer offload included; the ds_config without an "optimizer" section,
which the Trainer would use instead of the factory) the factory builds
muon.Muon with muon.deepspeed.create_deepspeed_config(), settles the config
Accelerate hands DeepSpeed (muon.deepspeed.settle_config: among others, under
offload, Accelerate would otherwise replace muon.Muon by DeepSpeed's CPU Adam)
and binds the muon config to the engine the Trainer builds, at the checkpoint
load of a resume or at on_train_begin, whichever comes first (a callback it
adds to the Trainer that called it). ZeRO's flat partitions are mapped back to
the weights as under muon.deepspeed.initialize. config_for refuses under
DeepSpeed: a loop of your own calls muon.deepspeed.initialize."""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from ._config import is_dtensor
from ._dtensor_config import create_dtensor_config
from . import deepspeed as _ds
from ._torch import Muon as _Muon

__all__ = ["Muon", "config_for", "param_groups"]


def _decayed_names(model) -> set[str]:
    """The names the Trainer decays (its own rule, read from transformers)."""
    from transformers import Trainer
    # get_decay_parameter_names reads only the model it is given.
    return set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]


def _adamw_ids(model) -> set[int]:
    """id() of the params the recipe steps with AdamW though they are matrices:
    every nn.Embedding's and the output head's."""
    modules = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is not None:
        modules.append(head)
    return {id(p) for m in modules for p in m.parameters()}


def param_groups(model: torch.nn.Module, *, lr: float = 0.02, weight_decay: float = 0.0,
                 adamw_lr: float | None = None,
                 adamw_weight_decay: float | None = None) -> list[dict[str, Any]]:
    """muon.Muon's param groups for a transformers model, by the recipe above:
    Muon's matrices with and without decay, AdamW's params with and without
    decay (groups left empty are dropped). Each AdamW group sets "adamw":
    True and its own lr and weight_decay (adamw_lr and adamw_wd None), so a
    scheduler that scales the groups' lr scales AdamW's too."""
    decayed = _decayed_names(model)
    adamw = _adamw_ids(model)
    a_lr = lr if adamw_lr is None else adamw_lr
    a_wd = weight_decay if adamw_weight_decay is None else adamw_weight_decay
    buckets: dict[tuple[bool, bool], list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # (DeepSpeed's zero.Init leaves each param empty, its shape in ds_shape.)
        to_adamw = id(p) in adamw or len(getattr(p, "ds_shape", p.shape)) != 2
        buckets.setdefault((to_adamw, name in decayed), []).append(p)
    groups = []
    for (to_adamw, decay), params in sorted(buckets.items()):
        if to_adamw:
            groups.append(dict(params=params, adamw=True, lr=a_lr,
                               weight_decay=a_wd if decay else 0.0, adamw_lr=None,
                               adamw_wd=None))
        else:
            groups.append(dict(params=params, lr=lr, weight_decay=weight_decay if decay else 0.0))
    return groups


def config_for(params: Any = ()) -> Any:
    """None in one process, create_dtensor_config() across ranks; refused under
    DeepSpeed (see the module). `params`: what the optimizer will step, whose
    DTensors need the config even in a one-rank job."""
    import torch.distributed as dist
    _refuse_deepspeed()
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if several or any(is_dtensor(p) for p in params):
        return create_dtensor_config()
    return None


def _deepspeed_config() -> dict[str, Any] | None:
    """The config Accelerate hands DeepSpeed when it runs DeepSpeed, else None."""
    try:
        from accelerate.state import AcceleratorState
        from accelerate.utils import DistributedType
    except ImportError:
        return None
    if AcceleratorState._shared_state.get("distributed_type") != DistributedType.DEEPSPEED:
        return None
    config = getattr(AcceleratorState().deepspeed_plugin, "deepspeed_config", None)
    if not isinstance(config, dict):
        raise ValueError("muon.transformers: Accelerate runs DeepSpeed here without a "
                         "DeepSpeed plugin config to read; build the engine with "
                         "muon.deepspeed.initialize")
    return config


def _refuse_deepspeed() -> None:
    if _deepspeed_config() is not None:
        raise ValueError(
            "muon.transformers.config_for: Accelerate runs DeepSpeed here, whose ZeRO hands the "
            "optimizer flat partitions of the params; under the Trainer use "
            "muon.transformers.Muon, in a loop of your own build muon.Muon with "
            "distributed_config=muon.deepspeed.create_deepspeed_config() and the engine with "
            "muon.deepspeed.initialize (see muon.deepspeed)")


def _calling_trainer() -> Any:
    """The Trainer whose create_optimizer called the factory: the Trainer's
    factory protocol hands a factory the model alone, and binding to the
    engine needs the Trainer that will build it."""
    from transformers import Trainer
    frame: Any = sys._getframe(3)  # (Muon.__call__'s caller: _for_deepspeed, __call__, then it)
    for _ in range(3):
        if frame is None:
            break
        candidate = frame.f_locals.get("self", frame.f_locals.get("trainer"))
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _engine_of(trainer_ref, opt_ref) -> Any:
    """The Trainer's DeepSpeed engine once it is built around this optimizer
    (directly at stage 0, through ZeRO's optimizer at stages 1-3), else None."""
    trainer, opt = trainer_ref(), opt_ref()
    engine = getattr(trainer, "model_wrapped", None)
    inner = getattr(engine, "optimizer", None)
    if opt is None or not callable(getattr(engine, "zero_optimization_stage", None)):
        return None
    return engine if opt is inner or opt is getattr(inner, "optimizer", None) else None


def _bind_to_trainer(config: Any, trainer: Any, opt: _Muon) -> None:
    """Binds `config` to the engine `trainer` will build around `opt`: at the
    first question about ZeRO's partitions (a resume's checkpoint load, which
    the Trainer runs before any callback) or at on_train_begin, from a
    callback added to the Trainer (ZeRO-3's first step must find every param
    group emptied, so bound before it)."""
    from transformers import TrainerCallback
    trainer_ref, opt_ref = weakref.ref(trainer), weakref.ref(opt)
    config.bind_when_built(lambda: _engine_of(trainer_ref, opt_ref))

    class MuonDeepSpeedBinding(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            config.bind_if_built()

    trainer.add_callback(MuonDeepSpeedBinding())


def _for_deepspeed(ds_config: dict[str, Any], distributed_config: Any) -> Any:
    """The Trainer that called the factory and the muon config for the engine
    it will build; Accelerate's DeepSpeed config settled."""
    trainer = _calling_trainer()
    if trainer is None:
        raise ValueError("muon.transformers.Muon: under DeepSpeed it binds to the engine the "
                         "Trainer builds, so it must be called by a Trainer's create_optimizer; "
                         "in a loop of your own use muon.deepspeed.initialize")
    if isinstance(distributed_config, str):
        distributed_config = _ds.create_deepspeed_config()
    elif not isinstance(distributed_config, _ds.DeepSpeedConfig):
        raise ValueError("muon.transformers.Muon: under DeepSpeed distributed_config must be "
                         "\"auto\" or muon.deepspeed.create_deepspeed_config(), got a %s"
                         % type(distributed_config).__name__)
    _ds.settle_config(ds_config)
    return trainer, distributed_config


class Muon:
    """The Trainer's optimizer factory (optimizer_cls_and_kwargs=(Muon,
    kwargs)): Muon()(model, **kwargs) is muon.Muon(param_groups(model, lr,
    weight_decay, adamw_lr, adamw_weight_decay), distributed_config=..., the
    other kwargs); distributed_config "auto" (the default) is config_for(the params)."""

    def __call__(self, model: torch.nn.Module, *, lr: float = 0.02,
                 weight_decay: float = 0.0, adamw_lr: float | None = None,
                 adamw_weight_decay: float | None = None,
                 distributed_config: Any = "auto", **kwargs: Any) -> _Muon:
        groups = param_groups(model, lr=lr, weight_decay=weight_decay, adamw_lr=adamw_lr,
                              adamw_weight_decay=adamw_weight_decay)
        if isinstance(distributed_config, str) and distributed_config != "auto":
            raise ValueError("muon.transformers.Muon: distributed_config must be \"auto\", "
                             "None or a config, got %r" % (distributed_config,))
        ds_config = _deepspeed_config()
        if ds_config is not None:
            trainer, config = _for_deepspeed(ds_config, distributed_config)
            opt = _Muon(groups, lr=lr, weight_decay=weight_decay, distributed_config=config,
                        **kwargs)
            _bind_to_trainer(config, trainer, opt)
            return opt
        if isinstance(distributed_config, str):  # "auto"
            distributed_config = config_for([p for g in groups for p in g["params"]])
        return _Muon(groups, lr=lr, weight_decay=weight_decay,
                     distributed_config=distributed_config, **kwargs)
