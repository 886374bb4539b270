"""libmuon on a GPU: CUDA tensors against torch.optim.Muon and against
libmuon's own CPU backend, several ranks on one GPU, CUDA-graph capture and
no allocation in the steady state.

Skips, saying why, where torch sees no CUDA device (CI and the development
machines have none); tests/gpu/run_on_gpu.sh runs it on a machine with one.
"""

import threading
import time

import pytest
import torch

import muon

import os

# MUON_REQUIRE_GPU=1 (tests/gpu/run_on_gpu.sh): no GPU is a failure, never a skip.
if os.environ.get("MUON_REQUIRE_GPU") == "1" and not torch.cuda.is_available():
    raise RuntimeError("MUON_REQUIRE_GPU=1, but torch.cuda.is_available() is False")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: torch.cuda.is_available() is False here; run "
    "tests/gpu/run_on_gpu.sh on a machine with a GPU")

DEV = torch.device("cuda", 0)
SHAPES = [(256, 512), (512, 256), (384, 384), (64, 1000)]
STEPS = 100
LR, WD = 0.02, 0.1


def make_problem(seed, shapes=SHAPES, steps=STEPS, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=g).to(dtype) * 0.05 for s in shapes]
    grads = [[torch.randn(s, generator=g).to(dtype) for s in shapes] for _ in range(steps)]
    return init, grads


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_torch(init, grads, device):
    params = [torch.nn.Parameter(p.clone().to(device)) for p in init]
    opt = torch.optim.Muon(params, lr=LR, weight_decay=WD)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.to(device)
        opt.step()
    return [p.detach() for p in params]


def run_libmuon(init, grads, device, ns_dtype="bf16", groups=None, **kw):
    params = [torch.nn.Parameter(p.clone().to(device)) for p in init]
    opt = muon.Muon(params if groups is None else groups(params), lr=LR, weight_decay=WD,
                    ns_dtype=ns_dtype, **kw)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.to(device)
        opt.step()
    torch.cuda.synchronize()
    return [p.detach() for p in params]


def test_bf16_matches_torch_optim_muon_on_the_gpu():
    init, grads = make_problem(1)
    ours = run_libmuon(init, grads, DEV)
    ref = run_torch(init, grads, DEV)
    worst = 0.0
    for shape, a, b, p0 in zip(SHAPES, ours, ref, init):
        moved = rel(b, p0.to(DEV))  # how far torch moved the parameter, relative
        d = rel(a, b)
        print("bf16 NS %-12s: |libmuon - torch| / |torch| = %.2e (parameter moved %.2e)"
              % (shape, d, moved))
        worst = max(worst, d / moved)
    print("bf16 NS: worst difference relative to the distance moved: %.2e" % worst)
    # bf16 Newton-Schulz rounds each product to 8 significant bits; after 100
    # steps the two implementations may differ by a few bf16 ulps of the
    # updates, a small fraction of how far the parameters moved.
    assert worst < 2e-2


def test_fp32_matches_the_cpu_backend():
    init, grads = make_problem(2)
    gpu = run_libmuon(init, grads, DEV, ns_dtype="fp32")
    params = [torch.nn.Parameter(p.clone()) for p in init]
    opt = muon.Muon(params, lr=LR, weight_decay=WD, ns_dtype="fp32")
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    worst = 0.0
    for shape, a, b in zip(SHAPES, gpu, params):
        d = rel(a, b.detach())
        print("fp32 NS %-12s: |cuda - cpu| / |cpu| = %.2e" % (shape, d))
        worst = max(worst, d)
    assert worst < 1e-5


@pytest.mark.parametrize("ns_dtype,algorithm,normuon", [
    ("fp32", "gram", False), ("bf16", "gram", False), ("fp16", "gram", False),
    ("fp16", "standard", False), ("bf16", "standard", True), ("fp32", "gram", True)])
