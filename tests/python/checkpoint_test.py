"""Checkpoint and resume through the ctypes package.

An uninterrupted run of 20 steps is compared bit for bit with a run that stops
after 10 steps, saves (the whole-optimizer blob and the per-parameter momentum
buffers), and resumes in a fresh optimizer over copies of the saved parameters.
"""

import numpy
import pytest
import torch

import muon

SHAPES = [
    ("w_in", (16, 24), "2d"),
    ("w_out", (24, 16), "2d"),
    ("w_sq", (16, 16), "2d"),
    ("experts", (3, 8, 6), "batched_leading"),
    ("conv", (6, 2, 3, 3), "flatten_trailing"),
]
KWARGS = dict(lr=0.02, weight_decay=0.05)  # bf16 Newton-Schulz, the default

# (array kind, dtype, extra options)
CASES = {
    "numpy-fp32": ("numpy", numpy.float32, {}),
    "torch-fp32": ("torch", torch.float32, {}),
    "torch-bf16": ("torch", torch.bfloat16, {}),
    "torch-fp16": ("torch", torch.float16, {}),
    "torch-bf16-fp32-momentum": ("torch", torch.bfloat16, {"momentum_fp32": True}),
    "torch-fp32-ns-fp32": ("torch", torch.float32, {"ns_dtype": "fp32"}),
}


def _tensor(kind, dtype, values):
    """`values` (a float32 torch tensor) as the case's array kind and dtype."""
    if kind == "numpy":
        return values.numpy().astype(dtype)
    return values.to(dtype)


def _copy(x):
    return x.copy() if isinstance(x, numpy.ndarray) else x.clone()


def _equal(a, b):
    if isinstance(a, numpy.ndarray):
        return a.dtype == b.dtype and numpy.array_equal(a, b)
    return a.dtype == b.dtype and torch.equal(a, b)


class Run:
    """Parameters and gradient buffers registered with one optimizer."""

    def __init__(self, kind, dtype, options, params):
        self.kind, self.dtype = kind, dtype
        self.params = params
        self.grads = [_copy(p) for p in params]
        self.opt = muon.Optimizer(**KWARGS, **options)
        for (name, _, view), p, g in zip(SHAPES, self.params, self.grads):
            self.opt.register(p, g, name=name, matrix_view=view)

    def steps(self, first, count):
        """Runs steps first .. first+count-1; the gradients depend only on the step."""
        for step in range(first, first + count):
            gen = torch.Generator().manual_seed(1000 + step)
            for (_, shape, _), g in zip(SHAPES, self.grads):
                g[...] = _tensor(self.kind, self.dtype, torch.randn(shape, generator=gen))
            self.opt.step()


def _initial(kind, dtype):
    gen = torch.Generator().manual_seed(7)
    return [_tensor(kind, dtype, torch.randn(shape, generator=gen) * 0.1) for _, shape, _ in SHAPES]


@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_bit_identical(case):
    kind, dtype, options = CASES[case]

    # Uninterrupted: 10 steps, checkpoint, 10 more.
    full = Run(kind, dtype, options, _initial(kind, dtype))
    full.steps(0, 10)
    blob = full.opt.state_bytes()
    states = [full.opt.get_state(i) for i in range(len(SHAPES))]
    saved_params = [_copy(p) for p in full.params]
    full.steps(10, 10)
    assert full.opt.step_count == 20

    # The checkpoint is a real copy: the run went on without changing it.
    assert all(not _equal(p, s) for p, s in zip(full.params, saved_params))
    expected_state_dtype = (torch.float32 if options.get("momentum_fp32") else dtype)
    for s, (_, shape, _) in zip(states, SHAPES):
        assert tuple(s.shape) == shape and s.dtype == expected_state_dtype

    # Resume from the blob.
    blob_run = Run(kind, dtype, options, [_copy(p) for p in saved_params])
    assert blob_run.opt.step_count == 0
    blob_run.opt.load_state_bytes(blob)
    assert blob_run.opt.step_count == 10
    assert blob_run.opt.state_bytes() == blob  # the restored state is the saved one
    blob_run.steps(10, 10)
    assert blob_run.opt.step_count == 20
    for (name, _, _), a, b in zip(SHAPES, full.params, blob_run.params):
        assert _equal(a, b), "param %s differs after resuming from state_bytes" % name

    # Resume from the per-parameter buffers (the step count is the host's then).
    state_run = Run(kind, dtype, options, [_copy(p) for p in saved_params])
    for i, s in enumerate(states):
        state_run.opt.set_state(i, s)
        assert _equal(state_run.opt.get_state(i), s)
    state_run.steps(10, 10)
    for (name, _, _), a, b in zip(SHAPES, full.params, state_run.params):
        assert _equal(a, b), "param %s differs after resuming from get_state" % name

    # Both resumed optimizers end with the uninterrupted run's momentum.
    for i in range(len(SHAPES)):
        final = full.opt.get_state(i)
        assert _equal(blob_run.opt.get_state(i), final)
        assert _equal(state_run.opt.get_state(i), final)

    for run in (full, blob_run, state_run):
        run.opt.close()


