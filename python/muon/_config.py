"""DistributedConfig: the design's distributed config for muon.Muon, three
torch-level callables (assign_fn, gather_fn, redistribute_fn) registered on
the custom path (muon_register_param_custom); and the helpers the other
configs share (lookups by param or name, torch and torch.distributed).

Every config derives from muon.DistributedConfigBase (_base_config.py),
which names the protocol muon.Muon calls: options() and attach(optimizer,
named_params), with prepare(), set_param_order(), global_ndim() and the
rest optional. The create_*_config helpers (_pg_config.py,
_dtensor_config.py) return DistributedConfigs too, whose three functions
describe their layout; while none is replaced they register placements
instead (muon_register_param with a global shape), so the library moves the
pieces itself.

attach is collective: muon.Muon calls it at the first step() of each param
group, so every rank of the world must step the same number of param groups,
in the same order. Layout errors are found there and raised on every rank.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Any, Callable

from ._base_config import DistributedConfigBase, check_pipeline_options
from ._dist import TorchDistComm

if TYPE_CHECKING:
    from typing import Mapping, Union

    import torch

    from ._base_config import NamedParams
    from ._optimizer import Optimizer

    # A per-param table: a dict keyed by the param object or its name, or a
    # callable (name, param) -> value (None: no entry).
    ParamTable = Union[Mapping[Any, Any], Callable[[str, torch.Tensor], Any]]

__all__ = ["DistributedConfig"]


def torch_and_dist():
    import torch
    import torch.distributed as dist
    return torch, dist


def torch_version():
    torch, _ = torch_and_dist()
    return torch.__version__


def require_dist(what):
    _, dist = torch_and_dist()
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("muon.%s: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first" % what)
    return dist


def matrix_ndim_error(name, shape):
    return ("param '%s' has %d dimension(s) (shape %s); Muon orthogonalizes matrices only: "
            "optimize 0-D and 1-D parameters (biases, norms) with AdamW"
            % (name, len(shape), tuple(shape)))


def matrix_view_for(ndim):
    # 2-D params as they are; N-D ones with the view their muon.Muon param group
    # gave (Optimizer.set_view), else none (the library refuses them, naming
    # the views).
    return "2d" if ndim == 2 else None


def grad_buffer(param):
    """The param's grad tensor, allocated (zeros) when there is none: the library
    borrows its storage."""
    torch, _ = torch_and_dist()
    if param.grad is None:
        param.grad = torch.zeros_like(param, memory_format=torch.contiguous_format)
    return param.grad


def lookup(table, name, param):
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


def lookup_named(table, name, default_name, param):
    """A dict entry keyed by the param, its name or muon.Muon's name for it; or a
    callable's answer for (name, param). Returns (found, value)."""
    found, value = lookup(table, name, param)
    if not found and isinstance(table, dict) and default_name != name:
        found, value = lookup(table, default_name, param)
    return found, value


def lookup_any(table, name, default_name, param, convert):
    """lookup_named's value, converted; None when there is none."""
    found, value = lookup_named(table, name, default_name, param)
    return convert(value) if found else None


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
class DistributedConfig(DistributedConfigBase):
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

    assign_fn: Callable[..., Any]
    gather_fn: Callable[..., Any]
    redistribute_fn: Callable[..., Any]
    state: Any = dataclasses.field(default_factory=dict)
    async_gpu_parallelism: bool = True
    prefetch_count: int = 1

    def __post_init__(self) -> None:
        for what, fn in (("assign_fn", self.assign_fn), ("gather_fn", self.gather_fn),
                         ("redistribute_fn", self.redistribute_fn)):
            if not callable(fn):
                raise TypeError("muon.DistributedConfig: %s must be callable, got %s"
                                % (what, type(fn).__name__))
        self.async_gpu_parallelism, self.prefetch_count = check_pipeline_options(
            self.async_gpu_parallelism, self.prefetch_count)
        if self.state is None:
            self.state = {}
        # The tensors over the library's buffers handed to the callables, held a
        # little longer: if the callables pass them to torch.distributed, gloo's
        # worker thread must not drop the last reference (see _dist.py).
        self._recent: collections.deque[Any] = collections.deque(maxlen=4)
        self._owners = None  # design form: param_idx -> rank, once assign_fn ran
        self._index: dict[int, int] = {}  # id(param) -> param_idx

    def _design_form(self, fn, per_param_arity):
        return _positional_arity(fn) != per_param_arity

    def _state_entry(self, key):
        return self.state.get(key) if isinstance(self.state, dict) else None

    def _declared_global_shape(self, default_name, param):
        found, name = lookup(self._state_entry("names"), default_name, param)
        return lookup_any(self._state_entry("global_shapes"), str(name) if found else default_name,
                           default_name, param, lambda s: tuple(int(d) for d in s))

    def _world(self):
        comm = self._state_entry("world_comm")
        if comm is not None:
            return comm
        require_dist("DistributedConfig")
        return TorchDistComm(self._state_entry("world_pg"))

    # -- the design's assignment, once -----------------------------------------------

    def prepare(self, named_matrices: NamedParams) -> None:
        """Runs the design's assign_fn over every matrix muon.Muon steps (a list of
        (name, param)), once; muon.Muon calls this from __init__ and before each
        step (it waits for torch.distributed to be initialized)."""
        if self._owners is not None or not self._design_form(self.assign_fn, 3):
            return
        world = self._state_entry("world_comm")
        if world is not None:
            rank, size = int(world.rank), int(world.size)
        else:
            _, dist = torch_and_dist()
            if not dist.is_available() or not dist.is_initialized():
                return  # at the first step; attach then says what is missing
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

    def attach(self, optimizer: Optimizer, named_params: NamedParams) -> None:
        """Registers every param on the custom path, its three callables calling
        this config's assign_fn, gather_fn and redistribute_fn (see the class)."""
        world = self._world()
        optimizer.set_world(world)
        seen = set()
        for default_name, param in named_params:
            found, name = lookup(self._state_entry("names"), default_name, param)
            name = str(name) if found else default_name
            if name in seen:
                raise ValueError("muon.DistributedConfig: two parameters are named '%s'" % name)
            seen.add(name)
            shape = lookup_any(self._state_entry("global_shapes"), name, default_name, param,
                                lambda s: tuple(int(d) for d in s))
            if shape is None:
                shape = self._probe_global_shape(world, name, param) or tuple(param.shape)
            if len(shape) < 2:
                raise ValueError("muon.DistributedConfig: " + matrix_ndim_error(name, shape))
            rows, cols = shape[0], math.prod(shape[1:])
            grad = grad_buffer(param)
            optimizer.register_custom(_local(param), _local(grad), name, rows, cols,
                                      *self._callbacks(name, param, rows, cols))

    def _probe_global_shape(self, world, name, param):
        """The design's gather_fn returns the whole tensor, whose shape nobody
        declared: learn it once, at registration, by a gather of zeros on every
        rank, the owner telling the others the shape (a DTensor says it itself).
        None when nothing is to be learned (per-parameter form: the local shape)."""
        torch, dist = torch_and_dist()
        if is_dtensor(param) or id(param) not in self._index or \
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
        torch, _ = torch_and_dist()
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
            if is_dtensor(param):  # the design's shard of a DTensor param is a DTensor
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
    return t.to_local() if is_dtensor(t) else t


def is_dtensor(t):
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
