"""The low-level distributed API from Python: ranks as Python threads.

Each rank registers only its piece of every matrix (muon.Shard / FlatRange /
Replicate over the world and its groups) and steps; the pieces must equal,
bit for bit, the matching elements of a single-process muon.Optimizer run
over the whole matrices with the same gradients. The communicators are the
library's in-process adapter (muon.InProcessWorld) or a muon.Communicator
written here in Python (threading barriers and shared numpy buffers), whose
collectives the library calls through ctypes, from the optimizer's helper
thread too. Also: a callback that raises, the custom path
(register_custom) and a custom assignment callable.
"""

import ctypes
import threading

import numpy
import pytest
import torch

import muon
from muon import _lib
from thread_ranks import TIMEOUT, Hub, ThreadComm, run_ranks

STEPS = 4


def no_errors(errors):
    for rank, e in enumerate(errors):
        if e is not None:
            raise AssertionError("rank %d failed: %r" % (rank, e)) from e


# ---------------------------------------------------------------------------
# Layouts: a TP 2 x FSDP 2 mesh of 4 ranks (tp = rank % 2, fsdp = rank // 2)
# ---------------------------------------------------------------------------

# (name, global shape, matrix view, placements from the global tensor down):
# ("shard", group, dim, split) / ("rep", group) / ("flat", group, cuts), where a
# flat range's cuts are the n + 1 boundaries of the ranks' ranges.
MODEL = [
    ("attn.qkv", (12, 8), "2d", [("shard", "tp", 0, "even"), ("shard", "fsdp", 0, "chunk")]),
    ("attn.out", (8, 12), "2d", [("shard", "tp", 1, "even"), ("shard", "fsdp", 0, "chunk")]),
    ("embed", (10, 6), "2d", [("rep", "tp"), ("shard", "fsdp", 0, "chunk")]),
    ("mlp.up", (9, 4), "2d", [("rep", "tp"), ("shard", "fsdp", 0, [6, 3])]),
    ("zero.flat", (7, 5), "2d", [("flat", "world", [0, 9, 20, 20, 35])]),  # rank 2: empty
    ("experts", (2, 4, 6), "batched_leading", [("shard", "tp", 0, "even"), ("rep", "fsdp")]),
    ("tall", (16, 4), "2d", [("shard", "fsdp", 0, "even"), ("flat", "tp", [0, 13, 32])]),
]
WORLD = 4


