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
adamw_lr, steps the norms and biases).

Pipeline parallel (torchtitan's pipeline_llm: one model part per stage, a
rank holding one or more): the container builds ONE LibMuon optimizer per
rank over the LibMuon groups of all its model parts, even where they hold no
such param (a stage of embeddings only), so that every rank of the job steps
one; each stage's params are DTensors on meshes without the "pp" dim, and
the ranks of the other stages hold other params. The recipe's groups are
StageParamGroupConfigs: a stage that holds no param a pattern matches (the
middle stages have no embeddings) leaves the pattern out there, where
torchtitan's own ParamGroupConfig refuses it."""

from __future__ import annotations

import re
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


@dataclass(kw_only=True, slots=True)
class StageParamGroupConfig(ParamGroupConfig):
    """A ParamGroupConfig that may match no param of a model part: a pipeline
    stage holds some layers only (torchtitan's own refuses such a part). The
    container leaves it out of that part."""


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
    return [StageParamGroupConfig(pattern=embeddings, optimizer_name="AdamW",
                                  optimizer_kwargs=adamw),
            StageParamGroupConfig(pattern=r".*", optimizer_name=NAME, optimizer_kwargs=muon)]


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


Key = Any  # a run's key: None, ("split", sizes) or ("view", matrix_view)


def _runs(group: dict[str, Any], special: dict[int, tuple[str, Any]],
          split_qkv: bool) -> dict[Key, dict[str, Any]]:
    """A param group cut into runs of params that take the same split or view
    (a group's split_sizes and matrix_view apply to all its params), by key."""
    names = list(group.get("param_names", ()))
    runs: dict[Key, dict[str, Any]] = {}
    for k, p in enumerate(group["params"]):
        key = special.get(id(p))
        if key is not None and key[0] == "split" and not split_qkv:
            key = None
        run = runs.get(key)
        if run is None:
            run = runs[key] = _run_of(group, key)
        run["params"].append(p)
        if names:
            run["param_names"].append(names[k])
    return runs


def _run_of(group: dict[str, Any], key: Key) -> dict[str, Any]:
    """An empty run of `group` for `key`: its options and the key's split or view."""
    run = {**group, "params": []}
    if "param_names" in group:
        run["param_names"] = []
    if key is not None and key[0] == "split" and "split_sizes" not in group:
        run["split_sizes"] = list(key[1])
    elif key is not None and key[0] == "view" and "matrix_view" not in group:
        run["matrix_view"] = key[1]
    return run


def _regroup(groups: list[dict[str, Any]], special: dict[int, tuple[str, Any]],
             split_qkv: bool) -> list[dict[str, Any]]:
    """Each param group cut into its runs (see _runs); an empty group kept."""
    out: list[dict[str, Any]] = []
    for group in groups:
        out.extend(_runs(group, special, split_qkv).values() if group["params"]
                   else [dict(group)])
    return out


def _job_keys(local: list[tuple[int, Key]]) -> list[tuple[int, Key]]:
    """The (LibMuon param group config, run key) pairs of every rank, in one
    order: each rank's muon.Muon gets a param group for each, empty where it
    has none, because muon.Muon's groups step in turn and each step is
    collective (pipeline stages hold different layers: a stage without MoE
    layers has no experts' group)."""
    keys = set(local)
    if _distributed():
        everyone: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, sorted(local, key=_order))
        keys = {tuple(k) for rank in everyone for k in rank}
    return sorted(keys, key=_order)


def _order(key: tuple[int, Key]) -> tuple[Any, ...]:
    index, run = key
    if run is None:
        return (index, 0, ())
    return (index, 1 if run[0] == "split" else 2, tuple(run[1]) if run[0] == "split" else
            (run[1],))


