"""How a ProcessGroupConfig reads its params' layout at attach: names, local
and global shapes and TP dims (read_params), then, over each group kind, the
shape its split adds up to (FSDP pieces, TP pieces), experts and replicas,
every problem noted on the Job. ProcessGroupConfig inherits these methods
(LayoutChecks)."""

import math

from ._config import matrix_ndim_error
from ._flat import segment_of
from ._pg_functions import chunk_sizes, crc
from ._pg_job import DefaultDim, ParamEntry, ParamError


class LayoutChecks:
    """ProcessGroupConfig's layout reading (self: the config; job: the Job)."""

    def _read_params(self, job, named_params):
        """Names, local shapes, global shapes and TP dims, and the checks that need
        no communication; one ParamEntry per param, in the given order."""
        entries = []
        taken = {}
        for default_name, param in named_params:
            e = ParamEntry(default_name, param, default_name)
            entries.append(e)
            try:
                e.name = self._name(default_name, param)
            except Exception as err:  # noqa: BLE001  (reported on every rank)
                job.fail(e, str(err) if isinstance(err, ParamError) else
                         "param '%s': naming it raised %s: %s"
                         % (default_name, type(err).__name__, err))
                continue
            if e.name in taken:
                job.fail(e, "params '%s' and '%s' are both named '%s'"
                         % (taken[e.name], default_name, e.name))
            taken[e.name] = default_name
            e.local = tuple(param.shape)
            e.segment = segment_of(param)
            try:
                e.global_shape = self._global_shape(e.name, default_name, param)
                e.tp_dim = self._tp_dim(e.name, default_name, param) \
                    if "tp" in job.groups else None
                if e.global_shape is None and e.segment is not None:
                    # The range indexes the TP piece (the whole tensor without TP).
                    g = list(e.segment.shape)
                    if e.tp_dim is not None and 0 <= e.tp_dim < len(g):
                        g[e.tp_dim] *= job.sizes["tp"]
                    e.global_shape = tuple(g)
            except Exception as err:  # noqa: BLE001
                job.fail(e, "param '%s': reading global_shapes/tp_dims raised %s: %s"
                         % (e.name, type(err).__name__, err))
                continue
            self._check_shapes(job, e)
        return entries

    def _check_shapes(self, job, e):
        """A param's checks that need no communication; its checksum into e.crc."""
        if e.segment is not None and ("fsdp" not in job.groups or
                                      self._fsdp_outer(job.groups)):
            job.fail(e, "param '%s' is a range of a flat buffer (an FSDP1 FlatParameter or a "
                     "ZeRO partition), split over the ranks of its FSDP group: %s"
                     % (e.name, "pass that group as fsdp_pg (FSDP1: the model's "
                                "process_group)" if "fsdp" not in job.groups else
                                "the buffer flattens the TP piece, so pass "
                                "gather_order=('fsdp', 'tp')"))
            return
        flat = self.fsdp_mode == "flat" and "fsdp" in job.groups
        if flat and e.global_shape is None:
            job.fail(e, "param '%s': fsdp_mode='flat' needs its global shape; pass "
                     "global_shapes={param or name: shape, ...}" % e.name)
            return
        ndim_shape = e.global_shape if e.global_shape is not None else e.local
        if len(ndim_shape) < 2:
            job.fail(e, matrix_ndim_error(e.name, ndim_shape))
            return
        if e.tp_dim is not None and not 0 <= e.tp_dim < len(ndim_shape):
            job.fail(e, "param '%s': tp dim %d does not exist in shape %s"
                     % (e.name, e.tp_dim, tuple(ndim_shape)))
        e.crc = crc(e.param) if self.verify_replicas else 0

    def _fsdp_pieces(self, job, pieces):
        """FSDP: the shape FSDP splits, from every member's piece. `pieces` holds
        (entry, the shape of its FSDP piece) for the good entries; returns
        (entry, the shape FSDP splits) for those still good."""
        if "fsdp" not in job.groups:
            return pieces
        n = job.sizes["fsdp"]
        me = job.dist.get_rank(job.groups["fsdp"])
        payload = {e.name: shape for e, shape in pieces}
        payload.update({("range", e.name): (e.segment.start, e.segment.length)
                        for e, _ in pieces if e.segment is not None})
        everyone = job.gather("fsdp", payload)
        out = []
        for e, shape in pieces:
            missing = everyone.ranks_without(e.name)
            if missing:
                job.fail(e, "param '%s' is sharded over the FSDP group but rank(s) "
                         "%s do not have it" % (e.name, missing))
                continue
            if e.segment is not None:
                e.ranges = [d.get(("range", e.name), (0, 0)) for d in everyone]
                whole = self._flat_piece(job, e, n, me)
            elif self.fsdp_mode == "flat":
                whole = self._flat_piece(job, e, n, me)
            else:
                whole = self._chunked_piece(job, e, shape, everyone, n)
            if whole is not None:
                out.append((e, whole))
        return [(e, whole) for e, whole in out if not e.bad]

    def _flat_piece(self, job, e, n, me):
        """Flat FSDP: the TP piece the flat ranges index (None: noted on the Job),
        and this rank's range of it into e.fsdp."""
        piece = self._tp_piece(e, job.sizes.get("tp", 1))
        if piece is None:
            job.fail(e, "param '%s': global dim %d (%d) does not split evenly "
                     "over %d TP ranks" % (e.name, e.tp_dim,
                                           e.global_shape[e.tp_dim], job.sizes["tp"]))
            return None
        if e.segment is not None:  # the flat buffer says which range
            e.fsdp = ("flat", e.segment.start, e.segment.length)
            return piece
        total = math.prod(piece)
        step = -(-total // n)
        start = min(me * step, total)
        e.fsdp = ("flat", start, max(0, min(step, total - start)))
        return piece

    def _chunked_piece(self, job, e, mine, everyone, n):
        """FSDP over dim 0: the shape the members' pieces (`mine` this rank's) add
        up to (None: noted on the Job), and the split into e.fsdp."""
        shapes = [tuple(d[e.name]) for d in everyone]
        mine = tuple(mine)
        if any(len(s) != len(mine) or s[1:] != mine[1:] for s in shapes):
            job.fail(e, "param '%s': FSDP ranks hold pieces of shapes %s; FSDP "
                     "splits dim 0 only" % (e.name, shapes))
            return None
        dim0 = [s[0] for s in shapes]
        e.fsdp = ("shard", "chunk" if dim0 == chunk_sizes(sum(dim0), n) else dim0)
        return (sum(dim0),) + mine[1:]

    def _tp_global_shapes(self, job, pieces):
        """TP: the shape TP splits, from every member's piece, or a replica check.
        `pieces` holds (entry, the shape of its TP piece) for the good entries;
        returns (entry, the shape TP splits) for those still good, and TP's
        split of each into e.tp."""
        if "tp" not in job.groups:
            for e, _ in pieces:
                e.tp = None
            return pieces
        everyone = job.gather("tp", {e.name: (shape, e.crc) for e, shape in pieces})
        out = []
        for e, shape in pieces:
            missing = everyone.ranks_without(e.name)
            if missing:
                job.fail(e, "param '%s' is missing on rank(s) %s of its "
                         "TP group; every TP rank holds every TP-sharded or "
                         "replicated param" % (e.name, missing))
                continue
            d = e.tp_dim
            if d is None:
                if not self._replica_mismatch(e, shape, everyone, "tensor-parallel", job.errors,
                                              "; is it TP-sharded but missing from tp_dims?"):
                    e.tp = None
                    out.append((e, shape))
                continue
            if isinstance(d, DefaultDim) and self.verify_replicas and len(everyone) > 1 and \
                    len({m[e.name][1] for m in everyone}) == 1:
                job.fail(e, "param '%s' is read as TP-sharded on dim %d (tp_dim_per_param does "
                         "not list it, and dim %d is the default) but every TP rank holds the "
                         "same values: if it is replicated over TP, say so with "
                         "tp_dim_per_param={%d: None}" % (e.name, d, d,
                                                          self._param_index(e.param)))
                continue
            shapes = [tuple(m[e.name][0]) for m in everyone]
            mine = tuple(shape)
            if any(len(p) != len(mine) or p[:d] + p[d + 1:] != mine[:d] + mine[d + 1:]
                   for p in shapes):
                job.fail(e, "param '%s': TP ranks hold pieces of shapes %s, which do not "
                         "differ in dim %d only" % (e.name, shapes, d))
                continue
            split = [p[d] for p in shapes]
            g = list(mine)
            g[d] = sum(split)
            e.tp = (d, "even" if len(set(split)) == 1 else split)
            out.append((e, tuple(g)))
        return [(e, whole) for e, whole in out if not e.bad]

    def _ep_experts(self, job, good):
        """EP: a name on every EP rank is a dense (replicated) param, on one an expert."""
        if "ep" not in job.groups:
            return good
        everyone = job.gather("ep", {e.name: (e.piece, e.crc) for e in good})
        for e in good:
            holders = [everyone.world[r] for r, d in enumerate(everyone) if e.name in d]
            if len(holders) == len(everyone):
                e.expert = False
                self._replica_mismatch(e, e.piece, everyone, "expert-parallel", job.errors,
                                       "; expert params need distinct names on different "
                                       "EP ranks (names=...)")
            elif len(holders) == 1:
                e.expert = True
            else:
                job.fail(e, "param '%s' is held by EP ranks %s of %d: a param is either "
                         "dense (on every EP rank) or an expert (on one)"
                         % (e.name, holders, len(everyone)))
        return [e for e in good if not e.bad]

    def _check_replicas(self, job, good):
        """DP, CP: replicas."""
        for role, text in (("dp", "data-parallel"), ("cp", "context-parallel")):
            if role not in job.groups:
                continue
            everyone = job.gather(role, {e.name: (e.piece, e.crc) for e in good})
            for e in good:
                missing = everyone.ranks_without(e.name)
                if missing:
                    job.fail(e, "param '%s' is replicated over the %s group but rank(s) "
                             "%s do not have it" % (e.name, text, missing))
                    continue
                self._replica_mismatch(e, e.piece, everyone, text, job.errors, "")

    def _tp_piece(self, e, tp_size):
        """The TP piece's shape from the global shape (flat mode)."""
        g = list(e.global_shape)
        d = e.tp_dim
        if d is not None:
            if g[d] % tp_size:
                return None
            g[d] //= tp_size
        return tuple(g)

    def _replica_mismatch(self, e, shape, everyone, text, errors, hint):
        """Whether the members of a replica group (`everyone`'s payloads) hold
        other shapes than this rank's `shape`, or other values; noted."""
        shapes = [tuple(d[e.name][0]) for d in everyone]
        if any(s != tuple(shape) for s in shapes):
            errors.append("param '%s' is replicated over the %s group but its ranks hold "
                          "shapes %s%s" % (e.name, text, shapes, hint))
            e.bad = True
            return True
        if self.verify_replicas:
            crcs = [d[e.name][1] for d in everyone]
            if len(set(crcs)) != 1:
                differ = [everyone.world[r] for r, c in enumerate(crcs) if c != crcs[0]]
                errors.append("param '%s' is replicated over the %s group but its values on "
                              "rank(s) %s differ from rank %d's%s (verify_replicas=False skips "
                              "this check)" % (e.name, text, differ, everyone.world[0],
                                               hint))
                e.bad = True
                return True
        return False
