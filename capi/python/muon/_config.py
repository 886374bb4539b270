"""Distributed configs for muon.Muon: how each rank's parameters map to the
library's distributed engine (capi/muon.h).

A config implements two methods that muon.Muon calls once per param group:

  _options() -> dict
      extra keyword arguments of the low-level muon.Optimizer
      (prefetch_count, async_parallelism);
  _attach(optimizer, named_params)
      sets the world, adds the groups and registers every (name, param) of the
      group, in the order given, with its grad buffer (allocated when
      param.grad is None).

DistributedConfig wraps three torch-level callables over the custom path
(muon_register_param_custom). The create_*_config helpers describe common
layouts with placements (muon_register_param with a global shape), so the
library moves the pieces itself: TP as Shard(tp_dim), FSDP as Shard(0, chunk)
or FlatRange, DP and CP as Replicate, EP by registering experts only where
they live, PP by each stage registering its own parameters.

_attach is collective: muon.Muon calls it at the first step() of each param
group, so every rank of the world must step the same number of param groups,
in the same order. Layout errors are found there and raised on every rank.
"""

import collections
import dataclasses
import inspect
import math
import typing
import zlib

from ._comm import FlatRange, Replicate, Shard
from ._dist import TorchDistComm

__all__ = [
    "DistributedConfig",
    "create_processgroup_config",
    "create_auto_config",
    "create_devicemesh_config",
    "create_dtensor_config",
]


def _torch():
    import torch
    import torch.distributed as dist
    return torch, dist


def _require_dist(what):
    _, dist = _torch()
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("muon.%s: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first" % what)
    return dist


def _check_pipeline_options(async_gpu_parallelism, prefetch_count):
    if isinstance(prefetch_count, bool) or not isinstance(prefetch_count, int) or \
            prefetch_count < 0:
        raise ValueError("muon: prefetch_count must be an int >= 0, got %r" % (prefetch_count,))
    return bool(async_gpu_parallelism), int(prefetch_count)


def _matrix_ndim_error(name, shape):
    return ("param '%s' has %d dimension(s) (shape %s); Muon orthogonalizes matrices only: "
            "optimize 0-D and 1-D parameters (biases, norms) with AdamW"
            % (name, len(shape), tuple(shape)))


def _matrix_view(ndim):
    # As muon.Muon registers parameters in one process: 2-D as they are, N-D
    # flattened to (d0, d1*...*dk).
    return "2d" if ndim == 2 else "flatten_trailing"


def _grad_buffer(param):
    """The param's grad tensor, allocated (zeros) when there is none: the library
    borrows its storage."""
    torch, _ = _torch()
    if param.grad is None:
        param.grad = torch.zeros_like(param, memory_format=torch.contiguous_format)
    return param.grad


def _lookup(table, name, param):
    """table: None, a dict keyed by the param object or its name, or a callable
    (name, param) -> value (None: no entry). Returns (found, value)."""
    if table is None:
        return False, None
    if callable(table) and not isinstance(table, dict):
        value = table(name, param)
        return value is not None, value
    for key, value in table.items():
        if key is param or (isinstance(key, str) and key == name):
            return True, value
    return False, None


def _lookup_any(table, name, default_name, param, convert):
    """A dict entry keyed by the param, its name or muon.Muon's name for it; or a
    callable's answer for (name, param). None when there is none."""
    found, value = _lookup(table, name, param)
    if not found and isinstance(table, dict) and default_name != name:
        found, value = _lookup(table, default_name, param)
    return convert(value) if found else None


class _Config:
    """The pipeline options every config carries."""

    def __init__(self, async_gpu_parallelism=True, prefetch_count=1):
        self.async_gpu_parallelism, self.prefetch_count = _check_pipeline_options(
            async_gpu_parallelism, prefetch_count)

    def _options(self):
        return {"prefetch_count": self.prefetch_count,
                "async_parallelism": self.async_gpu_parallelism}

    def _declared_global_shape(self, default_name, param):
        """The global shape the config was told for a param, or None."""
        return None

    def _global_ndim(self, default_name, param):
        """The param's global number of dims (a DTensor's ndim is global; a local
        piece's may not be: a flat shard is 1-D). muon.Muon gives the params whose
        global tensor has fewer than 2 dims to AdamW."""
        try:
            shape = self._declared_global_shape(default_name, param)
        except Exception:  # noqa: BLE001  (a lookup that fails is reported by _attach)
            shape = None
        return len(shape) if shape is not None else param.ndim


# ---------------------------------------------------------------------------
# DistributedConfig: the custom path
# ---------------------------------------------------------------------------


