"""What Megatron-core puts on its parameters and in parallel_state, read
without importing megatron.core: the TP attributes of its parallel layers
(tensor_model_parallel, partition_dim), and whether parallel_state lays MoE
experts out over groups of their own. The generic process-group configs and
muon.megatron both read them here."""

from __future__ import annotations

import sys
from typing import Any


def has_megatron_tp(param: Any) -> bool:
    """Whether Megatron-core marked the param's TP layout (its tensor-parallel
    layers set tensor_model_parallel and partition_dim on every weight)."""
    return hasattr(param, "tensor_model_parallel") and hasattr(param, "partition_dim")


def megatron_attr_tp_dim(param: Any) -> int | None:
    """The dim Megatron's attributes split the param along over its TP group
    (an expert's: the expert TP group), or None (replicated)."""
    if getattr(param, "tensor_model_parallel", False):
        return int(getattr(param, "partition_dim"))
    return None


def experts_laid_out_apart(ps: Any) -> str | None:
    """Where parallel_state `ps` lays MoE experts out otherwise than dense
    params (expert parallel, or an expert TP size other than the TP size):
    its sizes, as text; else None."""
    ep = ps.get_expert_model_parallel_world_size()
    etp, tp = ps.get_expert_tensor_parallel_world_size(), ps.get_tensor_model_parallel_world_size()
    if ep == 1 and etp == tp:
        return None
    return "expert parallel %d, expert TP %d, TP %d" % (ep, etp, tp)


def experts_apart_in_this_job() -> str | None:
    """experts_laid_out_apart of megatron.core's parallel_state where it is
    loaded and initialized; else None."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None
    return experts_laid_out_apart(ps)


def generic_megatron_tp_dim(param: Any) -> int | None:
    """megatron_attr_tp_dim for the generic process-group configs, refused
    where parallel_state lays MoE experts out over groups of their own: an
    expert's attributes then refer to the expert TP group, which a config of
    TP and DP does not know (its pieces would be put together wrongly)."""
    apart = experts_apart_in_this_job()
    if apart is not None:
        raise ValueError(
            "its TP dim would be read from Megatron-core's attributes, but parallel_state "
            "lays MoE experts out over groups of their own (%s), where an expert's "
            "attributes refer to the expert TP group: use muon.megatron."
            "create_megatron_config(model=model), or give every TP dim in tp_dims" % apart)
    return megatron_attr_tp_dim(param)