def test_state_bytes_round_trip_through_bytearray_and_memoryview():
    params = _initial("torch", torch.float32)
    run = Run("torch", torch.float32, {}, params)
    run.steps(0, 3)
    blob = run.opt.state_bytes()
    assert isinstance(blob, bytes)
    other = Run("torch", torch.float32, {}, [p.clone() for p in params])
    other.opt.load_state_bytes(bytearray(blob))
    assert other.opt.state_bytes() == blob
    other.opt.load_state_bytes(memoryview(blob))
    assert other.opt.step_count == 3


def test_get_state_returns_a_copy_and_fills_out():
    p = torch.zeros(4, 6)
    g = torch.randn(4, 6)
    with muon.Optimizer() as opt:
        opt.register(p, g)
        opt.step()
        state = opt.get_state(0)
        expected = state.clone()
        state.zero_()  # writing the copy leaves the optimizer's buffer alone
        assert torch.equal(opt.get_state(0), expected)
        out = torch.empty(4, 6)
        assert opt.get_state(0, out=out) is out
        assert torch.equal(out, expected)
    a = numpy.zeros((4, 6), numpy.float32)
    ga = numpy.ones((4, 6), numpy.float32)
    with muon.Optimizer() as opt:
        opt.register(a, ga)
        opt.step()
        s = opt.get_state(0)
        assert isinstance(s, numpy.ndarray) and s.dtype == numpy.float32
        # The EMA of a constant gradient of ones after one step: 1 - momentum.
        assert numpy.allclose(s, 1 - 0.95, rtol=1e-6)


def test_resume_at_another_world_size_from_every_ranks_blobs():
    """Saved by 4 thread ranks holding row shards, loaded by 2 holding column
    shards (muon.Optimizer.load_states_bytes with all 4 blobs): the next step
    equals single-process Muon's bit for bit."""

    from thread_ranks import Hub, ThreadComm, run_ranks
    rng = numpy.random.default_rng(5)
    init = rng.standard_normal((8, 6)).astype(numpy.float32)
    grads = [rng.standard_normal((8, 6)).astype(numpy.float32) for _ in range(3)]
    opts = dict(lr=0.02, ns_dtype="fp32")

    def job(n, cut, steps, blobs=None, start=None):
        hub = Hub(n)

        def body(rank):
            with muon.Optimizer(**opts) as opt:
                world = opt.set_world(ThreadComm(hub, rank))
                sl = cut(rank, n)
                piece = (init if start is None else start)[sl].copy()
                grad = numpy.zeros_like(piece)
                opt.register(piece, grad, name="w", global_shape=(8, 6),
                             placements=[muon.Shard(world, 0 if cut is rows else 1)])
                if blobs is not None:
                    opt.load_states_bytes(blobs)
                for g in steps:
                    grad[...] = g[sl]
                    opt.step()
                return opt.state_bytes(), piece

        results, errors = run_ranks(n, body)
        assert all(e is None for e in errors), errors
        return results

    def rows(rank, n):
        return (slice(8 // n * rank, 8 // n * (rank + 1)), slice(None))

    def cols(rank, n):
        return (slice(None), slice(6 // n * rank, 6 // n * (rank + 1)))

    saved = job(4, rows, grads[:2])
    whole = numpy.zeros((8, 6), numpy.float32)
    for rank, (_, piece) in enumerate(saved):
        whole[rows(rank, 4)] = piece
    resumed = job(2, cols, grads[2:], blobs=[b for b, _ in saved], start=whole)

    with muon.Optimizer(**opts) as ref:
        p = init.copy()
        g = numpy.zeros_like(p)
        ref.register(p, g, name="w")
        for step_grad in grads:
            g[...] = step_grad
            ref.step()
    for rank, (_, piece) in enumerate(resumed):
        want = p[cols(rank, 2)]
        assert numpy.array_equal(piece.view(numpy.uint32), want.view(numpy.uint32)), rank