def test_variants_match_the_cpu_backend(ns_dtype, algorithm, normuon):
    # Gram Newton-Schulz (cuBLASLt products of muon/math/split_ns.h's
    # program), fp16 Newton-Schulz and NorMuon (its moments on the GPU) on
    # the GPU against the CPU backend, 30
    # steps: fp32 within 1e-5 (as the standard iteration's fp32 test), bf16
    # within 2e-2 of the distance moved (as the bf16 test against torch), fp16
    # within 5e-3 of it. And not the standard fp32 iteration's result (the
    # variant ran; a square matrix runs the standard iteration under Gram).
    init, grads = make_problem(5, steps=30)
    gpu = run_libmuon(init, grads, DEV, ns_dtype=ns_dtype, ns_algorithm=algorithm,
                      normuon=normuon)
    cpu = run_libmuon(init, grads, torch.device("cpu"), ns_dtype=ns_dtype,
                      ns_algorithm=algorithm, normuon=normuon)
    standard = run_libmuon(init, grads, DEV, ns_dtype="fp32")
    bound = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 5e-3}[ns_dtype]
    for shape, a, b, s, p0 in zip(SHAPES, gpu, cpu, standard, init):
        moved = rel(b, p0)
        d, from_standard = rel(a, b), rel(a, s)
        print("%s %s%s NS %-12s: |cuda - cpu| / |cpu| = %.2e, from fp32 standard %.2e, "
              "moved %.2e" % (ns_dtype, algorithm, " NorMuon" if normuon else "", shape, d,
                              from_standard, moved))
        assert d < (bound if ns_dtype == "fp32" else bound * moved)
        if shape[0] != shape[1] or ns_dtype != "fp32" or normuon:
            assert from_standard > 0


def split_groups(params):
    # A fused QKV's rows {q, k, v} and a matrix split in periods of columns.
    return [{"params": [params[0]], "split_sizes": [128, 64, 64]},
            {"params": [params[1]], "split_sizes": [96, 32], "split_dim": 1},
            {"params": params[2:]}]


@pytest.mark.parametrize("ns_dtype", ["fp32", "bf16"])
def test_split_blocks_match_the_cpu_backend(ns_dtype):
    # split_sizes on the GPU: each block gathered (cudaMemcpy2DAsync),
    # orthogonalized, lr-scaled and scattered back in device memory, with
    # NorMuon's moments per block; 20 steps against the CPU backend (bounds
    # as the variants'), and away from the unsplit result.
    init, grads = make_problem(7, steps=20)
    gpu = run_libmuon(init, grads, DEV, ns_dtype=ns_dtype, groups=split_groups, normuon=True)
    cpu = run_libmuon(init, grads, torch.device("cpu"), ns_dtype=ns_dtype, groups=split_groups,
                      normuon=True)
    whole = run_libmuon(init, grads, DEV, ns_dtype=ns_dtype, normuon=True)
    bound = {"fp32": 1e-5, "bf16": 2e-2}[ns_dtype]
    for i, (shape, a, b, w, p0) in enumerate(zip(SHAPES, gpu, cpu, whole, init)):
        moved, d, from_whole = rel(b, p0), rel(a, b), rel(a, w)
        print("%s split %-12s: |cuda - cpu| / |cpu| = %.2e, from unsplit %.2e, moved %.2e"
              % (ns_dtype, shape, d, from_whole, moved))
        assert d < (bound if ns_dtype == "fp32" else bound * moved)
        if i < 2:
            assert from_whole > 2 * d


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_clip_scales_the_heads_on_the_gpu_as_on_the_cpu(dtype):
    # QK-Clip (muon_qk_clip_on_stream on torch's current stream) on a fused
    # GQA projection: after a step, the clipped heads' rows scaled in device
    # memory by the CPU's factors (each side's stepped weights differ in the
    # last bits, so the factors are compared, within the dtype's rounding);
    # the unclipped head's rows untouched.
    torch.manual_seed(9)
    hd = 16
    init = torch.randn((4 + 2 + 2) * hd, 64).to(dtype)
    grad = torch.randn_like(init)
    logits = [150.0, 50.0, 200.0, -3.0]
    out = {}
    for device in (torch.device("cpu"), DEV):
        w = torch.nn.Parameter(init.clone().to(device))
        w.grad = grad.to(device)
        opt = muon.Muon([w], lr=LR, ns_dtype="fp32")
        opt.step()
        stepped = w.detach().clone()
        layer = opt.register_qk(w, num_heads=4, num_kv_heads=2, q_head_rows=hd,
                                k_first_row=4 * hd, k_head_rows=hd, alpha=0.3)
        assert opt.qk_clip({layer: logits}, tau=100.0) == 2
        out[device.type] = (stepped.cpu(), w.detach().cpu())
    (cpu_stepped, cpu), (gpu_stepped, gpu) = out["cpu"], out["cuda"]
    scaled_cpu = cpu.float() / cpu_stepped.float()
    scaled_gpu = gpu.float() / gpu_stepped.float()
    print("%s QK-Clip: largest |cuda - cpu| of the factors %.2e"
          % (dtype, (scaled_gpu - scaled_cpu).abs().nan_to_num(0).max().item()))
    assert torch.allclose(scaled_gpu, scaled_cpu, rtol=1e-2, equal_nan=True)
    assert torch.equal(gpu[hd:2 * hd], gpu_stepped[hd:2 * hd])  # head 1 (logit 50): kept
    assert not torch.equal(gpu[:hd], gpu_stepped[:hd])  # head 0: clipped


