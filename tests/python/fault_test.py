"""Fault injection with communicators and callbacks written in Python (ranks
as threads): a Python communicator that raises in its k-th collective on one
rank (after taking part in it), for the exchange stepper and the ZeRO-2
stepper, and host callbacks of the custom path that raise on one rank. For
every collective of a step: no hang (run_ranks bounds every rank), every
rank raises muon.MuonError for that step naming the failing rank, further
steps are refused until every rank restores its checkpoint, and the resumed
run ends bit for bit like an uninterrupted one. (A fault in the step's own
verdict exchange on one rank reaches the others at the next step, which
every rank fails: tested on its own.) A rank that never enters its step is
released by aborting the in-process world."""

import threading

import numpy
import pytest

import muon
from thread_ranks import TIMEOUT, Hub, ThreadComm, run_ranks

WORLD = 4
STEPS = 3
FAULT_STEP = 1
OPTIONS = dict(lr=0.02, weight_decay=0.1, ns_dtype="fp32", prefetch_count=1)


class Injected(RuntimeError):
    pass


class Counter:
    """One rank's collectives over all its communicators; raises at call
    `fail_on` after the call moved the data (the others complete)."""

    def __init__(self, fail_on=-1):
        self.fail_on, self.calls = fail_on, 0

    def tick(self, rank):
        self.calls += 1
        if self.calls - 1 == self.fail_on:
            raise Injected("injected fault on rank %d" % rank)


class FaultyComm(ThreadComm):
    def __init__(self, hub, rank, counter, world_rank):
        super().__init__(hub, rank)
        self.counter, self.world_rank = counter, world_rank

    def all_gather(self, *a):
        super().all_gather(*a)
        self.counter.tick(self.world_rank)

    def all_to_all_v(self, *a):
        super().all_to_all_v(*a)
        self.counter.tick(self.world_rank)

    def reduce_scatter(self, *a):
        super().reduce_scatter(*a)
        self.counter.tick(self.world_rank)


def _values(shape, seed):
    return numpy.random.default_rng(seed).standard_normal(shape).astype(numpy.float32)


# Layouts: (name, global shape, rows this rank holds | None for all, replicated mode)
EXCHANGE = [("w", (12, 8)), ("v", (8, 10)), ("u", (6, 6)), ("t", (10, 4)), ("s", (7, 9))]


