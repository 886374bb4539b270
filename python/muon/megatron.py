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

Mixture-of-experts layers (Megatron-core's MoE: SequentialMLP's local
experts, TEGroupedMLP's per-expert weights) are found in the model given as
model=: each expert is one matrix per weight, held by one expert-parallel
rank, split over the expert tensor-parallel group along its partition_dim and
replicated over the expert data-parallel group (parallel_state's expert
groups; Megatron's DDP reduces its gradients there). It is named by its global
expert id (expert-parallel rank * num_local_experts + local index, as
Megatron's own checkpoints number it), so its replicas agree and experts
differ. The expert groups may differ from the dense ones (an expert tensor-
parallel size other than the TP size, expert_tensor_parallel_size=1 being
common): the dense params are laid out over TP and DP, the experts over
their own groups, in one job. With expert parallel or an expert TP size
other than the TP size, model= is required (an expert read as a dense TP
piece would be put together wrongly); an expert parameter (allreduce=False)
that model= does not reach is refused at the first step, naming it. Under
ddp= with expert parallel, the experts' ranges are those of Megatron's
expert-parallel buffers, split over the expert data-parallel group (an
expert TP size other than the TP size without expert parallel is refused
there). Not mapped: the legacy GroupedMLP (several experts in one weight;
use SequentialMLP or TEGroupedMLP).
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any

from ._config import is_dtensor, require_dist
from ._flat import Segment
from ._megatron_attrs import experts_laid_out_apart, megatron_attr_tp_dim
from ._pg_config import ProcessGroupConfig
from ._pg_job import Job

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["create_megatron_config", "megatron_tp_dim", "megatron_flat_ranges",
           "megatron_qkv_splits", "megatron_experts", "muon_kwargs", "param_groups",
           "QkClip"]

# Megatron-core's muon_scale_mode (Emerging-Optimizers' get_muon_scale_factor)
# as muon.Muon's adjust_lr_fn, and its muon_fp32_matmul_prec as ns_dtype.
_SCALE_MODES = {"spectral": "spectral", "shape_scaling": "original",
                "unit_rms_norm": "spectral_unclamped"}
_MATMUL_PRECISIONS = {"medium": "bf16", "high": "fp32", "highest": "fp32"}


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
    """The dim a Megatron parameter is split along over its tensor-parallel
    group (an expert's: the expert tensor-parallel group), or None
    (replicated)."""
    return megatron_attr_tp_dim(param)


def _dense_tp_dim(param: torch.Tensor) -> int | None:
    """megatron_tp_dim of a param laid out over the dense groups; ValueError
    for an expert parameter, which belongs to the expert groups."""
    if getattr(param, "allreduce", True) is False:
        raise ValueError("it is a Megatron expert parameter (allreduce=False) that "
                         "create_megatron_config did not find as an expert: pass the model "
                         "holding it as model= (its MoE layers: SequentialMLP or "
                         "TEGroupedMLP experts)")
    return megatron_tp_dim(param)


_TE_EXPERT = re.compile(r"^(.*\.(?:weight|bias))(\d+)$")


def megatron_experts(model: Any) -> dict[torch.Tensor, str]:
    """{param: name}: every parameter of the MoE experts of `model` (a module,
    or a list of model chunks, DDP-wrapped or not), named by its module path
    with the expert's global id (expert-parallel rank * num_local_experts +
    local index): SequentialMLP's local_experts.<id>.<...>, TEGroupedMLP's
    <linear>.weight<id>. The same on every rank holding a piece of the
    expert, different for different experts. Dict keys are the param
    objects. ValueError for the legacy GroupedMLP (its weights hold several
    experts each)."""
    from megatron.core.transformer.moe import experts as moe
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    out = {}
    for c, chunk in enumerate(chunks):
        module: Any = getattr(chunk, "module", chunk)
        prefix = "chunk%d." % c if len(chunks) > 1 else ""
        for path, m in module.named_modules():
            if not isinstance(m, (moe.SequentialMLP, moe.TEGroupedMLP, moe.GroupedMLP)):
                continue
            local = m.num_local_experts
            first = m.ep_group.rank() * local  # Megatron's checkpoints number them so
            path = prefix + (path + "." if path else "")
            if isinstance(m, moe.SequentialMLP):  # one MLP per local expert
                for i, expert in enumerate(m.local_experts):
                    for name, p in expert.named_parameters():
                        out[p] = "%slocal_experts.%d.%s" % (path, first + i, name)
                continue
            if isinstance(m, moe.GroupedMLP):
                raise ValueError("muon.megatron: %s is Megatron's legacy GroupedMLP, whose "
                                 "weight1 and weight2 hold all %d local experts side by side; "
                                 "build the MoE layer with SequentialMLP (moe_grouped_gemm="
                                 "False) or TEGroupedMLP (TransformerEngine), whose weights "
                                 "are one expert each" % (path.rstrip(".") or "the model",
                                                          local))
            for name, p in m.named_parameters():  # TEGroupedMLP: weight<i>, bias<i>
                found = _TE_EXPERT.match(name)
                if found is None:
                    raise ValueError("muon.megatron: expert param '%s%s' is not named as "
                                     "TEGroupedMLP names its experts (<linear>.weight<i>), so "
                                     "its global expert id is unknown" % (path, name))
                out[p] = "%s%s%d" % (path, found.group(1), first + int(found.group(2)))
    return out


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


def muon_kwargs(config: Any) -> dict[str, Any]:
    """muon.Muon's options for Megatron-core's OptimizerConfig `config`, the
    values get_megatron_muon_optimizer gives its Muon and its Adam: lr,
    weight_decay; momentum (muon_momentum), nesterov (muon_use_nesterov),
    ns_steps (muon_num_ns_steps), adjust_lr_fn (muon_scale_mode: "spectral"
    -> "spectral", "shape_scaling" -> "original", "unit_rms_norm" ->
    "spectral_unclamped"), extra_scale_factor (muon_extra_scale_factor),
    ns_dtype (muon_fp32_matmul_prec: "medium" -> "bf16", "high" and
    "highest" -> "fp32"); adamw_betas (adam_beta1, adam_beta2), adamw_eps
    (adam_eps). Megatron's Muon keeps an exponential moving average of the
    gradients (lerp by 1 - momentum), torch's and libmuon's their sum: the
    same direction, by the constant factor 1 - momentum that Newton-Schulz's
    normalization takes out. Every matrix is orthogonalized whole, as
    muon_tp_mode "duplicated" and "distributed" do; Megatron's default
    "blockwise" (each TP piece alone) is not reproduced (a UserWarning says
    so). muon_split_qkv goes to create_megatron_config(split_qkv=...)."""
    mode = getattr(config, "muon_scale_mode", "spectral")
    if mode not in _SCALE_MODES:
        raise ValueError("muon.megatron.muon_kwargs: muon_scale_mode %r is not one of %s"
                         % (mode, sorted(_SCALE_MODES)))
    precision = getattr(config, "muon_fp32_matmul_prec", "medium")
    if precision not in _MATMUL_PRECISIONS:
        raise ValueError("muon.megatron.muon_kwargs: muon_fp32_matmul_prec %r is not one of %s"
                         % (precision, sorted(_MATMUL_PRECISIONS)))
    if getattr(config, "muon_tp_mode", "duplicated") == "blockwise":
        warnings.warn("muon.megatron.muon_kwargs: muon_tp_mode='blockwise' orthogonalizes each "
                      "TP piece of a matrix on its own; libmuon orthogonalizes every matrix "
                      "whole (as 'duplicated' and 'distributed' do)", UserWarning, stacklevel=2)
    return dict(lr=config.lr, weight_decay=config.weight_decay, momentum=config.muon_momentum,
                nesterov=bool(config.muon_use_nesterov), ns_steps=int(config.muon_num_ns_steps),
                adjust_lr_fn=_SCALE_MODES[mode],
                extra_scale_factor=float(config.muon_extra_scale_factor),
                ns_dtype=_MATMUL_PRECISIONS[precision],
                adamw_betas=(config.adam_beta1, config.adam_beta2), adamw_eps=config.adam_eps)


def param_groups(model: Any, config: Any) -> list[dict[str, Any]]:
    """muon.Muon's param groups for `model` (a module or a list of model
    chunks, DDP-wrapped or not) under Megatron-core's OptimizerConfig
    `config`: Megatron's own groups (megatron.core.optimizer's
    _get_param_groups: wd_mult, lr_mult, max_lr, min_lr, is_expert_parallel)
    each cut as get_megatron_muon_optimizer cuts them, the 2-D params that
    are not an embedding's or the output layer's
    (is_embedding_or_output_parameter) with Muon, the rest with AdamW
    ("adamw": True). lr and weight_decay start at config.lr and
    config.weight_decay * wd_mult; adamw_lr and adamw_wd are None (the
    group's), so Megatron's OptimizerParamScheduler, which sets every group's
    lr and weight_decay, drives both. Collective over the world (Megatron
    agrees its groups there): every rank calls it."""
    from megatron.core.optimizer import _get_param_groups
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    out = []
    for group in _get_param_groups(chunks, config, None):
        params = group["params"]
        muon = [p for p in params if p.dim() == 2 and
                not getattr(p, "is_embedding_or_output_parameter", False)]
        taken = {id(p) for p in muon}
        rest = [p for p in params if id(p) not in taken]
        keys = {k: v for k, v in group.items() if k != "params"}
        keys.update(lr=config.lr, weight_decay=config.weight_decay * group.get("wd_mult", 1.0),
                    adamw_lr=None, adamw_wd=None)
        for members, adamw in ((muon, False), (rest, True)):
            out.append(dict(keys, params=members, adamw=adamw))
    return out


class QkClip:
    """MuonClip's QK-Clip (Kimi K2) for the self-attention layers of a
    Megatron-core model, libmuon's per-head clip fed as Megatron-core's own
    clip_qk is: each layer's per-head max logits from
    core_attention.current_max_attn_logits (what TransformerEngine's
    attention records when TransformerConfig.qk_clip is set; this TP rank's
    heads), the largest over data parallel (with CP) as Megatron takes it,
    all of a layer's heads put together over TP; tau and alpha from the
    layer's qk_clip_threshold and qk_clip_alpha. Each query group of the
    fused linear_qkv (q_per_group query heads, one key head) is registered
    with opt.register_qk at construction. Call it after opt.step(), where
    Megatron calls clip_qk; it returns the number of heads clipped on this
    rank's layers and resets the logits. Megatron-core's clip_qk scales a
    GQA group by its largest head's gamma; here every head's logits scale by
    exactly its own (an MHA layer: the same as Megatron's)."""

    def __init__(self, opt: Any, model: Any) -> None:
        from megatron.core.transformer.attention import SelfAttention
        self._opt = opt
        self._layers: list[tuple[Any, list[int], int]] = []
        chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        for chunk in chunks:
            for m in getattr(chunk, "module", chunk).modules():
                if not isinstance(m, SelfAttention):
                    continue
                cfg = m.config
                if getattr(cfg, "attention_output_gate", False):
                    raise ValueError("muon.megatron.QkClip: a layer with attention_output_gate "
                                     "(gate rows in linear_qkv) is not mapped")
                heads = cfg.num_attention_heads
                groups = cfg.num_query_groups or heads
                per, kv = heads // groups, cfg.kv_channels
                block = (per + 2) * kv  # a query group's rows: its queries, key, value
                handles = [opt.register_qk(m.linear_qkv.weight, num_heads=per, num_kv_heads=1,
                                           alpha=cfg.qk_clip_alpha, q_first_row=g * block,
                                           q_head_stride=kv, q_head_rows=kv,
                                           k_first_row=g * block + per * kv, k_head_rows=kv)
                           for g in range(groups)]
                self._layers.append((m, handles, per))

    def __call__(self) -> int:
        import torch
        import torch.distributed as dist
        ps = _parallel_state()
        tp = ps.get_tensor_model_parallel_group()
        dp = ps.get_data_parallel_group(with_context_parallel=True)
        clipped = 0
        for m, handles, per in self._layers:
            mine = m.core_attention.current_max_attn_logits
            if mine is None:
                raise ValueError("muon.megatron.QkClip: a layer's core_attention."
                                 "current_max_attn_logits is None: set TransformerConfig."
                                 "qk_clip (TransformerEngine's attention records them) and "
                                 "call this after a forward pass")
            mine = mine.detach().float().clone()
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=dp)
            parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(tp))]
            dist.all_gather(parts, mine, group=tp)
            logits = torch.cat(parts).cpu()
            clipped += self._opt.qk_clip(
                {h: logits[g * per:(g + 1) * per] for g, h in enumerate(handles)},
                m.config.qk_clip_threshold)
            m.core_attention.current_max_attn_logits = None
        return clipped


