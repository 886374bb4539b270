"""CPU benchmark: libmuon's host backend against its baselines, in one run.

Every figure is printed with its baseline from the same run: the
implementations are interleaved (one call of each in turn, `--reps` rounds)
and each one's median is reported. With several threads each call starts
after a pause, and a call under 0.1 s right after an untimed one of the same
implementation (WARM_BELOW_S below).

1. Newton-Schulz, 5 iterations of torch's quintic, fp32: libmuon
   (muon.Optimizer.orthogonalize, ns_dtype fp32) against numpy doing torch's
   products (X X^T, addmm, addmm on the wide orientation) and torch's own
   fp32 products (the same steps in torch.mm).
2. Newton-Schulz in bf16: libmuon on the engine it chooses for this CPU (its
   AMX kernel, its AVX512-BF16 kernel, or emulated: fp32 products rounded to
   bf16) and on each engine named by --engines (MUON_CPU_BF16) against
   torch.optim._muon._zeropower_via_newtonschulz.
   --schedules instead: the schedules (cubic5, CANS, Polar Express,
   DeepSeek-V4) against torch's 5-step quintic, all libmuon's, bf16 and fp32.
   --variants instead: muon.Muon.step with NorMuon against the plain Muon
   step on the same tensors (both libmuon's), bf16 and fp32 parameters.
   --gram instead: Gram Newton-Schulz against the standard iteration (both
   libmuon's, Polar Express x5, restart at 2) at aspect ratios 1, 3.5, 8.
   --dtypes instead: the standard iteration in fp32, fp16 and bf16.
   --split instead: a fused QKV stepped whole and as its Q, K, V blocks.
3. A full optimizer step over real matrix sets (GPT-2 124M, a Llama-3-8B-shaped
   set scaled to fit): muon.Muon.step against torch.optim.Muon.step on the
   same tensors, fp32 and bf16 parameters (--step-only: this table alone).

   bazel build -c opt //:libmuon.so
   MUON_LIBRARY=bazel-bin/libmuon.so tests/python/run_python.sh bench/cpu_bench.py

A CPU of another kind, on this one: MUON_CPU_ISA caps libmuon (cpu_features.h),
ONEDNN_MAX_CPU_ISA torch's oneDNN, OPENBLAS_CORETYPE both OpenBLAS builds; the
header prints what was set.
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch

import muon

HERE = os.path.dirname(os.path.abspath(__file__))
A, B, C = 3.4445, -4.7750, 2.0315
STEPS = 5
EPS = 1e-7


def ns_flops(rows, cols):
    m, n = min(rows, cols), max(rows, cols)
    return STEPS * (4 * m * m * n + 2 * m ** 3)


def numpy_ns(g):
    """torch's Newton-Schulz in numpy fp32 (the same products, in order)."""
    x = g / (np.linalg.norm(g) + EPS)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(STEPS):
        a = x @ x.T
        b = B * a + C * (a @ a)
        x = A * x + b @ x
    return x.T if tall else x


def torch_fp32_ns(g):
    """torch.optim.Muon's Newton-Schulz with fp32 products (torch.mm / addmm)."""
    x = g / (g.norm() + EPS)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    for _ in range(STEPS):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=B, alpha=C)
        x = torch.addmm(x, update, x, beta=A)
    return x.T if tall else x


# Idle worker threads of OpenBLAS (numpy's and ours) and of OpenMP (torch's)
# spin for a while after their work; with several threads each, the next
# implementation would share the cores with them. Each call starts after
# this pause.
SETTLE_S = 0.2
# With several threads, a thread pool that wakes after another library's
# pool ran may find its worker placed on the core of the thread that woke
# it: measured on the 2-vCPU machine, libmuon's 512^2 bf16 Newton-Schulz
# took 13-15 ms right after any torch or numpy call (with the pause) and
# 3.7-4.2 ms with OMP_PROC_BIND=true or back to back; torch's own calls
# vary the same way. A call shorter than this is therefore timed warm: right
# after an untimed call of the same implementation, as it runs inside a
# step, the same for every implementation.
WARM_BELOW_S = 0.1