def mesh_groups(rank):
    """World ranks of this rank's groups, in the order every rank creates them."""
    tp = [2 * (rank // 2), 2 * (rank // 2) + 1]
    fsdp = [rank % 2, rank % 2 + 2]
    return {"world": list(range(WORLD)), "tp": tp, "fsdp": fsdp}


def local_indices(shape, placements, rank):
    """Indices (into the flattened global tensor) of this rank's piece, in the
    piece's shape."""
    groups = mesh_groups(rank)
    idx = numpy.arange(int(numpy.prod(shape))).reshape(shape)
    for pl in placements:
        members = groups[pl[1]]
        gr, gn = members.index(rank), len(members)
        if pl[0] == "rep":
            continue
        if pl[0] == "flat":
            cuts = pl[2]
            idx = idx.reshape(-1)[cuts[gr]:cuts[gr + 1]]
            continue
        dim, split = pl[2], pl[3]
        d = idx.shape[dim]
        if split == "even":
            a = gr * (d // gn)
            b = a + d // gn
        elif split == "chunk":
            c = -(-d // gn)
            a = min(d, gr * c)
            b = min(d, a + c)
        else:
            a = sum(split[:gr])
            b = a + split[gr]
        idx = numpy.take(idx, numpy.arange(a, b), axis=dim)
    return numpy.ascontiguousarray(idx)


def placements_for(spec, ids, rank):
    groups = mesh_groups(rank)
    out = []
    for pl in spec:
        gid = ids[pl[1]]
        if pl[0] == "rep":
            out.append(muon.Replicate(gid))
        elif pl[0] == "shard":
            out.append(muon.Shard(gid, pl[2], pl[3]))
        else:
            gr = groups[pl[1]].index(rank)
            cuts = pl[2]
            out.append(muon.FlatRange(gid, cuts[gr], cuts[gr + 1] - cuts[gr]))
    return out


def initial_values(seed=0):
    rng = numpy.random.default_rng(seed)
    return {name: (0.5 * rng.standard_normal(shape)).astype(numpy.float32)
            for name, shape, _, _ in MODEL}


def gradients(steps, seed=1):
    rng = numpy.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(numpy.float32)
             for name, shape, _, _ in MODEL} for _ in range(steps)]


def single_process(options, init, grads, model=MODEL, extras=None):
    params = {name: init[name].copy() for name, _, _, _ in model}
    bufs = {name: numpy.zeros_like(init[name]) for name, _, _, _ in model}
    with muon.Optimizer(**options) as opt:
        for name, _, view, _ in model:
            opt.register(params[name], bufs[name], name=name, matrix_view=view,
                         **(extras or {}))
        for step_grads in grads:
            for name in bufs:
                bufs[name][...] = step_grads[name]
            opt.step()
    return params


def make_comms(kind, rank, shared):
    """This rank's (world, tp, fsdp) communicators: the in-process adapter or
    ThreadComm over hubs shared by the members."""
    groups = mesh_groups(rank)
    if kind == "inprocess":
        world = shared["world"]
        return {g: world.comm(rank, None if g == "world" else groups[g])
                for g in ("world", "tp", "fsdp")}
    comms = {}
    for g in ("world", "tp", "fsdp"):
        key = (g, tuple(groups[g]))
        with shared["lock"]:
            hub = shared.setdefault(key, Hub(len(groups[g])))
        comms[g] = ThreadComm(hub, groups[g].index(rank))
    return comms


def shared_state(kind):
    return {"world": muon.InProcessWorld(WORLD)} if kind == "inprocess" else {
        "lock": threading.Lock()}


def distributed(kind, options, init, grads, model=MODEL, before_step=None):
    """Every rank registers its pieces and steps; returns per rank
    {name: (indices, final piece)}, the stats and the communicators."""
    shared = shared_state(kind)

    def body(rank):
        comms = make_comms(kind, rank, shared)
        with muon.Optimizer(**options) as opt:
            ids = {"world": opt.set_world(comms["world"])}
            ids["tp"] = opt.add_group(comms["tp"])
            ids["fsdp"] = opt.add_group(comms["fsdp"])
            assert opt.world_rank == rank and opt.world_size == WORLD
            pieces = {}
            for name, shape, view, spec in model:
                idx = local_indices(shape, spec, rank)
                piece = init[name].reshape(-1)[idx]
                grad = numpy.zeros_like(piece)
                opt.register(piece, grad, name=name, matrix_view=view, global_shape=shape,
                             placements=placements_for(spec, ids, rank))
                pieces[name] = (idx, piece, grad)
            for step, step_grads in enumerate(grads):
                for name, (idx, _, grad) in pieces.items():
                    grad[...] = step_grads[name].reshape(-1)[idx]
                if before_step is not None:
                    before_step(rank, step, comms)
                opt.step()
            stats = opt.stats()
        return {name: (idx, piece) for name, (idx, piece, _) in pieces.items()}, stats, comms

    results, errors = run_ranks(WORLD, body)
    return results, errors


def assert_pieces_match(results, reference):
    for rank, (pieces, _, _) in enumerate(results):
        for name, (idx, piece) in pieces.items():
            want = reference[name].reshape(-1)[idx]
            assert piece.shape == want.shape
            # Bit for bit: compare the float32 words.
            diff = numpy.flatnonzero(piece.view(numpy.uint32) != want.view(numpy.uint32))
            assert diff.size == 0, "rank %d, %s: %d of %d elements differ, e.g. %r vs %r" % (
                rank, name, diff.size, piece.size, piece.reshape(-1)[diff[0]],
                want.reshape(-1)[diff[0]])


# ---------------------------------------------------------------------------
# Equality with single-process Muon
# ---------------------------------------------------------------------------

BASE = dict(lr=0.02, weight_decay=0.1)


@pytest.mark.parametrize("kind", ["inprocess", "python"])
@pytest.mark.parametrize("extra", [
    dict(),                                              # bf16 Newton-Schulz, prefetch 1
    dict(ns_dtype="fp32", prefetch_count=0, async_parallelism=False, assignment="round_robin"),
    dict(assignment="spread"),
], ids=["bf16-prefetch", "fp32-serial-round-robin", "bf16-spread"])
def test_tp_fsdp_flat_layouts_match_single_process(kind, extra):
    options = dict(BASE, **extra)
    init, grads = initial_values(), gradients(STEPS)
    reference = single_process(options, init, grads)
    results, errors = distributed(kind, options, init, grads)
    no_errors(errors)
    assert_pieces_match(results, reference)
    # Every matrix is orthogonalized exactly once, by the rank that owns it.
    matrices = sum(2 if view == "batched_leading" else 1 for _, _, view, _ in MODEL)
    stats = [s for _, s, _ in results]
    assert all(s["matrices_total"] == matrices and s["steps"] == STEPS for s in stats)
    assert sum(s["matrices_owned"] for s in stats) == matrices
    assert sum(s["matrices_orthogonalized"] for s in stats) == matrices
    assert all(s["matrices_orthogonalized"] == s["matrices_owned"] for s in stats)
    if kind == "python":
        calls = results[0][2]["world"].calls
        assert calls.get("all_gather", 0) > 0 and calls.get("all_to_all_v", 0) > 0, calls
        moved = sum(s["bytes_sent"] for s in stats)
        assert moved == sum(s["bytes_received"] for s in stats) and moved > 0


SPLIT_MODEL = [("big", (8, 64), "2d", [("shard", "world", 0, "even")])] + [
    ("small%d" % i, (4, 4), "2d", [("rep", "world")]) for i in range(15)]


# Every variant under split (BlockSums: what the members sum), and the
# tolerance against one process: fp32 rounding (Gram: its own fp32 noise,
# as far as one process's Gram and standard iterations differ), fp16's.
SPLIT_VARIANTS = {
    "standard": (dict(ns_dtype="fp32"), 1e-5),
    "normuon": (dict(ns_dtype="fp32", normuon=True), 1e-5),
    "gram": (dict(ns_dtype="fp32", ns_algorithm="gram"), 3e-5),
    "fp16": (dict(ns_dtype="fp16"), 1e-3),
}


@pytest.mark.parametrize("variant", sorted(SPLIT_VARIANTS))
@pytest.mark.parametrize("kind", ["inprocess", "python"])
def test_split_assignment_matches_single_process_within_fp32(kind, variant):
    # "big" costs 3x the fifteen small matrices together (a split needs 4
    # matrices per rank): assignment="split"
    # has the 4 ranks orthogonalize it together (each one block of 16
    # columns, the sums through the communicator's all_to_all_v); the sums
    # run in another order than one process's products, so the pieces agree
    # within fp32 rounding, not bit for bit.
    rng = numpy.random.default_rng(3)
    init = {name: (0.5 * rng.standard_normal(shape)).astype(numpy.float32)
            for name, shape, _, _ in SPLIT_MODEL}
    grads = [{name: rng.standard_normal(shape).astype(numpy.float32)
              for name, shape, _, _ in SPLIT_MODEL} for _ in range(STEPS)]
    options, tolerance = SPLIT_VARIANTS[variant]
    reference = single_process(dict(BASE, **options), init, grads, model=SPLIT_MODEL)
    results, errors = distributed(kind, dict(BASE, assignment="split", **options), init,
                                  grads, model=SPLIT_MODEL)
    no_errors(errors)
    for rank, (pieces, _, _) in enumerate(results):
        for name, (idx, piece) in pieces.items():
            want = reference[name].reshape(-1)[idx]
            worst = numpy.abs(piece - want).max() / numpy.abs(reference[name]).max()
            assert worst <= tolerance, (rank, name, worst)
    stats = [s for _, s, _ in results]
    # Each matrix once in the job; "big" once per member (each its part).
    assert all(s["matrices_total"] == len(SPLIT_MODEL) for s in stats)
    assert sum(s["matrices_orthogonalized"] for s in stats) == len(SPLIT_MODEL) - 1 + WORLD


def test_custom_assignment_callable():
    seen = []
    lock = threading.Lock()

    def last_holder(matrices):
        with lock:
            seen.append(matrices)
        return [m["holders"][-1] for m in matrices]

    options = dict(BASE, assignment=last_holder)
    init, grads = initial_values(), gradients(2)
    reference = single_process(dict(BASE), init, grads)
    results, errors = distributed("inprocess", options, init, grads)
    no_errors(errors)
    assert_pieces_match(results, reference)
    assert len(seen) == WORLD  # once per rank, at the first step
    table = seen[0]
    assert all(t == table for t in seen)  # the same table on every rank
    names = [m["param_name"] for m in table]
    assert names == sorted(names) and set(names) == {name for name, _, _, _ in MODEL}
    experts = [m for m in table if m["param_name"] == "experts"]
    assert [m["index"] for m in experts] == [0, 1]
    assert [m["holders"] for m in experts] == [[0, 2], [1, 3]]  # TP shard, replicated on FSDP
    qkv = next(m for m in table if m["param_name"] == "attn.qkv")
    assert (qkv["rows"], qkv["cols"], qkv["holders"]) == (12, 8, [0, 1, 2, 3])
    assert qkv["ns_flops"] > 0
    owned = [s["matrices_owned"] for _, s, _ in results]
    assert owned == [sum(1 for m in table if m["holders"][-1] == r) for r in range(WORLD)]


def test_custom_assignment_errors_surface():
    def wrong(matrices):
        raise KeyError("no owner for %s" % matrices[0]["param_name"])

    init, grads = initial_values(), gradients(1)
    _, errors = distributed("inprocess", dict(BASE, assignment=wrong), init, grads)
    for e in errors:
        assert isinstance(e, muon.MuonError), repr(e)
        assert "KeyError" in e.message and "no owner for" in e.message, e.message
        assert isinstance(e.__cause__, KeyError)


def test_zero2_bf16_through_python_reduce_scatter():
    # Each rank passes its own gradient; the engine averages them with the
    # Python reduce_scatter (bf16: summed in float32 in rank order, rounded once),
    # steps the parameters it owns and all-gathers the new values.
    n = 2
    shapes = [("z.a", (8, 8)), ("z.b", (8, 8)), ("z.c", (8, 8)), ("z.d", (6, 10))]
    gen = torch.Generator().manual_seed(5)
    init = {name: (0.5 * torch.randn(shape, generator=gen)).bfloat16() for name, shape in shapes}
    grads = [[{name: torch.randn(shape, generator=gen).bfloat16() for name, shape in shapes}
              for _ in range(n)] for _ in range(STEPS)]
    # Single process on the averaged gradients.
    ref = {name: t.clone() for name, t in init.items()}
    bufs = {name: torch.zeros_like(t) for name, t in init.items()}
    with muon.Optimizer(**BASE) as opt:
        for name, _ in shapes:
            opt.register(ref[name], bufs[name], name=name)
        for per_rank in grads:
            for name, _ in shapes:
                total = per_rank[0][name].float()
                for r in range(1, n):
                    total = total + per_rank[r][name].float()
                bufs[name].copy_(total.bfloat16() / n)  # / 2: exact in bf16
            opt.step()

    hub = Hub(n)

    def body(rank):
        comm = ThreadComm(hub, rank)
        with muon.Optimizer(**BASE) as opt:
            world = opt.set_world(comm)
            params = {name: t.clone() for name, t in init.items()}
            pgrads = {name: torch.zeros_like(t) for name, t in init.items()}
            for name, shape in shapes:
                opt.register(params[name], pgrads[name], name=name, global_shape=shape,
                             placements=[muon.Replicate(world)], replicated_mode="zero2")
            for per_rank in grads:
                for name, _ in shapes:
                    pgrads[name].copy_(per_rank[rank][name])
                opt.step()
            return params, opt.stats(), dict(comm.calls)

    results, errors = run_ranks(n, body)
    no_errors(errors)
    for rank, (params, stats, calls) in enumerate(results):
        for name, _ in shapes:
            assert torch.equal(params[name].view(torch.int16), ref[name].view(torch.int16)), (
                rank, name)
        assert calls.get("reduce_scatter", 0) > 0 and calls.get("all_gather", 0) > 0
    # Each matrix orthogonalized once per step, by one of the ranks.
    assert sum(s["matrices_orthogonalized"] for _, s, _ in results) == len(shapes)


# ---------------------------------------------------------------------------
# Failures in Python callbacks
# ---------------------------------------------------------------------------


class FailingComm(ThreadComm):
    armed = False

    def all_to_all_v(self, *args):
        if self.armed:  # on every rank, before anyone waits: nobody hangs
            raise ValueError("injected failure on rank %d" % self.rank)
        return super().all_to_all_v(*args)


def test_callback_exception_becomes_muon_error_naming_the_param():
    n = 2
    init = {"only.weight": numpy.ones((8, 6), numpy.float32)}
    grads = [{"only.weight": numpy.full((8, 6), 0.5, numpy.float32)}] * 3
    hub = Hub(n)
    failures = [None] * n
    after = [None] * n

    def body(rank):
        comm = FailingComm(hub, rank)
        with muon.Optimizer(**BASE) as opt:
            world = opt.set_world(comm)
            piece = init["only.weight"][4 * rank:4 * rank + 4].copy()
            grad = grads[0]["only.weight"][4 * rank:4 * rank + 4].copy()
            opt.register(piece, grad, name="only.weight", global_shape=(8, 6),
                         placements=[muon.Shard(world, 0)])
            opt.step()
            comm.armed = True
            try:
                opt.step()
            except muon.MuonError as e:
                failures[rank] = e
            try:
                opt.step()
            except muon.MuonError as e:
                after[rank] = e

    _, errors = run_ranks(n, body)
    no_errors(errors)
    for rank in range(n):
        e = failures[rank]
        assert e is not None, "rank %d: the failing step did not raise" % rank
        assert e.status == "UNKNOWN"
        assert "param 'only.weight'" in e.message, e.message
        assert "all_to_all_v" in e.message, e.message
        assert "ValueError: injected failure on rank %d" % rank in e.message, e.message
        assert isinstance(e.__cause__, ValueError)
        # The optimizer refuses to go on from half-updated state.
        assert after[rank] is not None and after[rank].status == "FAILED_PRECONDITION"


def test_communicator_needs_rank_and_size():
    class Incomplete(muon.Communicator):
        pass

    with muon.Optimizer() as opt:
        with pytest.raises(TypeError, match="rank"):
            opt.set_world(Incomplete())

    class Wrong(muon.Communicator):
        rank, size = 2, 2

    with pytest.raises(ValueError, match="rank 2 and size 2"):
        Wrong().table
    with muon.Optimizer() as opt:
        with pytest.raises(TypeError, match="communicator"):
            opt.set_world(object())


def test_placement_values_are_checked():
    with pytest.raises(ValueError, match="split"):
        muon.Shard(0, 0, "uneven")
    with pytest.raises(TypeError):
        muon.Shard(0, 0, [1.5, 2])
    assert muon.Shard(1, 0, [3, 2]) == muon.Shard(1, 0, (3, 2))
    assert repr(muon.FlatRange(0, 4, 5)) == "FlatRange(group=0, start=4, length=5)"
    world = muon.InProcessWorld(1)
    comm = world.comm(0)
    with muon.Optimizer() as opt:
        assert opt.set_world(comm) == 0
        # A placement may name the communicator object given to set_world.
        p, g = numpy.zeros((4, 4), numpy.float32), numpy.ones((4, 4), numpy.float32)
        opt.register(p, g, name="w", global_shape=(4, 4), placements=[muon.Shard(comm, 0)])
        with pytest.raises(TypeError, match="group"):
            opt.register(numpy.zeros((4, 4), numpy.float32), numpy.ones((4, 4), numpy.float32),
                         name="v", global_shape=(4, 4), placements=[muon.Shard(object(), 0)])
        with pytest.raises(muon.MuonError, match="'v'"):  # group 7 does not exist
            opt.register(numpy.zeros((4, 4), numpy.float32), numpy.ones((4, 4), numpy.float32),
                         name="v", global_shape=(4, 4), placements=[muon.Shard(7, 0)])
        opt.step()
        assert opt.stats()["matrices_owned"] == 1


# ---------------------------------------------------------------------------
# The custom path
# ---------------------------------------------------------------------------

ROWS, COLS = 10, 6


def custom_rows(rank):
    """Rank r holds rows [2r, 2r + 2), rank 3 rows 6..9: a layout only the host knows."""
    return slice(2 * rank, 2 * rank + (4 if rank == 3 else 2))


# The custom path with a parameter's own multipliers and split blocks too
# (registration options it once ignored: lr_scale, weight_decay_scale).
CUSTOM_EXTRAS = [None, dict(lr_scale=0.5, weight_decay_scale=3.0, split_sizes=[3, 2])]


@pytest.mark.parametrize("extras", CUSTOM_EXTRAS, ids=["plain", "scales_and_split"])
def test_register_custom_matches_single_process(extras):
    n, owner_choice = 4, 1
    rng = numpy.random.default_rng(7)
    init = (0.5 * rng.standard_normal((ROWS, COLS))).astype(numpy.float32)
    grads = [rng.standard_normal((ROWS, COLS)).astype(numpy.float32) for _ in range(STEPS)]
    options = dict(BASE, ns_dtype="fp32")
    reference = single_process(options, {"custom": init}, [{"custom": g} for g in grads],
                               model=[("custom", (ROWS, COLS), "2d", [])],
                               extras=extras)["custom"]
    if extras:  # the options move the result
        plain = single_process(options, {"custom": init}, [{"custom": g} for g in grads],
                               model=[("custom", (ROWS, COLS), "2d", [])])["custom"]
        assert not numpy.array_equal(plain, reference)

    world = muon.InProcessWorld(n)
    gathered = numpy.zeros((ROWS, COLS), numpy.float32)
    result = numpy.zeros((ROWS, COLS), numpy.float32)
    host = threading.Barrier(n, timeout=TIMEOUT)
    asked = []

    def body(rank):
        rows = custom_rows(rank)

        def assign(name, world_size):
            asked.append((name, world_size))
            return owner_choice

        def gather(local, owner):
            assert local.dtype == numpy.float32 and local.shape == (rows.stop - rows.start, COLS)
            gathered[rows] = local
            host.wait()
            return gathered if rank == owner else None

        def redistribute(full, owner, local_out):
            assert (full is not None) == (rank == owner)
            if full is not None:
                assert full.shape == (ROWS, COLS)
                result[...] = full
            host.wait()
            local_out[...] = result[rows]
            host.wait()

        with muon.Optimizer(**options) as opt:
            opt.set_world(world.comm(rank))
            piece = init[rows].copy()
            grad = numpy.zeros_like(piece)
            assert opt.register_custom(piece, grad, "custom", ROWS, COLS, assign, gather,
                                       redistribute, **(extras or {})) == 0
            for g in grads:
                grad[...] = g[rows]
                opt.step()
            return piece, opt.stats()

    results, errors = run_ranks(n, body)
    no_errors(errors)
    assert sorted(asked) == [("custom", n)] * n
    for rank, (piece, stats) in enumerate(results):
        want = reference[custom_rows(rank)]
        assert numpy.array_equal(piece.view(numpy.uint32), want.view(numpy.uint32)), rank
        assert stats["matrices_owned"] == (1 if rank == owner_choice else 0)
    assert sum(s["matrices_orthogonalized"] for _, s in results) == 1


@pytest.mark.parametrize("failing", ["gather", "redistribute", "assign", "shape"])
def test_register_custom_failures(failing):
    n = 1 if failing == "shape" else 2  # "shape": the owner alone, so nobody waits on it
    world = muon.InProcessWorld(n)
    host = threading.Barrier(n, timeout=TIMEOUT)
    full = numpy.zeros((4, COLS), numpy.float32)

    def body(rank):
        rows = slice(2 * rank, 2 * rank + 2)

        def assign(name, world_size):
            if failing == "assign":
                raise LookupError("no owner for %s" % name)
            return 0

        def gather(local, owner):
            if failing == "gather":
                raise RuntimeError("gather broke")
            full[rows] = local
            host.wait()
            if rank != owner:
                return None
            return full[:3] if failing == "shape" else torch.from_numpy(full)

        def redistribute(matrix, owner, local_out):
            if failing == "redistribute":
                raise ZeroDivisionError("redistribute broke")
            host.wait()
            local_out[...] = full[rows]

        with muon.Optimizer(lr=0.02) as opt:
            opt.set_world(world.comm(rank))
            piece = numpy.ones((2, COLS), numpy.float32)
            opt.register_custom(piece, numpy.ones_like(piece), "odd.matrix", 4, COLS, assign,
                                gather, redistribute)
            opt.step()

    _, errors = run_ranks(n, body)
    expected = {
        "gather": ("gather_fn", "RuntimeError: gather broke", RuntimeError),
        "redistribute": ("redistribute_fn", "ZeroDivisionError: redistribute broke",
                         ZeroDivisionError),
        "assign": ("assign_fn", "LookupError: no owner for odd.matrix", LookupError),
    }
    for rank, e in enumerate(errors):
        if failing == "shape":  # what the owner's gather returned is checked
            assert isinstance(e, muon.MuonError), repr(e)
            assert "param 'odd.matrix': gather_fn returned a 3 x 6 matrix" in e.message
            assert "registered as 4 x 6" in e.message
            continue
        assert isinstance(e, muon.MuonError), repr(e)
        fragment, text, cause = expected[failing]
        assert "odd.matrix" in e.message and fragment in e.message, e.message
        assert text in e.message, e.message
        assert isinstance(e.__cause__, cause)


# ---------------------------------------------------------------------------
# The bindings' structs
# ---------------------------------------------------------------------------


def test_struct_layouts_follow_the_header():
    # No muon_sizeof_* exists for these; their LP64 layouts from include/libmuon/muon.h.
    layout = _lib.muon_custom_layout_t
    assert ctypes.sizeof(layout) == 56
    assert (layout.global_rows.offset, layout.assign_fn.offset, layout.gather_fn.offset,
            layout.redistribute_fn.offset) == (16, 32, 40, 48)
    assert ctypes.sizeof(_lib.muon_gathered_t) == 24
    info = _lib.muon_matrix_info_t
    assert ctypes.sizeof(info) == 56
    assert (info.ns_flops.offset, info.holders.offset, info.num_holders.offset) == (32, 40, 48)
    comm = _lib.muon_comm_t
    assert (comm.rank.offset, comm.all_gather.offset, comm.release.offset) == (16, 24, 64)
    assert _lib.muon_stats_t.nonfinite_grads.offset == 80  # 0.4
    # 0.5: memory_bytes, momentum_bytes, param_elements, bytes_per_param
    assert (_lib.muon_stats_t.memory_bytes.offset, _lib.muon_stats_t.bytes_per_param.offset) == (
        96, 120)
    assert ctypes.sizeof(_lib.muon_stats_t) == 128
    # 0.4: skip_nonfinite after assign_state, then padding to 8.
    assert _lib.muon_options_t.assign_fn.offset + 16 == _lib.muon_options_t.skip_nonfinite.offset
    # 0.5: the allocator's three pointers, then update_in_grad and padding to 8.
    assert (_lib.muon_options_t.allocate.offset, _lib.muon_options_t.allocator_ctx.offset,
            _lib.muon_options_t.update_in_grad.offset) == (152, 168, 176)
    # 0.6: update_scale, cautious_wd, reserved2.
    assert (_lib.muon_options_t.update_scale.offset, _lib.muon_options_t.cautious_wd.offset,
            _lib.muon_options_t.reserved2.offset) == (184, 192, 196)
    # 0.7: normuon, reserved3, normuon_beta2, normuon_eps, ns_algorithm, skip_nonfinite_updates,
    # ns_gram_restarts.
    o = _lib.muon_options_t
    assert (o.normuon.offset, o.reserved3.offset, o.normuon_beta2.offset,
            o.normuon_eps.offset) == (200, 204, 208, 216)
    assert (o.ns_algorithm.offset, o.skip_nonfinite_updates.offset, o.ns_gram_restarts.offset) == (
        224, 228, 232)
    assert ctypes.sizeof(_lib.muon_options_t) == 240
    po = _lib.muon_param_options_t  # 0.7: lr_scale, weight_decay_scale, split blocks
    assert (po.lr_scale.offset, po.weight_decay_scale.offset, ctypes.sizeof(po)) == (56, 64, 88)
    assert (po.split_dim.offset, po.num_split_sizes.offset, po.split_sizes.offset) == (72, 76, 80)
    qk = _lib.muon_qk_clip_layer_t  # 0.7
    assert (qk.num_heads.offset, qk.q_first_row.offset, qk.k_head_rows.offset,
            qk.alpha.offset) == (24, 32, 80, 88)
    assert ctypes.sizeof(qk) == 96 == _lib.lib.muon_sizeof_qk_clip_layer()


def test_inprocess_comm_objects():
    world = muon.InProcessWorld(3)
    c = world.comm(2, [2, 0])
    assert (c.rank, c.size, c.world_rank, c.ranks) == (0, 2, 2, (2, 0))
    assert not c.table.release  # released by the object, not by each optimizer
    with pytest.raises(muon.MuonError, match="rank"):
        world.comm(1, [2, 0])  # 1 is not in the list
    # One communicator serves several optimizers in turn (as one per param group).
    solo = muon.InProcessWorld(1)
    comm = solo.comm(0)
    params = []
    for k in range(2):
        opt = muon.Optimizer(lr=0.1)
        opt.set_world(comm)
        p = numpy.zeros((3, 3), numpy.float32)
        opt.register(p, numpy.eye(3, dtype=numpy.float32), name="w%d" % k)
        opt.step()
        params.append(p)
        opt.close()
    assert numpy.array_equal(params[0], params[1]) and params[0].any()