def _positional_arity(fn):
    """The number of positional parameters `fn` requires, or None when it takes
    *args or cannot be inspected."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    n = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            n += 1
    return n


@dataclasses.dataclass(eq=False)
class DistributedConfig(_Config):
    """Zero-redundancy Muon over layouts the host gathers itself (the design's
    DistributedConfig).

    The design's signatures (param_idx counts the matrices muon.Muon is given,
    over all its param groups, in order):

    assign_fn(params, state) -> {rank: [param_idx, ...]} or {param_idx: rank}
        called once, in muon.Muon's __init__ (or at the first step when
        torch.distributed is not initialized yet); every index assigned once,
        to a rank of the world. muon.Muon keeps the answer in
        state["assignments"] and this rank in state["rank"].
    gather_fn(momentum_buffer_shard, rank, state) -> full tensor
        called on every rank holding the param, `rank` being the assigned
        rank, with state["current_param_idx"] set; the shard is a float32
        tensor of the local param's shape holding this rank's momentum-updated
        values. On the assigned rank return the whole update; elsewhere the
        value is ignored (None will do). Collective among the holders: use your
        own process groups.
    redistribute_fn(update, rank, state) -> this rank's shard
        called on every holder, `update` the orthogonalized full update (float32)
        on the assigned rank and None elsewhere.

    The per-parameter signatures are accepted too (told apart by their
    number of positional parameters): assign_fn(param, state, world_size) ->
    rank, called at the first step; gather_fn(local_update, param, owner,
    state); redistribute_fn(full_update_or_None, param, owner, state).

    state: a dict passed to the callables (default: a new one). These keys are
    read too: "global_shapes" (a dict keyed by param or name, or a callable
    (name, param) -> shape) gives the whole matrix's shape of a param
    (default: the local shape: a replicated or local param); "names" (the
    same forms) gives a param's name, its identity across ranks (default:
    muon.Muon's "group{g}.param{i}"); "world_pg" the torch.distributed group of
    every rank stepping Muon (default: the world), or "world_comm" a
    muon.Communicator to use instead.

    The callables run inside step(), in the order of parameter names. An
    exception they raise fails the step with muon.MuonError naming the
    parameter and the exception.
    """

    assign_fn: typing.Callable
    gather_fn: typing.Callable
    redistribute_fn: typing.Callable
    state: typing.Any = dataclasses.field(default_factory=dict)
    async_gpu_parallelism: bool = True
    prefetch_count: int = 1

    def __post_init__(self):
        for what, fn in (("assign_fn", self.assign_fn), ("gather_fn", self.gather_fn),
                         ("redistribute_fn", self.redistribute_fn)):
            if not callable(fn):
                raise TypeError("muon.DistributedConfig: %s must be callable, got %s"
                                % (what, type(fn).__name__))
        self.async_gpu_parallelism, self.prefetch_count = _check_pipeline_options(
            self.async_gpu_parallelism, self.prefetch_count)
        if self.state is None:
            self.state = {}
        # The tensors over the library's buffers handed to the callables, held a
        # little longer: if the callables pass them to torch.distributed, gloo's
        # worker thread must not drop the last reference (see _dist.py).
        self._recent = collections.deque(maxlen=4)
        self._owners = None  # design form: param_idx -> rank, once assign_fn ran
        self._index = {}     # id(param) -> param_idx

    def _design_form(self, fn, per_param_arity):
        return _positional_arity(fn) != per_param_arity

    def _state_entry(self, key):
        return self.state.get(key) if isinstance(self.state, dict) else None

    def _declared_global_shape(self, default_name, param):
        found, name = _lookup(self._state_entry("names"), default_name, param)
        return _lookup_any(self._state_entry("global_shapes"), str(name) if found else default_name,
                           default_name, param, lambda s: tuple(int(d) for d in s))

    def _world(self):
        comm = self._state_entry("world_comm")
        if comm is not None:
            return comm
        _require_dist("DistributedConfig")
        return TorchDistComm(self._state_entry("world_pg"))

    # -- the design's assignment, once -----------------------------------------------

    def _prepare(self, named_matrices):
        """Runs the design's assign_fn over every matrix muon.Muon steps (a list of
        (name, param)), once; muon.Muon calls this from __init__ and before each
        step (it waits for torch.distributed to be initialized)."""
        if self._owners is not None or not self._design_form(self.assign_fn, 3):
            return
        world = self._state_entry("world_comm")
        if world is not None:
            rank, size = int(world.rank), int(world.size)
        else:
            _, dist = _torch()
            if not dist.is_available() or not dist.is_initialized():
                return  # at the first step; _attach then says what is missing
            group = self._state_entry("world_pg")
            rank, size = dist.get_rank(group), dist.get_world_size(group)
        params = [p for _, p in named_matrices]
        names = [name for name, _ in named_matrices]
        answer = self.assign_fn(params, self.state)
        self._owners = _owners_from_assignment(answer, names, size)
        self._index = {id(p): i for i, p in enumerate(params)}
        if isinstance(self.state, dict):
            self.state["assignments"] = answer
            self.state["rank"] = rank

    # -- registration ---------------------------------------------------------------

    def _attach(self, optimizer, named_params):
        world = self._world()
        optimizer.set_world(world)
        seen = set()
        for default_name, param in named_params:
            found, name = _lookup(self._state_entry("names"), default_name, param)
            name = str(name) if found else default_name
            if name in seen:
                raise ValueError("muon.DistributedConfig: two parameters are named '%s'" % name)
            seen.add(name)
            shape = _lookup_any(self._state_entry("global_shapes"), name, default_name, param,
                                lambda s: tuple(int(d) for d in s))
            if shape is None:
                shape = self._probe_global_shape(world, name, param) or tuple(param.shape)
            if len(shape) < 2:
                raise ValueError("muon.DistributedConfig: " + _matrix_ndim_error(name, shape))
            rows, cols = shape[0], math.prod(shape[1:])
            grad = _grad_buffer(param)
            optimizer.register_custom(_local(param), _local(grad), name, rows, cols,
                                      *self._callbacks(name, param, rows, cols))

    def _probe_global_shape(self, world, name, param):
        """The design's gather_fn returns the whole tensor, whose shape nobody
        declared: learn it once, at registration, by a gather of zeros on every
        rank, the owner telling the others the shape (a DTensor says it itself).
        None when nothing is to be learned (per-parameter form: the local shape)."""
        torch, dist = _torch()
        if _is_dtensor(param) or id(param) not in self._index or \
                not self._design_form(self.gather_fn, 4):
            return None
        owner = self._owners[self._index[id(param)]]
        self.state["current_param_idx"] = self._index[id(param)]
        full = self.gather_fn(torch.zeros(tuple(_local(param).shape)), owner, self.state)
        mine = tuple(full.shape) if self.state["rank"] == owner and full is not None else None
        if not isinstance(world, TorchDistComm):
            raise ValueError("muon.DistributedConfig: param '%s' has no global shape; give it "
                             "in state['global_shapes'] (with a world_comm, muon cannot ask "
                             "the owner)" % name)
        group = self._state_entry("world_pg")
        box = [mine]
        src = owner if group is None else dist.get_global_rank(group, owner)
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    def _callbacks(self, name, param, rows, cols):
        """assign_fn, gather_fn and redistribute_fn in Optimizer.register_custom's
        form, calling this config's callables for `param` (registered as `name`,
        a rows x cols matrix)."""
        torch, _ = _torch()
        cfg = self
        local_shape = tuple(_local(param).shape)
        design_gather = self._design_form(self.gather_fn, 4)
        design_redistribute = self._design_form(self.redistribute_fn, 4)

        def set_current():
            if isinstance(cfg.state, dict) and id(param) in cfg._index:
                cfg.state["current_param_idx"] = cfg._index[id(param)]

        def assign(param_name, world_size):
            if cfg._design_form(cfg.assign_fn, 3):
                if cfg._owners is None:
                    raise RuntimeError("assign_fn has not run: muon.Muon runs it (in __init__ "
                                       "or at the first step)")
                return cfg._owners[cfg._index[id(param)]]
            return _as_rank(cfg.assign_fn(param, cfg.state, int(world_size)), name)

        def gather(local, owner):
            update = torch.from_numpy(local).view(tuple(_local(param).shape))
            cfg._recent.append(update)
            if _is_dtensor(param):  # the design's shard of a DTensor param is a DTensor
                update = type(param).from_local(update, param.device_mesh, param.placements,
                                                shape=param.shape, stride=param.stride())
            set_current()
            if design_gather:
                full = cfg.gather_fn(update, int(owner), cfg.state)
            else:
                full = cfg.gather_fn(update, param, int(owner), cfg.state)
            if full is None or (design_gather and not _is_owner(cfg, owner)):
                return None
            return _full_matrix(torch, full, name, rows, cols)

        def redistribute(full, owner, local_out):
            full_t = torch.from_numpy(full) if full is not None else None
            cfg._recent.append(full_t)
            set_current()
            if design_redistribute:
                piece = cfg.redistribute_fn(full_t, int(owner), cfg.state)
            else:
                piece = cfg.redistribute_fn(full_t, param, int(owner), cfg.state)
            _copy_piece(torch, _local(piece), local_out, name, local_shape)

        return assign, gather, redistribute


def _as_rank(owner, name):
    """A per-parameter assign_fn's answer as a world rank (an int)."""
    if isinstance(owner, bool) or not isinstance(owner, int):
        try:
            owner = int(owner)
        except Exception:
            raise TypeError("assign_fn returned %r for param '%s'; it must return a "
                            "world rank (int)" % (owner, name)) from None
    return owner


