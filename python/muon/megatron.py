"""muon.Muon over Megatron-core's parallelism: the groups from
megatron.core.parallel_state, each parameter's layout from the attributes
Megatron's parallel layers put on it.

    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, ...)
    model = ...  # ColumnParallelLinear, RowParallelLinear, ... (megatron.core)
    opt = muon.Muon(model.parameters(), lr=0.02,
                    distributed_config=muon.megatron.create_megatron_config(model=model))

A parameter with tensor_model_parallel=True is split over the TP group along
its partition_dim (ColumnParallelLinear: dim 0; RowParallelLinear: dim 1;
VocabParallelEmbedding: dim 0); every other parameter is replicated over TP.
A partition_stride above 1 (interleaved pieces) needs nothing more: Newton-
Schulz commutes with reordering rows or columns, so the pieces orthogonalized
in rank order give each rank exactly its own update. Data parallel (with
context parallel, whose ranks hold replicas too) is a replica group: the host
averages gradients before step(), as Megatron's DDP does; pipeline stages
register their own parameters.

With Megatron's distributed-optimizer layout
(DistributedDataParallel(..., DistributedDataParallelConfig(
use_distributed_optimizer=True), model)), pass the DDP model as `ddp`: each
bucket of its grad buffer is split evenly over the data-parallel ranks, so a
rank owns a flat range of each parameter (DistributedOptimizer's recipe,
read from the buffers: param_index_map, bucket offsets and sizes). muon.Muon
then steps exactly those ranges, as FlatRange pieces of each TP piece over
the data-parallel group (Newton-Schulz once per matrix in the job), reading
the reduce-scattered gradient from param.main_grad, and ends its step with
the DDP model's param all-gather, which is what DistributedOptimizer.step
does for Adam. It replaces DistributedOptimizer, which admits Adam only:

    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(
        use_distributed_optimizer=True), model)
    opt = muon.Muon(ddp.parameters(), lr=0.02,
                    distributed_config=muon.megatron.create_megatron_config(ddp=ddp))
    ddp.zero_grad_buffer(); loss.backward(); ddp.finish_grad_sync(); opt.step()

Fused QKV weights are split as Megatron-core's own Muon splits them
(OptimizerConfig.muon_split_qkv=True, its default): every attention layer's
linear_qkv.weight, laid out per query group as q_per_group * kv_channels
query rows, kv_channels key rows and kv_channels value rows, is
orthogonalized as three matrices (the queries of every group one matrix, the
keys one, the values one), each scaled for its own shape. The layers are
found in the model: pass it as model= (with ddp= it is the DDP model's);
split_qkv=False orthogonalizes each fused QKV whole.

Not mapped yet: expert parameters (allreduce=False, Megatron's MoE, also
its expert-parallel buffers); an expert parameter fails at the first step
naming it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ._flat import Segment
from ._pg_config import ProcessGroupConfig, create_processgroup_config

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["create_megatron_config", "megatron_tp_dim", "megatron_flat_ranges",
           "megatron_qkv_splits"]


def megatron_qkv_splits(model: Any) -> dict[torch.Tensor, tuple[int, list[int]]]:
    """{param: (0, [q_per_group * kv_channels, kv_channels, kv_channels])} for
    the fused QKV weight (linear_qkv.weight) of every attention layer of
    `model` (a module, or a list of model chunks, DDP-wrapped or not): the
    split_sizes Megatron-core's Muon splits it with (muon_split_qkv), read
    from each layer's TransformerConfig. Dict keys are the param objects."""
    out = {}
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        module: Any = getattr(chunk, "module", chunk)
        for m in module.modules():
            qkv, cfg = getattr(m, "linear_qkv", None), getattr(m, "config", None)
            if cfg is None:
                continue
            w = getattr(qkv, "weight", None)
            heads = getattr(cfg, "num_attention_heads", None)
            if w is None or heads is None or w.dim() != 2:
                continue
            groups = getattr(cfg, "num_query_groups", None) or heads
            kv = cfg.kv_channels
            out[w] = (0, [heads // groups * kv, kv, kv])
    return out


def megatron_tp_dim(param: torch.Tensor) -> int | None:
    """The dim a Megatron parameter is split along over the TP group, or None
    (replicated). ValueError for an expert parameter (not mapped yet)."""
    if getattr(param, "allreduce", True) is False:
        raise ValueError("it is a Megatron expert parameter (allreduce=False), which "
                         "muon.megatron does not map yet; give experts to "
                         "muon.create_processgroup_config(ep_pg=..., names=...)")
    if getattr(param, "tensor_model_parallel", False):
        return int(getattr(param, "partition_dim"))
    return None


def _parallel_state():
    try:
        from megatron.core import parallel_state
    except ImportError as err:
        raise RuntimeError("muon.megatron.create_megatron_config: megatron.core is not "
                           "importable (%s); install megatron-core, or pass tp_group, "
                           "dp_group and pp_group" % err) from err
    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("muon.megatron.create_megatron_config: call megatron.core."
                           "parallel_state.initialize_model_parallel first (or pass "
                           "tp_group, dp_group and pp_group)")
    return parallel_state


def megatron_flat_ranges(ddp: Any,
                         dp_rank: int | None = None) -> dict[torch.Tensor, tuple[int, int]]:
    """{param: (start, length)}: the range of each parameter's row-major
    flattening that data-parallel rank `dp_rank` (default: this one) owns under
    Megatron's distributed optimizer, for every dense parameter of the DDP
    model(s) `ddp` (length 0 where the rank owns none of it). Megatron's rule:
    bucket b covers [offset, offset + numel) of its buffer, rank r owns the
    r-th of dp equal pieces of it, and buffer.param_index_map places each
    parameter in the buffer."""
    out = {}
    for chunk in ddp if isinstance(ddp, (list, tuple)) else [ddp]:
        if not getattr(getattr(chunk, "ddp_config", None), "use_distributed_optimizer", False):
            raise ValueError("muon.megatron: the DDP model was not built with "
                             "DistributedDataParallelConfig(use_distributed_optimizer=True)")
        if getattr(chunk, "expert_parallel_buffers", None):
            raise ValueError("muon.megatron: expert parameters (Megatron's MoE) are not "
                             "mapped yet")
        for buffer in chunk.buffers:
            group = buffer.data_parallel_group
            n = group.size()
            r = group.rank() if dp_rank is None else dp_rank
            for b, bucket in enumerate(buffer.buckets):
                size = bucket.grad_data.numel()
                if size % n:
                    raise ValueError("muon.megatron: bucket %d (%d elements) does not split "
                                     "evenly over %d data-parallel ranks" % (b, size, n))
                lo = bucket.offset + r * (size // n)
                hi = lo + size // n
                for param, (start, end, bucket_id) in buffer.param_index_map.items():
                    if bucket_id != b:
                        continue
                    first, last = max(start, lo), min(end, hi)
                    out[param] = (first - start, last - first) if first < last else (0, 0)
    return out


class MegatronDistOptConfig(ProcessGroupConfig):
    """What create_megatron_config(ddp=...) returns: each parameter of the DDP
    model(s) is a flat buffer (its own flattening) of which this rank steps
    the range Megatron's distributed optimizer gives it."""

    flat_grad_attr = "main_grad"

    def __init__(self, chunks, tp_group, pp_group, **kwargs):
        ranges = megatron_flat_ranges(chunks)
        groups = {b.data_parallel_group for c in chunks for b in c.buffers}
        if len(groups) != 1:
            raise ValueError("muon.megatron: the DDP buffers use %d data-parallel groups; "
                             "one is mapped" % len(groups))
        dp_group = groups.pop()
        names = {}
        for c in chunks:
            for name, p in c.module.named_parameters():
                names.setdefault(p, name)
        ProcessGroupConfig.__init__(
            self, {"fsdp": dp_group, "tp": tp_group, "pp": pp_group},
            tp_dims=lambda name, param: megatron_tp_dim(getattr(param, "_muon_buffer", param)),
            fsdp_mode="flat", verify_replicas=kwargs["verify_replicas"],
            async_gpu_parallelism=kwargs["async_gpu_parallelism"],
            prefetch_count=kwargs["prefetch_count"], gather_order=("fsdp", "tp"))
        self._chunks = list(chunks)
        self._ranges = ranges
        self._names = names
        self.param_splits = {id(p): v for p, v in megatron_qkv_splits(self._chunks).items()} \
            if kwargs["split_qkv"] else {}

    def flat_segments(self, name: str, param: torch.Tensor) -> list[Segment] | None:
        r = self._ranges.get(param)
        if r is None:
            return None
        start, length = r
        return [Segment(self._names.get(param, name), tuple(param.shape), start, length,
                        start)]

    def after_step(self) -> None:
        # What DistributedOptimizer does after the inner step: every rank's
        # updated ranges all-gathered into the whole params.
        for chunk in self._chunks:
            chunk.start_param_sync(force_sync=True)


def create_megatron_config(*, ddp: Any = None, tp_group: ProcessGroup | None = None,
                           dp_group: ProcessGroup | None = None,
                           pp_group: ProcessGroup | None = None,
                           replicated_mode: str = "host_averaged", verify_replicas: bool = True,
                           async_gpu_parallelism: bool = True, prefetch_count: int = 1,
                           model: Any = None, split_qkv: bool = True) -> ProcessGroupConfig:
    """A muon.DistributedConfig for a model built of Megatron-core layers.

    The groups default to parallel_state's: the tensor-model-parallel group,
    the data-parallel group with context parallel, the pipeline group (only
    when there is more than one stage). Give all three to use other groups (or
    no megatron.core at all). replicated_mode="zero2": the library averages
    the raw gradients over DP itself and keeps momentum on each matrix's owner
    only. The rest: as muon.create_processgroup_config, which this calls with
    tp_dims read by megatron_tp_dim.

    ddp: Megatron's DistributedDataParallel model (or a list of its chunks)
    built with use_distributed_optimizer=True: the distributed optimizer's
    layout (see the module's docstring); its buffers give the data-parallel
    group, and dp_group and replicated_mode do not apply.

    model: the model (or its chunks) whose attention layers' fused QKV
    weights split_qkv splits as Megatron-core's Muon does (see the module's
    docstring); with ddp= the DDP model's. split_qkv=False: orthogonalize
    them whole. A param group's own split_sizes wins over this.
    """
    if tp_group is None or (dp_group is None and ddp is None):
        ps = _parallel_state()
        tp_group = tp_group if tp_group is not None else \
            ps.get_tensor_model_parallel_group()
        if dp_group is None and ddp is None:
            dp_group = ps.get_data_parallel_group(with_context_parallel=True)
        if pp_group is None and ps.get_pipeline_model_parallel_world_size() > 1:
            pp_group = ps.get_pipeline_model_parallel_group()
    if ddp is not None:
        if dp_group is not None or replicated_mode != "host_averaged":
            raise ValueError("muon.megatron.create_megatron_config: with ddp=, the data-parallel "
                             "group is the DDP buffers' and the ranges are sharded: leave "
                             "dp_group and replicated_mode unset")
        chunks = list(ddp) if isinstance(ddp, (list, tuple)) else [ddp]
        return MegatronDistOptConfig(chunks, tp_group, pp_group,
                                     verify_replicas=verify_replicas,
                                     async_gpu_parallelism=async_gpu_parallelism,
                                     prefetch_count=prefetch_count, split_qkv=split_qkv)
    if split_qkv and model is None and ddp is None:
        warnings.warn("muon.megatron.create_megatron_config: no model= given, so fused QKV "
                      "weights are orthogonalized whole, not split into Q, K and V as "
                      "Megatron-core's Muon does by default (muon_split_qkv); pass model= "
                      "(or split_qkv=False to keep them whole and silence this)", UserWarning,
                      stacklevel=2)
    config = create_processgroup_config(
        tp_pg=tp_group, dp_pg=dp_group, pp_pg=pp_group,
        tp_dims=lambda name, param: megatron_tp_dim(param),
        replicated_mode=replicated_mode, verify_replicas=verify_replicas,
        async_gpu_parallelism=async_gpu_parallelism, prefetch_count=prefetch_count)
    if split_qkv and model is not None:
        config.param_splits = {id(p): v for p, v in megatron_qkv_splits(model).items()}
    return config