def test_the_nan_guard_skips_a_non_finite_update_on_the_gpu():
    # skip_nonfinite_updates on the GPU: a NaN gradient makes a non-finite
    # update; the count kernel sees it, the host waits for the count, and
    # no parameter changes (that step and the next: the momentum keeps it).
    init, grads = make_problem(8, steps=3)
    params = [torch.nn.Parameter(p.clone().to(DEV)) for p in init]
    opt = muon.Muon(params, lr=LR, weight_decay=WD, skip_nonfinite_updates=True)
    for i, step in enumerate(grads):
        for p, g in zip(params, step):
            p.grad = g.to(DEV)
        if i == 1:
            params[0].grad[0, 0] = float("nan")
        opt.step()
        torch.cuda.synchronize()
        if i == 0:
            after_first = [p.detach().clone() for p in params]
            assert not torch.equal(after_first[0], init[0].to(DEV))
    assert opt.stats()["steps_skipped"] == 2
    for p, q in zip(params, after_first):
        assert torch.equal(p.detach(), q)


def test_large_matrices_match_torch_optim_muon():
    # 4096 and 8192 rows or columns: the symmetric products run in 2 x 2 and
    # 4 x 4 tiles (libmuon's rule, cuda_backend.h); three bf16 steps against
    # torch.optim.Muon's, within 2e-2 of the distance moved.
    shapes = [(4096, 4096), (4096, 6144), (8192, 8192)]
    init, grads = make_problem(6, shapes=shapes, steps=3)
    ours = run_libmuon(init, grads, DEV)
    ref = run_torch(init, grads, DEV)
    for shape, a, b, p0 in zip(shapes, ours, ref, init):
        moved, d = rel(b, p0.to(DEV)), rel(a, b)
        print("bf16 NS %-12s: |libmuon - torch| / |torch| = %.2e (moved %.2e)" % (shape, d, moved))
        assert d < 2e-2 * moved


def test_half_dtypes_run_on_the_gpu():
    for dtype in (torch.bfloat16, torch.float16):
        init, grads = make_problem(3, steps=10, dtype=dtype)
        ours = run_libmuon(init, grads, DEV)
        ref = run_torch(init, grads, DEV)
        for shape, a, b, p0 in zip(SHAPES, ours, ref, init):
            assert a.dtype == dtype
            moved = rel(b.float(), p0.to(DEV).float())
            d = rel(a.float(), b.float())
            print("%s params %-12s: difference %.2e, moved %.2e" % (dtype, shape, d, moved))
            assert d < 0.1 * moved


# ---------------------------------------------------------------------------
# Several ranks on one GPU (the in-process adapter)
# ---------------------------------------------------------------------------

