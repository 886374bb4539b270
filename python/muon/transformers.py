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
Under DeepSpeed (the Trainer's deepspeed= argument) the factory refuses: ZeRO
replaces the params with flat partitions, which muon.deepspeed maps
(create_deepspeed_config and muon.deepspeed.initialize, outside the Trainer)."""

from __future__ import annotations

from typing import Any

import torch

from ._config import is_dtensor
from ._dtensor_config import create_dtensor_config
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
        to_adamw = id(p) in adamw or p.ndim != 2
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


def _refuse_deepspeed() -> None:
    try:
        from accelerate.state import AcceleratorState
        from accelerate.utils import DistributedType
    except ImportError:
        return
    if AcceleratorState._shared_state.get("distributed_type") == DistributedType.DEEPSPEED:
        raise ValueError(
            "muon.transformers: Accelerate runs DeepSpeed here, whose ZeRO hands the optimizer "
            "flat partitions of the params; build muon.Muon with distributed_config="
            "muon.deepspeed.create_deepspeed_config() and call muon.deepspeed.initialize "
            "yourself (see muon.deepspeed), not through the Trainer's deepspeed= argument")


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
        if isinstance(distributed_config, str):
            if distributed_config != "auto":
                raise ValueError("muon.transformers.Muon: distributed_config must be \"auto\", "
                                 "None or a config, got %r" % (distributed_config,))
            distributed_config = config_for([p for g in groups for p in g["params"]])
        return _Muon(groups, lr=lr, weight_decay=weight_decay,
                     distributed_config=distributed_config, **kwargs)
