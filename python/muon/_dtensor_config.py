"""create_dtensor_config: each param's layout read from the DTensor it is
(torch >= 2.x), as placements; its three design functions (dtensor_assign_fn,
dtensor_gather_fn, dtensor_redistribute_fn) run the custom path when one is
replaced.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ._comm import Replicate, Shard
from ._config import (DistributedConfig, grad_buffer, is_dtensor, lookup, matrix_ndim_error,
                      matrix_view_for, require_dist, torch_and_dist, torch_version)
from ._dist import TorchDistComm

if TYPE_CHECKING:
    from ._base_config import NamedParams
    from ._config import ParamTable
    from ._optimizer import Optimizer

def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor  # torch >= 2.4
        return DTensor
    except ImportError:
        pass
    try:
        from torch.distributed._tensor import DTensor  # torch 2.0 - 2.3
        return DTensor
    except ImportError:
        return None




# The mesh dims whose ranks hold other pipeline stages (torchtitan's, torch's recipes).
PIPELINE_DIMS = ("pp",)


def create_dtensor_config(async_gpu_parallelism: bool = True, prefetch_count: int = 1, *,
                          names: ParamTable | None = None,
                          replicated_mode: str = "host_averaged",
                          pipeline_dims: Sequence[str] = PIPELINE_DIMS) -> DistributedConfig:
    """A DistributedConfig that reads each param's layout from the DTensor it is
    (torch >= 2.x): every mesh dim's Shard(d) becomes Shard(group, d, "chunk")
    (DTensor splits like torch.chunk), Replicate becomes Replicate(group), and
    the strided shards of tensor parallel then FSDP2 are ordered as they apply.
    A dim of the job's mesh that a param's mesh leaves out holds copies of it
    (Replicate over that dim), except the dims named in pipeline_dims, whose
    ranks hold other pipeline stages; so do the ranks outside a mesh that is a
    view of a 1-D world mesh (torchtitan's), whose dims cannot be told apart.
    Its assign_fn, gather_fn and redistribute_fn (dtensor_assign_fn, ...) can
    be read or replaced: replacing one runs the three through the custom path."""
    if _dtensor_class() is None:
        raise RuntimeError(
            "muon.create_dtensor_config needs torch.distributed's DTensor (torch >= 2.x); "
            "this torch is %s, which has none: use create_processgroup_config with process "
            "groups from torch.distributed.new_group" % torch_version())
    if isinstance(pipeline_dims, str) or not all(isinstance(d, str) for d in pipeline_dims):
        raise TypeError("create_dtensor_config: pipeline_dims must be a sequence of mesh dim "
                        "names, such as ('pp',); got %r" % (pipeline_dims,))
    return _DTensorConfig(names, replicated_mode, async_gpu_parallelism, prefetch_count,
                          tuple(pipeline_dims))




def _replica_dims(mesh, pipeline_dims):
    """(root mesh, dim) of the dims of the job's mesh that a DTensor on a sub-mesh
    does not use: the ranks along them hold copies of it (FSDP2's mesh["dp"]
    inside a (dp, tp) mesh: the TP ranks each hold the same shards). Along a
    pipeline dim they hold other stages' params instead. A mesh whose root's
    dims do not name its own (torchtitan's meshes are views of a 1-D world
    mesh, unflattened) has no replicas outside it either: torchtitan puts its
    replicas (HSDP) in the param's own mesh, and the ranks outside are other
    pipeline stages. Were they copies after all, each set would register the
    whole param, and the first step refuses it on every rank (pieces overlap)."""
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    if root is mesh or mesh.size() == root.size():
        return []
    sub, full = mesh.mesh_dim_names or (), root.mesh_dim_names or ()
    if not sub or any(n not in full for n in sub):
        return []
    return [(root, d) for d, n in enumerate(full)
            if n not in sub and n not in pipeline_dims]


def _dtensor_placements(name, param, group_ids):
    """A DTensor's placements (one per mesh dim) as libmuon placements, ordered
    from the global tensor down to the local piece. DTensor shards left to right
    over the mesh dims, except that a _StridedShard(d, split_factor=k) (what
    tensor parallel then FSDP2 produce) applies after the shards of dim d to its
    right whose group sizes make k. The piece this gives is checked against
    DTensor's own (its local shape and offset): a layout read wrong is an
    error naming the param, never a silent mix-up."""
    mesh = param.device_mesh
    ordered, pending = [], []  # pending: [dim, split_factor left, group id]
    for mdim, pl in enumerate(param.placements):
        gid, size = group_ids[mdim], mesh.size(mdim)
        factor = getattr(pl, "split_factor", None)
        if factor is not None and factor > 1:
            pending.append([pl.dim, int(factor), gid])
        elif pl.is_shard():
            ordered.append(Shard(gid, pl.dim, split="chunk"))
            for entry in list(pending):
                if entry[0] == pl.dim:
                    entry[1] //= size
                    if entry[1] == 1:
                        ordered.append(Shard(entry[2], entry[0], split="chunk"))
                        pending.remove(entry)
        elif pl.is_replicate():
            ordered.append(Replicate(gid))
        else:
            raise ValueError("param '%s': placement %s on mesh dim %d is neither Shard nor "
                             "Replicate (reduce Partial placements before stepping)"
                             % (name, pl, mdim))
    if pending:
        raise ValueError("param '%s': placements %s: a strided shard's split factor does not "
                         "match the shards after it" % (name, tuple(param.placements)))
    _check_dtensor_piece(name, param, ordered, {g: mesh.size(d) for d, g in
                                                 enumerate(group_ids)},
                         {g: mesh.get_local_rank(d) for d, g in enumerate(group_ids)})
    return ordered


def _check_dtensor_piece(name, param, placements, sizes, coords):
    """The box the ordered chunk shards give this rank equals DTensor's."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, offset = list(param.shape), [0] * param.ndim
    for pl in placements:
        if not isinstance(pl, Shard):
            continue
        n, r = sizes[pl.group], coords[pl.group]
        step = -(-shape[pl.dim] // n) if shape[pl.dim] else 0
        start = min(r * step, shape[pl.dim])
        offset[pl.dim] += start
        shape[pl.dim] = max(0, min(step, shape[pl.dim] - start))
    want_shape, want_offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements)
    if tuple(shape) != tuple(want_shape) or (
            any(shape) and tuple(offset) != tuple(want_offset)):
        raise ValueError("param '%s': its placements %s give this rank the box %s at %s, but "
                         "DTensor says %s at %s; this layout cannot be described yet"
                         % (name, tuple(param.placements), tuple(shape), tuple(offset),
                            tuple(want_shape), tuple(want_offset)))


def dtensor_assign_fn(params, state):
    """create_dtensor_config's assign_fn (the design's form): the largest
    Newton-Schulz cost first, to the least loaded rank; {rank: [param_idx]}.
    Keeps the params in state["params"] for the other two functions."""
    _, dist = torch_and_dist()
    n = dist.get_world_size()
    state["params"] = list(params)
    cost = []
    for i, p in enumerate(params):
        rows, cols = p.shape[0], math.prod(p.shape[1:])
        cost.append((min(rows, cols) ** 2 * max(rows, cols), i))
    load, out = [0] * n, {r: [] for r in range(n)}
    for c, i in sorted(cost, key=lambda x: (-x[0], x[1])):
        r = load.index(min(load))
        out[r].append(i)
        load[r] += c
    return out


def dtensor_gather_fn(tensor, rank, state):
    """create_dtensor_config's gather_fn: the whole tensor of a DTensor shard."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def dtensor_redistribute_fn(update, rank, state):
    """create_dtensor_config's redistribute_fn: the assigned rank's update to every
    rank of the world, then each rank's shard with its param's mesh and
    placements."""
    torch, dist = torch_and_dist()
    param = state["params"][state["current_param_idx"]]
    full = update.contiguous() if update is not None else torch.empty(tuple(param.shape))
    dist.broadcast(full, src=rank)
    if not is_dtensor(param):
        return full
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(full, param.device_mesh, param.placements)


class _DTensorConfig(DistributedConfig):
    """What create_dtensor_config returns: a DistributedConfig whose three
    functions are dtensor_assign_fn, dtensor_gather_fn and
    dtensor_redistribute_fn. While they are all in place, the library moves the
    pieces itself (each DTensor's placements as libmuon placements); replace
    any of them and the config runs the three through the custom path."""

    def __init__(self, names, replicated_mode, async_gpu_parallelism, prefetch_count,
                 pipeline_dims):
        super().__init__(dtensor_assign_fn, dtensor_gather_fn, dtensor_redistribute_fn, {},
                         async_gpu_parallelism, prefetch_count)
        self.names = names
        self.replicated_mode = replicated_mode
        self.pipeline_dims = pipeline_dims

    def _native(self):
        return (self.assign_fn is dtensor_assign_fn and self.gather_fn is dtensor_gather_fn
                and self.redistribute_fn is dtensor_redistribute_fn)

    def prepare(self, named_matrices: NamedParams) -> None:
        if not self._native():
            self.state.setdefault("params", [p for _, p in named_matrices])
            super().prepare(named_matrices)

    def attach(self, optimizer: Optimizer, named_params: NamedParams) -> None:
        if not self._native():
            return super().attach(optimizer, named_params)
        require_dist("create_dtensor_config")
        attach_dtensors(optimizer, named_params, self.names, self.replicated_mode,
                        self.pipeline_dims)


def attach_dtensors(optimizer, named_params, names, replicated_mode,
                    pipeline_dims=PIPELINE_DIMS):
    """Registers DTensor params with their placements: the world, one group per
    mesh dim, then each param (names: create_dtensor_config's `names`). A param
    that is not a DTensor is a whole tensor on every rank, as the design says
    (Replicate over the world: the host keeps the copies equal, as DDP does)."""
    DTensor = _dtensor_class()
    torch, _ = torch_and_dist()
    world = optimizer.set_world(TorchDistComm(None))
    # Groups first (the library takes no group after a registration), one per
    # mesh dim, in the order the params meet them (the same on every rank).
    group_ids = {}
    for default_name, param in named_params:
        if isinstance(param, DTensor):
            mesh = param.device_mesh
            dims = [(mesh, d) for d in range(mesh.ndim)] + _replica_dims(
                mesh, pipeline_dims)
            for m, dim in dims:
                key = (id(m), dim)
                if key not in group_ids:
                    group_ids[key] = optimizer.add_group(TorchDistComm(m.get_group(dim)))
    for default_name, param in named_params:
        found, name = lookup(names, default_name, param)
        name = str(name) if found else default_name
        if param.ndim < 2:
            raise ValueError(matrix_ndim_error(name, tuple(param.shape)))
        if not isinstance(param, DTensor):
            optimizer.register(param, grad_buffer(param), name=name,
                               matrix_view=matrix_view_for(param.ndim),
                               global_shape=tuple(param.shape), placements=[Replicate(world)],
                               replicated_mode=replicated_mode, _split_name=default_name)
            continue
        mesh = param.device_mesh
        placements = [Replicate(group_ids[(id(m), d)])
                      for m, d in _replica_dims(mesh, pipeline_dims)] + _dtensor_placements(
            name, param, [group_ids[(id(mesh), dim)] for dim in range(mesh.ndim)])
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        optimizer.register(param.to_local(), param.grad.to_local(), name=name,
                           matrix_view=matrix_view_for(param.ndim),
                           global_shape=tuple(param.shape), placements=placements,
                           replicated_mode=replicated_mode, _split_name=default_name)
