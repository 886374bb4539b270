"""The library optimizers behind muon.Muon: one muon.Optimizer per param group
(LibraryGroup), built at the group's first step, rebuilt when its matrices or
fixed options change, its parameters registered (in one process, or through
the distributed config) and its gradients bound before each step. Muon
inherits these methods (LibraryGroups)."""

import operator

import torch

from . import _optimizer
from ._allocator import TorchAllocator
from ._comm import Communicator, gather_objects
from ._group_options import (check_step_param, coefficients_key, group_split, group_view,
                             lowlevel_kwargs, ns_dtype_of, real_value, variants_of, view_for)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _library_param(g, i, p):
    """The tensor the library updates for g.params[i] (`p`): p itself where it is
    contiguous, else its contiguous copy g.shadows[i] (made here, kept)."""
    if p.is_contiguous():
        g.shadows[i] = None
        return p
    shadow = g.shadows[i]
    if shadow is None or shadow.shape != p.shape or shadow.dtype != p.dtype:
        shadow = g.shadows[i] = torch.empty(tuple(p.shape), dtype=p.dtype, device=p.device)
    return shadow


def _library_grad(g, i, grad):
    """The gradient the library reads for g.params[i]: `grad` itself where it is
    contiguous, else a copy of it in g.staged[i]."""
    if grad.is_contiguous():
        g.staged[i] = None
        return grad
    staged = g.staged[i]
    if staged is None or staged.shape != grad.shape or staged.dtype != grad.dtype:
        staged = g.staged[i] = torch.empty(tuple(grad.shape), dtype=grad.dtype,
                                           device=grad.device)
    staged.copy_(grad)
    return staged