def _has_experts(model: Any) -> bool:
    """Whether `model` has Megatron-core MoE experts (False without megatron.core)."""
    try:
        return bool(megatron_experts(model))
    except ImportError:
        return False


def _initialized_parallel_state():
    """megatron.core's parallel_state when it is importable and initialized,
    else None."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    return parallel_state if parallel_state.model_parallel_is_initialized() else None


def megatron_flat_ranges(ddp: Any,
                         dp_rank: int | None = None) -> dict[torch.Tensor, tuple[int, int]]:
    """{param: (start, length)}: the range of each parameter's row-major
    flattening that data-parallel rank `dp_rank` (default: this one; of the
    expert data-parallel group for an expert's) owns under Megatron's
    distributed optimizer, for every parameter of the DDP model(s) `ddp`, MoE
    experts' included (length 0 where the rank owns none of it). Megatron's rule:
    bucket b covers [offset, offset + numel) of its buffer, rank r owns the
    r-th of dp equal pieces of it, and buffer.param_index_map places each
    parameter in the buffer."""
    out = {}
    for chunk in ddp if isinstance(ddp, (list, tuple)) else [ddp]:
        if not getattr(getattr(chunk, "ddp_config", None), "use_distributed_optimizer", False):
            raise ValueError("muon.megatron: the DDP model was not built with "
                             "DistributedDataParallelConfig(use_distributed_optimizer=True)")
        for buffer in list(chunk.buffers) + list(getattr(chunk, "expert_parallel_buffers", [])):
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


class MegatronExpertLayout(ProcessGroupConfig):
    """The MoE experts' layout, over parallel_state's expert groups: expert
    data parallel (as "dp": replicas), expert parallel ("ep": each expert on
    one of its ranks), expert tensor parallel ("tp": the partition_dim
    split) and the pipeline ("pp"); each expert param named by
    megatron_experts, after muon.Muon's name for it."""

    def __init__(self, groups, names: dict[int, str], **kwargs):
        ProcessGroupConfig.__init__(
            self, groups, **kwargs,
            tp_dims=lambda name, param: megatron_attr_tp_dim(getattr(param, "_muon_buffer", param)))
        self.expert_names = names  # id(param) -> the expert's global name

    def _name(self, default_name, param):
        own = self.expert_names.get(id(param))  # (a range's view is named by its segment)
        return ProcessGroupConfig._name(
            self, default_name if own is None else "%s.%s" % (default_name, own), param)


class _ExpertsApart:
    """The attach of a Megatron config whose MoE experts are laid out over
    their own groups by self.experts (a MegatronExpertLayout; None: no
    experts apart): both layouts read and registered in one attach."""

    experts: MegatronExpertLayout | None = None

    def attach(self, optimizer, named_params):
        if self.experts is None or any(is_dtensor(p) for _, p in named_params):
            return ProcessGroupConfig.attach(self, optimizer, named_params)
        # Every rank reads both layouts, the same gathers in the same order,
        # whether it holds experts or not (a pipeline stage without MoE).
        dist = require_dist("create_megatron_config")
        names = self.experts.expert_names
        ours = [id(getattr(p, "_muon_buffer", p)) in names for _, p in named_params]
        job, xjob = Job(self, dist), Job(self.experts, dist)
        entries = self.read_layout(job, [np for np, x in zip(named_params, ours) if not x])
        xentries = self.experts.read_layout(xjob, [np for np, x in zip(named_params, ours) if x])
        job.errors.extend(xjob.errors)
        if job.errors:
            registered = False
        elif not self._native():
            if xentries:
                job.errors.append("MoE experts need the config's own assign_fn, gather_fn and "
                                  "redistribute_fn (the library then moves the pieces): "
                                  "experts hold different params on different ranks")
            registered = not xentries and self._register_custom(job, optimizer, entries)
        else:
            registered = self._register_all(job, optimizer, entries,
                                            (self.experts, xjob, xentries))
        job.raise_on_every_rank(registered)


class MegatronConfig(_ExpertsApart, ProcessGroupConfig):
    """What create_megatron_config returns without ddp=: the dense params laid
    out over TP and DP (with CP), the MoE experts (when model= is given and
    parallel_state is initialized) over their own groups."""

    def __init__(self, groups, experts: MegatronExpertLayout | None, **kwargs):
        ProcessGroupConfig.__init__(self, groups,
                                    tp_dims=lambda name, param: _dense_tp_dim(param), **kwargs)
        self.experts = experts


class MegatronDistOptConfig(_ExpertsApart, ProcessGroupConfig):
    """What create_megatron_config(ddp=...) returns: each parameter of the DDP
    model(s) is a flat buffer (its own flattening) of which this rank steps
    the range Megatron's distributed optimizer gives it; under expert
    parallel (`ps`: parallel_state), the MoE experts' ranges (Megatron's
    expert-parallel buffers, split over the expert data-parallel group) are
    laid out over the expert groups."""

    flat_grad_attr = "main_grad"

    def __init__(self, chunks, tp_group, pp_group, ps=None, **kwargs):
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
        flat = dict(fsdp_mode="flat", verify_replicas=kwargs["verify_replicas"],
                    async_gpu_parallelism=kwargs["async_gpu_parallelism"],
                    prefetch_count=kwargs["prefetch_count"], gather_order=("fsdp", "tp"))
        ProcessGroupConfig.__init__(
            self, {"fsdp": dp_group, "tp": tp_group, "pp": pp_group},
            tp_dims=lambda name, param: _dense_tp_dim(getattr(param, "_muon_buffer", param)),
            **flat)
        if ps is not None and ps.get_expert_model_parallel_world_size() > 1:
            experts = megatron_experts(chunks)
            names.update(experts)  # a range of an expert is named by its global id, so its
            # views' default names carry it (MegatronExpertLayout adds nothing to them)
            edp = {c.intra_expt_dp_group for c in chunks}
            if len(edp) != 1:
                raise ValueError("muon.megatron: the DDP chunks use %d expert data-parallel "
                                 "groups; one is mapped" % len(edp))
            self.experts = MegatronExpertLayout(
                {"fsdp": edp.pop(), "ep": ps.get_expert_model_parallel_group(),
                 "tp": ps.get_expert_tensor_parallel_group(), "pp": pp_group},
                {id(p): name for p, name in experts.items()}, **flat)
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
    only. The rest: as muon.create_processgroup_config's, the TP dims read by
    megatron_tp_dim; with model=, the MoE experts laid out over the expert
    groups (see the module's docstring).

    ddp: Megatron's DistributedDataParallel model (or a list of its chunks)
    built with use_distributed_optimizer=True: the distributed optimizer's
    layout (see the module's docstring); its buffers give the data-parallel
    group, and dp_group and replicated_mode do not apply.

    model: the model (or its chunks) whose attention layers' fused QKV
    weights split_qkv splits as Megatron-core's Muon does (see the module's
    docstring); with ddp= the DDP model's. split_qkv=False: orthogonalize
    them whole. A param group's own split_sizes wins over this.
    """
    if replicated_mode not in ("host_averaged", "zero2"):
        raise ValueError("muon.megatron.create_megatron_config: replicated_mode must be "
                         "'host_averaged' or 'zero2', got %r" % (replicated_mode,))
    ps = None
    if tp_group is None or (dp_group is None and ddp is None):
        ps = _parallel_state()
        tp_group = tp_group if tp_group is not None else \
            ps.get_tensor_model_parallel_group()
        if dp_group is None and ddp is None:
            dp_group = ps.get_data_parallel_group(with_context_parallel=True)
        if pp_group is None and ps.get_pipeline_model_parallel_world_size() > 1:
            pp_group = ps.get_pipeline_model_parallel_group()
    else:
        ps = _initialized_parallel_state()
    apart = experts_laid_out_apart(ps) if ps is not None else None
    if ddp is not None:
        if dp_group is not None or replicated_mode != "host_averaged":
            raise ValueError("muon.megatron.create_megatron_config: with ddp=, the data-parallel "
                             "group is the DDP buffers' and the ranges are sharded: leave "
                             "dp_group and replicated_mode unset")
        if apart is not None and ps.get_expert_model_parallel_world_size() == 1:
            raise ValueError("muon.megatron.create_megatron_config: with ddp=, an expert TP size "
                             "(%d) other than the TP size (%d) is mapped under expert parallel "
                             "only (Megatron's expert-parallel buffers); without ddp= every "
                             "layout is" % (ps.get_expert_tensor_parallel_world_size(),
                                            ps.get_tensor_model_parallel_world_size()))
        chunks = list(ddp) if isinstance(ddp, (list, tuple)) else [ddp]
        return MegatronDistOptConfig(chunks, tp_group, pp_group, ps,
                                     verify_replicas=verify_replicas,
                                     async_gpu_parallelism=async_gpu_parallelism,
                                     prefetch_count=prefetch_count, split_qkv=split_qkv)
    if split_qkv and model is None and ddp is None:
        warnings.warn("muon.megatron.create_megatron_config: no model= given, so fused QKV "
                      "weights are orthogonalized whole, not split into Q, K and V as "
                      "Megatron-core's Muon does by default (muon_split_qkv); pass model= "
                      "(or split_qkv=False to keep them whole and silence this)", UserWarning,
                      stacklevel=2)
    if model is None and apart is not None:
        raise ValueError("muon.megatron.create_megatron_config: parallel_state lays MoE experts "
                         "out apart from the dense params (%s): pass the model as model= so "
                         "its experts are found and laid out over the expert groups" % apart)
    common = dict(replicated_mode=replicated_mode, verify_replicas=verify_replicas,
                  async_gpu_parallelism=async_gpu_parallelism, prefetch_count=prefetch_count)
    experts = None
    if model is not None and ps is not None:
        experts = MegatronExpertLayout(
            {"dp": ps.get_expert_data_parallel_group(),
             "ep": ps.get_expert_model_parallel_group(),
             "tp": ps.get_expert_tensor_parallel_group(), "pp": pp_group},
            {id(p): name for p, name in megatron_experts(model).items()}, **common)
    elif model is not None and _has_experts(model):
        raise ValueError("muon.megatron.create_megatron_config: model= has MoE experts, which "
                         "are laid out over parallel_state's expert groups; call megatron."
                         "core.parallel_state.initialize_model_parallel first (the groups "
                         "given by hand cover the dense params)")
    config = MegatronConfig({"dp": dp_group, "tp": tp_group, "pp": pp_group}, experts,
                            **common)
    if split_qkv and model is not None:
        config.param_splits = {id(p): v for p, v in megatron_qkv_splits(model).items()}
    return config
