"""One collective attach of a process-group config: the groups present and
their sizes, the payloads gathered over a group, and this rank's problems,
raised on every rank at the end (Job); with the small types it reports
(ParamError, DefaultDim, Gathered)."""

import math

_ROLE_TEXT = {"dp": "data-parallel (dp_pg)", "cp": "context-parallel (cp_pg)",
              "ep": "expert-parallel (ep_pg)", "tp": "tensor-parallel (tp_pg)",
              "fsdp": "FSDP (fsdp_pg)", "pp": "pipeline (pp_pg)"}


class ParamError(ValueError):
    pass


class DefaultDim(int):
    """A TP dim nobody gave for the param: create_auto_config's default (dim 0)."""


class Gathered(list):
    """Every group member's payload, in group-rank order; .world: their world ranks."""

    world = ()

    def ranks_without(self, name):
        return [self.world[r] for r, d in enumerate(self) if name not in d]


class Job:
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