def _full_matrix(torch, full, name, rows, cols):
    """gather_fn's answer on the owner, checked: the whole matrix as a rows x cols
    float32 numpy array (over a contiguous CPU copy)."""
    if not isinstance(full, torch.Tensor):
        raise TypeError("gather_fn returned %s for param '%s'; return a tensor (on "
                        "the owner) or None" % (type(full).__name__, name))
    if full.numel() != rows * cols:
        raise ValueError("gather_fn returned %d elements (shape %s) for param '%s'; "
                         "the whole matrix has %d x %d" % (full.numel(),
                                                           tuple(full.shape), name,
                                                           rows, cols))
    full = full.detach().to(device="cpu", dtype=torch.float32).contiguous()
    return full.reshape(rows, cols).numpy()


def _copy_piece(torch, piece, local_out, name, local_shape):
    """Checks redistribute_fn's answer (this rank's piece, a tensor) and copies it
    into local_out, the library's float32 buffer (local_shape: for the message)."""
    if not isinstance(piece, torch.Tensor):
        raise TypeError("redistribute_fn returned %s for param '%s'; return this "
                        "rank's piece as a tensor" % (type(piece).__name__, name))
    if piece.numel() != local_out.size:
        raise ValueError("redistribute_fn returned %d elements (shape %s) for param "
                         "'%s'; this rank holds %d (shape %s)"
                         % (piece.numel(), tuple(piece.shape), name, local_out.size,
                            local_shape))
    out = torch.from_numpy(local_out.reshape(-1))
    out.copy_(piece.detach().reshape(-1).to(device="cpu", dtype=torch.float32))


def _local(t):
    """The local tensor of a DTensor, else the tensor itself."""
    return t.to_local() if _is_dtensor(t) else t


def _is_dtensor(t):
    return callable(getattr(t, "to_local", None)) and hasattr(t, "device_mesh")


def _is_owner(cfg, owner):
    """Whether this rank is `owner` (the design's gather_fn may return the full
    tensor everywhere; only the owner's counts)."""
    rank = cfg.state.get("rank") if isinstance(cfg.state, dict) else None
    return rank is None or int(rank) == int(owner)