# A call that takes longer than this is timed from its first call on (what a
# warm-up would settle, threads and allocations, costs milliseconds of it):
# torch's bf16 step on a CPU without native bf16 takes minutes.
LONG_CALL_S = 60.0


def interleaved(fns, reps):
    """Median seconds of each of `fns`, called in turn `reps` times (one warm-up each,
    except a call longer than LONG_CALL_S, whose first call is one of the reps)."""
    first = []
    for f in fns:
        t = time.perf_counter()
        f()
        first.append(time.perf_counter() - t)
    several = torch.get_num_threads() > 1
    times = [[t] if t > LONG_CALL_S else [] for t in first]
    for _ in range(reps):
        for i, f in enumerate(fns):
            if len(times[i]) >= reps:
                continue
            if several:
                time.sleep(SETTLE_S)
                if first[i] < WARM_BELOW_S:
                    f()
            t = time.perf_counter()
            f()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def ns_table(shapes, reps):
    print("\n## Newton-Schulz, fp32 (5 iterations; median ms; GFLOP/s counting 4m^2n + 2m^3)\n")
    print("libmuon on the fp32 engine it chooses (MUON_CPU_FP32 unset: its AVX-512 kernel where "
          "the CPU has AVX-512) and on OpenBLAS "
          "(MUON_CPU_FP32=openblas).\n")
    print("| shape | libmuon ms | libmuon on OpenBLAS ms | numpy ms | torch fp32 ms | "
          "libmuon GFLOP/s | vs numpy | vs torch |")
    print("|---|---|---|---|---|---|---|---|")
    opt = engine_optimizer("MUON_CPU_FP32", None, "fp32")
    on_blas = engine_optimizer("MUON_CPU_FP32", "openblas", "fp32")
    for rows, cols in shapes:
        g = torch.randn(rows, cols)
        out = torch.empty_like(g)
        gn = g.numpy().copy()
        ours, blas, np_t, th = interleaved(
            [lambda: opt.orthogonalize(g, out), lambda: on_blas.orthogonalize(g, out),
             lambda: numpy_ns(gn), lambda: torch_fp32_ns(g)],
            reps)
        print("| %dx%d | %.2f | %.2f | %.2f | %.2f | %.1f | %.2fx | %.2fx |" % (
            rows, cols, ours * 1e3, blas * 1e3, np_t * 1e3, th * 1e3,
            ns_flops(rows, cols) / ours / 1e9, np_t / ours, th / ours))
    opt.close()
    on_blas.close()


def engine_optimizer(variable, engine, ns_dtype):
    """An optimizer whose backend chose its products' engine with `variable`
    (MUON_CPU_BF16, MUON_CPU_FP32) set to `engine` (None: unset, libmuon's
    choice). The backend decides at each product's setup, so the setting
    stays for the optimizer's products: the variable is set around each call
    of the returned optimizer's orthogonalize."""
    opt = muon.Optimizer(ns_dtype=ns_dtype)
    plain = opt.orthogonalize

    def orthogonalize(g, out):
        before = os.environ.get(variable)
        if engine is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = engine
        try:
            return plain(g, out)
        finally:
            if before is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = before
    opt.orthogonalize = orthogonalize
    return opt


def bf16_optimizer(engine):
    """A bf16 optimizer on `engine` (MUON_CPU_BF16; "auto": libmuon's choice).
    The backend decides on its first product, made here."""
    before = os.environ.get("MUON_CPU_BF16")
    os.environ["MUON_CPU_BF16"] = engine
    try:
        opt = muon.Optimizer(ns_dtype="bf16")
        opt.orthogonalize(torch.randn(4, 4), torch.empty(4, 4, dtype=torch.bfloat16))
    finally:
        if before is None:
            del os.environ["MUON_CPU_BF16"]
        else:
            os.environ["MUON_CPU_BF16"] = before
    return opt


