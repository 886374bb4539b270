"""create_processgroup_config, create_auto_config and create_devicemesh_config:
layouts made of torch.distributed process groups (or a DeviceMesh's). Each
returns a DistributedConfig whose assign_fn, gather_fn and redistribute_fn
are processgroup_assign_fn, processgroup_gather_fn and
processgroup_redistribute_fn. While those three are in place, the layout is
told to the library as placements (muon_register_param with a global shape),
so the library moves the pieces itself: TP as Shard(tp_dim), FSDP as
Shard(0, chunk) or FlatRange, DP and CP as Replicate, EP by registering
experts only where they live, PP by each stage registering its own
parameters. Replace any of them and the three run through the custom path
over the same layout, which attach writes into the config's state.

attach is collective: every rank issues the same collectives in the same
order, and any inconsistency is raised on every rank, naming the ranks.

ProcessGroupConfig is this module's; it inherits its layout reading from
_pg_layout.py (LayoutChecks), runs each attach as a _pg_job.Job, and its
three functions are _pg_functions.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ._comm import FlatRange, Replicate, Shard
from ._config import (DistributedConfig, grad_buffer, is_dtensor, lookup, lookup_any,
                      lookup_named, matrix_view_for, require_dist, torch_and_dist, torch_version)
from ._dist import TorchDistComm
from ._megatron_attrs import generic_megatron_tp_dim, has_megatron_tp
from ._pg_functions import (chunk_sizes as _chunk_sizes, processgroup_assign_fn,
                            processgroup_gather_fn, processgroup_redistribute_fn)
from ._pg_job import DefaultDim, Job, ParamError
from ._pg_layout import LayoutChecks

if TYPE_CHECKING:
    import torch
    from torch.distributed import DeviceMesh, ProcessGroup

    from ._base_config import NamedParams
    from ._config import ParamTable
    from ._optimizer import Optimizer


@dataclass(frozen=True)
class IndexTables:
    """create_auto_config's tables, keyed by a param's index over the params
    given to muon.Muon (param groups in order), as the design keys them.

    tp_dims: an int (every param TP-sharded on that dim) or {index: dim or
    None}; a matrix the dict does not list is on dim 0, the design's default
    (a DefaultDim, which the ranks' values must bear out). None: TP dims
    come from the config's name-keyed tp_dims. experts: {index: expert id}:
    those params are named "expert{id}." + their name.
    """
    tp_dims: int | dict[int, int | None] | None = None
    experts: dict[int, Any] | None = None


class ProcessGroupConfig(LayoutChecks, DistributedConfig):
    """A layout made of torch.distributed process groups: what
    create_processgroup_config returns (its arguments are this class's; see
    there), and the base a framework adapter derives from (muon.megatron's and
    muon.deepspeed's configs do).

    groups maps each role ("dp", "cp", "ep", "tp", "fsdp", "pp") to this
    rank's process group of that kind (None: not used). At attach the config
    reads every param's layout from the ranks (one all_gather_object per group
    kind) and registers it with placements. An adapter sets what it learns of
    its framework and overrides the protocol's hooks (muon.DistributedConfigBase):
    flat_segments() for flat buffers (ZeRO partitions, Megatron's distributed
    optimizer), flat_grad_attr, after_step(), global_ndim(), attach() to check
    it is ready; and param_splits, {id(param): (split_dim, split_sizes)}, the
    split blocks it gives params (Megatron's fused QKV; a param group's own
    split_sizes win).
    """

    def __init__(self, groups: dict[str, ProcessGroup | None],
                 world_pg: ProcessGroup | None = None, tp_dims: ParamTable | None = None,
                 fsdp_mode: str = "chunk", names: ParamTable | None = None,
                 replicated_mode: str = "host_averaged",
                 global_shapes: ParamTable | None = None, verify_replicas: bool = True,
                 async_gpu_parallelism: bool = True, prefetch_count: int = 1,
                 gather_order: Sequence[str] | None = None,
                 index_tables: IndexTables | None = None) -> None:
        state = {"world_pg": world_pg,
                 "groups": {role: pg for role, pg in groups.items() if pg is not None}}
        DistributedConfig.__init__(self, processgroup_assign_fn, processgroup_gather_fn,
                                   processgroup_redistribute_fn, state, async_gpu_parallelism,
                                   prefetch_count)
        self.groups = groups  # role -> process group (None when absent)
        self.world_pg = world_pg
        self.tp_dims = tp_dims
        self.fsdp_mode = fsdp_mode
        self.names = names
        self.replicated_mode = replicated_mode
        self.global_shapes = global_shapes
        self.verify_replicas = verify_replicas
        # ("tp", "fsdp"): FSDP splits the whole matrix
        self.gather_order = _gather_order(gather_order, fsdp_mode)
        # id(param) -> (split_dim, split_sizes): the split blocks an adapter gives
        self.param_splits: dict[int, tuple[int, list[int]]] = {}
        self.index_tables = index_tables or IndexTables()  # create_auto_config's
        self._order: dict[int, int] = {}  # id(param) -> its index among muon.Muon's params

    # -- per-param lookups ----------------------------------------------------------

    def _param_index(self, param):
        return self._order.setdefault(id(param), len(self._order))

    def set_param_order(self, params: Sequence[torch.Tensor]) -> None:
        """muon.Muon's params, over its param groups in order: a param's index
        (tp_dim_per_param, expert_assignments) is its position here."""
        self._order = {id(p): k for k, p in enumerate(params)}

    def _name(self, default_name, param):
        if self.names is not None:
            found, name = lookup(self.names, default_name, param)
            if not found:
                raise ParamError("param '%s' (shape %s) has no entry in `names`"
                                 % (default_name, tuple(param.shape)))
            return str(name)
        name = default_name
        pp = self.groups.get("pp")
        if pp is not None:
            _, dist = torch_and_dist()
            name = "stage%d.%s" % (dist.get_rank(pp), name)
        experts = self.index_tables.experts
        if experts is not None and self._param_index(param) in experts:
            name = "expert%s.%s" % (experts[self._param_index(param)], name)
        return name

    def _tp_dim(self, name, default_name, param):
        """The param's TP shard dim, None when replicated over TP; (dim, True) marks
        a dim nobody gave (the design's default, dim 0), which the ranks' values
        must then bear out. What the caller's table gives wins; a param it does
        not list that carries Megatron's TP attributes (tensor_model_parallel,
        partition_dim) is read from them."""
        table = self.index_tables.tp_dims
        if table is not None:
            if isinstance(table, int):
                return table
            idx = self._param_index(param)
            if idx in table:
                return None if table[idx] is None else int(table[idx])
            if has_megatron_tp(param):
                return generic_megatron_tp_dim(param)
            return DefaultDim(0)
        found, value = lookup_named(self.tp_dims, name, default_name, param)
        if found:
            return None if value is None else int(value)
        return generic_megatron_tp_dim(param) if has_megatron_tp(param) else None

    def _declared_global_shape(self, default_name, param):
        return self._global_shape(self._name(default_name, param), default_name, param)

    def _global_shape(self, name, default_name, param):
        return lookup_any(self.global_shapes, name, default_name, param,
                           lambda shape: tuple(int(d) for d in shape))

    # -- attach ---------------------------------------------------------------------
    #
    # Every rank issues the same collectives in the same order (one gather per
    # group kind, then one over the world to agree on the errors), whatever it
    # finds: its problems are collected and raised on every rank at the end.

    def _native(self):
        """Whether the three functions are this config's own (the library then
        moves the pieces); False once one is replaced (the custom path)."""
        return (self.assign_fn is processgroup_assign_fn
                and self.gather_fn is processgroup_gather_fn
                and self.redistribute_fn is processgroup_redistribute_fn)

    def _fsdp_outer(self, roles):
        """Whether FSDP splits the whole matrix and TP each FSDP piece (the
        design's order: TP gathered first), rather than FSDP each TP piece."""
        return tuple(self.gather_order) == ("tp", "fsdp") and "tp" in roles and "fsdp" in roles

    def prepare(self, named_matrices: NamedParams) -> None:
        if not self._native():
            DistributedConfig.prepare(self, named_matrices)

    def attach(self, optimizer: Optimizer, named_params: NamedParams) -> None:
        if any(is_dtensor(p) for _, p in named_params):
            return self._attach_dtensors(optimizer, named_params)
        job = Job(self, require_dist("create_processgroup_config"))
        entries = self.read_layout(job, named_params)
        if job.errors:
            registered = False
        elif self._native():
            registered = self._register_all(job, optimizer, entries)
        else:
            registered = self._register_custom(job, optimizer, entries)
        job.raise_on_every_rank(registered)

    def read_layout(self, job: Job, named_params: NamedParams) -> list:
        """Every param's layout read from the ranks over this config's groups
        (collective: the same gathers on every rank, whatever it holds), each
        problem noted on `job`; the ParamEntry of each param, in order."""
        entries = self._read_params(job, named_params)
        local_pieces = [(e, e.local) for e in entries if not e.bad]
        if self._fsdp_outer(job.groups):  # TP pieces add up to FSDP's, those to the whole
            pieces = self._tp_global_shapes(job, local_pieces)
            wholes = self._fsdp_pieces(job, pieces)
        else:  # FSDP pieces add up to TP's, those to the whole
            pieces = self._fsdp_pieces(job, local_pieces)
            wholes = self._tp_global_shapes(job, pieces)
        for e, piece in pieces:
            e.piece = piece  # what DP, CP and EP replicate
        for e, whole in wholes:
            e.global_inferred = whole
        good = self._ep_experts(job, [e for e, _ in wholes])
        self._check_replicas(job, good)
        return entries

    def _attach_dtensors(self, optimizer, named_params):
        """DTensor params (FSDP2, tensor parallel on the mesh) describe their own
        layout: registered from their placements, as create_dtensor_config does
        (a plain tensor beside them is whole on every rank)."""
        if not self._native():
            raise ValueError("muon distributed config: with DTensor params, a replaced "
                             "assign_fn, gather_fn or redistribute_fn needs "
                             "create_dtensor_config, whose functions take DTensors")
        from ._dtensor_config import attach_dtensors
        attach_dtensors(optimizer, named_params, self.names, self.replicated_mode)

    def _register_all(self, job, optimizer, entries, *more):
        """The world, the groups and the registrations; False (the error noted)
        when one of them fails. `more`: (config, its job, its entries) of
        params laid out over other groups in the same world (Megatron's
        experts), registered after these by that config."""
        try:
            world = optimizer.set_world(TorchDistComm(self.world_pg))
            gid = self.add_groups(optimizer, job, world)
            # Every group is added before the first registration (muon.h).
            others = [(config, config.add_groups(optimizer, other_job, world), other_entries)
                      for config, other_job, other_entries in more]
            for e in entries:
                self._register(optimizer, gid, e)
            for config, other_gid, other_entries in others:
                for e in other_entries:
                    config._register(optimizer, other_gid, e)
            return True
        except Exception as err:  # noqa: BLE001  (reported on every rank)
            job.errors.append("%s: %s" % (type(err).__name__, err))
            return False

    @staticmethod
    def add_groups(optimizer, job, world):
        """The optimizer's group id of each role of `job` (and "world": `world`)."""
        gid = {"world": world}
        gid.update({role: optimizer.add_group(TorchDistComm(job.groups[role]))
                    for role in ("dp", "cp", "ep", "tp", "fsdp") if role in job.groups})
        return gid

    def _global_of(self, e):
        """The param's whole shape: given (flat FSDP) or added up from the pieces."""
        if e.fsdp is not None and e.fsdp[0] == "flat":
            return tuple(e.global_shape)
        inferred = tuple(e.global_inferred)
        if e.global_shape is not None and tuple(e.global_shape) != inferred:
            raise ValueError("param '%s': global_shapes says %s but the ranks' pieces add "
                             "up to %s" % (e.name, tuple(e.global_shape), inferred))
        return inferred

    def _steps(self, roles, e):
        """How the param is laid out over the groups present (`roles`), outermost
        first: (kind, role, arg), kind "replicate", "shard" (arg: (dim, split))
        or "flat" (arg: (start, length) of this rank)."""
        steps = [("replicate", role, None) for role in ("dp", "cp") if role in roles]
        if "ep" in roles and not e.expert:
            steps.append(("replicate", "ep", None))
        split = []
        if "tp" in roles:
            split.append(("replicate", "tp", None) if e.tp is None else
                         ("shard", "tp", e.tp))
        if "fsdp" in roles:
            kind = e.fsdp
            split.append(("flat", "fsdp", kind[1:]) if kind[0] == "flat" else
                         ("shard", "fsdp", (0, kind[1])))
        if self._fsdp_outer(roles):
            split.reverse()
        return steps + split

    def _register(self, optimizer, gid, e):
        param = e.param
        global_shape = self._global_of(e)
        placements = []
        for kind, role, arg in self._steps(gid, e):
            if kind == "replicate":
                placements.append(Replicate(gid[role]))
            elif kind == "shard":
                placements.append(Shard(gid[role], arg[0], split=arg[1]))
            else:
                placements.append(FlatRange(gid[role], arg[0], arg[1]))
        # The param group's split (muon.Muon set it under the default name),
        # else the config's own (Megatron's fused QKV).
        pending = getattr(optimizer, "split_pending", None)
        split = None if pending is not None and pending(e.default) else self._split_of(e.param)
        optimizer.register(param, grad_buffer(param), name=e.name,
                           matrix_view=matrix_view_for(len(global_shape)),
                           global_shape=global_shape, placements=placements,
                           replicated_mode=self.replicated_mode,
                           split_sizes=split[1] if split else None,
                           split_dim=split[0] if split else 0, _split_name=e.default)

    def _split_of(self, param):
        """(split_dim, split_sizes) this config gives `param`: what param_splits
        ({id(param): (dim, sizes)}, set by an adapter such as muon.megatron's
        fused-QKV split) holds, else None; a range of a flat buffer (a view)
        is looked up by the param the buffer is."""
        return self.param_splits.get(id(getattr(param, "_muon_buffer", param)))

    # -- the custom path (one of the three functions replaced) ---------------------

    def _register_custom(self, job, optimizer, entries):
        """The layouts into state, then DistributedConfig's registration of the
        three functions; False (the error noted) when that fails."""
        if "pp" in job.groups or any(e.expert for e in entries):
            job.errors.append(
                "a replaced assign_fn, gather_fn or redistribute_fn runs the design's "
                "functions, whose param_idx must name the same param on every rank; pipeline "
                "stages (pp) and experts hold different params on different ranks: keep the "
                "config's own three functions there (the library then moves the pieces)")
            return False
        try:
            if self.replicated_mode != "host_averaged":
                raise ValueError("replicated_mode=%r needs the config's own three functions"
                                 % self.replicated_mode)
            if self._owners is None:
                raise RuntimeError("assign_fn has not run: muon.Muon runs it (in __init__ or "
                                   "at the first step)")
            layouts, names, shapes = {}, {}, {}
            for e in entries:
                layouts[self._index[id(e.param)]] = self._layout(job, e)
                names[e.param] = e.name
                shapes[e.name] = self._global_of(e)
            self.state["layouts"] = {**self.state.get("layouts", {}), **layouts}
            self.state["names"] = {**self.state.get("names", {}), **names}
            self.state["global_shapes"] = {**self.state.get("global_shapes", {}), **shapes}
            DistributedConfig.attach(self, optimizer,
                                     [(e.default, e.param) for e in entries])
            return True
        except Exception as err:  # noqa: BLE001  (reported on every rank)
            job.errors.append("%s: %s" % (type(err).__name__, err))
            return False

    def _layout(self, job, e):
        """state["layouts"]'s entry of a param (see processgroup_gather_fn)."""
        shape = list(self._global_of(e))
        steps = []
        for kind, role, arg in self._steps(job.groups, e):
            if kind == "replicate":
                continue
            n = job.sizes[role]
            me = job.dist.get_rank(job.groups[role])
            if kind == "shard":
                dim, split = arg
                sizes = ([shape[dim] // n] * n if split == "even" else
                         _chunk_sizes(shape[dim], n) if split == "chunk" else list(split))
                steps.append({"group": role, "kind": "shard", "dim": dim, "sizes": sizes})
                shape[dim] = sizes[me]
            else:
                total = math.prod(shape)
                c = -(-total // n)
                ranges = e.ranges or [
                    (min(r * c, total), max(0, min(c, total - min(r * c, total))))
                    for r in range(n)]
                steps.append({"group": role, "kind": "flat", "shape": tuple(shape),
                              "ranges": ranges})
                shape = [ranges[me][1]]
        if math.prod(shape) != math.prod(e.local):
            raise ValueError("param '%s': its layout gives this rank %s elements, it holds %s"
                             % (e.name, math.prod(shape), math.prod(e.local)))
        return {"name": e.name, "global_shape": self._global_of(e),
                "local_shape": tuple(e.local), "steps": steps}


def create_processgroup_config(fsdp_pg: ProcessGroup | None = None,
                               tp_pg: ProcessGroup | None = None,
                               dp_pg: ProcessGroup | None = None,
                               ep_pg: ProcessGroup | None = None,
                               cp_pg: ProcessGroup | None = None,
                               pp_pg: ProcessGroup | None = None, *,
                               world_pg: ProcessGroup | None = None,
                               tp_dims: ParamTable | None = None, fsdp_mode: str = "chunk",
                               names: ParamTable | None = None,
                               replicated_mode: str = "host_averaged",
                               global_shapes: ParamTable | None = None,
                               verify_replicas: bool = True, async_gpu_parallelism: bool = True,
                               prefetch_count: int = 1,
                               gather_order: Sequence[str] | None = None) -> ProcessGroupConfig:
    """A config for layouts made of torch.distributed process groups.

    Each rank passes the groups it is a member of (None for a kind not used);
    the sizes of the groups given multiply to the world's. Every Muon param of
    this rank is registered with placements, outermost first:

      dp_pg, cp_pg   Replicate: the host averaged the gradients over these
                     groups before step() (DDP; CP), or, with
                     replicated_mode="zero2" and only one such group, the
                     library averages raw gradients itself (ZeRO-2);
      ep_pg          params held by every EP rank are Replicate over it; an
                     expert (a name held by one EP rank) is registered there
                     only. Give experts distinct names (`names`);
      tp_pg          Shard(tp_dim) for params in `tp_dims` (a dict keyed by
                     param or name, or a callable (name, param) -> dim or
                     None); a param it does not give that carries
                     Megatron-core's tensor_model_parallel / partition_dim
                     attributes: Shard(partition_dim), or Replicate when
                     tensor_model_parallel is False; Replicate for the others;
      fsdp_pg        fsdp_mode "chunk": FSDP splits dim 0 in pieces of
                     ceil(rows / n) rows, the tail short or empty (torch.chunk,
                     FSDP2); other splits of dim 0 are read from the ranks;
                     "flat": the local param holds elements [r*c, r*c + c)
                     (c = ceil(numel / n), clipped, possibly none) of the
                     row-major flattening of the TP piece (ZeRO, FSDP1,
                     Megatron's distributed optimizer), in any shape with that
                     many elements (1-D flat shards included);
                     needs global_shapes;
      pp_pg          each stage registers its own params; names default to
                     "stage{pp rank}." + muon.Muon's name.

    The global shape of a sharded param is read from the ranks' pieces (one
    all_gather_object per group at construction) unless global_shapes (a
    dict keyed by param or name, or a callable) gives it. verify_replicas
    checks that replicated params hold the same values on every replica at
    construction (a TP-sharded param missing from tp_dims shows up here).

    gather_order: with both TP and FSDP, which split is undone first. The
    design's ("tp", "fsdp") is the default with fsdp_mode "chunk": FSDP
    splits the whole matrix's dim 0 and TP splits each FSDP piece (placements
    FSDP then TP). ("fsdp", "tp"): FSDP splits each TP piece (TP applied
    first, as FSDP2 over a tensor-parallel model); the only order of
    fsdp_mode "flat", whose FSDP flattens the TP piece.

    The config is a muon.DistributedConfig: its assign_fn, gather_fn and
    redistribute_fn are processgroup_assign_fn (round robin),
    processgroup_gather_fn and processgroup_redistribute_fn, which read the
    layout from state["layouts"] (written at the first step). Left in place,
    the library moves the pieces itself (faster: no whole matrix leaves its
    owner); replace one and the three run through the custom path (every
    rank must then hold a piece of every param: no pp_pg, no experts).

    world_pg: the group of every rank stepping Muon (default: the world).
    The first step() of muon.Muon with this config registers the params; it
    is collective over the world, and any inconsistency raises ValueError on
    every rank, naming the ranks and the param.
    """
    if fsdp_mode not in ("chunk", "flat"):
        raise ValueError("muon: fsdp_mode must be 'chunk' or 'flat', got %r" % (fsdp_mode,))
    if replicated_mode not in ("host_averaged", "zero2"):
        raise ValueError("muon: replicated_mode must be 'host_averaged' or 'zero2', got %r"
                         % (replicated_mode,))
    if tp_dims is not None and tp_pg is None:
        raise ValueError("muon: tp_dims given without tp_pg")
    for what, table in (("tp_dims", tp_dims), ("names", names),
                        ("global_shapes", global_shapes)):
        if table is not None and not isinstance(table, dict) and not callable(table):
            raise TypeError("muon: %s must be a dict (keyed by param or name) or a callable "
                            "(name, param) -> value, got %s" % (what, type(table).__name__))
    groups = {"dp": dp_pg, "cp": cp_pg, "ep": ep_pg, "tp": tp_pg, "fsdp": fsdp_pg, "pp": pp_pg}
    return ProcessGroupConfig(groups, world_pg, tp_dims, fsdp_mode, names, replicated_mode,
                               global_shapes, verify_replicas, async_gpu_parallelism,
                               prefetch_count, _gather_order(gather_order, fsdp_mode))


def _gather_order(order, fsdp_mode):
    """gather_order checked; the design's by default (see create_processgroup_config)."""
    if order is None:
        return ("fsdp", "tp") if fsdp_mode == "flat" else ("tp", "fsdp")
    if isinstance(order, str) or tuple(order) not in (("tp", "fsdp"), ("fsdp", "tp")):
        raise ValueError("muon: gather_order must be ('tp', 'fsdp') (the design's: FSDP splits "
                         "the whole matrix, TP each FSDP piece) or ('fsdp', 'tp') (FSDP splits "
                         "each TP piece), got %r" % (order,))
    if fsdp_mode == "flat" and tuple(order) == ("tp", "fsdp"):
        raise ValueError("muon: fsdp_mode='flat' flattens each TP piece, so its gather_order is "
                         "('fsdp', 'tp'), not ('tp', 'fsdp')")
    return tuple(order)


def create_auto_config(fsdp_process_group: ProcessGroup | None = None,
                       tp_process_group: ProcessGroup | None = None,
                       ddp_process_group: ProcessGroup | None = None,
                       ep_process_group: ProcessGroup | None = None,
                       cp_process_group: ProcessGroup | None = None,
                       tp_dim_per_param: int | dict[int, int | None] | None = None,
                       expert_assignments: dict[int, Any] | None = None,
                       async_gpu_parallelism: bool = True, prefetch_count: int = 1, *,
                       pp_process_group: ProcessGroup | None = None,
                       world_process_group: ProcessGroup | None = None,
                       fsdp_mode: str = "chunk", replicated_mode: str = "host_averaged",
                       global_shapes: ParamTable | None = None, verify_replicas: bool = True,
                       tp_shard_dim: int | None = None,
                       gather_order: Sequence[str] | None = None) -> ProcessGroupConfig:
    """create_processgroup_config under the names of torch's distributed-Muon design.

    tp_dim_per_param: an int (every param is TP-sharded on that dim) or a
    dict {param index: dim or None} (index over all params given to
    muon.Muon, param groups in order; None: replicated over TP). As in the
    design, a matrix the dict does not list is TP-sharded on dim 0 (unless it
    carries Megatron-core's tensor_model_parallel / partition_dim, which are
    read instead); if its TP ranks hold the same values it is an error that
    says to list it as None.
    tp_shard_dim: the design's other name for an int tp_dim_per_param.
    expert_assignments: a dict {param index: expert id}: those params are
    experts, named "expert{id}." + muon.Muon's name, so the same expert has the
    same name on its replicas and different experts differ. gather_order and
    the rest: as create_processgroup_config (the design's order by default).
    """
    if tp_shard_dim is not None:
        if tp_dim_per_param is not None:
            raise ValueError("muon: give tp_dim_per_param or tp_shard_dim, not both")
        tp_dim_per_param = tp_shard_dim
    if isinstance(tp_dim_per_param, bool) or not (
            tp_dim_per_param is None or isinstance(tp_dim_per_param, (int, dict))):
        raise TypeError("muon: tp_dim_per_param must be an int or a dict {param index: dim}")
    if expert_assignments is not None and not isinstance(expert_assignments, dict):
        raise TypeError("muon: expert_assignments must be a dict {param index: expert id}")
    if tp_dim_per_param is not None and tp_process_group is None:
        raise ValueError("muon: tp_dim_per_param given without tp_process_group")
    cfg = create_processgroup_config(
        fsdp_process_group, tp_process_group, ddp_process_group, ep_process_group,
        cp_process_group, pp_process_group, world_pg=world_process_group, fsdp_mode=fsdp_mode,
        replicated_mode=replicated_mode, global_shapes=global_shapes,
        verify_replicas=verify_replicas, async_gpu_parallelism=async_gpu_parallelism,
        prefetch_count=prefetch_count, gather_order=gather_order)
    if tp_dim_per_param is None and tp_process_group is not None:
        tp_dim_per_param = {}  # every matrix on dim 0, the design's default
    cfg.index_tables = IndexTables(
        tp_dim_per_param, None if expert_assignments is None else dict(expert_assignments))
    return cfg


# ---------------------------------------------------------------------------
# DeviceMesh (torch >= 2.x)
# ---------------------------------------------------------------------------


def _device_mesh_class():
    try:
        from torch.distributed.device_mesh import DeviceMesh  # torch >= 2.2
        return DeviceMesh
    except ImportError:
        pass
    try:
        from torch.distributed._tensor import DeviceMesh  # torch 2.0, 2.1
        return DeviceMesh
    except ImportError:
        return None



_MESH_ROLES = {"dp": "dp", "ddp": "dp", "replicate": "dp", "dp_replicate": "dp",
               "cp": "cp", "ep": "ep", "tp": "tp", "fsdp": "fsdp", "shard": "fsdp",
               "dp_shard": "fsdp", "pp": "pp"}


def create_devicemesh_config(device_mesh: DeviceMesh,
                             mesh_dim_names: Sequence[str] | None = None, *,
                             tp_dims: ParamTable | None = None, fsdp_mode: str = "chunk",
                             names: ParamTable | None = None,
                             replicated_mode: str = "host_averaged",
                             global_shapes: ParamTable | None = None,
                             verify_replicas: bool = True, async_gpu_parallelism: bool = True,
                             prefetch_count: int = 1,
                             gather_order: Sequence[str] | None = None) -> ProcessGroupConfig:
    """create_processgroup_config with the groups of a DeviceMesh (torch >= 2.x).

    mesh_dim_names: the role of each mesh dimension, from "dp" (or "ddp",
    "replicate"), "fsdp" (or "shard"), "tp", "cp", "ep", "pp"; default: the
    mesh's own dim names.
    """
    if _device_mesh_class() is None:
        raise RuntimeError(
            "muon.create_devicemesh_config needs torch.distributed's DeviceMesh (torch >= 2.x); "
            "this torch is %s, which has none: use create_processgroup_config with process "
            "groups from torch.distributed.new_group" % torch_version())
    names_of_dims = tuple(mesh_dim_names or getattr(device_mesh, "mesh_dim_names", None) or ())
    if len(names_of_dims) != device_mesh.ndim:
        raise ValueError("muon: the mesh has %d dims; give one role per dim in mesh_dim_names"
                         % device_mesh.ndim)
    groups = {}
    for dim, role_name in enumerate(names_of_dims):
        role = _MESH_ROLES.get(str(role_name).lower())
        if role is None:
            raise ValueError("muon: mesh dim %d is named %r; use one of %s"
                             % (dim, role_name, sorted(_MESH_ROLES)))
        if role in groups:
            raise ValueError("muon: two mesh dims have the role %r" % role)
        groups[role + "_pg"] = device_mesh.get_group(dim)
    return create_processgroup_config(
        tp_dims=tp_dims, fsdp_mode=fsdp_mode, names=names, replicated_mode=replicated_mode,
        global_shapes=global_shapes, verify_replicas=verify_replicas,
        async_gpu_parallelism=async_gpu_parallelism, prefetch_count=prefetch_count,
        gather_order=gather_order, **groups)


