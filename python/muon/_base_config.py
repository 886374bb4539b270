"""DistributedConfigBase (muon.DistributedConfigBase): the protocol muon.Muon
drives a distributed_config through, each method named, documented and given
its default once; and ConfigHooks, which reads that protocol from any config,
the underscore names of 0.6 (_attach, _options, ...) included."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch

    from ._flat import Segment
    from ._optimizer import Optimizer

    NamedParams = Sequence[tuple[str, torch.Tensor]]

# The protocol's attributes and their defaults. 0.6 named every part of the
# protocol with a leading underscore; those names work for one release more.
_ATTRIBUTES = {"flat_grad_attr": "grad", "skip_empty_groups": False}


def check_pipeline_options(async_gpu_parallelism, prefetch_count):
    """The pipeline options every config carries, checked: (bool, int)."""
    if isinstance(prefetch_count, bool) or not isinstance(prefetch_count, int) or \
            prefetch_count < 0:
        raise ValueError("muon: prefetch_count must be an int >= 0, got %r" % (prefetch_count,))
    return bool(async_gpu_parallelism), int(prefetch_count)


class DistributedConfigBase:
    """The base of every distributed config: what muon.Muon(distributed_config=)
    calls, with the defaults a config overrides.

    muon.Muon builds one low-level muon.Optimizer per param group and, at that
    group's first step, hands it to attach() with the group's parameters. A
    config implements attach(); the rest is optional:

      options() -> dict               extra muon.Optimizer arguments (default: the
                                      pipeline options, prefetch_count and
                                      async_parallelism, and assignment when set)
      attach(optimizer, named_params) sets the world, adds the groups and registers
                                      every (name, param), collectively
      prepare(named_matrices)         every matrix muon.Muon steps, from its
                                      __init__ and before each step
      set_param_order(params)         every param muon.Muon was given, in order
      global_ndim(name, param) -> int the dims of the param's global tensor
      flat_segments(name, param)      a flat buffer's Segments, or None
      after_step()                    at the end of each step()
      flat_grad_attr                  where a flat buffer's gradient is ("grad")
      skip_empty_groups               step no param group without params (False)
      assignment                      who orthogonalizes each matrix, as
                                      muon.Optimizer's: "balanced", "round_robin",
                                      "spread", "split" (None: the library's
                                      default, balanced); the same on every rank

    muon.DistributedConfig and the configs the create_*_config helpers and the
    framework adapters return derive from this class; any object with
    options() and attach() is taken too. The 0.6 names (_options, _attach,
    _prepare, _set_param_order, _global_ndim, _flat_segments, _after_step,
    _flat_grad_attr, _skip_empty_groups) call these, and muon.Muon still calls
    a 0.6 config's, for one release.
    """

    async_gpu_parallelism: bool = True
    prefetch_count: int = 1
    flat_grad_attr: str = "grad"
    skip_empty_groups: bool = False
    assignment: Any = None

    def __init__(self, async_gpu_parallelism: bool = True, prefetch_count: int = 1) -> None:
        self.async_gpu_parallelism, self.prefetch_count = check_pipeline_options(
            async_gpu_parallelism, prefetch_count)

    def options(self) -> dict[str, Any]:
        """Extra keyword arguments of the low-level muon.Optimizer of each param
        group: the pipeline options (prefetch_count, async_parallelism)."""
        out = {"prefetch_count": self.prefetch_count,
               "async_parallelism": self.async_gpu_parallelism}
        if self.assignment is not None:
            out["assignment"] = self.assignment
        return out

    def attach(self, optimizer: Optimizer, named_params: NamedParams) -> None:
        """Sets the world of `optimizer` (one param group's muon.Optimizer), adds
        its groups and registers every (name, param) of `named_params`, in that
        order, each with its grad buffer (allocated when param.grad is None).
        Collective: muon.Muon calls it at the first step() of each param group,
        on every rank."""
        raise NotImplementedError("%s.attach(optimizer, named_params) registers the params; "
                                  "a distributed config implements it" % type(self).__name__)

    def prepare(self, named_matrices: NamedParams) -> None:
        """Called with every (name, matrix) muon.Muon steps, from its __init__ and
        before each step (the design's assign_fn runs here). Default: nothing."""

    def set_param_order(self, params: Sequence[torch.Tensor]) -> None:
        """Called once with every param muon.Muon was given, over its param
        groups in order (a param's index is its position). Default: nothing."""

    def global_ndim(self, name: str, param: torch.Tensor) -> int:
        """The number of dims of the param's global tensor (a flat shard's local
        piece is 1-D; a DTensor's ndim is global). muon.Muon gives the params
        whose global tensor has fewer than 2 dims to AdamW. Default: the
        global shape the config was told, else param.ndim."""
        try:
            shape = self._declared_global_shape(name, param)
        except Exception:  # noqa: BLE001  (a lookup that fails is reported by attach)
            shape = None
        return len(shape) if shape is not None else param.ndim

    def flat_segments(self, name: str, param: torch.Tensor) -> list[Segment] | None:
        """The Segments (muon._flat.Segment) of a param that is a flat buffer
        holding ranges of several weights, or None for a plain param (then
        FSDP1's own metadata is read). Default: None."""
        return None

    def after_step(self) -> None:
        """Called at the end of each step() (Megatron's DDP all-gathers the
        ranges just updated). Default: nothing."""

    def _declared_global_shape(self, default_name: str,
                               param: torch.Tensor) -> tuple[int, ...] | None:
        """The global shape the config was told for a param, or None."""
        return None

    # -- the names of 0.6, for one release -----------------------------------------

    def _options(self):
        return self.options()

    def _attach(self, optimizer, named_params):
        return self.attach(optimizer, named_params)

    def _prepare(self, named_matrices):
        return self.prepare(named_matrices)

    def _set_param_order(self, params):
        return self.set_param_order(params)

    def _global_ndim(self, name, param):
        return self.global_ndim(name, param)

    def _flat_segments(self, name, param):
        return self.flat_segments(name, param)

    def _after_step(self):
        return self.after_step()

    @property
    def _flat_grad_attr(self):
        return self.flat_grad_attr

    @_flat_grad_attr.setter
    def _flat_grad_attr(self, value):
        self.flat_grad_attr = value

    @property
    def _skip_empty_groups(self):
        return self.skip_empty_groups

    @_skip_empty_groups.setter
    def _skip_empty_groups(self, value):
        self.skip_empty_groups = value


def _overrides_old_name(config, name):
    """Whether `config` is a DistributedConfigBase whose class (written against
    0.6) overrides the underscore name of `name` itself."""
    old = getattr(type(config), "_" + name, None)
    return old is not DistributedConfigBase.__dict__["_" + name]


class ConfigHooks:
    """The protocol of one distributed config as muon.Muon calls it: the
    config's method where it has one (a 0.6 config's underscore name where
    that is what it has or overrides), the default where it has none. Read at
    each call: a config may change after muon.Muon took it (DeepSpeed's bind)."""

    def __init__(self, config):
        self.config = config

    @staticmethod
    def accepts(config):
        """Whether `config` provides options() and attach() (or 0.6's names)."""
        return all(callable(getattr(config, name, None)) or
                   callable(getattr(config, "_" + name, None)) for name in ("options", "attach"))

    def _method(self, name):
        config = self.config
        if isinstance(config, DistributedConfigBase):
            return getattr(config, "_" + name if _overrides_old_name(config, name) else name)
        for attr in (name, "_" + name):
            method = getattr(config, attr, None)
            if callable(method):
                return method
        return None

    def _attribute(self, name):
        config = self.config
        if isinstance(config, DistributedConfigBase):
            return getattr(config, "_" + name if _overrides_old_name(config, name) else name)
        return getattr(config, name, getattr(config, "_" + name, _ATTRIBUTES[name]))

    def options(self):
        return self._method("options")() or {}

    def attach(self, optimizer, named_params):
        self._method("attach")(optimizer, named_params)

    def prepare(self, named_matrices):
        method = self._method("prepare")
        if method is not None:
            method(named_matrices)

    def set_param_order(self, params):
        method = self._method("set_param_order")
        if method is not None:
            method(params)

    def global_ndim(self, name, param):
        method = self._method("global_ndim")
        return method(name, param) if method is not None else param.ndim

    def flat_segments(self, name, param):
        method = self._method("flat_segments")
        return method(name, param) if method is not None else None

    def after_step(self):
        method = self._method("after_step")
        if method is not None:
            method()

    @property
    def flat_grad_attr(self):
        return self._attribute("flat_grad_attr")

    @property
    def skip_empty_groups(self):
        return self._attribute("skip_empty_groups")
