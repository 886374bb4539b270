"""muon.Optimizer's registration settings given ahead of the registration:
the split blocks and the matrix view that muon.Muon's param groups give a
parameter before a distributed config registers it under that name."""

from __future__ import annotations

from typing import Any, Sequence

from ._options import MATRIX_VIEW, choice, split_spec


class PendingRegistrations:
    """A mixin of muon.Optimizer (which calls _init_pending in its constructor)."""

    def _init_pending(self) -> None:
        self._splits: dict[str, Any] = {}  # name -> (split_dim, split_sizes)
        self._splits_used: set[str] = set()  # the names of _splits a registration took
        self._pending_views: dict[str, str] = {}  # name -> matrix view

    def set_split(self, name: str, split_sizes: Sequence[int] | None,
                  split_dim: int = 0) -> None:
        """The split blocks (see register()) that the registration of `name` takes
        when it gives none: a distributed config registers the parameters, and
        muon.Muon says the split of each beforehand. split_sizes None: none."""
        if split_sizes is None:
            self._splits.pop(name, None)
        else:
            self._splits[name] = split_spec(split_sizes, split_dim, "param %r" % (name,))

    def set_view(self, name: str, matrix_view: str | None) -> None:
        """The matrix view (see register()) that the registration of `name` takes
        when it is given None: muon.Muon's param group matrix_view, set before
        a distributed config registers the parameters. None: none."""
        if matrix_view is None:
            self._pending_views.pop(name, None)
        else:
            choice("matrix_view", matrix_view, MATRIX_VIEW)
            self._pending_views[name] = matrix_view

    def split_pending(self, name: str) -> bool:
        """Whether set_split gave `name` split blocks for its registration."""
        return name in self._splits

    def split_taken(self, name: str) -> bool:
        """Whether the registration of `name` took the split set_split gave it."""
        return name in self._splits_used

    def _take_split(self, name: str | None) -> Any:
        split = self._splits.get(name) if name is not None else None
        if split is not None and name is not None:
            self._splits_used.add(name)
        return split

    def _pending_view(self, name: str | None) -> str:
        return self._pending_views.get(name, "2d") if name is not None else "2d"
