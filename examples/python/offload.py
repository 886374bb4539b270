"""Optimizer offload with libmuon: the model lives on the GPU, Muon steps on the host
(the split ZeRO-Offload makes for Adam).

Every weight matrix has a mirror in host memory, and so does its gradient; both
mirrors are pinned (page-locked: torch.empty(..., pin_memory=True)) when CUDA is
available, so the copies run asynchronously by DMA. Each step:

  1. forward and backward on the device (here a regression loss per matrix:
     mean((W x - y)^2) over a small batch, enough to give every matrix a real
     gradient from autograd);
  2. the gradients copied device -> host into the pinned mirrors (non_blocking),
     then one synchronize;
  3. muon.Muon (libmuon, on the CPU) steps the host mirrors in place: momentum,
     Newton-Schulz, decay, update;
  4. the updated values copied host -> device (non_blocking; the next forward
     runs after them on the same stream).

Without a GPU (this project's CI) the same code runs with the "device" being
the CPU: the device tensors are ordinary CPU tensors, the copies are host to
host and nothing is pinned; the output says so.

It prints, per step, the host step's milliseconds and the same per 1e9
parameters (the host's cost of offloading Muon for a billion-parameter model,
one process using the machine's cores), and the copies' milliseconds. Then it
checks itself: the same initial values stepped by torch.optim.Muon with the
same gradients (copied before libmuon's step), and asserts that the two
agree. With ns_dtype="fp32" (the default here) torch's Newton-Schulz, which
runs in bf16, is replaced by the same iteration in float64 (an fp32 one differs
from float64 by more than libmuon's fp32 does), and the two agree to 1e-4 of
what the steps changed. With "bf16" torch.optim.Muon runs as it is, both
rounding every product to bf16; two bf16 runs differ by bf16's noise, which
Newton-Schulz amplifies in the directions the gradients do not span (their
rank is the batch, 16), so only a sanity bound is asserted there (0.5 of the
change: a wrong learning rate, sign or decay is off by more).

    PYTHONPATH=python .venv/bin/python examples/python/offload.py
    ... offload.py --ns-dtype bf16                          (the library's default NS dtype)
    ... offload.py --model llama3-8b --layers 1 --steps 2 --ns-dtype bf16
                     (218 M parameters, GPU-sized; the check's reference steps on the CPU,
                      and with fp32 its float64 Newton-Schulz takes minutes there: --no-check)

Options: --model (a file of bench/models: gpt2-124m, llama3-8b, llama3-70b,
mixtral-8x7b; its 2-D hidden matrices, role "matrix"), --layers (how many of
each matrix, default 1), --steps, --lr, --ns-dtype fp32|bf16 (default fp32,
which the check holds tightly; bf16 is the library's default), --batch,
--no-check (skip the reference), --models-dir.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.optim._muon as torch_muon

import muon

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "..", "bench", "models")


def model_shapes(models_dir, name, layers):
    """The model's 2-D hidden matrices, `layers` of each (as bench/cpu_bench.py reads them)."""
    with open(os.path.join(models_dir, name + ".json")) as f:
        model = json.load(f)
    shapes = []
    for p in model["params"]:
        if p["role"] != "matrix":
            continue
        for i in range(min(p["count"], layers)):
            shapes.append(("%s.%d" % (p["name"], i), tuple(p["shape"])))
    return shapes


