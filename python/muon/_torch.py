"""muon.Muon: a torch.optim.Optimizer whose step runs in libmuon.

With distributed_config=None it behaves like torch.optim.Muon (PyTorch >= 2.9):
the same signature and defaults, param groups with their own hyper-parameters,
LR schedulers, zero_grad(set_to_none=True/False), parameters without a
gradient skipped, and state_dict()/load_state_dict() in torch's format
(state[index]["momentum_buffer"]), copy.deepcopy and pickle. One low-level
muon.Optimizer per param group borrows the parameters and gradients in place
(no copies; only a parameter or gradient that is not contiguous goes through
a contiguous copy, as the library reads and writes contiguous memory).

Muon is this module's class; it inherits the methods over its library
optimizers from _library_groups.py (LibraryGroups) and its state in torch's
format from _torch_state.py (TorchState); _group_options.py checks a param
group's options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, overload

import torch

from . import _optimizer
from ._base_config import ConfigHooks
from ._config import is_dtensor
from ._flat import FlatBuffer, fsdp1_segments, segment_of
from ._group_options import (DEFAULT_COEFFICIENTS, check_group, check_param, check_step_param,
                             group_view, ndim_error)
from ._library_groups import LibraryGroups
from ._torch_state import TorchState

if TYPE_CHECKING:
    from typing import Union

    from ._base_config import DistributedConfigBase
    from ._options import Coefficients

    # One attention layer's largest logit per query head (QK-Clip).
    HeadLogits = Union[Sequence[float], torch.Tensor]

_increment_version = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
# The step is the library's work through ctypes, which torch.compile cannot
# trace: compiled (torch.compile(opt.step), or a compiled training step that
# calls it), Dynamo leaves it whole to eager Python instead of tracing into it
# (a hundred frames and graph breaks on ctypes structures).
_eager_under_compile = getattr(getattr(torch, "compiler", None), "disable", lambda fn: fn)


class Muon(TorchState, LibraryGroups, torch.optim.Optimizer):
    """Muon (torch.optim.Muon's update rule and signature) stepped by libmuon.

    Muon(params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
         ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
         adjust_lr_fn=None, distributed_config=None, *, ns_dtype="bf16",
         adamw_lr=None, adamw_betas=(0.95, 0.95), adamw_eps=1e-8, adamw_wd=0.0,
         extra_scale_factor=1.0, cautious_wd=False, normuon=False, normuon_beta2=0.95,
         normuon_eps=1e-8, ns_algorithm="standard", gram_restarts=(2,),
         skip_nonfinite_updates=False)

    params: parameters, or param groups (dicts) with their own values of the
    options. Matrices (2 or more dims; for a sharded parameter, its global
    tensor's) are stepped by Muon in libmuon; the others (biases, norms, scalars)
    by torch.optim.AdamW inside this optimizer, with lr adamw_lr (None: the
    group's lr), betas adamw_betas, eps adamw_eps and weight decay adamw_wd
    (None: the group's weight_decay, as a scheduler that sets it wants), so
    one optimizer takes model.parameters(). Their AdamW state (step, exp_avg,
    exp_avg_sq) is in state_dict() in torch's format. A param group with
    "adamw": True sends its matrices to AdamW too (embeddings and output heads,
    as Muon recipes do: {"params": [emb.weight, head.weight], "adamw": True}).
    adjust_lr_fn:
    None or "original" (lr * sqrt(max(1, rows / cols))), "match_rms_adamw"
    (lr * 0.2 * sqrt(max(rows, cols))) or "spectral_unclamped" (lr * sqrt(rows /
    cols)), as torch; or "spectral" (lr * sqrt(max(rows, cols)): Megatron-core's
    and Emerging-Optimizers' default scale). ns_dtype: "bf16" (Newton-Schulz as
    torch.optim.Muon computes it) or "fp32". ns_coefficients may also be a
    list of (a, b, c) rows, one per iteration, or a preset: "polar_express",
    "cans", "deepseekv4" (ns_steps=10), "cubic5" (ns_steps=5; c = 0, one
    product less per iteration) or "aol" (ns_steps=4; AOL's pre-scaling
    instead of the Frobenius division); muon.h lists their values.
    extra_scale_factor multiplies every Muon update after adjust_lr_fn
    (Emerging-Optimizers' name; weight decay keeps the plain lr): an update
    RMS target such as DeepSeek-V4's 0.18 is "match_rms_adamw" (0.2) with 0.9.
    cautious_wd=True decays a matrix element only where its update and its
    value have the same sign (cautious weight decay, arXiv 2510.12402; the
    AdamW-stepped params keep torch's AdamW decay).
    normuon=True is NorMuon (arXiv 2510.05491, as Dion ships it): each
    matrix's owner keeps a second moment per row of its orthogonalized update
    (decay normuon_beta2) and normalizes the rows by its root (+ normuon_eps),
    keeping the update's Frobenius norm; adjust_lr_fn and extra_scale_factor
    apply after it. The moments are in state_dict() as
    "normuon_second_moment" (fp32, the whole matrices' rows; in a flat
    buffer's state, a dict of them by segment name). With a
    distributed_config they live on each matrix's owner and each step
    gathers them over the world (a muon.Communicator world: torch.distributed),
    so state_dict() may be called on one rank alone (Hugging Face's Trainer
    saves DDP checkpoints so); over a world of C functions state_dict()
    cannot gather them and says so. A DTensor param's are replicated over its
    mesh. On CPUs and GPUs.
    ns_algorithm="gram" runs Gram Newton-Schulz (Dao-AILab's, restarting at
    the iterations in gram_restarts); ns_dtype="fp16" computes in fp16 after
    normalizing in fp32. On CPUs and GPUs.
    skip_nonfinite_updates=True: a NaN guard; no parameter changes on any
    rank when an orthogonalized update holds a non-finite value.

    Hyper-parameters are read from each param group before every step, so
    LR schedulers work. A parameter whose .grad is None is skipped, as torch
    does; a .grad that torch replaced (zero_grad(set_to_none=True) then
    backward) is rebound, never copied. A parameter that is not contiguous (a
    transposed view, a strided slice) is stepped through a contiguous copy,
    refreshed from it before each step and copied back after (so is a
    gradient that is not contiguous, copied in); a complex matrix raises
    RuntimeError at step() once it has a gradient, as torch does. The momentum
    buffers live in the library: state_dict() copies them out in torch's
    format, and load_state_dict() copies them back (state_dict() ->
    load_state_dict() -> state_dict() is the identity); `self.state` holds
    them only while those calls run. copy.deepcopy() and pickle copy the
    optimizer as torch copies one (its param groups, with deep copies of the
    parameters, and its state; no hooks): the copy builds its own library
    optimizers at its first step. An optimizer with a distributed_config
    refuses to be copied (TypeError).

    distributed_config: a muon.DistributedConfig (the design's: assign_fn,
    gather_fn, redistribute_fn, state), what a create_*_config helper or a
    framework adapter returns, or any muon.DistributedConfigBase: an object
    with options() (extra muon.Optimizer arguments) and attach(optimizer,
    named_params) (sets the world, adds groups and registers every (name,
    param); see muon.DistributedConfigBase for the optional rest); every rank
    then steps every parameter (a missing gradient counts as zero).
    """

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
                 lr: float | torch.Tensor = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: Coefficients = DEFAULT_COEFFICIENTS, eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None,
                 distributed_config: DistributedConfigBase | None = None, *,
                 ns_dtype: str | torch.dtype = "bf16", adamw_lr: float | None = None,
                 adamw_betas: tuple[float, float] = (0.95, 0.95), adamw_eps: float = 1e-8,
                 adamw_wd: float | None = 0.0, extra_scale_factor: float = 1.0,
                 cautious_wd: bool = False, normuon: bool = False, normuon_beta2: float = 0.95,
                 normuon_eps: float = 1e-8, ns_algorithm: str = "standard",
                 gram_restarts: Iterable[int] = (2,),
                 skip_nonfinite_updates: bool = False) -> None:
        if distributed_config is not None and not ConfigHooks.accepts(distributed_config):
            raise TypeError("muon.Muon: distributed_config must provide options() and "
                            "attach(optimizer, named_params) (a muon.DistributedConfigBase), "
                            "got %s" % type(distributed_config).__name__)
        self._init_bookkeeping(distributed_config)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype, adamw_lr=adamw_lr,
                        adamw_betas=adamw_betas, adamw_eps=adamw_eps, adamw_wd=adamw_wd,
                        extra_scale_factor=extra_scale_factor, cautious_wd=cautious_wd,
                        normuon=normuon, normuon_beta2=normuon_beta2, normuon_eps=normuon_eps,
                        ns_algorithm=ns_algorithm, gram_restarts=tuple(gram_restarts),
                        skip_nonfinite_updates=skip_nonfinite_updates)
        check_group(defaults)
        super().__init__(params, defaults)
        for gi, group in self._numbered():
            for _, p in self._members(gi, group):
                if getattr(p, "use_muon", False):
                    # DeepSpeed orthogonalizes the gradient of a parameter so
                    # flagged itself when the optimizer's class name says Muon:
                    # Newton-Schulz would run twice, with no error.
                    raise ValueError(
                        "muon.Muon: a parameter of size %s has DeepSpeed's use_muon flag set; "
                        "DeepSpeed would orthogonalize its gradient itself before muon.Muon "
                        "does (twice, silently): leave use_muon unset (del p.use_muon) and let "
                        "muon.Muon choose the matrices" % (tuple(p.shape),))
        if self._config is None:
            # What each group held when built: a wrapper that swaps its matrices
            # for flat 1-D partitions (DeepSpeed ZeRO) is refused at step().
            self._built_matrices = {gi: len(self._matrices(gi, group))
                                    for gi, group in self._numbered()}
            self._built_ids = {id(p) for gi, group in self._numbered()
                               for _, p in self._members(gi, group)}
        if self._hooks is not None:
            self._hooks.set_param_order([p for gi, group in self._numbered()
                                         for _, p in self._members(gi, group)])
        self._prepare_config()

    def _init_bookkeeping(self, config):
        """What this class keeps beside torch.optim.Optimizer's attributes, empty."""
        self._config = config
        self._hooks = None if config is None else ConfigHooks(config)  # the config's protocol
        self._flat = {}        # id(param) -> (param, its FlatBuffer or None for a plain one)
        self._numbers = {}     # id(param group dict) -> (the dict, its number)
        self._by_number = {}   # number -> param group dict
        self._groups = {}      # param group number -> LibraryGroup, once it stepped
        self._groups_agreed = False  # every rank steps as many param groups (first step)
        self._has_state = {}   # id(param) -> True once it has a momentum buffer (torch's state)
        self._pending = {}     # id(param) -> momentum to set at build (None: zero)
        self._pending_moments = {}  # id(param) -> NorMuon moments to set at build
        self._qk = []          # register_qk's layers: (q param, k param, library arguments)
        self._qk_ids = {}      # (id(LibraryGroup), handle) -> the layer's id in that library optimizer
        self._adamw = None     # torch.optim.AdamW over the non-matrix params, sharing self.state
        self._adamw_key = None
        self._built_matrices = {}  # param group number -> its matrices when built (single process)
        self._built_ids = set()    # id(param) of every param it was built with
        self._moments_cache = None  # NorMuon's moments gathered at the last step (a config's)

    def _prepare_config(self):
        """Lets the config see every matrix once (the design's assign_fn runs there)."""
        if self._hooks is not None:
            self._hooks.prepare([(self._name(gi, i), p) for gi, group in self._numbered()
                                 for i, p in self._matrices(gi, group)])

    def _numbered(self):
        """(number, group) of the current param groups. A group keeps its number
        (its position when first seen) while its dict lives, so a host that
        steps one group at a time (DeepSpeed's ZeRO sets param_groups to
        [group] around each step()) reaches the same library optimizer."""
        out = []
        for group in self.param_groups:
            entry = self._numbers.get(id(group))
            if entry is None or entry[0] is not group:
                entry = self._numbers[id(group)] = (group, len(self._by_number))
                self._by_number[entry[1]] = group
            out.append((entry[1], group))
        return out

    # -- flat buffers (FSDP1's FlatParameter, ZeRO partitions) -----------------------

    def _flat_segments(self, name, p):
        """The segments of a flat buffer (muon._flat), or None for a plain param:
        what the config's table says (framework adapters), else FSDP1's own
        metadata."""
        if self._hooks is None:
            return None
        segments = self._hooks.flat_segments(name, p)
        return segments if segments is not None else fsdp1_segments(p)

    def _flat_of(self, gi, i, p):
        """p's FlatBuffer, or None for a plain param (asked once per param object:
        a host may put flat buffers into param_groups after construction, as
        DeepSpeed's ZeRO and Megatron's distributed optimizer do)."""
        entry = self._flat.get(id(p))
        if entry is None or entry[0] is not p:
            segments = self._flat_segments(self._name(gi, i), p)
            fb = None if segments is None else FlatBuffer(
                self._name(gi, i), p, segments,
                grad_attr=self._hooks.flat_grad_attr)
            entry = self._flat[id(p)] = (p, fb)
        return entry[1]

    def _members(self, gi, group):
        """(key, tensor) of what the group steps: a plain param as itself (key: its
        index), a flat buffer as the views of its segments (key: (index, k))."""
        out = []
        for i, p in enumerate(group["params"]):
            fb = self._flat_of(gi, i, p)
            if fb is None:
                out.append((i, p))
            else:
                out.extend(((i, k), v) for k, v in enumerate(fb.views))
        return out

    def _flat_buffers(self):
        """The FlatBuffers of the current param groups."""
        return [fb for gi, group in self._numbered()
                for i, p in enumerate(group["params"])
                for fb in (self._flat_of(gi, i, p),) if fb is not None]

    # -- param groups ----------------------------------------------------------

    @property
    def distributed_config(self) -> DistributedConfigBase | None:
        """The distributed_config this optimizer was built with (None: one process)."""
        return self._config

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        count = len(self.param_groups)
        super().add_param_group(param_group)
        try:
            group = self.param_groups[-1]
            check_group(group)
            gi = [n for n, g in self._numbered() if g is group][0]
            view = group_view(group)
            for i, p in self._members(gi, group):
                if self._is_matrix(gi, i, p):
                    check_param(p, self._config is not None, view)
                    if self._config is not None and view is None:
                        self._check_global_dims(gi, i, p)
        except BaseException:
            for group in self.param_groups[count:]:  # nothing half-added
                for p in group["params"]:
                    self._flat.pop(id(p), None)
                entry = self._numbers.pop(id(group), None)
                if entry is not None and entry[0] is group:
                    self._by_number.pop(entry[1], None)
            del self.param_groups[count:]
            raise

    # -- the library optimizers ---------------------------------------------------

    def _name(self, gi, i):
        if isinstance(i, tuple):  # a segment of a flat buffer
            i, k = i
            fb = self._flat[id(self._by_number[gi]["params"][i])][1]
            return "group%d.param%d.%s" % (gi, i, fb.segments[k].name)
        return "group%d.param%d" % (gi, i)

    def _is_matrix(self, gi, i, p):
        """Muon's (a matrix, globally, in a group that does not ask for AdamW) or
        AdamW's."""
        group = self._by_number.get(gi)
        if group is not None and group.get("adamw", False):
            return False
        segment = segment_of(p)
        if segment is not None:
            return len(segment.shape) >= 2
        if self._hooks is not None:
            return self._hooks.global_ndim(self._name(gi, i), p) >= 2
        return p.ndim >= 2

    def _global_dims(self, gi, i, p):
        """The global tensor's shape where known, else its number of dims."""
        segment = segment_of(p)
        if segment is not None:
            return tuple(segment.shape)
        ndim = self._hooks.global_ndim(self._name(gi, i), p)
        return tuple(p.shape) if ndim == p.ndim else ndim

    def _check_global_dims(self, gi, i, p):
        """Refuses a distributed matrix of 3 or more dims whose group gives no
        matrix_view: experts stacked along dim 0 flattened into one matrix would
        be orthogonalized together, silently."""
        dims = self._global_dims(gi, i, p)
        if (dims if isinstance(dims, int) else len(dims)) > 2:
            raise ValueError(ndim_error(dims, "param %r" % (self._name(gi, i),)))

    def _matrices(self, gi, group):
        """(key in the group, param) of the group's matrices."""
        return [(i, p) for i, p in self._members(gi, group) if self._is_matrix(gi, i, p)]

    # -- QK-Clip -------------------------------------------------------------------

    def _matrix_position(self, p):
        """(group number, its position among the group's matrices) of matrix `p`."""
        for gi, group in self._numbered():
            for k, (_, q) in enumerate(self._matrices(gi, group)):
                if q is p:
                    return gi, k
        return None

    def register_qk(self, q_param: torch.Tensor, k_param: torch.Tensor | None = None, *,
                    num_heads: int, alpha: float = 0.5, **rows: int) -> int:
        """MuonClip's QK-Clip (Kimi K2) for one attention layer; returns the
        layer's handle for qk_clip. q_param holds the query heads, k_param
        (default: q_param, a fused QKV projection) the key heads, as rows of
        their global matrices: query head h is rows [q_first_row + h *
        q_head_stride, + q_head_rows), key head g the same with the k_ fields.
        num_kv_heads for GQA, q_rotary_rows for MLA (the last rows of each
        query head). Zeros (the defaults) split the rows evenly over the heads.
        Both must be matrices this optimizer steps with Muon, in one param
        group. See muon_qk_clip in include/libmuon/muon.h for the formulas."""
        k_param = q_param if k_param is None else k_param
        where = []
        for which, p in (("q_param", q_param), ("k_param", k_param)):
            found = self._matrix_position(p)
            if found is None:
                raise ValueError("muon.Muon.register_qk: %s is not a matrix this optimizer "
                                 "steps with Muon (QK-Clip scales Muon-stepped query and key "
                                 "projections)" % which)
            where.append(found)
        if where[0][0] != where[1][0]:
            raise ValueError("muon.Muon.register_qk: q_param and k_param are in different "
                             "param groups (%d and %d); put them in one" % (where[0][0],
                                                                          where[1][0]))
        unknown = set(rows) - set(_optimizer.Optimizer._QK_FIELDS)
        if unknown:
            raise TypeError("muon.Muon.register_qk got unknown arguments %s" % sorted(unknown))
        self._qk.append((q_param, k_param, dict(num_heads=num_heads, alpha=alpha, **rows)))
        return len(self._qk) - 1

    @torch.no_grad()
    def qk_clip(self, max_logits: Mapping[int, HeadLogits] | Sequence[HeadLogits],
                tau: float) -> int:
        """QK-Clip after a step: `max_logits` maps each register_qk handle to
        that layer's largest attention logit per query head (or is a sequence
        in handle order), the same on every rank; heads above `tau` shrink.
        Returns the number of heads clipped (on this rank's layers)."""
        items = (max_logits.items() if isinstance(max_logits, dict)
                 else enumerate(max_logits))
        clipped = 0
        for handle, logits in items:
            if not 0 <= handle < len(self._qk):
                raise ValueError("muon.Muon.qk_clip: %r is not a register_qk handle" % (handle,))
            q, k, kwargs = self._qk[handle]
            gi, qpos = self._matrix_position(q)
            kpos = self._matrix_position(k)[1]
            g = self._groups.get(gi)
            if g is None:
                raise RuntimeError("muon.Muon.qk_clip: call it after a step (it scales the "
                                   "weights a step produced)")
            qid, kid = g.ids[qpos], g.ids[kpos]
            if qid is None or kid is None:
                continue  # this rank holds no piece of them
            layer = self._qk_ids.get((id(g), handle))
            if layer is None:
                layer = self._qk_ids[(id(g), handle)] = g.opt.register_qk_clip(qid, kid,
                                                                              **kwargs)
            for pos in {qpos, kpos}:  # a contiguous copy: refreshed, clipped, written back
                if g.shadows[pos] is not None:
                    g.shadows[pos].copy_(g.params[pos])
            clipped += g.opt.qk_clip(layer, torch.as_tensor(logits, dtype=torch.float32)
                                     .reshape(-1), tau)
            for pos in {qpos, kpos}:
                if g.shadows[pos] is not None:
                    g.params[pos].copy_(g.shadows[pos])
        return clipped

    # -- torch.optim.Optimizer ---------------------------------------------------------

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        super().zero_grad(*args, **kwargs)
        if self._config is None:
            self._unbind_missing_grads()

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @_eager_under_compile
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One Muon step for every param group; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for fb in self._flat_buffers():
            fb.sync()
        self._prepare_config()
        skip_empty = self._hooks is not None and self._hooks.skip_empty_groups
        stepping = [(gi, group, self._matrices(gi, group)) for gi, group in self._numbered()
                    if not (skip_empty and not group["params"])]
        if self._config is None:  # every group checked before any steps
            for gi, _, indexed in stepping:
                for i, p in indexed:
                    if is_dtensor(p):
                        self._refuse_dtensor(gi, i, p)
        for gi, group, indexed in stepping:  # (ZeRO-3 steps its sub-groups one at a time)
            if not indexed and self._config is None:
                self._check_not_flattened(gi, group)
                continue  # (distributed: stepped anyway, the step is collective)
            for _, p in indexed:  # before the library sees them, as torch's _init_group
                if self._config is None:
                    if p.grad is not None:
                        check_step_param(p, p.grad)
                elif torch.is_complex(p):
                    check_step_param(p, None)
            if self._config is None:
                # A complex matrix without a gradient is skipped, as torch skips it
                # (with one, check_step_param refused it).
                indexed = [(i, p) for i, p in indexed if not torch.is_complex(p)]
            g = self._group_for_step(gi, group, indexed)
            self._push_hyper(g, group)
            if self._config is None:
                stepped = self._bind_single(g, g.params)
                if not stepped:
                    continue  # torch does nothing for a group without gradients
            else:
                stepped = self._bind_distributed(g, g.params)
                if not self._groups_agreed:
                    self._agree_group_count(g, len(stepping))
                    self._groups_agreed = True
            try:
                g.opt.step()
            except _optimizer.MuonError as e:
                # A group of AdamW params only (on every rank: the library's verdict
                # is the job's), distributed: nothing for Muon to do.
                if g.params or e.status != "FAILED_PRECONDITION" or \
                        g.opt.stats()["matrices_total"] != 0:
                    raise
            if self._config is None:
                self._write_back(g)
            for p in stepped:
                self._has_state[id(p)] = True
                if _increment_version is not None:
                    _increment_version(p)  # updated in place, as torch's optimizers do
        self._step_adamw()
        self._cache_moments()
        if self._hooks is not None:
            self._hooks.after_step()  # e.g. Megatron's DDP all-gathers the ranges just updated
        return loss

    def push_hyperparameters(self, stream: Any = None) -> None:
        """Before each replay of a step captured into a CUDA graph: writes every
        group's current lr, weight_decay and momentum where the captured kernels
        read them, so that the replays follow an LR scheduler (a replay runs no
        Python; without this it keeps the values of the step that was captured).
        On `stream` (default: torch's current stream). Harmless elsewhere."""
        for gi, group in self._numbered():
            g = self._groups.get(gi)
            if g is not None:
                self._push_hyper(g, group)
                g.opt.push_hyperparameters(stream)

    def _refuse_dtensor(self, gi, i, p):
        """A DTensor param without a distributed_config: each rank holds a piece
        (FSDP2, tensor parallel; Accelerate's FSDP2 swaps them into param_groups
        after construction), which one process cannot orthogonalize whole."""
        raise ValueError(
            "muon.Muon: param '%s' is a DTensor (placements %s on a mesh of %d ranks: FSDP2 or "
            "tensor parallel, or a wrapper such as Accelerate's FSDP2 that swapped it into "
            "param_groups) and muon.Muon was built without distributed_config, which steps "
            "whole tensors in one process: build it with distributed_config="
            "muon.create_dtensor_config(), on every rank"
            % (self._name(gi, i), tuple(str(pl) for pl in p.placements), p.device_mesh.size()))

    def _check_not_flattened(self, gi, group):
        """A group built with matrices that now holds only 1-D tensors it was not
        built with: a wrapper replaced the matrices with flat partitions (DeepSpeed
        ZeRO hands the client optimizer one per group), which would be stepped as
        AdamW, silently. Refused, naming the wiring that steps them as Muon."""
        had = self._built_matrices.get(gi, 0)
        new = [p for _, p in self._members(gi, group) if id(p) not in self._built_ids]
        if had and new and all(p.ndim < 2 for p in new):
            raise RuntimeError(
                "muon.Muon: param group %d was built with %d matri%s and now holds only flat "
                "1-D tensors it was not built with (sizes %s): a wrapper replaced its "
                "parameters with flat partitions (DeepSpeed ZeRO does), which would be stepped "
                "as AdamW, not Muon. Under DeepSpeed build muon.Muon with distributed_config="
                "muon.deepspeed.create_deepspeed_config() and call muon.deepspeed.initialize"
                % (gi, had, "x" if had == 1 else "ces", [tuple(p.shape) for p in new[:3]]))

    def _step_adamw(self):
        """torch.optim.AdamW over every group's non-matrix params, with the group's
        adamw_* values; its state is this optimizer's (self.state)."""
        groups, key = [], []
        for gi, group in self._numbered():
            matrices = {id(p) for _, p in self._matrices(gi, group)}
            others = [p for _, p in self._members(gi, group) if id(p) not in matrices]
            if not others:
                continue
            lr = group["adamw_lr"] if group["adamw_lr"] is not None else group["lr"]
            wd = group["adamw_wd"] if group["adamw_wd"] is not None else group["weight_decay"]
            groups.append(dict(params=others, lr=lr, betas=tuple(group["adamw_betas"]),
                               eps=group["adamw_eps"], weight_decay=wd))
            key.append(tuple(id(p) for p in others))
        if not groups:
            return
        if self._adamw is None or self._adamw_key != key:
            self._adamw = torch.optim.AdamW(groups)
            self._adamw_key = key
        else:
            for mine, values in zip(self._adamw.param_groups, groups):
                mine.update({k: v for k, v in values.items() if k != "params"})
        self._adamw.state = self.state  # (load_state_dict replaces self.state)
        self._adamw.step()

    def stats(self) -> dict[str, int | float]:
        """What moved and what was computed in the last step on this rank, summed
        over the param groups (the library's muon_get_stats)."""
        total: dict[str, int | float] = {}
        for g in getattr(self, "_groups", {}).values():
            if getattr(g, "opt", None) is None:
                continue
            for k, v in g.opt.stats().items():
                if k == "steps":
                    total[k] = max(total.get(k, 0), v)
                else:
                    total[k] = total.get(k, 0) + v
        return total

    def __del__(self):
        for g in getattr(self, "_groups", {}).values():
            if g is not None:
                try:
                    g.opt.close()
                except Exception:
                    pass
