"""muon.Muon inside DeepSpeed's ZeRO stage 1 and 2.

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

muon.deepspeed.initialize is deepspeed.initialize with
"zero_allow_untested_optimizer" set and the config bound to the ZeRO
optimizer it builds; with deepspeed.initialize itself, call
config.bind(engine.optimizer) before the first step. Not mapped: ZeRO stage
3 (params partitioned outside the optimizer), MoE expert groups (another
data-parallel group) and DeepSpeed's own Muon (its `use_muon` param flag
must stay unset: it would orthogonalize the gradients itself; muon.Muon
refuses a parameter that carries it), and elastic checkpoints (they would save
muon.Muon's state empty: refused at bind). muon.Muon handed to deepspeed.initialize
without this config raises at step() rather than step ZeRO's flat partitions
as AdamW.
"""

import json
import math

from ._pg_config import _ProcessGroupConfig
from ._flat import Segment

__all__ = ["create_deepspeed_config", "initialize", "zero_partition_segments"]


def _partitions(zero):
    """The fp32 partitions the client optimizer's groups hold, one per group."""
    if hasattr(zero, "single_partition_of_fp32_groups"):   # DeepSpeedZeroOptimizer
        return zero.single_partition_of_fp32_groups
    if hasattr(zero, "fp32_groups_flat_partition"):        # BF16_Optimizer (bf16, stage 1)
        return zero.fp32_groups_flat_partition
    raise ValueError("muon.deepspeed: the optimizer to bind is a %s, not DeepSpeed's ZeRO stage "
                     "1 or 2 optimizer (DeepSpeedZeroOptimizer, BF16_Optimizer: "
                     "engine.optimizer under zero_optimization.stage 1 or 2); stages 0 and 3 "
                     "are not mapped yet" % type(zero).__name__)


def zero_partition_segments(zero, group_index, rank, world_size):
    """The Segments of group `group_index`'s partition on data-parallel rank
    `rank` of `world_size`: every param of the group, in the flat buffer's
    order, with its range [start, start + length) in that partition (empty
    where the partition holds none of it), named by DeepSpeed's param names."""
    g = group_index
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


class DeepSpeedConfig(_ProcessGroupConfig):
    """What create_deepspeed_config returns: a muon.DistributedConfig whose FSDP
    group is ZeRO's data-parallel group, known once bound to the ZeRO optimizer."""

    def __init__(self, verify_replicas, async_gpu_parallelism, prefetch_count):
        _ProcessGroupConfig.__init__(
            self, {"fsdp": None}, None, None, "flat", None, "host_averaged", None,
            verify_replicas, async_gpu_parallelism, prefetch_count, ("fsdp", "tp"))
        self._zero = None
        self._segments = {}  # group index -> Segments of this rank's partition

    def bind(self, zero_optimizer):
        """Binds the config to the ZeRO optimizer deepspeed.initialize built
        (engine.optimizer; an engine is accepted too)."""
        from ._config import _torch
        zero = zero_optimizer
        if not hasattr(zero, "real_dp_process_group") and hasattr(zero, "optimizer"):
            zero = zero.optimizer  # the engine
        partitions = _partitions(zero)
        if getattr(zero, "elastic_checkpoint", False):
            # DeepSpeed's elastic save reads the base optimizer's state by the
            # flat partitions, which muon.Muon's state is not keyed by: it would
            # be saved empty, and the load would fail later (on some ranks).
            raise ValueError("muon.deepspeed: zero_optimization.elastic_checkpoint is on; its "
                             "checkpoints would drop muon.Muon's state (momentum and AdamW "
                             "moments): set \"elastic_checkpoint\": false (the default) and "
                             "resume at another size through muon's own state "
                             "(opt.state_dict() / muon_load_states)")
        groups = list(zero.real_dp_process_group)
        if any(g is not groups[0] for g in groups):
            raise ValueError("muon.deepspeed: the param groups are partitioned over different "
                             "data-parallel groups (MoE expert groups), which muon.deepspeed "
                             "does not map")
        _, dist = _torch()
        rank, size = dist.get_rank(groups[0]), dist.get_world_size(groups[0])
        self._segments = {g: zero_partition_segments(zero, g, rank, size)
                          for g in range(len(partitions))}
        self._zero = zero
        self.groups["fsdp"] = groups[0]
        self.state["groups"]["fsdp"] = groups[0]
        self.world_pg = groups[0]
        self.state["world_pg"] = groups[0]
        return self

    def _flat_segments(self, name, param):
        if self._zero is None:
            return None
        for g, part in enumerate(_partitions(self._zero)):
            if part is param:
                return self._segments[g]
        return None

    def _attach(self, optimizer, named_params):
        if self._zero is None:
            raise RuntimeError("muon.deepspeed: the config is not bound to DeepSpeed's ZeRO "
                               "optimizer; build the engine with muon.deepspeed.initialize, "
                               "or call config.bind(engine.optimizer) after "
                               "deepspeed.initialize")
        return _ProcessGroupConfig._attach(self, optimizer, named_params)


def create_deepspeed_config(*, verify_replicas=True, async_gpu_parallelism=True,
                            prefetch_count=1):
    """A muon.DistributedConfig for muon.Muon as DeepSpeed's client optimizer
    under ZeRO stage 1 or 2 (see the module's docstring)."""
    return DeepSpeedConfig(verify_replicas, async_gpu_parallelism, prefetch_count)


def initialize(*, optimizer, config, **kwargs):
    """deepspeed.initialize(optimizer=optimizer, config=config, **kwargs) for a
    muon.Muon with create_deepspeed_config(): sets
    "zero_allow_untested_optimizer" (DeepSpeed refuses client optimizers it does
    not know otherwise) and binds the config to the ZeRO optimizer. Returns
    what deepspeed.initialize returns."""
    import deepspeed
    cfg = getattr(optimizer, "_config", None)
    if not isinstance(cfg, DeepSpeedConfig):
        raise TypeError("muon.deepspeed.initialize: optimizer must be a muon.Muon built with "
                        "distributed_config=muon.deepspeed.create_deepspeed_config()")
    if isinstance(config, str):
        with open(config) as f:
            config = json.load(f)
    config = dict(config)
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (1, 2):
        what = {0: "ZeRO stage 0 (data parallelism without ZeRO; DeepSpeed's default when "
                   "zero_optimization.stage is absent)",
                3: "ZeRO stage 3 (parameters partitioned too)"}.get(
                    stage, "ZeRO stage %r" % (stage,))
        raise ValueError("muon.deepspeed.initialize: %s is not mapped yet; set "
                         "zero_optimization.stage to 1 or 2 (the same training, the optimizer "
                         "state partitioned)" % what)
    config.setdefault("zero_allow_untested_optimizer", True)
    out = deepspeed.initialize(optimizer=optimizer, config=config, **kwargs)
    cfg.bind(out[1])
    return out
