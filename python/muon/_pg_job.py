"""One collective attach of a process-group config: the groups present and
their sizes, the payloads gathered over a group, and this rank's problems,
raised on every rank at the end (Job); each param as the attach reads it
(ParamEntry); and the small types they report (ParamError, DefaultDim,
Gathered)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ._flat import Segment

Shape = tuple[int, ...]

_ROLE_TEXT = {"dp": "data-parallel (dp_pg)", "cp": "context-parallel (cp_pg)",
              "ep": "expert-parallel (ep_pg)", "tp": "tensor-parallel (tp_pg)",
              "fsdp": "FSDP (fsdp_pg)", "pp": "pipeline (pp_pg)"}


@dataclasses.dataclass(eq=False)
class ParamEntry:
    """One param of an attach, as the layout checks read it: filled in step by
    step (ProcessGroupConfig.attach), marked bad once a problem is noted on
    the Job (the attach then registers nothing)."""

    default: str                    # muon.Muon's name for the param
    param: Any                      # the tensor: this rank's piece
    name: str                       # its name across ranks (the config's)
    bad: bool = False               # a problem was noted (Job.fail)
    local: Shape = ()               # this rank's piece's shape
    segment: Segment | None = None  # the range of a flat buffer it views, if any
    global_shape: Shape | None = None  # the whole shape, as told (or read from the segment)
    tp_dim: int | None = None       # the dim TP splits (None: replicated over TP)
    crc: int = 0                    # a checksum of its values (verify_replicas)
    # What the pieces over the groups add up to:
    piece: Shape | None = None            # the piece DP, CP and EP replicate
    global_inferred: Shape | None = None  # the whole
    # The splits read from the ranks:
    tp: tuple[int, str | list[int]] | None = None  # (dim, "even" | each TP rank's size)
    fsdp: tuple[Any, ...] | None = None  # ("flat", start, length) or ("shard", "chunk" | sizes)
    ranges: list[tuple[int, int]] | None = None  # a flat buffer's (start, length) per FSDP rank
    expert: bool = False            # held by one EP rank only


class ParamError(ValueError):
    """A param's problem a lookup raised, reported as its message says."""


class DefaultDim(int):
    """A TP dim nobody gave for the param: create_auto_config's default (dim 0)."""


class Gathered(list):
    """Every group member's payload, in group-rank order; .world: their world ranks."""

    world = ()

    def ranks_without(self, name):
        return [self.world[r] for r, d in enumerate(self) if name not in d]


class Job:
    """One attach: the groups present, their sizes, this rank's problems (raised
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
        """Notes a problem of `entry` (a ParamEntry), which is then left out."""
        self.errors.append(message)
        entry.bad = True

    def gather(self, role, payload):
        """payload (a dict name -> value) of every member of the group, in group-rank
        order; .world lists their ranks in the world (for messages)."""
        out = [None] * self.sizes[role]
        self.dist.all_gather_object(out, (self.my_rank, payload), group=self.groups[role])
        gathered = Gathered(d for _, d in out)
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
