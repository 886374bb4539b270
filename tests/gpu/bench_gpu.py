"""GPU benchmark: libmuon against torch in the same run; prints one table.

1. Newton-Schulz (5 steps, bf16, torch's coefficients) on 1024², 4096²,
   8192², 4096x14336 and the Llama-3-8B matrix set: libmuon's CUDA backend
   (ns_bench, strided-batched over same-shape matrices) against
   torch.optim._muon._zeropower_via_newtonschulz called per matrix, as
   torch.optim.Muon does. ms per call and effective TFLOP/s counting
   4 m^2 n + 2 m^3 per iteration (m <= n), the standard iteration's count,
   for both: so TFLOP/s compares times. The Gram column is libmuon's Gram
   Newton-Schulz (ns_algorithm GRAM, restarting at 2; square matrices run
   the standard iteration) on the same matrices, with its distance from
   the standard iteration's result (the largest of |gram - standard| over
   the largest |standard|, in one matrix per shape).
2. A full optimizer step over the Llama-3-8B matrix set (bf16 parameters):
   muon.Muon.step against torch.optim.Muon.step, and muon.Muon with
   ns_algorithm="gram".

   run_python.sh tests/gpu/bench_gpu.py --ns-bench bazel-bin/tests/gpu/ns_bench
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "..", "bench", "models")
A, B, C = 3.4445, -4.7750, 2.0315
STEPS = 5


def flops(rows, cols):
    m, n = min(rows, cols), max(rows, cols)
    return STEPS * (4 * m * m * n + 2 * m ** 3)


def llama_set(layers):
    with open(os.path.join(MODELS, "llama3-8b.json")) as f:
        model = json.load(f)
    out = {}
    for p in model["params"]:
        if p["role"] == "matrix":
            shape = tuple(p["shape"])
            out[shape] = out.get(shape, 0) + p["count"] * layers // model["layers"]
    return [(count, r, c) for (r, c), count in out.items()]


def time_cuda(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters


def torch_ns(batches, iters):
    from torch.optim._muon import _zeropower_via_newtonschulz as zp
    mats = []
    for count, r, c in batches:
        x = torch.randn(r, c, device="cuda")
        mats += [x] * count  # the same matrix, as ns_bench does

    def run():
        for x in mats:
            zp(x, (A, B, C), STEPS, 1e-7)
    return time_cuda(run, iters)


def ours_ns(ns_bench, batches, iters, gram=False, tiles=0):
    specs = ["%dx%dx%d" % b for b in batches]
    flags = (["--gram"] if gram else []) + ["--tiles", str(tiles)]
    out = subprocess.run([ns_bench, "--iters", str(iters)] + flags + specs, check=True,
                         capture_output=True, text=True).stdout
    return sum(float(line.split()[4]) for line in out.splitlines() if line.startswith("ns "))


def full_step(layers, iters):
    import muon
    shapes = [(r, c) for count, r, c in llama_set(layers) for _ in range(count)]
    results = {}
    for name in ("torch", "libmuon", "libmuon gram"):
        params = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=torch.bfloat16) * 0.02)
                  for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        if name == "torch":
            opt = torch.optim.Muon(params, lr=0.02)
        else:
            opt = muon.Muon(params, lr=0.02,
                            ns_algorithm="gram" if name == "libmuon gram" else "standard")
        results[name] = time_cuda(opt.step, iters)
        del opt, params
        torch.cuda.empty_cache()
    return results, len(shapes)


def gram_distance(rows, cols):
    """max |gram - standard| / max |standard| on one random matrix (bf16)."""
    import muon
    out = []
    for algo in ("standard", "gram"):
        w = torch.nn.Parameter(torch.zeros(rows, cols, device="cuda", dtype=torch.bfloat16))
        torch.manual_seed(3)
        w.grad = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        opt = muon.Muon([w], lr=1.0, momentum=0.0, weight_decay=0.0, adjust_lr_fn="original",
                        ns_algorithm=algo)
        opt.step()
        out.append(w.detach().float())
        del opt
    return ((out[1] - out[0]).abs().max() / out[0].abs().max()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns-bench", required=True, help="path of the built ns_bench")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--layers", type=int, default=32, help="Llama-3-8B layers (32: the whole set)")
    ap.add_argument("--peak", type=float, default=989.0,
                    help="the GPU's dense bf16 peak in TFLOP/s (H100/H200 SXM datasheet: 989)")
    ap.add_argument("--skip-step", action="store_true")
    args = ap.parse_args()
    name = torch.cuda.get_device_name(0)
    print("GPU: %s; torch %s; %s" % (name, torch.__version__, time.strftime("%Y-%m-%d")))
    cases = [("1024x1024", [(1, 1024, 1024)]), ("4096x4096", [(1, 4096, 4096)]),
             ("8192x8192", [(1, 8192, 8192)]), ("4096x14336", [(1, 4096, 14336)]),
             ("Llama-3-8B set (%d layers)" % args.layers, llama_set(args.layers))]
    print("| Newton-Schulz, 5 steps, bf16 | torch ms | libmuon whole products ms | libmuon ms "
          "| speed-up | torch TFLOP/s | libmuon TFLOP/s | libmuon % of peak | libmuon Gram ms "
          "| Gram speed-up | Gram vs standard |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, batches in cases:
        total = sum(count * flops(r, c) for count, r, c in batches)
        t = torch_ns(batches, args.iters)
        w = ours_ns(args.ns_bench, batches, args.iters, tiles=1)
        o = ours_ns(args.ns_bench, batches, args.iters)
        g = ours_ns(args.ns_bench, batches, args.iters, gram=True)
        dist = max(gram_distance(r, c) for _, r, c in batches)
        print("| %s | %.3f | %.3f | %.3f | %.2fx | %.0f | %.0f | %.0f%% | %.3f | %.2fx | %.1e |" % (
            label, t, w, o, t / o, total / t / 1e9, total / o / 1e9,
            100 * total / o / 1e9 / args.peak, g, t / g, dist))
        sys.stdout.flush()
    # The symmetric products' tiles, side by side (libmuon's rule: 2 x 2 from
    # m = 4096, 4 x 4 from 8192).
    tile_cases = [(1, 4096, 4096), (1, 4096, 14336), (1, 8192, 8192), (8, 2048, 8192)]
    print("\n| symmetric products' tiles, ms | " + " | ".join("%dx%dx%d" % c for c in tile_cases)
          + " |")
    print("|---|" + "---|" * len(tile_cases))
    for tiles in (1, 2, 3, 4, 8):
        row = [ours_ns(args.ns_bench, [c], args.iters, tiles=tiles) for c in tile_cases]
        print("| %d x %d | %s |" % (tiles, tiles, " | ".join("%.3f" % v for v in row)))
        sys.stdout.flush()
    if not args.skip_step:
        res, n = full_step(args.layers, args.iters)
        print("\n| Full step, Llama-3-8B matrix set (%d matrices, bf16 params) | ms |" % n)
        print("|---|---|")
        print("| torch.optim.Muon.step | %.1f |" % res["torch"])
        print("| muon.Muon.step (libmuon) | %.1f |" % res["libmuon"])
        print("| speed-up | %.2fx |" % (res["torch"] / res["libmuon"]))
        print("| muon.Muon(ns_algorithm=\"gram\").step | %.1f |" % res["libmuon gram"])
        print("| speed-up, Gram | %.2fx |" % (res["torch"] / res["libmuon gram"]))


if __name__ == "__main__":
    main()