def bf16_table(shapes, reps, engines):
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_ns
    print("\n## Newton-Schulz, bf16 (5 iterations; median ms)\n")
    print("| shape | %s | torch bf16 ms | %s |" % (
        " | ".join("libmuon %s ms" % e for e in engines),
        " | ".join("%s vs torch" % e for e in engines)))
    print("|---|%s---|%s" % ("---|" * len(engines), "---|" * len(engines)))
    opts = [bf16_optimizer(e) for e in engines]
    for rows, cols in shapes:
        g = torch.randn(rows, cols)
        outs = [torch.empty(rows, cols, dtype=torch.bfloat16) for _ in engines]
        fns = [(lambda o=o, out=out: o.orthogonalize(g, out)) for o, out in zip(opts, outs)]
        times = interleaved(fns + [lambda: torch_ns(g, (A, B, C), STEPS, EPS)], reps)
        ours, th = times[:-1], times[-1]
        print("| %dx%d | %s | %.2f | %s |" % (
            rows, cols, " | ".join("%.2f" % (t * 1e3) for t in ours), th * 1e3,
            " | ".join("%.2fx" % (th / t) for t in ours)))
    for o in opts:
        o.close()


def schedules_table(shapes, reps, dtype):
    """Newton-Schulz schedules against torch's 5-step quintic, both libmuon's,
    in one run: cubic5 runs two products an iteration instead of three; aol
    four iterations after its pre-scaling (whose W W^T is the first gram)."""
    print("\n## Newton-Schulz schedules, %s (median ms; libmuon on its %s engine)\n"
          % (dtype, "bf16" if dtype == "bf16" else "fp32"))
    runs = [("quintic x5", (A, B, C), 5), ("cubic5", "cubic5", 5), ("cans", "cans", 5),
            ("polar_express x5", "polar_express", 5), ("deepseekv4", "deepseekv4", 10),
            ("aol x4", "aol", 4)]
    print("| shape | %s | %s |" % (" | ".join("%s ms" % n for n, _, _ in runs),
                                   " | ".join("%s vs quintic" % n for n, _, _ in runs[1:])))
    print("|---|%s%s" % ("---|" * len(runs), "---|" * (len(runs) - 1)))
    opts = [muon.Optimizer(ns_dtype=dtype, ns_coefficients=co, ns_steps=k) for _, co, k in runs]
    out_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    for rows, cols in shapes:
        g = torch.randn(rows, cols)
        outs = [torch.empty(rows, cols, dtype=out_dtype) for _ in runs]
        times = interleaved([(lambda o=o, out=out: o.orthogonalize(g, out))
                             for o, out in zip(opts, outs)], reps)
        print("| %dx%d | %s | %s |" % (
            rows, cols, " | ".join("%.2f" % (t * 1e3) for t in times),
            " | ".join("%.2fx" % (times[0] / t) for t in times[1:])))
    for o in opts:
        o.close()


