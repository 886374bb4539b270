"""muon.Muon inside DeepSpeed, ZeRO stages 0 to 3.

    opt = muon.Muon(model.parameters(), lr=0.02,
                    distributed_config=muon.deepspeed.create_deepspeed_config())
    engine, zero_opt, _, _ = muon.deepspeed.initialize(model=model, optimizer=opt,
                                                        config=ds_config)
    loss = ...; engine.backward(loss); engine.step()

ZeRO-1/2 flattens each param group into one buffer, splits it evenly over the
data-parallel ranks and hands the client optimizer, as the group's only
param, this rank's fp32 partition: a flat buffer holding ranges of several
weights (muon/_flat.py). The config maps each partition back to its weights
from the ZeRO optimizer's own layout (the flat order, the offsets with their
alignment padding, the equal partitions), so every matrix's ranges go to the
library as FlatRange pieces over the data-parallel group (Newton-Schulz once
per matrix in the job, on one rank) and the other weights' ranges to AdamW.
DeepSpeed averages, unscales and clips the gradients before step(), skips a
step on every rank when one overflowed, and steps the groups one at a time in
the same order on every rank.

ZeRO-3 partitions every param on its own (rank r holds elements [r*c, r*c+c)
of it, c = ceil(numel / world), ds_shape its shape, zero.Init included) and
hands the client one fp32 partition per sub-group, the pieces one after
another: FlatRange pieces again. muon.Muon steps a param group's matrices
together, so a group must be one sub-group: initialize sets
"sub_group_size" when it is unset, and bind refuses a size that splits one.

ZeRO stage 0 (DeepSpeed's default) is replicated data parallelism: the engine
averages the gradients and hands the client the whole params (or whole fp32
copies of them under bf16 and fp16), which the config registers replicated
over the engine's data-parallel group: each matrix orthogonalized by one rank.

MoE (deepspeed.moe.layer.MoE, its params split into param groups by
split_params_into_different_moe_groups_for_optimizer; stages 0-2, DeepSpeed
has no MoE at stage 3): each expert lives on one rank of its expert-parallel
group and is averaged and partitioned over its expert-data-parallel group.
The config names each expert by its global id (DeepSpeed's local index i on
expert-parallel rank r is expert r * num_local_experts + i) and registers it
on the ranks that hold it, its ranges over the expert-data-parallel group;
the dense params' ranges over the whole data-parallel group (stage 0: whole
params, replicated).

muon.deepspeed.initialize is deepspeed.initialize with the config settled
(settle_config) and the muon config bound to the engine it builds; with
deepspeed.initialize itself, call config.bind(engine) (or
config.bind(engine.optimizer) at stages 1-3) before the first step and
before engine.load_checkpoint (an unbound config refuses both: the flat
partitions' state would not be mapped). Hugging Face's Trainer builds the
engine itself: muon.transformers.Muon binds there. Not
mapped: MiCS, MoE with experts of two expert-parallel sizes, and
DeepSpeed's own Muon (its `use_muon` param flag must stay unset: it would
orthogonalize the gradients itself; muon.Muon refuses a parameter that
carries it), elastic checkpoints (they would save muon.Muon's state
empty: refused by settle_config and at bind) and universal checkpoints
(ds_to_universal keeps Adam's state only: checkpoint.load_universal is
refused by settle_config and at bind).
muon.Muon handed to deepspeed.initialize without this config raises at
step() rather than step ZeRO's flat partitions as AdamW.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any, Callable

from ._flat import Segment
from ._pg_config import ProcessGroupConfig

if TYPE_CHECKING:
    import torch

    from ._base_config import NamedParams
    from ._optimizer import Optimizer
    from ._torch import Muon

__all__ = ["create_deepspeed_config", "initialize", "settle_config",
           "zero_partition_segments"]


def _stage3(zero):
    return hasattr(zero, "fp32_partitioned_groups_flat") and hasattr(zero, "fp16_groups")


def _partitions(zero):
    """The fp32 partitions the client optimizer steps: one per param group
    (ZeRO-1/2), one per sub-group (ZeRO-3)."""
    if _stage3(zero):                                      # DeepSpeedZeroOptimizer_Stage3
        return zero.fp32_partitioned_groups_flat
    if hasattr(zero, "single_partition_of_fp32_groups"):   # DeepSpeedZeroOptimizer
        return zero.single_partition_of_fp32_groups
    if hasattr(zero, "fp32_groups_flat_partition"):        # BF16_Optimizer (bf16, stage 1)
        return zero.fp32_groups_flat_partition
    raise ValueError("muon.deepspeed: the optimizer to bind is a %s, not DeepSpeed's ZeRO stage "
                     "1 or 2 optimizer (DeepSpeedZeroOptimizer, BF16_Optimizer: "
                     "engine.optimizer under zero_optimization.stage 1 or 2, "
                     "DeepSpeedZeroOptimizer_Stage3 under stage 3)" % type(zero).__name__)


_UNIVERSAL = ("muon.deepspeed: DeepSpeed's universal checkpoints (checkpoint.load_universal) "
              "cannot carry muon.Muon's state: ds_to_universal keeps Adam's exp_avg and "
              "exp_avg_sq and the fp32 weights only (a param group without exp_avg stops it "
              "with a KeyError; one with it loses the momentum), and its ZeRO-3 loader reads "
              "those keys only. Resume at another size through muon's own state "
              "(torch.distributed.checkpoint of opt.state_dict(), or muon_load_states), or "
              "load the DeepSpeed checkpoint as saved, at the size it was saved at")


_ELASTIC = ("muon.deepspeed: zero_optimization.elastic_checkpoint is on; its checkpoints would "
            "drop muon.Muon's state (momentum and AdamW moments): set \"elastic_checkpoint\": "
            "false (the default) and resume at another size through muon's own state "
            "(opt.state_dict() / muon_load_states)")

_UNBOUND = ("muon.deepspeed: the config is not bound to DeepSpeed's engine; build the engine with "
            "muon.deepspeed.initialize, or call config.bind(engine) after deepspeed.initialize "
            "and before the first step or checkpoint load (DeepSpeed's FP16_UnfusedOptimizer, "
            "bf16 or fp16 at ZeRO stage 0, steps at construction: use stage 1 there)")


def settle_config(config: dict[str, Any]) -> dict[str, Any]:
    """What muon.Muon needs of a DeepSpeed config (a dict), checked and set in
    place; returns it. A known ZeRO stage; no bf16 or fp16 at stage 0 (see
    initialize); at stage 3 one sub-group per param group (muon.Muon steps a
    group's matrices together; DeepSpeed's default splits groups above 1e9
    elements), "sub_group_size" set when unset; DeepSpeed's consent to a client
    optimizer ("zero_allow_untested_optimizer"); under optimizer offload
    "zero_force_ds_cpu_optimizer" false (DeepSpeed refuses a client optimizer
    otherwise, and Accelerate replaces it by DeepSpeed's CPU Adam without a
    word: Adam would train the matrices); no elastic checkpoints and no
    universal checkpoint loading (neither carries muon.Muon's state).
    muon.deepspeed.initialize applies it to a copy of its config;
    muon.transformers to the config Accelerate hands DeepSpeed."""
    zero_config = dict(config.get("zero_optimization") or {})
    stage = zero_config.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError("muon.deepspeed: zero_optimization.stage is %r; DeepSpeed's stages are "
                         "0, 1, 2 and 3" % (stage,))
    half = [k for k in ("bf16", "fp16") if (config.get(k) or {}).get("enabled", False)]
    if stage == 0 and half:
        raise ValueError("muon.deepspeed: %s at ZeRO stage 0 wraps the optimizer in DeepSpeed's "
                         "FP16_UnfusedOptimizer, which steps it once with zero gradients when it "
                         "is built (weight decay would shrink every weight before training); set "
                         "zero_optimization.stage 1 (the same training, the optimizer state "
                         "partitioned), or train in fp32 at stage 0" % half[0])
    if zero_config.get("elastic_checkpoint", False):
        raise ValueError(_ELASTIC)
    if (config.get("checkpoint") or {}).get("load_universal", False):
        raise ValueError(_UNIVERSAL)
    offload = (zero_config.get("offload_optimizer") or {}).get("device", "none")
    if offload not in (None, "none"):
        if config.get("zero_force_ds_cpu_optimizer", False) is True:
            raise ValueError("muon.deepspeed: \"zero_force_ds_cpu_optimizer\": true with "
                             "zero_optimization.offload_optimizer replaces muon.Muon by "
                             "DeepSpeed's CPU Adam (Accelerate does it silently); set it false: "
                             "muon.Muon steps the offloaded partitions on the host itself")
        config["zero_force_ds_cpu_optimizer"] = False
    if stage == 3 and "sub_group_size" not in zero_config:
        zero_config["sub_group_size"] = 10 ** 15
    config["zero_optimization"] = zero_config
    config.setdefault("zero_allow_untested_optimizer", True)
    return config


def _refuse_universal_loading(engine, zero, stage3):
    """Refused at bind when the engine's config asks for universal loading;
    for a ZeRO optimizer bound without its engine, its universal loader refuses
    when called (before it writes the optimizer's state)."""
    if engine is not None and getattr(getattr(engine, "_config", None),
                                      "load_universal_checkpoint", False):
        raise ValueError(_UNIVERSAL)

    def refuse(*args, **kwargs):
        raise ValueError(_UNIVERSAL)
    name = ("load_hp_checkpoint_state_from_checkpoint_dir_stage3" if stage3
            else "load_hp_checkpoint_state_from_checkpoint_dir")
    if hasattr(zero, name):
        setattr(zero, name, refuse)


def zero_partition_segments(zero: Any, group_index: int, rank: int,
                            world_size: int) -> list[Segment]:
    """The Segments of group `group_index`'s partition on data-parallel rank
    `rank` of `world_size`: every param of the group, in the flat buffer's
    order, with its range [start, start + length) in that partition (empty
    where the partition holds none of it), named by DeepSpeed's param names."""
    g = group_index
    if _stage3(zero):
        return _stage3_segments(zero, g, rank, world_size)
    if hasattr(zero, "round_robin_bit16_groups"):
        # The buffer's order is the round-robin one (the group's own order unless
        # round_robin_gradients is on); offsets include parameter_alignment's padding.
        params = zero.round_robin_bit16_groups[g]
        flat = zero.bit16_groups_flat[g]
        metas = getattr(zero, "round_robin_bit16_meta", None)
        shapes = [tuple(m.shape) for m in metas[g]] if metas else [tuple(p.shape) for p in params]
        offsets = getattr(zero, "round_robin_bit16_offsets", None)
        offsets = list(offsets[g]) if offsets else None
    else:
        params = zero.bf16_groups[g]
        flat = zero.bf16_groups_flat[g]
        shapes = [tuple(p.shape) for p in params]
        offsets = None
    if offsets is None:
        offsets, at = [], 0
        for s in shapes:
            offsets.append(at)
            at += math.prod(s)
    size = flat.numel() // world_size
    if size * world_size != flat.numel():
        raise ValueError("muon.deepspeed: group %d's flat buffer (%d elements) does not split "
                         "evenly over %d ranks; this DeepSpeed lays partitions out in a way "
                         "muon.deepspeed does not know" % (g, flat.numel(), world_size))
    lo, hi = rank * size, (rank + 1) * size
    names = getattr(zero, "param_names", None) or {}
    out = []
    for k, (p, shape, at) in enumerate(zip(params, shapes, offsets)):
        name = names.get(p, "group%d.flat%d" % (g, k))
        first, last = max(at, lo), min(at + math.prod(shape), hi)
        if first < last:
            out.append(Segment(name, shape, first - at, last - first, first - lo))
        else:
            out.append(Segment(name, shape, 0, 0, 0))
    return out


def _stage3_segments(zero, sub_group, rank, world_size):
    """ZeRO-3: every param of a sub-group is split on its own, rank r holding
    elements [r*c, r*c + c) of the flattened param (c = ceil(numel / world),
    the last rank's piece padded), and the sub-group's flat fp32 partition is
    those pieces, padded, one after another."""
    names = getattr(zero, "param_names", None) or {}
    out, at = [], 0
    for k, p in enumerate(zero.fp16_groups[sub_group]):
        c = p.partition_numel()
        if c * world_size < p.ds_numel:
            raise ValueError("muon.deepspeed: %s's ZeRO-3 partitions (%d elements on each of %d "
                             "ranks) do not cover its %d elements; this DeepSpeed partitions in "
                             "a way muon.deepspeed does not know"
                             % (names.get(p, "a param"), c, world_size, p.ds_numel))
        start = rank * c
        length = max(0, min(c, p.ds_numel - start))
        name = names.get(p, "subgroup%d.param%d" % (sub_group, k))
        out.append(Segment(name, tuple(p.ds_shape), start if length else 0, length, at))
        at += c
    flat = zero.fp32_partitioned_groups_flat[sub_group]
    if at != flat.numel():
        raise ValueError("muon.deepspeed: ZeRO-3 sub-group %d's fp32 partition has %d elements, "
                         "its params' pieces %d; this DeepSpeed lays partitions out in a way "
                         "muon.deepspeed does not know" % (sub_group, flat.numel(), at))
    return out


def _check_stage3(zero):
    """What ZeRO-3 must be for muon.Muon: one sub-group per param group (the
    client steps a param group's matrices together), no MiCS shard groups."""
    if "MiCS" in type(zero).__name__:
        raise ValueError("muon.deepspeed: MiCS (mics_shard_size) partitions over shard groups "
                         "that muon.deepspeed does not map; unset mics_shard_size")
    owner = zero.sub_group_to_group_id
    groups = [owner[s] for s in range(len(zero.fp16_groups))]
    if len(set(groups)) != len(groups):
        per_group = {}
        for s, g in enumerate(groups):
            per_group[g] = per_group.get(g, 0) + sum(p.partition_numel()
                                                     for p in zero.fp16_groups[s])
        raise ValueError("muon.deepspeed: zero_optimization.sub_group_size splits the param "
                         "groups into %d sub-groups; muon.Muon steps a group's matrices "
                         "together. Set \"sub_group_size\" above the largest group's partition "
                         "(%d elements per rank here), or leave it unset under "
                         "muon.deepspeed.initialize" % (len(groups), max(per_group.values())))


_LOCAL_EXPERT = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..*)$")


def _is_expert(param):
    """DeepSpeed's MoE marks expert params: allreduce False, group_name its
    expert-parallel group's name ("ep_size_2")."""
    return getattr(param, "allreduce", True) is False and hasattr(param, "group_name")


class _Experts:
    """The MoE layout of this rank: the expert-parallel and
    expert-data-parallel groups of the experts' one group name, and each
    expert param's global name (DeepSpeed's name with the local expert index
    made global)."""

    def __init__(self, named_experts, dist):
        from deepspeed.utils import groups
        kinds = sorted({p.group_name for _, p in named_experts})
        if len(kinds) != 1:
            raise ValueError("muon.deepspeed: the model's experts use %d expert-parallel sizes "
                             "(%s); muon.deepspeed maps MoE with one (give every MoE layer the "
                             "same ep_size)" % (len(kinds), ", ".join(kinds)))
        # (DeepSpeed's only accessors of these groups, which its engine uses.)
        self.ep_group = groups._get_expert_parallel_group(kinds[0])
        self.edp_group = groups._get_expert_data_parallel_group(kinds[0])
        ep_rank = dist.get_rank(self.ep_group)
        local = {}  # the name around the local index -> local experts seen
        for name, _ in named_experts:
            m = _LOCAL_EXPERT.match(name)
            if m is None:
                raise ValueError("muon.deepspeed: expert param '%s' is not named as DeepSpeed's "
                                 "MoE names its experts (...deepspeed_experts.<i>....), so its "
                                 "global expert id is unknown" % name)
            key = (m.group(1), m.group(3))
            local[key] = max(local.get(key, 0), int(m.group(2)) + 1)
        self.names = {}  # id(param) -> global name
        for name, p in named_experts:
            m = _LOCAL_EXPERT.match(name)
            count = local[(m.group(1), m.group(3))]
            self.names[id(p)] = "%s%d%s" % (m.group(1), ep_rank * count + int(m.group(2)),
                                            m.group(3))
        self.by_local_name = {name: self.names[id(p)] for name, p in named_experts}


class DeepSpeedConfig(ProcessGroupConfig):
    """What create_deepspeed_config returns: a muon.DistributedConfig whose FSDP
    group is ZeRO's data-parallel group, known once bound to the ZeRO optimizer."""

    def __init__(self, verify_replicas, async_gpu_parallelism, prefetch_count):
        ProcessGroupConfig.__init__(
            self, {"fsdp": None}, fsdp_mode="flat", verify_replicas=verify_replicas,
            async_gpu_parallelism=async_gpu_parallelism, prefetch_count=prefetch_count,
            gather_order=("fsdp", "tp"))
        self._zero = None      # the ZeRO optimizer (stages 1-3)
        self._bound = False
        self._segments = {}  # group index -> Segments of this rank's partition
        self._experts = None   # MoE: _Experts
        self._expert_segments = set()  # MoE at ZeRO-1/2: the experts' global names
        self._source = None    # bind_when_built's engine source

    def bind(self, zero_optimizer: Any) -> DeepSpeedConfig:
        """Binds the config to the engine deepspeed.initialize built (or, at
        stages 1-3, to its ZeRO optimizer, engine.optimizer)."""
        from ._config import torch_and_dist
        zero = zero_optimizer
        engine = None
        if hasattr(zero, "module") and hasattr(zero, "optimizer"):
            engine, zero = zero, zero.optimizer
        stage3 = _stage3(zero)
        _refuse_universal_loading(engine, zero, stage3)
        if not (stage3 or hasattr(zero, "real_dp_process_group")):
            return self._bind_stage0(engine, zero)
        partitions = _partitions(zero)
        if stage3:
            _check_stage3(zero)
        if getattr(zero, "elastic_checkpoint", False):
            # DeepSpeed's elastic save reads the base optimizer's state by the
            # flat partitions, which muon.Muon's state is not keyed by: it would
            # be saved empty, and the load would fail later (on some ranks).
            raise ValueError(_ELASTIC)
        # The group each partition is split over (ZeRO-3: one per sub-group).
        groups = [zero.dp_process_group] * len(partitions) if stage3 else \
            list(zero.real_dp_process_group)
        _, dist = torch_and_dist()
        moe = [] if stage3 else [g for g, group in enumerate(zero.optimizer.param_groups)
                                 if group.get("moe")]
        dense = [g for g in range(len(groups)) if g not in moe]
        if any(groups[g] is not groups[dense[0]] for g in dense):
            raise ValueError("muon.deepspeed: the dense param groups are partitioned over "
                             "different data-parallel groups, which muon.deepspeed does not map")
        self._segments = {g: zero_partition_segments(zero, g, dist.get_rank(groups[g]),
                                                     dist.get_world_size(groups[g]))
                          for g in range(len(partitions))}
        self._zero = zero
        if moe:
            return self._bind_moe(zero, groups, moe, dense, dist)
        if stage3:
            # ZeRO-3 puts a sub-group's partition into its param group for the
            # one step() that steps it (and every partition for a checkpoint's
            # save or load) and empties the group after; until the first, the
            # groups hold the model's (partitioned) params. Those are dropped
            # here, so that every step() sees only the partition it steps (a
            # partition stays: bound late, from a checkpoint load).
            self.skip_empty_groups = True
            for group in zero.optimizer.param_groups:
                group["params"] = [p for p in group["params"]
                                   if any(p is part for part in partitions)]
        self._set_groups({"fsdp": groups[0]}, groups[0])
        return self

    def _bind_moe(self, zero, groups, moe, dense, dist):
        """ZeRO-1/2 with MoE param groups: the dense groups' ranges over the whole
        data-parallel group (the world here), each expert's over its
        expert-data-parallel group, on the ranks that hold it."""
        held = getattr(zero, "round_robin_bit16_groups", None) or zero.bf16_groups
        names = getattr(zero, "param_names", None) or {}
        named = [(names.get(p, ""), p) for g in moe for p in held[g] if _is_expert(p)]
        self._experts = _Experts(named, dist)
        for g in moe:
            if groups[g] is not self._experts.edp_group:
                raise ValueError("muon.deepspeed: MoE param group %d is partitioned over a "
                                 "group that is not its experts' expert-data-parallel group; "
                                 "this DeepSpeed lays MoE out in a way muon.deepspeed does not "
                                 "know" % g)
            for seg in self._segments[g]:
                seg.name = self._experts.by_local_name.get(seg.name, seg.name)
                self._expert_segments.add(seg.name)
        self._set_groups({"ep": self._experts.ep_group, "fsdp": self._experts.edp_group},
                         groups[dense[0]] if dense else dist.group.WORLD)
        return self

    def _bind_stage0(self, engine, wrapper):
        """ZeRO stage 0: DeepSpeed averages the gradients over the data-parallel
        group and hands the client the whole params (fp32), or whole fp32 copies
        of them (FP16_UnfusedOptimizer under bf16 or fp16): replicated data
        parallelism, each matrix orthogonalized by one rank of the group."""
        if engine is None or engine.zero_optimization_stage() != 0:
            raise ValueError(
                "muon.deepspeed: the optimizer to bind is a %s, not DeepSpeed's ZeRO optimizer "
                "(DeepSpeedZeroOptimizer, BF16_Optimizer or DeepSpeedZeroOptimizer_Stage3: "
                "engine.optimizer under zero_optimization.stage 1, 2 or 3); under stage 0 bind "
                "the engine itself: config.bind(engine)" % type(wrapper).__name__)
        if getattr(wrapper, "fused", False) or hasattr(wrapper, "fp32_groups_flat"):
            raise ValueError("muon.deepspeed: DeepSpeed's fused fp16 optimizer hands the client "
                             "one flat buffer of every param, which muon.deepspeed does not map "
                             "at stage 0; use bf16, or zero_optimization.stage 1, 2 or 3")
        from ._config import torch_and_dist
        named = [(n, p) for n, p in engine.module.named_parameters() if _is_expert(p)]
        if not named:
            self._set_groups({"dp": engine.seq_data_parallel_group},
                             engine.seq_data_parallel_group)
            return self
        # MoE: dense params replicated over the expert-parallel and the
        # expert-data-parallel groups, an expert over the latter only.
        self._experts = _Experts(named, torch_and_dist()[1])
        self._set_groups({"ep": self._experts.ep_group, "dp": self._experts.edp_group},
                         engine.seq_data_parallel_group)
        return self

    def _set_groups(self, groups, world):
        """Bound: the groups by role and the world the library steps over."""
        self._bound = True
        self.groups = dict(groups)
        self.state["groups"] = dict(groups)
        self.world_pg = world
        self.state["world_pg"] = world

    def _name(self, default_name, param):
        """Stage 0 with MoE: an expert (the model's own param) is named by its
        global expert id, the same on its replicas, distinct across experts."""
        experts = self._experts
        if experts is not None and id(param) in experts.names:
            return "%s.%s" % (default_name, experts.names[id(param)])
        return ProcessGroupConfig._name(self, default_name, param)

    def _ep_experts(self, job, good):
        """MoE at ZeRO-1/2: DeepSpeed says which params are experts (their
        ranges' values differ across ranks, so replicas are not compared)."""
        if not self._expert_segments:
            return ProcessGroupConfig._ep_experts(self, job, good)
        for e in good:
            e.expert = e.segment is not None and e.segment.name in self._expert_segments
        return good

    def _steps(self, roles, e):
        """MoE at ZeRO-1/2: an expert's ranges over its expert-data-parallel
        group ("fsdp"), a dense param's over the whole data-parallel group (the
        world)."""
        if not self._expert_segments:
            return ProcessGroupConfig._steps(self, roles, e)
        return [("flat", "fsdp" if e.expert else "world", e.fsdp[1:])]

    def bind_when_built(self, engine_source: Callable[[], Any]) -> None:
        """Binds the config late, to the engine engine_source() returns once
        it is built (None before): at the first question about the layout (a
        checkpoint load, the first step) or at bind_if_built(). For hosts that
        build the engine out of the caller's reach (Hugging Face's Trainer)."""
        self._source = engine_source

    def bind_if_built(self) -> None:
        """Binds to engine_source()'s engine when there is one and the config is
        not bound yet (ZeRO-3: before the first step, which must see every
        param group emptied)."""
        if not self._bound and self._source is not None:
            engine = self._source()
            if engine is not None:
                self.bind(engine)

    def flat_segments(self, name: str, param: torch.Tensor) -> list[Segment] | None:
        import torch
        if not self._bound and isinstance(param, torch.nn.Parameter):
            return None  # the model's own param, as given to muon.Muon (not a partition)
        # DeepSpeed's partitions are tensors it made, asked about at a checkpoint
        # load or a step: unbound, they would pass for plain params and their
        # state would stay unmapped.
        self.bind_if_built()
        if not self._bound:
            raise RuntimeError(_UNBOUND)
        if self._zero is None:
            return None
        for g, part in enumerate(_partitions(self._zero)):
            if part is param:
                return self._segments[g]
        return None

    def global_ndim(self, name: str, param: torch.Tensor) -> int:
        # A param partitioned by ZeRO-3 (zero.Init, or after initialize) is
        # empty; DeepSpeed keeps its shape in ds_shape.
        shape = getattr(param, "ds_shape", None)
        if shape is not None:
            return len(shape)
        return ProcessGroupConfig.global_ndim(self, name, param)

    def attach(self, optimizer: Optimizer, named_params: NamedParams) -> None:
        self.bind_if_built()
        if not self._bound:
            raise RuntimeError(_UNBOUND)
        return ProcessGroupConfig.attach(self, optimizer, named_params)


def create_deepspeed_config(*, verify_replicas: bool = True, async_gpu_parallelism: bool = True,
                            prefetch_count: int = 1) -> DeepSpeedConfig:
    """A muon.DistributedConfig for muon.Muon as DeepSpeed's client optimizer
    under any ZeRO stage (see the module's docstring)."""
    return DeepSpeedConfig(verify_replicas, async_gpu_parallelism, prefetch_count)


def initialize(*, optimizer: Muon, config: dict[str, Any] | str, **kwargs: Any) -> tuple:
    """deepspeed.initialize(optimizer=optimizer, config=config, **kwargs) for a
    muon.Muon with create_deepspeed_config(): settles a copy of the config
    (settle_config: "zero_allow_untested_optimizer", which DeepSpeed asks of
    client optimizers, and the refusals) and binds the muon config to the
    engine it builds. Returns what deepspeed.initialize returns."""
    import deepspeed
    cfg = getattr(optimizer, "distributed_config", None)
    if not isinstance(cfg, DeepSpeedConfig):
        raise TypeError("muon.deepspeed.initialize: optimizer must be a muon.Muon built with "
                        "distributed_config=muon.deepspeed.create_deepspeed_config()")
    if isinstance(config, str):
        with open(config) as f:
            config = dict(json.load(f))
    else:
        config = dict(config)
    settle_config(config)
    out = deepspeed.initialize(optimizer=optimizer, config=config, **kwargs)
    cfg.bind(out[0])  # the engine: stage 0's data-parallel group is the engine's
    return out