def _rows(shape, rank):
    step = -(-shape[0] // WORLD)
    return slice(min(rank * step, shape[0]), min((rank + 1) * step, shape[0]))


def _run(layout, fail_on=-1, fail_rank=None, keep_stepping=False, steps=STEPS):
    """Every rank trains STEPS steps; a checkpoint before each step; on a failed
    step: one more step (refused), then the checkpoint restored and the step
    redone. Returns per rank: calls before each step, errors per step, the
    refusal, and the final local pieces."""
    hubs, lock = {}, threading.Lock()

    def body(rank):
        counter = Counter(fail_on if fail_rank in (None, rank) else -1)
        with lock:
            hub = hubs.setdefault("world", Hub(WORLD))
        comm = FaultyComm(hub, rank, counter, rank)
        out = {"calls": [], "errors": [], "refused": None, "final": None}
        with muon.Optimizer(**OPTIONS) as opt:
            world = opt.set_world(comm)
            pieces = []
            for name, shape in EXCHANGE:
                if layout == "zero2":
                    piece = _values(shape, 1).copy()
                    place = [muon.Replicate(world)]
                else:
                    piece = _values(shape, 1)[_rows(shape, rank)].copy()
                    place = [muon.Shard(world, 0, split="chunk")]
                grad = numpy.zeros_like(piece)
                opt.register(piece, grad, name=name, global_shape=shape, placements=place,
                             replicated_mode="zero2" if layout == "zero2" else "host_averaged")
                pieces.append((name, shape, piece, grad))
            blob, saved = None, None
            failed = False
            for step in range(steps):
                for k, (name, shape, piece, grad) in enumerate(pieces):
                    g = _values(shape, 100 + 10 * step + k)
                    grad[...] = g if layout == "zero2" else g[_rows(shape, rank)]
                if step > 0:
                    blob, saved = opt.state_bytes(), [p.copy() for _, _, p, _ in pieces]
                out["calls"].append(counter.calls)
                try:
                    opt.step()
                    out["errors"].append(None)
                except muon.MuonError as e:
                    out["errors"].append(e)
                    failed = True
                    if not keep_stepping:
                        break
            out["calls"].append(counter.calls)
            if failed and not keep_stepping:
                try:
                    opt.step()
                except muon.MuonError as e:
                    out["refused"] = e
                for (_, _, piece, _), s in zip(pieces, saved):
                    piece[...] = s
                opt.load_state_bytes(blob)
                opt.step()  # the failed step again
            out["final"] = [p.copy() for _, _, p, _ in pieces]
        return out

    results, errors = run_ranks(WORLD, body)
    for rank, e in enumerate(errors):
        assert e is None, "rank %d: %r" % (rank, e)
    return results


@pytest.mark.parametrize("layout", ["exchange", "zero2"])
def test_a_python_communicator_failing_at_every_collective(layout):
    clean = _run(layout)
    # What a recovered run must end as: FAULT_STEP + 1 uninterrupted steps
    # (the recovery redoes the failed step and stops).
    want = _run(layout, steps=FAULT_STEP + 1)
    first = clean[1]["calls"][FAULT_STEP]
    last = clean[1]["calls"][FAULT_STEP + 1]
    assert last > first
    injected = 0
    for fail_rank in (None, 1):
        for k in range(first, last):
            verdict = k == last - 1
            if verdict and fail_rank is not None:
                continue  # test_a_fault_in_the_verdict_exchange_on_one_rank
            res = _run(layout, k, fail_rank)
            injected += 1
            for rank, r in enumerate(res):
                e = r["errors"][FAULT_STEP]
                where = (layout, k - first, fail_rank, rank)
                assert isinstance(e, muon.MuonError), where
                assert "injected fault on rank" in e.message, (where, e.message)
                if not verdict:
                    named = "rank 1: " if fail_rank == 1 else "rank 0: "
                    assert named in e.message, (where, e.message)
                assert r["refused"] is not None and r["refused"].status == "FAILED_PRECONDITION"
                for got, exp in zip(r["final"], want[rank]["final"]):
                    assert numpy.array_equal(got.view(numpy.uint32), exp.view(numpy.uint32)), \
                        where
    print("\n%s: %d faults injected through a Python communicator, every one survived"
          % (layout, injected))


def test_a_fault_in_the_verdict_exchange_on_one_rank():
    clean = _run("exchange")
    verdict = clean[1]["calls"][FAULT_STEP + 1] - 1
    res = _run("exchange", verdict, 1, keep_stepping=True)
    for rank, r in enumerate(res):
        assert (r["errors"][FAULT_STEP] is None) == (rank != 1), rank
        nxt = r["errors"][FAULT_STEP + 1]
        assert nxt is not None and nxt.status == "FAILED_PRECONDITION", rank
        assert "rank 1: FAILED_PRECONDITION: refused" in nxt.message, nxt.message


@pytest.mark.parametrize("where", ["gather", "redistribute"])
def test_a_custom_path_callback_failing_on_one_rank(where):
    """The host's own collectives (a barrier) in gather_fn / redistribute_fn;
    rank 2's raises after taking part: every rank fails the step, naming rank 2."""
    rows, cols = 8, 6
    world = muon.InProcessWorld(WORLD)
    host = threading.Barrier(WORLD, timeout=TIMEOUT)
    full = numpy.zeros((rows, cols), numpy.float32)
    result = numpy.zeros((rows, cols), numpy.float32)
    errors_at = [None] * WORLD

    def body(rank):
        mine = slice(2 * rank, 2 * rank + 2)
        armed = {"on": False}

        def gather(local, owner):
            full[mine] = local
            host.wait()
            if armed["on"] and where == "gather" and rank == 2:
                raise Injected("gather broke on rank 2")
            return full if rank == owner else None

        def redistribute(matrix, owner, local_out):
            if matrix is not None:
                result[...] = matrix
            host.wait()
            local_out[...] = result[mine]
            host.wait()
            if armed["on"] and where == "redistribute" and rank == 2:
                raise Injected("redistribute broke on rank 2")

        with muon.Optimizer(**OPTIONS) as opt:
            opt.set_world(world.comm(rank))
            piece = _values((rows, cols), 3)[mine].copy()
            grad = numpy.ones_like(piece)
            opt.register_custom(piece, grad, "custom", rows, cols, lambda n, s: 1, gather,
                                redistribute)
            opt.step()
            armed["on"] = True
            try:
                opt.step()
            except muon.MuonError as e:
                errors_at[rank] = e
            armed["on"] = False
            try:
                opt.step()
            except muon.MuonError as e:
                return e
            return None

    results, errors = run_ranks(WORLD, body)
    for rank in range(WORLD):
        assert errors[rank] is None, errors[rank]
        e = errors_at[rank]
        assert isinstance(e, muon.MuonError), rank
        assert "rank 2: " in e.message and "%s_fn" % where in e.message, e.message
        assert "broke on rank 2" in e.message, e.message
        assert results[rank] is not None and results[rank].status == "FAILED_PRECONDITION"


def test_a_rank_that_never_steps_is_released_by_aborting_the_world():
    """Rank 2 fails in host code before its step and never enters it: the
    others wait in the step's collectives (no collective has a timeout) until
    the host's watchdog aborts the in-process world; then every waiting rank's
    step raises UNAVAILABLE, and no thread is left behind."""
    world = muon.InProcessWorld(WORLD)
    entered = threading.Barrier(WORLD)

    def body(rank):
        with muon.Optimizer(**OPTIONS) as opt:
            wid = opt.set_world(world.comm(rank))
            piece = _values((6, 4), 5)
            opt.register(piece, numpy.ones_like(piece), "w", global_shape=piece.shape,
                         placements=[muon.Replicate(wid)])
            entered.wait()
            if rank == 2:
                raise Injected("the host failed before its step on rank 2")
            opt.step()

    watchdog = threading.Timer(0.5, world.abort)
    watchdog.start()
    try:
        _, errors = run_ranks(WORLD, body)
    finally:
        watchdog.cancel()
    assert isinstance(errors[2], Injected), errors[2]
    for rank in (0, 1, 3):
        e = errors[rank]
        assert isinstance(e, muon.MuonError) and e.status == "UNAVAILABLE", (rank, e)
        assert "the in-process world was aborted" in e.message, e.message