def float64_newton_schulz(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's Newton-Schulz (transpose tall, normalize, then
    X <- a X + (b A + c A^2) X with A = X X^T), computed in float64 instead of
    bf16 and returned in float32."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=torch.float64, copy=True)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(torch.float32)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2-124m")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--ns-dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--models-dir", default=MODELS)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    pin = cuda
    print("libmuon %s from %s" % (muon.__version__, muon.library_path))
    if cuda:
        print("device: %s (%s); host mirrors in pinned memory" % (
            device, torch.cuda.get_device_name(device)))
    else:
        print("device: none available, so the 'device' is the CPU itself: the model's tensors "
              "are CPU tensors, the copies are host to host, nothing is pinned")
    print("host: %d cores (os.sched_getaffinity), torch threads %d" % (
        len(os.sched_getaffinity(0)), torch.get_num_threads()))

    shapes = model_shapes(args.models_dir, args.model, args.layers)
    n_params = sum(r * c for _, (r, c) in shapes)
    print("matrices: %s, %d of each hidden matrix: %d matrices, %.2f M parameters (fp32); "
          "Newton-Schulz %s, 5 iterations" % (args.model, args.layers, len(shapes),
                                              n_params / 1e6, args.ns_dtype))

    torch.manual_seed(0)
    # The model, on the device.
    weights = [torch.nn.Parameter((torch.randn(r, c) / c ** 0.5).to(device))
               for _, (r, c) in shapes]
    # Its host mirrors: values and gradients, pinned where there is a GPU. The
    # optimizer steps these; their .grad is the pinned gradient buffer, bound
    # once (libmuon borrows it: the copies write into it in place).
    host = []
    for w in weights:
        h = torch.empty(w.shape, dtype=torch.float32, pin_memory=pin)
        h.copy_(w.detach())
        h.grad = torch.empty(w.shape, dtype=torch.float32, pin_memory=pin)
        host.append(h)
    opt = muon.Muon(host, lr=args.lr, ns_dtype=args.ns_dtype)
    print("host mirrors: %.2f GiB (values and gradients, fp32), %s" % (
        2 * 4 * n_params / 2 ** 30, "pinned" if pin else "pageable"))

    # The reference: torch.optim.Muon on copies of the same initial values.
    check = not args.no_check
    if check:
        initial = [h.detach().clone() for h in host]
        reference = [h.detach().clone() for h in host]
        torch_opt = torch.optim.Muon(reference, lr=args.lr)

    # A fixed batch per matrix: y = T x for a random teacher T (the gradients
    # have rank --batch at most, as a real batch's have few directions).
    data = []
    for w in weights:
        x = torch.randn(w.shape[1], args.batch, device=device)
        data.append((x, torch.randn(w.shape[0], w.shape[1], device=device) @ x / w.shape[1] ** 0.5))

    print("\n| step | loss | grads d2h ms | host step ms | host step ms per 1e9 params | "
          "values h2d ms |\n|---:|---:|---:|---:|---:|---:|")
    per_billion = 1e9 / n_params
    step_ms = []
    for step in range(args.steps):
        for w in weights:
            w.grad = None
        loss = sum(torch.nn.functional.mse_loss(w @ x, y) for w, (x, y) in zip(weights, data))
        loss.backward()
        sync(device)

        t0 = time.perf_counter()
        for w, h in zip(weights, host):
            h.grad.copy_(w.grad, non_blocking=True)
        sync(device)  # the gradients are on the host before the step reads them
        t1 = time.perf_counter()
        if check:
            for r, h in zip(reference, host):
                r.grad = h.grad.clone()  # a copy of its own: the two optimizers stay independent
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        with torch.no_grad():
            for w, h in zip(weights, host):
                w.copy_(h, non_blocking=True)
        sync(device)  # only to time the copies: the next forward would follow them anyway
        t4 = time.perf_counter()
        if check:
            original = torch_muon._zeropower_via_newtonschulz
            if args.ns_dtype == "fp32":
                torch_muon._zeropower_via_newtonschulz = float64_newton_schulz
            try:
                torch_opt.step()
            finally:
                torch_muon._zeropower_via_newtonschulz = original

        step_ms.append((t3 - t2) * 1e3)
        print("| %d | %.5f | %.1f | %.1f | %.0f | %.1f |" % (
            step, loss.item(), (t1 - t0) * 1e3, step_ms[-1], step_ms[-1] * per_billion,
            (t4 - t3) * 1e3), flush=True)

    # The device's values are the host's after the last copy back.
    for w, h in zip(weights, host):
        assert torch.equal(w.detach().cpu(), h), "a device copy differs from its host mirror"
    median = statistics.median(step_ms[1:] or step_ms)  # step 0 allocates
    print("\nhost step: median %.1f ms over steps %s, %.0f ms per 1e9 parameters" % (
        median, "1.." + str(args.steps - 1) if args.steps > 1 else "0", median * per_billion))

    if check:
        worst = max((h - r).abs().max().item() for h, r in zip(host, reference))
        moved = max((r - i).abs().max().item() for r, i in zip(reference, initial))
        # The difference relative to what the steps changed, in the Frobenius
        # norm over all matrices: ||ours - theirs|| / ||theirs - initial||.
        diff_sq = sum(((h - r).double() ** 2).sum().item() for h, r in zip(host, reference))
        change_sq = sum(((r - i).double() ** 2).sum().item() for r, i in zip(reference, initial))
        relative = (diff_sq / change_sq) ** 0.5
        # fp32: what is left is libmuon's fp32 rounding against float64
        # (an fp32 reference would add its own: torch's fp32 Newton-Schulz is
        # itself about 4e-5 from float64 on these shapes). bf16: both round
        # every product to bf16 and differ in the order of the fp32 sums
        # inside them; where the gradients have fewer directions than the
        # matrix has rows, the rest is bf16 noise that the iteration amplifies
        # (measured: 5e-3 on GPT-2's matrices, 0.16 on Llama-3 8B's with
        # rank-16 gradients), so the bound is a sanity check only.
        tolerance = 1e-4 if args.ns_dtype == "fp32" else 0.5
        print("check against torch.optim.Muon (its Newton-Schulz in %s) on the same gradients: "
              "max abs difference %.3g, the largest change the %d steps made %.3g; "
              "||ours - torch|| / ||torch - initial|| = %.3g (tolerance %.0e%s)"
              % ("float64" if args.ns_dtype == "fp32" else "bf16, torch's own", worst, args.steps,
                 moved, relative, tolerance,
                 "" if args.ns_dtype == "fp32" else ", a sanity bound: see the docstring"))
        assert relative <= tolerance, "libmuon's host step differs from torch.optim.Muon"
    print("ok")


if __name__ == "__main__":
    main()