def _local(t):
    """The local tensor of a DTensor-like tensor, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


class LibraryGroup:
    """The library optimizer of one param group and what it is bound to."""

    __slots__ = ("opt", "params", "index", "ids", "grads", "param_ptrs", "rebuild_key",
                 "pushed", "zeros", "shadows", "staged", "normuon")

    def __init__(self, opt, indexed, rebuild_key, normuon=False):
        self.opt = opt
        self.normuon = normuon      # NorMuon: the library keeps second moments
        self.index = [i for i, _ in indexed]  # each one's index in the param group
        self.params = [p for _, p in indexed]  # the group's matrices when built
        self.ids = []               # library id of each (None: not registered on this rank)
        self.grads = []             # the grad tensor bound for each (None: unbound)
        self.param_ptrs = []        # the param storage bound for each
        self.rebuild_key = rebuild_key
        self.pushed = None          # (lr, weight_decay, momentum) the library has
        self.zeros = {}             # distributed: zero grads bound for params without one
        # Single process: the library reads and writes contiguous memory only. A
        # parameter that is not contiguous is registered as a contiguous copy
        # (shadows[i]), refreshed from it before each step and copied back after;
        # a gradient that is not contiguous is copied into staged[i] at each step.
        self.shadows = []
        self.staged = []


class LibraryGroups:
    """muon.Muon's methods over its LibraryGroups (self._groups: param group
    number -> LibraryGroup)."""

    # Pending NorMuon moments (self._pending_moments) of a member whose loaded
    # state had none, under a distributed config, where the member is this
    # rank's piece: zeros of the whole matrices' shape, made at the build.
    ZERO_MOMENTS = object()

    @staticmethod
    def _rebuild_key(group):
        return (bool(group["nesterov"]), coefficients_key(group["ns_coefficients"]),
                real_value("eps", group["eps"]), operator.index(group["ns_steps"]),
                group["adjust_lr_fn"], ns_dtype_of(group["ns_dtype"]),
                tuple(sorted(variants_of(group).items())), group_split(group),
                group_view(group))

    def _build(self, gi, group, indexed):
        kwargs = lowlevel_kwargs(group)
        if self._config is not None:
            kwargs.update(self._hooks.options())
        if any(getattr(p, "is_cuda", False) for _, p in indexed):
            # The optimizer's GPU memory from torch's caching allocator: counted
            # by torch.cuda.memory_allocated, reused from its cache.
            kwargs.setdefault("allocator", TorchAllocator())
        opt = _optimizer.Optimizer(**kwargs)
        try:
            g = LibraryGroup(opt, indexed, self._rebuild_key(group), kwargs["normuon"])
            if self._config is None:
                self._register_single(g, gi)
            else:
                self._register_distributed(g, gi)
            self._apply_pending(g)
        except BaseException:
            opt.close()
            raise
        self._groups[gi] = g
        return g

    def _register_single(self, g, gi):
        params = g.params
        placeholders = []
        for i, p in enumerate(params):
            g.shadows.append(None)
            g.staged.append(None)
            target = _library_param(g, i, p)
            if target is not p:
                target.copy_(p)
            grad = p.grad
            if grad is None or grad.is_sparse:
                # The library wants a gradient at registration: an empty one,
                # unbound right after (the parameter is then skipped).
                grad = torch.empty_like(target, memory_format=torch.contiguous_format)
                placeholders.append(i)
            else:
                grad = _library_grad(g, i, grad)
            split = group_split(self._by_number[gi])
            view = view_for(group_view(self._by_number[gi]), target.ndim)
            g.ids.append(g.opt.register(target, grad, name=self._name(gi, g.index[i]),
                                        matrix_view=view, split_sizes=split and split[1],
                                        split_dim=split[0] if split else 0))
            g.grads.append(grad)
            g.param_ptrs.append(target.data_ptr())
        for i in placeholders:
            target = params[i] if g.shadows[i] is None else g.shadows[i]
            g.opt.rebind(g.ids[i], target, None)
            g.grads[i] = None

    def _register_distributed(self, g, gi):
        named = [(self._name(gi, i), p) for i, p in zip(g.index, g.params)]
        split = group_split(self._by_number[gi])
        view = group_view(self._by_number[gi])
        for name, _ in named:
            if split is not None:
                g.opt.set_split(name, split[1], split[0])
            g.opt.set_view(name, view)
        self._hooks.attach(g.opt, named)
        if split is not None:
            missed = [name for name, _ in named if not g.opt.split_taken(name)]
            if missed:  # the same on every rank: the same groups, the same config
                raise ValueError(
                    "muon.Muon: param group %d's split_sizes did not reach %s: this "
                    "distributed config registers them without it; register them as "
                    "whole matrices (no split_sizes) or through a muon config "
                    "(create_processgroup_config, create_megatron_config)"
                    % (gi, ", ".join(repr(n) for n in missed)))
        opt = g.opt
        ids = range(opt.num_params)
        by_object = {id(opt.param_tensor(k)): k for k in ids}
        by_name = {opt.param_name(k): k for k in ids}
        by_pointer = {opt.param_address(k): k for k in ids if opt.param_address(k)}
        for name, p in named:
            k = by_object.get(id(p))
            if k is None:
                k = by_name.get(name)
            if k is None:
                local = _local(p)
                k = by_pointer.get(local.data_ptr()) if local.numel() else None
            g.ids.append(k)
            g.shadows.append(None)  # the library steps the piece itself (QK-Clip too)
            g.grads.append(opt.grad_tensor(k) if k is not None else None)
            g.param_ptrs.append(opt.param_address(k) if k is not None else 0)

    def _state_dtype(self, g, pid):
        return _DTYPES[g.opt.state_dtype(pid)]

    @staticmethod
    def _local_state(g, pid):
        """A copy of a param's momentum, or None where another rank keeps it (a
        ZeRO-2 parameter this rank does not own: each rank's state_dict holds the
        momentum it owns, as a sharded optimizer's does)."""
        try:
            return g.opt.get_state(pid)
        except _optimizer.MuonError as e:
            if e.status != "FAILED_PRECONDITION":
                raise
            return None

    def _apply_pending(self, g):
        for p, pid in zip(g.params, g.ids):
            if pid is None or id(p) not in self._pending:
                continue
            value = self._pending.pop(id(p))
            dtype = self._state_dtype(g, pid)
            shape = tuple(g.opt.param_tensor(pid).shape)
            restore = value is not None
            if value is None:
                value = torch.zeros(shape, dtype=dtype)
            else:
                value = _local(value).detach().to(device="cpu", dtype=dtype).contiguous()
            try:
                g.opt.set_state(pid, value)
            except _optimizer.MuonError as e:
                # Nothing to restore for a ZeRO-2 param another rank owns.
                if restore or e.status != "FAILED_PRECONDITION":
                    raise
        for p, pid in zip(g.params, g.ids):
            moments = self._pending_moments.pop(id(p), None)
            if pid is not None and moments is not None and g.normuon:
                if moments is self.ZERO_MOMENTS:
                    value = g.opt.get_owned_moments(pid)[0].zero_()
                else:
                    value = moments.detach().to(device="cpu", dtype=torch.float32).contiguous()
                # Under a config every holder is given the whole moments and
                # keeps the matrices it owns.
                if self._config is None:
                    g.opt.set_moments(pid, value)
                else:
                    g.opt.set_owned_moments(pid, value)

    def _group_for_step(self, gi, group, indexed):
        g = self._groups.get(gi)
        if g is not None:
            same_params = len(g.params) == len(indexed) and all(
                a is b for a, (_, b) in zip(g.params, indexed))
            if not same_params or g.rebuild_key != self._rebuild_key(group):
                self._rebuild(gi, g)
                g = None
        if g is None:
            g = self._build(gi, group, indexed)
        return g

    def _rebuild(self, gi, g):
        """A group whose params or fixed options changed: a new library optimizer,
        with the momentum buffers carried over."""
        for p, pid in zip(g.params, g.ids):
            if pid is not None and self._has_state.get(id(p)):
                self._pending[id(p)] = self._local_state(g, pid)
                if g.normuon and self._config is None:
                    self._pending_moments[id(p)] = g.opt.get_moments(pid)
        g.opt.close()
        del self._groups[gi]

    def _push_hyper(self, g, group):
        values = (real_value("lr", group["lr"]), real_value("weight_decay", group["weight_decay"]),
                  real_value("momentum", group["momentum"]))
        if values != g.pushed:
            g.opt.lr, g.opt.weight_decay, g.opt.momentum = values
            g.pushed = values

    # -- binding gradients --------------------------------------------------------------

    def _bind_single(self, g, params):
        """Rebinds what torch replaced and refreshes the contiguous copies;
        returns the params that have a gradient."""
        active = []
        for i, p in enumerate(params):
            grad = p.grad
            check_step_param(p, grad)
            target = _library_param(g, i, p)
            moved = target.data_ptr() != g.param_ptrs[i]
            if grad is None:
                if g.grads[i] is not None or moved:
                    g.opt.rebind(g.ids[i], target, None)
                    g.grads[i], g.param_ptrs[i] = None, target.data_ptr()
                continue
            if target is not p:
                target.copy_(p)  # the host may have written p since the last step
            bound = _library_grad(g, i, grad)
            if moved or bound is not g.grads[i]:
                g.opt.rebind(g.ids[i], target, bound)
                g.grads[i], g.param_ptrs[i] = bound, target.data_ptr()
            active.append(p)
        return active

    @staticmethod
    def _write_back(g):
        """Copies the stepped contiguous copies into their parameters."""
        for p, shadow, grad in zip(g.params, g.shadows, g.grads):
            if shadow is not None and grad is not None:
                p.copy_(shadow)

    def _bind_distributed(self, g, params):
        """Every rank steps every parameter: a missing gradient is bound as zeros."""
        stepped = []
        for i, p in enumerate(params):
            pid = g.ids[i]
            if pid is None:
                continue
            registered = g.opt.param_tensor(pid)
            current = p if registered is p else _local(p)
            moved = current.data_ptr() != g.param_ptrs[i]
            grad = p.grad
            if grad is not None:
                grad = grad if registered is p else _local(grad)
            else:
                grad = g.zeros.get(i)
                if grad is None:
                    grad = g.zeros[i] = torch.zeros_like(
                        current, memory_format=torch.contiguous_format)
            if (moved or g.opt.grad_tensor(pid) is None
                    or grad.data_ptr() != g.opt.grad_address(pid)):
                g.opt.rebind(pid, current if moved else registered, grad)
                g.param_ptrs[i] = current.data_ptr()
            g.grads[i] = grad
            stepped.append(p)
        return stepped

    @staticmethod
    def _agree_group_count(g, count):
        """Every rank steps `count` param groups, each a collective step of its
        own: a rank with fewer (a pipeline stage without a kind of group) would
        leave the others' step of the rest waiting. Asked once, over the first
        group's world, before any group steps; refused on every rank alike. A
        world whose collectives are C functions is not asked."""
        comm = g.opt.world_comm
        if not isinstance(comm, Communicator):
            return
        counts = gather_objects(comm, count)
        if len(set(counts)) > 1:
            raise ValueError(
                "muon.Muon: the ranks step different numbers of param groups (%s, by world "
                "rank): each group's step is collective, so every rank needs the same param "
                "groups in the same order, a group left empty (params=[]) where a rank "
                "holds none of its params (pipeline stages)"
                % ", ".join(str(c) for c in counts))

    def _unbind_missing_grads(self):
        for g in self._groups.values():
            for i, p in enumerate(g.params):
                if g.grads[i] is not None and p.grad is None:
                    # Unbound now, so the dropped gradient's memory can be freed.
                    target = _library_param(g, i, p)
                    g.opt.rebind(g.ids[i], target, None)
                    g.grads[i], g.param_ptrs[i] = None, target.data_ptr()