def products_table(reps):
    """torch's own bf16 products (its bundled oneDNN) of one Newton-Schulz
    iteration, as torch runs them: bench/bf16_gemm_bench's rows."""
    print("\n## torch's bf16 products of one iteration (min ms; GFLOP/s counting 2mnk)\n")
    print("| matrix | product (m x n x k) | torch bf16 |")
    print("|---|---|---|")
    torch.manual_seed(1)
    for rows, cols in [(1024, 1024), (2048, 2048), (1024, 4096)]:
        m, n = min(rows, cols), max(rows, cols)
        x = (torch.randn(m, n) * 0.03).bfloat16()
        gram = (x @ x.T)
        for name, f, dims in [
                ("gram", lambda: x @ x.T, (m, m, n)),
                ("polynomial", lambda: torch.addmm(gram, gram, gram, beta=B, alpha=C), (m, m, m)),
                ("update", lambda: torch.addmm(x, gram, x, beta=A), (m, n, m))]:
            f()
            best = min(timed(f) for _ in range(reps))
            print("| %dx%d | %s %d x %d x %d | %.2f ms, %.0f GFLOP/s |" % (
                rows, cols, name, dims[0], dims[1], dims[2], best * 1e3,
                2 * dims[0] * dims[1] * dims[2] / best / 1e9))


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def model_shapes(name, layers=None, scale=1):
    with open(os.path.join(HERE, "models", name + ".json")) as f:
        model = json.load(f)
    shapes = []
    for p in model["params"]:
        if p["role"] != "matrix":
            continue
        count = p["count"] if layers is None else min(p["count"], layers)
        rows, cols = (d // scale for d in p["shape"])
        shapes += [(rows, cols)] * count
    return shapes


def step_table(sets, reps, dtypes=(torch.float32, torch.bfloat16)):
    print("\n## A full step (median ms per step): muon.Muon against torch.optim.Muon\n")
    print("| matrices | elements (M) | params | libmuon ms | torch ms | vs torch |")
    print("|---|---|---|---|---|---|")
    for label, shapes in sets:
        for dtype in dtypes:
            torch.manual_seed(0)
            ours_p = [torch.nn.Parameter(torch.randn(r, c).to(dtype)) for r, c in shapes]
            theirs_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
            for a, b in zip(ours_p, theirs_p):
                a.grad = torch.randn_like(a)
                b.grad = a.grad.clone()
            ours = muon.Muon(ours_p, lr=0.02)
            theirs = torch.optim.Muon(theirs_p, lr=0.02)
            t_ours, t_theirs = interleaved([ours.step, theirs.step], reps)
            elements = sum(r * c for r, c in shapes) / 1e6
            print("| %s | %.1f | %s | %.1f | %.1f | %.2fx |" % (
                label, elements, "fp32" if dtype == torch.float32 else "bf16", t_ours * 1e3,
                t_theirs * 1e3, t_theirs / t_ours))


def gram_table(reps):
    """Gram Newton-Schulz against the standard iteration, libmuon's both, in
    one run, per dtype: where the m x m iterations win."""
    shapes = [(1024, 1024), (1024, 3584), (3584, 1024), (512, 4096), (4096, 512)]
    print("\n## Gram Newton-Schulz against the standard iteration (median ms; Polar Express "
          "x5, restart at 2)\n")
    print("| shape | aspect | dtype | standard ms | gram ms | gram vs standard | GFLOP standard / gram |")
    print("|---|---|---|---|---|---|---|")
    for dtype in ("fp32", "fp16", "bf16"):
        opts = [muon.Optimizer(ns_dtype=dtype, ns_algorithm=a, ns_coefficients="polar_express",
                               ns_steps=5) for a in ("standard", "gram")]
        for rows, cols in shapes:
            g = torch.randn(rows, cols)
            outs = [torch.empty(rows, cols, dtype=torch.bfloat16 if dtype == "bf16"
                                else torch.float32) for _ in opts]
            times = interleaved([(lambda o=o, out=out: o.orthogonalize(g, out))
                                 for o, out in zip(opts, outs)], reps)
            m, n = min(rows, cols), max(rows, cols)
            standard = 5 * (4 * m * m * n + 2 * m ** 3) / 1e9
            gram = standard if m == n else (  # a square matrix runs the standard one
                4 * m * m * n + 4 * m * m * n + 5 * 2 * m ** 3 + 3 * 2 * m ** 3
                + 3 * 4 * m ** 3) / 1e9
            print("| %dx%d | %.1f | %s | %.1f | %.1f | %.2fx | %.1f / %.1f |" % (
                rows, cols, n / m, dtype, times[0] * 1e3, times[1] * 1e3, times[0] / times[1],
                standard, gram))
        for o in opts:
            o.close()


def dtypes_table(reps):
    """The standard iteration in fp32, fp16 and bf16 (libmuon's all, torch's
    quintic x5), in one run: what each dtype costs against fp32."""
    shapes = [(512, 512), (1024, 1024), (1024, 3584), (2048, 2048)]
    dtypes = ("fp32", "fp16", "bf16")
    print("\n## Newton-Schulz per ns_dtype (median ms; torch's quintic x5)\n")
    print("| shape | %s | %s |" % (" | ".join("%s ms" % d for d in dtypes),
                                   " | ".join("%s / fp32" % d for d in dtypes[1:])))
    print("|---|%s%s" % ("---|" * len(dtypes), "---|" * (len(dtypes) - 1)))
    opts = [muon.Optimizer(ns_dtype=d) for d in dtypes]
    for rows, cols in shapes:
        g = torch.randn(rows, cols)
        outs = [torch.empty(rows, cols) for _ in dtypes]
        times = interleaved([(lambda o=o, out=out: o.orthogonalize(g, out))
                             for o, out in zip(opts, outs)], reps)
        print("| %dx%d | %s | %s |" % (rows, cols, " | ".join("%.1f" % (t * 1e3) for t in times),
                                       " | ".join("%.2f" % (t / times[0]) for t in times[1:])))
    for o in opts:
        o.close()


def split_table(reps):
    """A GQA-fused QKV (Llama-3 8B's shape / 4: 8 query groups of 4 query heads
    and a key and a value head of 32 rows, hidden 1024) stepped whole and
    split into Q, K and V (split_sizes [128, 32, 32]): muon.Optimizer steps
    of the same tensor, one run."""
    rows, cols, sizes = 8 * 192, 1024, [128, 32, 32]
    print("\n## Split blocks: a fused QKV %dx%d whole and as Q, K, V (median ms per step)\n"
          % (rows, cols))
    print("| ns_dtype | whole ms | split ms | split vs whole | GFLOP whole / split |")
    print("|---|---|---|---|---|")
    for dtype in ("bf16", "fp32"):
        w = [torch.randn(rows, cols) for _ in range(2)]
        g = torch.randn(rows, cols)
        opts = []
        for k, split in enumerate((None, sizes)):
            o = muon.Optimizer(ns_dtype=dtype, lr=1e-4)
            o.register(w[k], g.clone(), name="qkv", split_sizes=split)
            opts.append(o)
        times = interleaved([o.step for o in opts], reps)
        m, n = min(rows, cols), max(rows, cols)
        whole = 5 * (4 * m * m * n + 2 * m ** 3) / 1e9
        split = sum(5 * (4 * min(r, cols) ** 2 * max(r, cols) + 2 * min(r, cols) ** 3)
                    for r in (8 * s for s in sizes)) / 1e9
        print("| %s | %.1f | %.1f | %.2fx | %.1f / %.1f |" % (
            dtype, times[0] * 1e3, times[1] * 1e3, times[0] / times[1], whole, split))
        for o in opts:
            o.close()


def variants_table(sets, reps):
    """The update variants' cost: a full muon.Muon step with each against the
    plain Muon step, on the same tensors, in one run."""
    print("\n## Update variants: a full muon.Muon step (median ms) against plain Muon\n")
    # "plain again": a second plain optimizer, the run's own noise floor.
    variants = [("plain", {}), ("normuon", dict(normuon=True)),
                ("cautious_wd", dict(cautious_wd=True)), ("plain again", {})]
    print("| matrices | params | %s | %s |" % (
        " | ".join("%s ms" % n for n, _ in variants),
        " | ".join("%s vs plain" % n for n, _ in variants[1:])))
    print("|---|---|%s%s" % ("---|" * len(variants), "---|" * (len(variants) - 1)))
    for label, shapes in sets:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            start = [torch.randn(r, c).to(dtype) for r, c in shapes]
            grads = [torch.randn_like(p) for p in start]
            opts = []
            for _, kwargs in variants:
                ps = [torch.nn.Parameter(p.clone()) for p in start]
                for p, g in zip(ps, grads):
                    p.grad = g.clone()
                opts.append(muon.Muon(ps, lr=0.02, **kwargs))
            times = interleaved([o.step for o in opts], reps)
            print("| %s | %s | %s | %s |" % (
                label, "fp32" if dtype == torch.float32 else "bf16",
                " | ".join("%.1f" % (t * 1e3) for t in times),
                " | ".join("%.3fx" % (times[0] / t) for t in times[1:])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-size", type=int, default=2048,
                    help="largest square Newton-Schulz size (4096: about a minute per call)")
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--step-only", action="store_true", help="only the full-step table")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 Newton-Schulz table")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 Newton-Schulz table")
    ap.add_argument("--bf16-max-size", type=int, default=None,
                    help="the bf16 table's largest square size, and no 1024x4096 shapes "
                         "(where torch's bf16 products are not native: minutes per call)")
    ap.add_argument("--engines", default="auto,emulated",
                    help="libmuon's bf16 engines to time (MUON_CPU_BF16 values, comma-separated)")
    ap.add_argument("--schedules", action="store_true",
                    help="only the schedules table (cubic5, CANS, Polar Express, DeepSeek-V4 "
                         "against torch's quintic), bf16 and fp32")
    ap.add_argument("--variants", action="store_true",
                    help="only the update variants' table (NorMuon, cautious weight decay "
                         "against plain Muon: a full muon.Muon step)")
    ap.add_argument("--gram", action="store_true",
                    help="only the Gram Newton-Schulz table (against the standard iteration)")
    ap.add_argument("--dtypes", action="store_true",
                    help="only the per-ns_dtype table (fp32, fp16, bf16 Newton-Schulz)")
    ap.add_argument("--split", action="store_true",
                    help="only the split-blocks table (a fused QKV whole and as Q, K, V)")
    ap.add_argument("--step-models", default="gpt2,llama",
                    help="the full-step table's models (gpt2, llama; comma-separated): on a "
                         "CPU without native bf16 torch's step takes minutes per GPT-2 step")
    ap.add_argument("--step-reps", type=int, default=None,
                    help="the full-step table's reps (default: half of --reps, at least 3)")
    ap.add_argument("--step-dtypes", default="fp32,bf16",
                    help="the full-step table's parameter dtypes (fp32, bf16; comma-separated)")
    ap.add_argument("--products", action="store_true",
                    help="also time torch's bf16 products on bf16_gemm_bench's shapes")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags = []
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        pass
    print("# libmuon CPU benchmark\n\n%s, %d threads (torch %s, numpy %s), %s" % (
        cpu, threads, torch.__version__, np.__version__, time.strftime("%Y-%m-%d")))
    print("\nCPU flags: %s; settings: %s" % (
        " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none",
        ", ".join("%s=%s" % (k, os.environ.get(k, "(unset)")) for k in (
            "OPENBLAS_CORETYPE", "MUON_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MUON_CPU_BF16",
            "MUON_CPU_FP32"))))
    sizes = [s for s in (256, 512, 1024, 2048, 4096) if s <= args.max_size]
    shapes = [(s, s) for s in sizes] + [(1024, 4096), (4096, 1024)]
    if args.schedules:
        for dtype in ("bf16", "fp32"):
            schedules_table(shapes, args.reps, dtype)
        return
    if args.gram:
        gram_table(args.reps)
        return
    if args.dtypes:
        dtypes_table(args.reps)
        return
    if args.split:
        split_table(args.reps)
        return
    if args.variants:
        variants_table([("GPT-2 124M", model_shapes("gpt2-124m")),
                        ("Llama-3 8B / 8, 2 layers", model_shapes("llama3-8b", layers=2,
                                                                   scale=8))], args.reps)
        return
    if not args.no_fp32 and not args.step_only:
        ns_table(shapes, args.reps)
    if not args.step_only and not args.no_bf16:
        bf16_shapes = shapes if args.bf16_max_size is None else [
            (s, s) for s in sizes if s <= args.bf16_max_size]
        bf16_table(bf16_shapes, args.reps, args.engines.split(","))
    if args.products:
        products_table(args.reps)
    if not args.no_step:
        models = {"gpt2": ("GPT-2 124M", lambda: model_shapes("gpt2-124m")),
                  "llama": ("Llama-3 8B / 8, 2 layers",
                            lambda: model_shapes("llama3-8b", layers=2, scale=8))}
        chosen = args.step_models.split(",")
        unknown = [m for m in chosen if m not in models]
        if unknown:
            ap.error("--step-models: unknown %s (choose from gpt2, llama)" % ", ".join(unknown))
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        chosen_dtypes = args.step_dtypes.split(",")
        unknown = [d for d in chosen_dtypes if d not in dtypes]
        if unknown:
            ap.error("--step-dtypes: unknown %s (choose from fp32, bf16)" % ", ".join(unknown))
        step_table([(models[m][0], models[m][1]()) for m in chosen],
                   args.step_reps or max(3, args.reps // 2),
                   [dtypes[d] for d in chosen_dtypes])


if __name__ == "__main__":
    main()