def _owners_from_assignment(answer, names, world_size):
    """The owner of each param_idx from what the design's assign_fn returned:
    {rank: [param_idx, ...]} or {param_idx: rank}. ValueError naming the
    parameter unless every index is assigned once, to a rank of the world."""
    n = len(names)

    def who(i):
        return "param '%s' (index %d)" % (names[i], i) if 0 <= i < n else "index %r" % (i,)

    if not isinstance(answer, dict):
        raise ValueError("muon.DistributedConfig: assign_fn returned %s; return {rank: "
                         "[param_idx, ...]} or {param_idx: rank}" % type(answer).__name__)
    pairs = []  # (param_idx, rank)
    for key, value in answer.items():
        if isinstance(value, (list, tuple, set, range)):
            pairs.extend((i, key) for i in value)
        else:
            pairs.append((key, value))
    owners = [None] * n
    for i, rank in pairs:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ValueError("muon.DistributedConfig: assign_fn assigned %s, which is not a "
                             "parameter (there are %d)" % (who(i), n))
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError("muon.DistributedConfig: assign_fn assigned %s to rank %r, outside "
                             "the world of %d ranks" % (who(i), rank, world_size))
        if owners[i] is not None:
            raise ValueError("muon.DistributedConfig: assign_fn assigned %s twice (to ranks %d "
                             "and %d)" % (who(i), owners[i], rank))
        owners[i] = rank
    missing = [i for i in range(n) if owners[i] is None]
    if missing:
        raise ValueError("muon.DistributedConfig: assign_fn did not assign %s; every parameter "
                         "needs exactly one rank" % who(missing[0]))
    return owners


# ---------------------------------------------------------------------------
# Placements from process groups
# ---------------------------------------------------------------------------

_ROLE_TEXT = {"dp": "data-parallel (dp_pg)", "cp": "context-parallel (cp_pg)",
              "ep": "expert-parallel (ep_pg)", "tp": "tensor-parallel (tp_pg)",
              "fsdp": "FSDP (fsdp_pg)", "pp": "pipeline (pp_pg)"}


