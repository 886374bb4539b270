"""muon.Muon in torchtitan (0.3 and later): torchtitan's own optimizer
container with one more optimizer name, "LibMuon".

    from muon import torchtitan as muon_torchtitan
    optimizer = muon_torchtitan.OptimizersContainer.Config(
        param_groups=muon_torchtitan.param_groups(lr=0.02, adamw_lr=3e-4))
    optimizers = optimizer.build(model_parts=model_parts)  # as torchtitan's Trainer does

The container is torchtitan's OptimizersContainer (step, zero_grad, its flat
FQN-keyed state_dict that torchtitan's checkpointer saves through
torch.distributed.checkpoint, LR schedulers, step hooks); a ParamGroupConfig
with optimizer_name "LibMuon" steps its params with muon.Muon, whose keyword
arguments are the group's optimizer_kwargs (lr, weight_decay, momentum,
ns_dtype, normuon, ...). For each LibMuon param group it:

  - passes distributed_config=muon.create_dtensor_config() when the params
    are DTensors (FSDP2, tensor parallel, expert-parallel meshes), each named
    by its FQN, and none when they are plain tensors;
  - splits each fused QKV weight (torchtitan's FusedQKVLinear.wqkv, rows laid
    out per KV group as heads_per_kv query heads, one key head, one value
    head) into its queries, keys and values, each orthogonalized as one
    matrix, as Megatron-core's Muon splits a fused QKV (split_qkv=False in
    optimizer_factory_kwargs_by_name["LibMuon"] keeps it whole);
  - registers the stacked experts of a GroupedExperts module ((E, m, n)
    tensors) as E matrices (matrix_view "batched_leading"). Another param of
    3 or more dims is refused unless its group gives a matrix_view.

torchtitan's parallelize functions (TP, EP, FSDP2) leave every param a DTensor,
under any spmd_backend; a TP shard left a plain tensor (Module.parallelize
alone under "spmd_types") is refused: it would be orthogonalized alone.

param_groups() is the usual recipe: embeddings and the output head with
torchtitan's AdamW, every other param with LibMuon (whose own AdamW, at
adamw_lr, steps the norms and biases)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.optimizer import OptimizersContainer as _Container
from torchtitan.components.optimizer import ParamGroupConfig

from ._config import is_dtensor
from ._dtensor_config import create_dtensor_config
from ._torch import Muon

NAME = "LibMuon"
# Module classes whose params the container treats specially, by class name
# (torchtitan's models/common): a fused QKV projection and stacked experts.
_FUSED_QKV = "FusedQKVLinear"
_EXPERTS = "GroupedExperts"


def param_groups(lr: float = 0.02, *, adamw_lr: float = 3e-4,
                 adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_weight_decay: float = 0.1,
                 embeddings: str = r"(^|\.)(tok_embeddings|lm_head|output)\.",
                 **muon_kwargs: Any) -> list[ParamGroupConfig]:
    """ParamGroupConfigs: params whose FQN matches `embeddings` (torchtitan's
    token embeddings and output head) with torchtitan's AdamW, every other
    param with LibMuon at `lr` (muon_kwargs: more muon.Muon options; its AdamW
    steps the norms and biases at adamw_lr with adamw_betas and adamw_eps)."""
    adamw = {"lr": adamw_lr, "betas": adamw_betas, "eps": adamw_eps,
             "weight_decay": adamw_weight_decay}
    muon = {"lr": lr, "adamw_lr": adamw_lr, "adamw_betas": adamw_betas, "adamw_eps": adamw_eps,
            **muon_kwargs}
    return [ParamGroupConfig(pattern=embeddings, optimizer_name="AdamW", optimizer_kwargs=adamw),
            ParamGroupConfig(pattern=r".*", optimizer_name=NAME, optimizer_kwargs=muon)]


def _special_params(model_parts: list[torch.nn.Module]) -> dict[int, tuple[str, Any]]:
    """{id(param): ("split", sizes) | ("view", "batched_leading")} for the fused
    QKV weights and stacked experts of the model parts."""
    out: dict[int, tuple[str, Any]] = {}
    for part in model_parts:
        for module in part.modules():
            kind = type(module).__name__
            if kind == _FUSED_QKV and hasattr(module, "wqkv"):
                fused: Any = module  # (torchtitan's FusedQKVLinear)
                head_dim, per_kv = int(fused.head_dim), int(fused.heads_per_kv)
                out[id(fused.wqkv.weight)] = ("split", (per_kv * head_dim, head_dim, head_dim))
            elif kind == _EXPERTS:
                for p in module.parameters(recurse=False):
                    if p.ndim == 3:
                        out[id(p)] = ("view", "batched_leading")
    return out


def _regroup(groups: list[dict[str, Any]], special: dict[int, tuple[str, Any]],
             split_qkv: bool) -> list[dict[str, Any]]:
    """Each param group cut into runs of params that take the same split or
    view (a group's split_sizes and matrix_view apply to all its params)."""
    out: list[dict[str, Any]] = []
    for group in groups:
        names = list(group.get("param_names", ()))
        runs: dict[Any, dict[str, Any]] = {}
        for k, p in enumerate(group["params"]):
            key = special.get(id(p))
            if key is not None and key[0] == "split" and not split_qkv:
                key = None
            run = runs.get(key)
            if run is None:
                run = runs[key] = {**group, "params": []}
                if names:
                    run["param_names"] = []
                if key is not None and key[0] == "split" and "split_sizes" not in group:
                    run["split_sizes"] = list(key[1])
                elif key is not None and key[0] == "view" and "matrix_view" not in group:
                    run["matrix_view"] = key[1]
            run["params"].append(p)
            if names:
                run["param_names"].append(names[k])
        out.extend(runs.values())
    return out


def build_muon(groups: list[dict[str, Any]], *, special: dict[int, tuple[str, Any]] | None = None,
               split_qkv: bool = True, distributed_config: Any = "auto",
               **kwargs: Any) -> Muon:
    """muon.Muon over torchtitan's param groups (with their param_names):
    distributed_config "auto" is create_dtensor_config() naming each param by
    its FQN when the params are DTensors, else None."""
    groups = _regroup(groups, special or {}, split_qkv)
    if distributed_config == "auto":
        params = [p for g in groups for p in g["params"]]
        if any(is_dtensor(p) for p in params):
            names = {p: n for g in groups for p, n in zip(g["params"], g.get("param_names", ()))}
            distributed_config = create_dtensor_config(names=names or None)
        else:
            distributed_config = None
    return Muon(groups, distributed_config=distributed_config, **kwargs)


def _unflatten(optim: Muon, flat: dict[str, Any]) -> dict[str, Any]:
    """The int-keyed state dict of `optim` from torchtitan's flat one (keys
    "state.{fqn}.{name}" and "param_groups.{fqn}.{key}"), for the state names
    and group keys optim.state_dict() has now."""
    current = optim.state_dict()
    state: dict[int, dict[str, Any]] = {}
    groups = []
    for group in current["param_groups"]:
        names = group.get("param_names", [])
        new = {"params": list(group["params"])}
        for key in group:
            if key in ("params", "param_names") or not names:
                continue
            flat_key = "param_groups.%s.%s" % (names[0], key)
            if flat_key not in flat:
                raise KeyError("muon.torchtitan: param group key %r of %s is not in the "
                               "checkpoint (%s)" % (key, names[0], flat_key))
            new[key] = flat[flat_key]
        groups.append(new)
        for index, fqn in zip(group["params"], names):
            entry = {name: flat["state.%s.%s" % (fqn, name)]
                     for name in current["state"].get(index, {})
                     if "state.%s.%s" % (fqn, name) in flat}
            if entry:
                state[index] = entry
    return {"state": state, "param_groups": groups}


class OptimizersContainer(_Container):
    """torchtitan's OptimizersContainer with muon.Muon as optimizer "LibMuon"."""

    @dataclass(kw_only=True, slots=True)
    class Config(_Container.Config):
        pass

    def __init__(self, config: Config, *, model_parts: list[torch.nn.Module]) -> None:
        self._special = _special_params(model_parts)
        super().__init__(config, model_parts=model_parts)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torchtitan's flat FQN-keyed state into each optimizer. torchtitan's
        own reader learns a param's state names from `optimizer.state`, where
        muon.Muon keeps no momentum (the library does): a LibMuon optimizer
        learns them from its state_dict() instead."""
        from torchtitan.components.optimizer.utils import (init_optim_state,
                                                           load_flat_optim_state_dict)
        for optim in self.optimizers:
            init_optim_state(optim)
            if isinstance(optim, Muon):
                optim.load_state_dict(_unflatten(optim, state_dict))
            else:
                load_flat_optim_state_dict(optim, state_dict)

    def _resolve_optimizer_factory(self, name: str) -> Any:  # type: ignore[override]
        if name != NAME:
            return _Container._resolve_optimizer_factory(name)
        special = self._special

        def factory(groups: list[dict[str, Any]], **kwargs: Any) -> Muon:
            return build_muon(groups, special=special, **kwargs)
        return factory