def build_muon(groups: list[dict[str, Any]], *, special: dict[int, tuple[str, Any]] | None = None,
               split_qkv: bool = True, distributed_config: Any = "auto",
               **kwargs: Any) -> Muon:
    """muon.Muon over torchtitan's param groups (with their param_names):
    distributed_config "auto" is create_dtensor_config() naming each param by
    its FQN when the params are DTensors, else None."""
    groups = _regroup(groups, special or {}, split_qkv)
    if distributed_config == "auto":
        params = [p for g in groups for p in g["params"]]
        # (A rank whose pipeline stages hold no LibMuon param still joins the
        # job's steps: torchtitan makes every param a DTensor when it runs on
        # more than one rank.)
        if any(is_dtensor(p) for p in params) or (not params and _distributed()):
            names = {p: n for g in groups for p, n in zip(g["params"], g.get("param_names", ()))}
            distributed_config = create_dtensor_config(names=names or None)
        else:
            distributed_config = None
    return Muon(groups, distributed_config=distributed_config, **kwargs)


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class LibMuonPart:
    """What the LibMuon factory gives the container for one model part (and
    torchtitan's log names): its param groups, which the one muon.Muon of this
    rank then steps, and the index of the config each came from."""

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        self.indices = [g.pop("_config") for g in groups]
        self.param_groups = groups


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
        self._one_muon(config)

    def _one_muon(self, config: Config) -> None:
        """The LibMuon groups of every model part into one muon.Muon (in the
        place of the first part's), with the same param groups on every rank
        of the job (empty ones where this rank has none: see _job_keys)."""
        configs = config.param_groups
        if not any(pg.optimizer_name == NAME for pg in configs):
            return
        kwargs = dict(config.optimizer_factory_kwargs_by_name.get(NAME, {}))
        split_qkv = kwargs.pop("split_qkv", True)
        optimizers: list[Any] = self.optimizers  # type: ignore[has-type]
        parts = [o for o in optimizers if isinstance(o, LibMuonPart)]
        mine: dict[tuple[int, Key], dict[str, Any]] = {}
        for part in parts:
            for index, group in zip(part.indices, part.param_groups):
                for key, run in _runs(group, self._special, split_qkv).items():
                    into = mine.setdefault((index, key), _run_of(run, None))
                    into["params"] += run["params"]
                    if "param_names" in run:
                        into["param_names"] += run["param_names"]
        impl = self._build_impl_kwargs(config)
        groups = [mine[k] if k in mine else
                  _run_of({"params": [], "param_names": [], **impl,
                           **configs[k[0]].optimizer_kwargs}, k[1])
                  for k in _job_keys(list(mine))]
        at = optimizers.index(parts[0]) if parts else len(optimizers)
        if groups:
            optimizers.insert(at, build_muon(groups, split_qkv=split_qkv, **kwargs))
        self.optimizers = [o for o in optimizers if not isinstance(o, LibMuonPart)]

    @staticmethod
    def _build_param_groups(model: torch.nn.Module, param_group_configs: list[ParamGroupConfig],
                            impl_kwargs: dict[str, Any]) -> Any:
        """torchtitan's, without the StageParamGroupConfigs that match no param
        of this model part (first match wins, as in torchtitan's); each LibMuon
        group notes which config it came from (its index: "_config")."""
        kept, claimed = [], set()
        for index, pg in enumerate(param_group_configs):
            pattern = re.compile(pg.pattern)
            hits = {name for name, p in model.named_parameters()
                    if p.requires_grad and name not in claimed and pattern.search(name)}
            if hits or not isinstance(pg, StageParamGroupConfig):
                kept.append((index, pg))
            claimed |= hits
        groups, patterns = _Container._build_param_groups(model, [pg for _, pg in kept],
                                                          impl_kwargs)
        indices = [index for index, pg in kept if pg.optimizer_name == NAME]
        for index, group in zip(indices, groups.get(NAME, [])):
            group["_config"] = index
        return groups, patterns

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

        def factory(groups: list[dict[str, Any]], **_: Any) -> LibMuonPart:
            return LibMuonPart(groups)  # (one muon.Muon over them all: _one_muon)
        return factory