def flat_range(rank, n, numel):
    per = -(-numel // n)
    start = min(rank * per, numel)
    return start, min(per, numel - start)


LAYOUTS = {
    "rows": lambda comm, rank, n, numel: [muon.Shard(comm, 0, "chunk")],
    "cols": lambda comm, rank, n, numel: [muon.Shard(comm, 1, "chunk")],
    "flat": lambda comm, rank, n, numel: [muon.FlatRange(comm, *flat_range(rank, n, numel))],
}


def piece_of(full, layout, rank, n):
    if layout in ("rows", "cols"):
        dim = 0 if layout == "rows" else 1
        parts = full.chunk(n, dim)
        return parts[rank] if rank < len(parts) else full.narrow(dim, 0, 0)
    start, length = flat_range(rank, n, full.numel())
    return full.reshape(-1)[start:start + length]


def run_ranks(n, body, errors):
    """Runs body(rank) on n threads; fails if one hangs or left an error in
    errors[rank]."""
    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    for rank, e in enumerate(errors):
        if e is not None:
            raise AssertionError("rank %d failed: %r" % (rank, e)) from e


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_ranks_on_one_gpu_equal_one_rank(n, layout):
    shapes = [(96, 160), (160, 96), (128, 128)]
    init, grads = make_problem(4, shapes=shapes, steps=5)
    whole = run_libmuon(init, grads, DEV)
    world = muon.InProcessWorld(n)
    results, errors = [None] * n, [None] * n

    def body(rank):
        try:
            torch.cuda.set_device(DEV)
            with muon.Optimizer(lr=LR, weight_decay=WD) as opt:
                wid = opt.set_world(world.comm(rank))
                pieces = []
                for k, (shape, p0) in enumerate(zip(shapes, init)):
                    piece = piece_of(p0.to(DEV), layout, rank, n).contiguous().clone()
                    grad = torch.zeros_like(piece)
                    opt.register(piece, grad, name="w%d" % k, global_shape=shape,
                                 placements=LAYOUTS[layout](wid, rank, n, p0.numel()))
                    pieces.append((piece, grad))
                for step in grads:
                    for (piece, grad), g in zip(pieces, step):
                        grad.copy_(piece_of(g.to(DEV), layout, rank, n))
                    opt.step()
                torch.cuda.synchronize()
                results[rank] = [p for p, _ in pieces]
        except BaseException as e:  # noqa: B902 - reported below
            errors[rank] = e

    run_ranks(n, body, errors)
    for rank in range(n):
        for k, full in enumerate(whole):
            want = piece_of(full, layout, rank, n)
            got = results[rank][k]
            assert got.shape == want.shape
            d = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
            assert d <= 1e-6, "rank %d, w%d: max difference %.3e" % (rank, k, d)


def run_split_ranks(device, **options):
    """4 in-process ranks under assignment "split": "big" (64 x 384, rows
    sharded) costs more than the 15 replicated 32 x 32 matrices' mean, so its
    members orthogonalize it together. Each rank's parameters after 3 steps,
    and the ranks' matrices_owned summed against matrices_total."""
    n = 4
    shapes = [(64, 384)] + [(32, 32)] * 15
    init, grads = make_problem(11, shapes=shapes, steps=3)
    world = muon.InProcessWorld(n)
    results, errors, stats = [None] * n, [None] * n, [None] * n

    def body(rank):
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            with muon.Optimizer(lr=LR, weight_decay=WD, assignment="split", **options) as opt:
                wid = opt.set_world(world.comm(rank))
                pieces = []
                for k, (shape, p0) in enumerate(zip(shapes, init)):
                    full = p0.to(device)
                    piece = (full.chunk(n, 0)[rank] if k == 0 else full).contiguous().clone()
                    grad = torch.zeros_like(piece)
                    place = [muon.Shard(wid, 0, "chunk")] if k == 0 else [muon.Replicate(wid)]
                    opt.register(piece, grad, name="w%d" % k, global_shape=shape,
                                 placements=place)
                    pieces.append((piece, grad))
                for step in grads:
                    for k, ((piece, grad), g) in enumerate(zip(pieces, step)):
                        g = g.to(device)
                        grad.copy_(g.chunk(n, 0)[rank] if k == 0 else g)
                    opt.step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                results[rank] = [p.cpu() for p, _ in pieces]
                stats[rank] = opt.stats()
        except BaseException as e:  # noqa: B902 - reported below
            errors[rank] = e

    run_ranks(n, body, errors)
    owned = sum(st["matrices_owned"] for st in stats)
    return results, owned, stats[0]["matrices_total"]


@pytest.mark.parametrize("options", [
    {"ns_dtype": "fp32"},
    {"ns_dtype": "bf16", "normuon": True},
    {"ns_dtype": "bf16", "ns_algorithm": "gram"},
])
def test_a_matrix_split_over_ranks_on_one_gpu_matches_the_cpu_ranks(options):
    """MUON_ASSIGNMENT_SPLIT on the GPU: the members' sums through device
    buffers, the block's program as the GPU backend's steps
    (muon/math/split_ns.h; Gram's m x m iterations too), against the same
    ranks on the CPU backend."""
    want, owned, total = run_split_ranks(torch.device("cpu"), **options)
    assert owned > total, "no matrix was split: the test proves nothing"
    got, gpu_owned, _ = run_split_ranks(DEV, **options)
    assert gpu_owned == owned
    # bf16 Gram: its chain of m x m products carries more bf16 rounding flips
    # between cuBLASLt's and OpenBLAS's sums than the standard iteration.
    bound = 1e-5 if options["ns_dtype"] == "fp32" else (
        4e-3 if "ns_algorithm" in options else 2e-3)
    for rank in range(4):
        for k, (g, w) in enumerate(zip(got[rank], want[rank])):
            d = (g.double() - w.double()).abs().max().item()
            assert d <= bound, "rank %d, w%d: max difference %.3e" % (rank, k, d)


# ---------------------------------------------------------------------------
# Stream order, CUDA graphs, memory
# ---------------------------------------------------------------------------


class CapturedAndEager:
    """One problem on two low-level optimizers: `opt`, whose step a test
    captures, and `ref`, stepped eagerly; feed() writes a step's gradients into
    both, and equal() says whether their parameters are the same bits."""

    def __init__(self, seed):
        init, self.grads = make_problem(seed, steps=4)
        self.params = [p.clone().to(DEV) for p in init]
        self.bufs = [torch.zeros_like(p) for p in self.params]
        self.eager = [p.clone() for p in self.params]
        self.ebufs = [torch.zeros_like(p) for p in self.params]
        self.opt = muon.Optimizer(lr=LR, weight_decay=WD)
        self.ref = muon.Optimizer(lr=LR, weight_decay=WD)
        for k, (p, g, e, eg) in enumerate(zip(self.params, self.bufs, self.eager, self.ebufs)):
            self.opt.register(p, g, name="w%d" % k)
            self.ref.register(e, eg, name="w%d" % k)

    def feed(self, step):
        for b, eb, g in zip(self.bufs, self.ebufs, step):
            b.copy_(g)
            eb.copy_(g)

    def equal(self):
        torch.cuda.synchronize()
        return all(torch.equal(p, e) for p, e in zip(self.params, self.eager))


def test_a_step_replays_from_a_cuda_graph():
    t = CapturedAndEager(5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # The first step sets up (allocates, waits once): not capturable.
        t.feed(t.grads[0])
        t.opt.step(stream=s)
        t.ref.step(stream=s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            t.opt.step(stream=s)
        for step in t.grads[1:]:
            t.feed(step)
            graph.replay()
            t.ref.step(stream=s)
    assert t.equal()


def test_a_step_captured_on_torch_graphs_own_stream_replays_like_steps():
    # torch's recipe: warm up on a side stream, then capture with
    # torch.cuda.graph() on the stream it makes (another than the last step's).
    t = CapturedAndEager(8)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        t.feed(t.grads[0])
        t.opt.step()
        t.ref.step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        t.opt.step()
    for step in t.grads[1:]:
        t.feed(step)
        graph.replay()
        t.ref.step()
    assert t.equal()


def test_muon_muon_captured_follows_its_lr_scheduler_through_push_hyperparameters():
    # A training loop captured with torch.cuda.graph: the scheduler changes lr
    # between replays, push_hyperparameters() carries it to the captured step.
    init, grads = make_problem(9, steps=6)
    params = [torch.nn.Parameter(p.clone().to(DEV)) for p in init]
    eager = [torch.nn.Parameter(p.clone().to(DEV)) for p in init]
    for p, e in zip(params, eager):
        p.grad = torch.zeros_like(p)
        e.grad = torch.zeros_like(e)
    opt = muon.Muon(params, lr=LR, weight_decay=WD)
    ref = muon.Muon(eager, lr=LR, weight_decay=WD)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for p, e, g in zip(params, eager, grads[0]):
            p.grad.copy_(g.to(DEV))
            e.grad.copy_(g.to(DEV))
        opt.step()
        ref.step()
    torch.cuda.synchronize()
    sched.step()
    ref_sched.step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for step in grads[1:]:
        for p, e, g in zip(params, eager, step):
            p.grad.copy_(g.to(DEV))
            e.grad.copy_(g.to(DEV))
        opt.push_hyperparameters()
        graph.replay()
        ref.step()
        sched.step()
        ref_sched.step()
    torch.cuda.synchronize()
    assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"] < LR / 16
    for p, e in zip(params, eager):
        assert torch.equal(p, e)


def test_a_step_returns_while_the_gpu_is_busy():
    # About a second of GPU work is queued ahead of the step: a step that only
    # enqueues returns at once; one that makes the host wait (a copy to
    # pageable host memory, a stream wait) returns after it. torch's own
    # p.add_(g) is the baseline, timed the same way.
    p = torch.randn(1024, 1024, device=DEV)
    g = torch.randn_like(p)
    opt = muon.Optimizer(lr=LR)
    opt.register(p, g, name="w")
    opt.step()
    opt.step()
    torch.cuda.synchronize()

    def behind_a_busy_gpu(fn):
        torch.cuda._sleep(int(2e9))  # about a second at H100/H200 clocks
        t = time.perf_counter()
        fn()
        returned = time.perf_counter() - t
        t = time.perf_counter()
        torch.cuda.synchronize()
        return returned, time.perf_counter() - t

    torch_returned, torch_waited = behind_a_busy_gpu(lambda: p.add_(g))
    print("torch p.add_(g) returned after %.3f s, then the host waited %.3f s"
          % (torch_returned, torch_waited))
    if torch_returned > 0.25:
        pytest.skip("launches wait for the GPU on this machine (torch's own p.add_(g) returned "
                    "after %.3f s; CUDA_LAUNCH_BLOCKING=%r): nothing to compare with"
                    % (torch_returned, os.environ.get("CUDA_LAUNCH_BLOCKING")))
    ours_returned, ours_waited = behind_a_busy_gpu(opt.step)
    print("muon step returned after %.3f s, then the host waited %.3f s"
          % (ours_returned, ours_waited))
    assert ours_waited > 0.3, "the queued work ended early (%.3f s): nothing proved" % ours_waited
    assert ours_returned < 0.25, "muon step waited %.3f s for the GPU" % ours_returned


def test_the_steady_state_allocates_no_device_memory():
    init, grads = make_problem(6, steps=12)
    params = [torch.nn.Parameter(p.clone().to(DEV)) for p in init]
    opt = muon.Muon(params, lr=LR, weight_decay=WD)
    dev_grads = [[g.to(DEV) for g in step] for step in grads]
    free = []
    for step in dev_grads:
        for p, g in zip(params, step):
            p.grad = g
        opt.step()
        torch.cuda.synchronize()
        free.append(torch.cuda.mem_get_info(DEV)[0])
    assert len(set(free[2:])) == 1, "free device memory changed across steps: %s" % free


def test_muon_muon_allocates_through_torchs_caching_allocator():
    # The optimizer's device memory (momentum, updates, the Newton-Schulz
    # workspace) counts in torch.cuda.memory_allocated and goes back at close.
    import gc

    init, grads = make_problem(8, steps=2)
    params = [torch.nn.Parameter(p.clone().to(DEV)) for p in init]
    dev_grads = [[g.to(DEV) for g in step] for step in grads]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(DEV)
    opt = muon.Muon(params, lr=LR, weight_decay=WD)
    for step in dev_grads:
        for p, g in zip(params, step):
            p.grad = g
        opt.step()
    torch.cuda.synchronize()
    momentum = sum(p.numel() * p.element_size() for p in params)
    held = torch.cuda.memory_allocated(DEV) - before
    assert held >= momentum, "%d bytes through torch's allocator, momentum alone is %d" % (
        held, momentum)
    del opt
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(DEV) == before


def test_state_round_trips_through_the_host():
    init, grads = make_problem(7, steps=3)
    params = [torch.nn.Parameter(p.clone().to(DEV)) for p in init]
    opt = muon.Muon(params, lr=LR, weight_decay=WD)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.to(DEV)
        opt.step()
    sd = opt.state_dict()
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = muon.Muon(params2, lr=LR, weight_decay=WD)
    opt2.load_state_dict(sd)
    for p, p2, g in zip(params, params2, grads[0]):
        p.grad = g.to(DEV)
        p2.grad = g.to(DEV)
    opt.step()
    opt2.step()
    torch.cuda.synchronize()
    for p, p2 in zip(params, params2):
        assert torch.equal(p, p2)


def test_the_plugin_finds_cuda_in_torchs_own_libraries():
    # A Python user's process has no CUDA toolkit on the loader's path: the
    # plugin's cudart and cuBLASLt must be the ones torch loaded (matched by
    # soname). A fresh process whose LD_LIBRARY_PATH keeps only the bundle's
    # own libraries (abseil, OpenBLAS), none of CUDA's.
    import subprocess
    import sys
    keep = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
            if d and "cuda" not in d and "nvidia" not in d]
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(keep))
    code = ("import torch, muon\n"
            "w = torch.nn.Parameter(torch.randn(64, 96, device='cuda'))\n"
            "w.grad = torch.randn_like(w)\n"
            "before = w.detach().clone()\n"
            "muon.Muon([w], lr=0.02).step()\n"
            "torch.cuda.synchronize()\n"
            "print('moved', (w.detach() - before).norm().item())\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    print("LD_LIBRARY_PATH=%s\n%s%s" % (env["LD_LIBRARY_PATH"], r.stdout, r.stderr[-2000:]))
    assert r.returncode == 0
    assert float(r.stdout.split()[-1]) > 0
