"""muon.Muon over Megatron-core's parallelism: the groups from
megatron.core.parallel_state, each parameter's layout from the attributes
Megatron's parallel layers put on it.

    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2, ...)
    model = ...  # ColumnParallelLinear, RowParallelLinear, ... (megatron.core)
    opt = muon.Muon(model.parameters(), lr=0.02,
                    distributed_config=muon.megatron.create_megatron_config())

A parameter with tensor_model_parallel=True is split over the TP group along
its partition_dim (ColumnParallelLinear: dim 0; RowParallelLinear: dim 1;
VocabParallelEmbedding: dim 0); every other parameter is replicated over TP.
A partition_stride above 1 (interleaved pieces) needs nothing more: Newton-
Schulz commutes with reordering rows or columns, so the pieces orthogonalized
in rank order give each rank exactly its own update. Data parallel (with
context parallel, whose ranks hold replicas too) is a replica group: the host
averages gradients before step(), as Megatron's DDP does; pipeline stages
register their own parameters.

Not mapped yet: expert parameters (allreduce=False, Megatron's MoE) and the
distributed optimizer's flat ranges (megatron.core.optimizer's
DistributedOptimizer shards each bucket of its grad buffer, which needs CUDA);
an expert parameter fails at the first step naming it.
"""

from ._pg_config import create_processgroup_config

__all__ = ["create_megatron_config", "megatron_tp_dim"]


def megatron_tp_dim(param):
    """The dim a Megatron parameter is split along over the TP group, or None
    (replicated). ValueError for an expert parameter (not mapped yet)."""
    if getattr(param, "allreduce", True) is False:
        raise ValueError("it is a Megatron expert parameter (allreduce=False), which "
                         "muon.megatron does not map yet; give experts to "
                         "muon.create_processgroup_config(ep_pg=..., names=...)")
    if getattr(param, "tensor_model_parallel", False):
        return int(param.partition_dim)
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


def create_megatron_config(*, tp_group=None, dp_group=None, pp_group=None,
                           replicated_mode="host_averaged", verify_replicas=True,
                           async_gpu_parallelism=True, prefetch_count=1):
    """A muon.DistributedConfig for a model built of Megatron-core layers.

    The groups default to parallel_state's: the tensor-model-parallel group,
    the data-parallel group with context parallel, the pipeline group (only
    when there is more than one stage). Give all three to use other groups (or
    no megatron.core at all). replicated_mode="zero2": the library averages
    the raw gradients over DP itself and keeps momentum on each matrix's owner
    only. The rest: as muon.create_processgroup_config, which this calls with
    tp_dims read by megatron_tp_dim.
    """
    if tp_group is None or dp_group is None:
        ps = _parallel_state()
        tp_group = tp_group if tp_group is not None else \
            ps.get_tensor_model_parallel_group()
        dp_group = dp_group if dp_group is not None else \
            ps.get_data_parallel_group(with_context_parallel=True)
        if pp_group is None and ps.get_pipeline_model_parallel_world_size() > 1:
            pp_group = ps.get_pipeline_model_parallel_group()
    return create_processgroup_config(
        tp_pg=tp_group, dp_pg=dp_group, pp_pg=pp_group,
        tp_dims=lambda name, param: megatron_tp_dim(param),
        replicated_mode=replicated_mode, verify_replicas=verify_replicas,
        async_gpu_parallelism=async_gpu_parallelism, prefetch_count=prefetch_count)