def _chunk_sizes(total, n):
    """torch.chunk's sizes of `total` over n (ceil each, tail short, possibly empty)."""
    step = -(-total // n) if total else 0
    return [max(0, min(step, total - r * step)) for r in range(n)]


def _crc(t):
    """A checksum of a tensor's bytes (replica checks)."""
    torch, _ = _torch()
    data = t.detach().to("cpu").contiguous().reshape(-1)
    if data.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        data = data.to(torch.float32)
    return zlib.crc32(data.view(torch.uint8).numpy().tobytes())


class _ProcessGroupConfig(_Config):
    """What create_processgroup_config returns (see there)."""

    def __init__(self, groups, world_pg, tp_dims, fsdp_mode, names, replicated_mode,
                 global_shapes, verify_replicas, async_gpu_parallelism, prefetch_count,
                 index_tables=None, name_fn=None):
        super().__init__(async_gpu_parallelism, prefetch_count)
        self.groups = groups  # role -> process group (None when absent)
        self.world_pg = world_pg
        self.tp_dims = tp_dims
        self.fsdp_mode = fsdp_mode
        self.names = names
        self.replicated_mode = replicated_mode
        self.global_shapes = global_shapes
        self.verify_replicas = verify_replicas
        # create_auto_config: tables keyed by the param's index over all param
        # groups, in the order muon.Muon attaches them.
        self._index_tables = index_tables or {}
        self._name_fn = name_fn
        self._index = {}
        self._tp_default = None  # create_auto_config: 0, the design's default TP dim

    # -- per-param lookups ----------------------------------------------------------

    def _param_index(self, param):
        return self._index.setdefault(id(param), len(self._index))

    def _set_param_order(self, params):
        """muon.Muon's params, over its param groups in order: a param's index
        (tp_dim_per_param, expert_assignments) is its position here."""
        self._index = {id(p): k for k, p in enumerate(params)}

    def _name(self, default_name, param):
        if self._name_fn is not None:
            return self._name_fn(self, default_name, param)
        if self.names is not None:
            found, name = _lookup(self.names, default_name, param)
            if not found:
                raise _ParamError("param '%s' (shape %s) has no entry in `names`"
                                  % (default_name, tuple(param.shape)))
            return str(name)
        pp = self.groups.get("pp")
        if pp is not None:
            _, dist = _torch()
            return "stage%d.%s" % (dist.get_rank(pp), default_name)
        return default_name

    def _tp_dim(self, name, default_name, param):
        """The param's TP shard dim, None when replicated over TP; (dim, True) marks
        a dim nobody gave (the design's default, dim 0), which the ranks' values
        must then bear out."""
        table = self._index_tables.get("tp_dims")
        if table is not None:
            if isinstance(table, int):
                return table
            idx = self._param_index(param)
            if idx in table:
                return None if table[idx] is None else int(table[idx])
            return _DefaultDim(self._tp_default) if self._tp_default is not None else None
        return _lookup_any(self.tp_dims, name, default_name, param, int)

    def _declared_global_shape(self, default_name, param):
        return self._global_shape(self._name(default_name, param), default_name, param)

    def _global_shape(self, name, default_name, param):
        return _lookup_any(self.global_shapes, name, default_name, param,
                           lambda shape: tuple(int(d) for d in shape))

    # -- attach ---------------------------------------------------------------------
    #
    # Every rank issues the same collectives in the same order (one gather per
    # group kind, then one over the world to agree on the errors), whatever it
    # finds: its problems are collected and raised on every rank at the end.

    def _attach(self, optimizer, named_params):
        job = _Job(self, _require_dist("create_processgroup_config"))
        entries = self._read_params(job, named_params)
        good = [e for e in entries if not e["bad"]]
        good = self._fsdp_pieces(job, good)
        good = self._tp_global_shapes(job, good)
        good = self._ep_experts(job, good)
        self._check_replicas(job, good)
        registered = not job.errors and self._register_all(job, optimizer, entries)
        job.raise_on_every_rank(registered)

    def _read_params(self, job, named_params):
        """Names, local shapes, global shapes and TP dims, and the checks that need
        no communication; one entry (a dict) per param, in the given order."""
        entries = []
        taken = {}
        for default_name, param in named_params:
            e = {"default": default_name, "param": param, "bad": False}
            entries.append(e)
            try:
                e["name"] = self._name(default_name, param)
            except Exception as err:  # noqa: BLE001  (reported on every rank)
                e["name"] = default_name
                job.fail(e, str(err) if isinstance(err, _ParamError) else
                         "param '%s': naming it raised %s: %s"
                         % (default_name, type(err).__name__, err))
                continue
            if e["name"] in taken:
                job.fail(e, "params '%s' and '%s' are both named '%s'"
                         % (taken[e["name"]], default_name, e["name"]))
            taken[e["name"]] = default_name
            e["local"] = tuple(param.shape)
            try:
                e["global"] = self._global_shape(e["name"], default_name, param)
                e["tp_dim"] = self._tp_dim(e["name"], default_name, param) \
                    if "tp" in job.groups else None
            except Exception as err:  # noqa: BLE001
                job.fail(e, "param '%s': reading global_shapes/tp_dims raised %s: %s"
                         % (e["name"], type(err).__name__, err))
                continue
            self._check_shapes(job, e)
        return entries

    def _check_shapes(self, job, e):
        flat = self.fsdp_mode == "flat" and "fsdp" in job.groups
        if flat and e["global"] is None:
            job.fail(e, "param '%s': fsdp_mode='flat' needs its global shape; pass "
                     "global_shapes={param or name: shape, ...}" % e["name"])
            return
        ndim_shape = e["global"] if e["global"] is not None else e["local"]
        if len(ndim_shape) < 2:
            job.fail(e, _matrix_ndim_error(e["name"], ndim_shape))
            return
        if e["tp_dim"] is not None and not 0 <= e["tp_dim"] < len(ndim_shape):
            job.fail(e, "param '%s': tp dim %d does not exist in shape %s"
                     % (e["name"], e["tp_dim"], tuple(ndim_shape)))
        e["crc"] = _crc(e["param"]) if self.verify_replicas else 0

    def _fsdp_pieces(self, job, good):
        """FSDP: the TP piece's shape (what FSDP splits) from every member's local shape."""
        if "fsdp" not in job.groups:
            for e in good:
                e["piece"] = e["local"]
            return good
        n = job.sizes["fsdp"]
        me = job.dist.get_rank(job.groups["fsdp"])
        everyone = job.gather("fsdp", {e["name"]: e["local"] for e in good})
        for e in good:
            missing = everyone.ranks_without(e["name"])
            if missing:
                job.fail(e, "param '%s' is sharded over the FSDP group but rank(s) "
                         "%s do not have it" % (e["name"], missing))
            elif self.fsdp_mode == "flat":
                self._flat_piece(job, e, n, me)
            else:
                self._chunked_piece(job, e, everyone, n)
        return [e for e in good if not e["bad"]]

    def _flat_piece(self, job, e, n, me):
        piece = self._tp_piece(e, job.sizes.get("tp", 1))
        if piece is None:
            job.fail(e, "param '%s': global dim %d (%d) does not split evenly "
                     "over %d TP ranks" % (e["name"], e["tp_dim"],
                                           e["global"][e["tp_dim"]], job.sizes["tp"]))
            return
        total = math.prod(piece)
        step = -(-total // n)
        start = min(me * step, total)
        e["piece"] = piece
        e["fsdp"] = ("flat", start, max(0, min(step, total - start)))

    def _chunked_piece(self, job, e, everyone, n):
        shapes = [tuple(d[e["name"]]) for d in everyone]
        if any(len(s) != len(e["local"]) or s[1:] != e["local"][1:] for s in shapes):
            job.fail(e, "param '%s': FSDP ranks hold pieces of shapes %s; FSDP "
                     "splits dim 0 only" % (e["name"], shapes))
            return
        dim0 = [s[0] for s in shapes]
        e["piece"] = (sum(dim0),) + e["local"][1:]
        e["fsdp"] = ("shard", "chunk" if dim0 == _chunk_sizes(sum(dim0), n) else dim0)

    def _tp_global_shapes(self, job, good):
        """TP: the global shape from every member's TP piece, or a replica check."""
        if "tp" not in job.groups:
            for e in good:
                e["global_inferred"] = e["piece"]
                e["tp"] = None
            return good
        everyone = job.gather("tp", {e["name"]: (e["piece"], e["crc"]) for e in good})
        for e in good:
            missing = everyone.ranks_without(e["name"])
            if missing:
                job.fail(e, "param '%s' is missing on rank(s) %s of its "
                         "TP group; every TP rank holds every TP-sharded or "
                         "replicated param" % (e["name"], missing))
                continue
            d = e["tp_dim"]
            if d is None:
                if not self._replica_mismatch(e, everyone, "tensor-parallel", job.errors,
                                              "; is it TP-sharded but missing from tp_dims?"):
                    e["global_inferred"] = e["piece"]
                    e["tp"] = None
                continue
            if isinstance(d, _DefaultDim) and self.verify_replicas and len(everyone) > 1 and \
                    len({m[e["name"]][1] for m in everyone}) == 1:
                job.fail(e, "param '%s' is read as TP-sharded on dim %d (tp_dim_per_param does "
                         "not list it, and dim %d is the default) but every TP rank holds the "
                         "same values: if it is replicated over TP, say so with "
                         "tp_dim_per_param={%d: None}" % (e["name"], d, d,
                                                          self._param_index(e["param"])))
                continue
            pieces = [tuple(m[e["name"]][0]) for m in everyone]
            if any(len(p) != len(e["piece"]) or p[:d] + p[d + 1:] !=
                   e["piece"][:d] + e["piece"][d + 1:] for p in pieces):
                job.fail(e, "param '%s': TP ranks hold pieces of shapes %s, which do not "
                         "differ in dim %d only" % (e["name"], pieces, d))
                continue
            split = [p[d] for p in pieces]
            g = list(e["piece"])
            g[d] = sum(split)
            e["global_inferred"] = tuple(g)
            e["tp"] = (d, "even" if len(set(split)) == 1 else split)
        return [e for e in good if not e["bad"]]

    def _ep_experts(self, job, good):
        """EP: a name on every EP rank is a dense (replicated) param, on one an expert."""
        if "ep" not in job.groups:
            return good
        everyone = job.gather("ep", {e["name"]: (e["piece"], e["crc"]) for e in good})
        for e in good:
            holders = [everyone.world[r] for r, d in enumerate(everyone) if e["name"] in d]
            if len(holders) == len(everyone):
                e["expert"] = False
                self._replica_mismatch(e, everyone, "expert-parallel", job.errors,
                                       "; expert params need distinct names on different "
                                       "EP ranks (names=...)")
            elif len(holders) == 1:
                e["expert"] = True
            else:
                job.fail(e, "param '%s' is held by EP ranks %s of %d: a param is either "
                         "dense (on every EP rank) or an expert (on one)"
                         % (e["name"], holders, len(everyone)))
        return [e for e in good if not e["bad"]]

    def _check_replicas(self, job, good):
        """DP, CP: replicas."""
        for role, text in (("dp", "data-parallel"), ("cp", "context-parallel")):
            if role not in job.groups:
                continue
            everyone = job.gather(role, {e["name"]: (e["piece"], e["crc"]) for e in good})
            for e in good:
                missing = everyone.ranks_without(e["name"])
                if missing:
                    job.fail(e, "param '%s' is replicated over the %s group but rank(s) "
                             "%s do not have it" % (e["name"], text, missing))
                    continue
                self._replica_mismatch(e, everyone, text, job.errors, "")

    def _register_all(self, job, optimizer, entries):
        """The world, the groups and the registrations; False (the error noted)
        when one of them fails."""
        try:
            optimizer.set_world(TorchDistComm(self.world_pg))
            gid = {role: optimizer.add_group(TorchDistComm(job.groups[role]))
                   for role in ("dp", "cp", "ep", "tp", "fsdp") if role in job.groups}
            for e in entries:
                self._register(optimizer, gid, e)
            return True
        except Exception as err:  # noqa: BLE001  (reported on every rank)
            job.errors.append("%s: %s" % (type(err).__name__, err))
            return False

    def _tp_piece(self, e, tp_size):
        """The TP piece's shape from the global shape (flat mode)."""
        g = list(e["global"])
        d = e["tp_dim"]
        if d is not None:
            if g[d] % tp_size:
                return None
            g[d] //= tp_size
        return tuple(g)

    def _replica_mismatch(self, e, everyone, text, errors, hint):
        shapes = [tuple(d[e["name"]][0]) for d in everyone]
        if any(s != tuple(e["piece"]) for s in shapes):
            errors.append("param '%s' is replicated over the %s group but its ranks hold "
                          "shapes %s%s" % (e["name"], text, shapes, hint))
            e["bad"] = True
            return True
        if self.verify_replicas:
            crcs = [d[e["name"]][1] for d in everyone]
            if len(set(crcs)) != 1:
                differ = [everyone.world[r] for r, c in enumerate(crcs) if c != crcs[0]]
                errors.append("param '%s' is replicated over the %s group but its values on "
                              "rank(s) %s differ from rank %d's%s (verify_replicas=False skips "
                              "this check)" % (e["name"], text, differ, everyone.world[0],
                                               hint))
                e["bad"] = True
                return True
        return False

    def _register(self, optimizer, gid, e):
        param = e["param"]
        if e.get("fsdp", (None,))[0] == "flat":
            global_shape = e["global"]
        else:
            global_shape = e["global_inferred"]
            if e["global"] is not None and tuple(e["global"]) != tuple(global_shape):
                raise ValueError("param '%s': global_shapes says %s but the ranks' pieces add "
                                 "up to %s" % (e["name"], tuple(e["global"]),
                                               tuple(global_shape)))
        placements = []
        if "dp" in gid:
            placements.append(Replicate(gid["dp"]))
        if "cp" in gid:
            placements.append(Replicate(gid["cp"]))
        if "ep" in gid and not e["expert"]:
            placements.append(Replicate(gid["ep"]))
        if "tp" in gid:
            if e["tp"] is None:
                placements.append(Replicate(gid["tp"]))
            else:
                placements.append(Shard(gid["tp"], e["tp"][0], split=e["tp"][1]))
        if "fsdp" in gid:
            kind = e["fsdp"]
            if kind[0] == "flat":
                placements.append(FlatRange(gid["fsdp"], kind[1], kind[2]))
            else:
                placements.append(Shard(gid["fsdp"], 0, split=kind[1]))
        optimizer.register(param, _grad_buffer(param), name=e["name"],
                           matrix_view=_matrix_view(len(global_shape)),
                           global_shape=tuple(global_shape), placements=placements,
                           replicated_mode=self.replicated_mode)


class _ParamError(ValueError):
    pass


class _DefaultDim(int):
    """A TP dim nobody gave for the param: create_auto_config's default (dim 0)."""


class _Gathered(list):
    """Every group member's payload, in group-rank order; .world: their world ranks."""

    world = ()

    def ranks_without(self, name):
        return [self.world[r] for r, d in enumerate(self) if name not in d]


class _Job:
    """One _attach: the groups present, their sizes, this rank's problems (raised
    on every rank at the end), and the collectives every rank issues."""

    def __init__(self, config, dist):
        self.dist = dist
        self.world_pg = config.world_pg
        self.groups = {role: pg for role, pg in config.groups.items() if pg is not None}
        self.errors = []
        self.world_size = dist.get_world_size(config.world_pg)
        self.sizes = {role: dist.get_world_size(pg) for role, pg in self.groups.items()}
        self.my_rank = dist.get_rank(config.world_pg)
        product = math.prod(self.sizes.values()) if self.sizes else 1
        if product != self.world_size:
            self.errors.append(
                "the group sizes (%s) multiply to %d but the world has %d ranks; every rank "
                "must be in exactly one group of each kind"
                % (", ".join("%s %d" % (_ROLE_TEXT[r], s) for r, s in self.sizes.items())
                   or "no groups", product, self.world_size))

    def fail(self, entry, message):
        self.errors.append(message)
        entry["bad"] = True

    def gather(self, role, payload):
        """payload (a dict name -> value) of every member of the group, in group-rank
        order; .world lists their ranks in the world (for messages)."""
        out = [None] * self.sizes[role]
        self.dist.all_gather_object(out, (self.my_rank, payload), group=self.groups[role])
        gathered = _Gathered(d for _, d in out)
        gathered.world = [r for r, _ in out]
        return gathered

    def raise_on_every_rank(self, registered):
        """Every rank's problems, gathered over the world and raised on every rank
        (ValueError naming the ranks of each), unless there are none."""
        everyone = [None] * self.world_size
        self.dist.all_gather_object(everyone, self.errors, group=self.world_pg)
        by_message = {}  # message -> the ranks that report it, in first-seen order
        for r, errs in enumerate(everyone):
            for msg in errs or []:
                by_message.setdefault(msg, []).append(r)
        problems = ["%s %s: %s" % ("ranks" if len(rs) > 1 else "rank",
                                   ", ".join(str(r) for r in rs), msg)
                    for msg, rs in by_message.items()]
        if problems or not registered:
            raise ValueError("muon distributed config: the layout is inconsistent (every rank "
                             "raises this):\n  " + "\n  ".join(problems))


def create_processgroup_config(fsdp_pg=None, tp_pg=None, dp_pg=None, ep_pg=None, cp_pg=None,
                               pp_pg=None, *, world_pg=None, tp_dims=None, fsdp_mode="chunk",
                               names=None, replicated_mode="host_averaged",
                               global_shapes=None, verify_replicas=True,
                               async_gpu_parallelism=True, prefetch_count=1):
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
                     None), Replicate for the others;
      fsdp_pg        fsdp_mode "chunk": the local param is dim 0's piece of
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
    return _ProcessGroupConfig(groups, world_pg, tp_dims, fsdp_mode, names, replicated_mode,
                               global_shapes, verify_replicas, async_gpu_parallelism,
                               prefetch_count)


def create_auto_config(fsdp_process_group=None, tp_process_group=None,
                       ddp_process_group=None, ep_process_group=None, cp_process_group=None,
                       tp_dim_per_param=None, expert_assignments=None,
                       async_gpu_parallelism=True, prefetch_count=1, *,
                       pp_process_group=None, world_process_group=None, fsdp_mode="chunk",
                       replicated_mode="host_averaged", global_shapes=None,
                       verify_replicas=True, tp_shard_dim=None):
    """create_processgroup_config under the names of torch's distributed-Muon design.

    tp_dim_per_param: an int (every param is TP-sharded on that dim) or a
    dict {param index: dim or None} (index over all params given to
    muon.Muon, param groups in order; None: replicated over TP). As in the
    design, a matrix the dict does not list is TP-sharded on dim 0; if its
    TP ranks hold the same values it is an error that says to list it as None.
    tp_shard_dim: the design's other name for an int tp_dim_per_param.
    expert_assignments: a dict {param index: expert id}: those params are
    experts, named "expert{id}." + muon.Muon's name, so the same expert has the
    same name on its replicas and different experts differ.
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
        prefetch_count=prefetch_count)
    if tp_dim_per_param is not None:
        cfg._index_tables["tp_dims"] = tp_dim_per_param
    elif tp_process_group is not None:
        cfg._index_tables["tp_dims"] = {}  # every matrix on dim 0, the design's default
    cfg._tp_default = 0
    if expert_assignments is not None:
        experts = dict(expert_assignments)

        def name_fn(config, default_name, param):
            idx = config._param_index(param)
            name = default_name
            if config.groups.get("pp") is not None:
                _, dist = _torch()
                name = "stage%d.%s" % (dist.get_rank(config.groups["pp"]), name)
            if idx in experts:
                name = "expert%s.%s" % (experts[idx], name)
            return name

        cfg._name_fn = name_fn
    return cfg


# ---------------------------------------------------------------------------
# DeviceMesh and DTensor (torch >= 2.x)
# ---------------------------------------------------------------------------


def _torch_version():
    torch, _ = _torch()
    return torch.__version__


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


_MESH_ROLES = {"dp": "dp", "ddp": "dp", "replicate": "dp", "dp_replicate": "dp",
               "cp": "cp", "ep": "ep", "tp": "tp", "fsdp": "fsdp", "shard": "fsdp",
               "dp_shard": "fsdp", "pp": "pp"}


def create_devicemesh_config(device_mesh, mesh_dim_names=None, *, tp_dims=None,
                             fsdp_mode="chunk", names=None, replicated_mode="host_averaged",
                             global_shapes=None, verify_replicas=True,
                             async_gpu_parallelism=True, prefetch_count=1):
    """create_processgroup_config with the groups of a DeviceMesh (torch >= 2.x).

    mesh_dim_names: the role of each mesh dimension, from "dp" (or "ddp",
    "replicate"), "fsdp" (or "shard"), "tp", "cp", "ep", "pp"; default: the
    mesh's own dim names.
    """
    if _device_mesh_class() is None:
        raise RuntimeError(
            "muon.create_devicemesh_config needs torch.distributed's DeviceMesh (torch >= 2.x); "
            "this torch is %s, which has none: use create_processgroup_config with process "
            "groups from torch.distributed.new_group" % _torch_version())
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
        async_gpu_parallelism=async_gpu_parallelism, prefetch_count=prefetch_count, **groups)


def create_dtensor_config(async_gpu_parallelism=True, prefetch_count=1, *, names=None,
                          replicated_mode="host_averaged"):
    """A DistributedConfig that reads each param's layout from the DTensor it is
    (torch >= 2.x): every mesh dim's Shard(d) becomes Shard(group, d, "chunk")
    (DTensor splits like torch.chunk), Replicate becomes Replicate(group), and
    the strided shards of tensor parallel then FSDP2 are ordered as they apply.
    Its assign_fn, gather_fn and redistribute_fn (dtensor_assign_fn, ...) can
    be read or replaced: replacing one runs the three through the custom path."""
    if _dtensor_class() is None:
        raise RuntimeError(
            "muon.create_dtensor_config needs torch.distributed's DTensor (torch >= 2.x); "
            "this torch is %s, which has none: use create_processgroup_config with process "
            "groups from torch.distributed.new_group" % _torch_version())
    return _DTensorConfig(names, replicated_mode, async_gpu_parallelism, prefetch_count)


def _replica_dims(name, mesh):
    """(root mesh, dim) of the dims of the job's mesh that a DTensor on a sub-mesh
    does not use: the ranks along them hold copies of it (FSDP2's mesh["dp"]
    inside a (dp, tp) mesh: the TP ranks each hold the same shards)."""
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    if root is mesh or root.ndim == mesh.ndim:
        return []
    sub, full = mesh.mesh_dim_names or (), root.mesh_dim_names or ()
    if not sub or any(n not in full for n in sub):
        raise ValueError("param '%s': it lives on a sub-mesh %s of the mesh %s whose other "
                         "dims cannot be told (name the mesh dims)" % (name, sub, full))
    return [(root, d) for d, n in enumerate(full) if n not in sub]


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
    _, dist = _torch()
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
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def dtensor_redistribute_fn(update, rank, state):
    """create_dtensor_config's redistribute_fn: the assigned rank's update to every
    rank of the world, then each rank's shard with its param's mesh and
    placements."""
    torch, dist = _torch()
    param = state["params"][state["current_param_idx"]]
    full = update.contiguous() if update is not None else torch.empty(tuple(param.shape))
    dist.broadcast(full, src=rank)
    if not _is_dtensor(param):
        return full
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(full, param.device_mesh, param.placements)


class _DTensorConfig(DistributedConfig):
    """What create_dtensor_config returns: a DistributedConfig whose three
    functions are dtensor_assign_fn, dtensor_gather_fn and
    dtensor_redistribute_fn. While they are all in place, the library moves the
    pieces itself (each DTensor's placements as libmuon placements); replace
    any of them and the config runs the three through the custom path."""

    def __init__(self, names, replicated_mode, async_gpu_parallelism, prefetch_count):
        super().__init__(dtensor_assign_fn, dtensor_gather_fn, dtensor_redistribute_fn, {},
                         async_gpu_parallelism, prefetch_count)
        self.names = names
        self.replicated_mode = replicated_mode

    def _native(self):
        return (self.assign_fn is dtensor_assign_fn and self.gather_fn is dtensor_gather_fn
                and self.redistribute_fn is dtensor_redistribute_fn)

    def _prepare(self, named_matrices):
        if not self._native():
            self.state.setdefault("params", [p for _, p in named_matrices])
            super()._prepare(named_matrices)

    def _attach(self, optimizer, named_params):
        if not self._native():
            return super()._attach(optimizer, named_params)
        _require_dist("create_dtensor_config")
        DTensor = _dtensor_class()
        torch, _ = _torch()
        optimizer.set_world(TorchDistComm(None))
        # Groups first (the library takes no group after a registration), one per
        # mesh dim, in the order the params meet them (the same on every rank).
        group_ids = {}
        for default_name, param in named_params:
            if isinstance(param, DTensor):
                mesh = param.device_mesh
                dims = [(mesh, d) for d in range(mesh.ndim)] + _replica_dims(default_name, mesh)
                for m, dim in dims:
                    key = (id(m), dim)
                    if key not in group_ids:
                        group_ids[key] = optimizer.add_group(TorchDistComm(m.get_group(dim)))
        for default_name, param in named_params:
            found, name = _lookup(self.names, default_name, param)
            name = str(name) if found else default_name
            if not isinstance(param, DTensor):
                raise TypeError("muon.create_dtensor_config: param '%s' is not a DTensor" % name)
            if param.ndim < 2:
                raise ValueError(_matrix_ndim_error(name, tuple(param.shape)))
            mesh = param.device_mesh
            placements = [Replicate(group_ids[(id(m), d)])
                          for m, d in _replica_dims(name, mesh)] + _dtensor_placements(
                name, param, [group_ids[(id(mesh), dim)] for dim in range(mesh.ndim)])
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            optimizer.register(param.to_local(), param.grad.to_local(), name=name,
                               matrix_view=_matrix_view(param.ndim),
                               global_shape=tuple(param.shape), placements=placements,
                               replicated_mode=self.replicated_mode)
