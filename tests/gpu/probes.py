"""What a pass/fail test answers poorly, printed for a person to read;
run_on_gpu.sh runs it after the benchmark.

  profile   the kernel-time split of three steps on one 8192^2 bf16 matrix,
            libmuon against torch.optim.Muon, with the card's torch.mm bf16
            rate as the ceiling
"""

import sys

import torch

import muon

DEV = torch.device("cuda", 0)


def profile():
    from torch.profiler import ProfilerActivity, profile as prof_ctx
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        a @ a
    e.record()
    torch.cuda.synchronize()
    print("profile: torch.mm 8192^3 bf16 %.0f TFLOP/s"
          % (2 * 8192 ** 3 * 10 / (s.elapsed_time(e) / 1e3) / 1e12))
    del a
    for name in ("libmuon", "torch"):
        w = torch.nn.Parameter(torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16) * 0.02)
        w.grad = torch.randn_like(w)
        opt = muon.Muon([w], lr=0.02) if name == "libmuon" else torch.optim.Muon([w], lr=0.02)
        for _ in range(3):
            opt.step()
        torch.cuda.synchronize()
        with prof_ctx(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                opt.step()
            torch.cuda.synchronize()
        print("profile: %s, 3 steps" % name)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                        max_name_column_width=60))
        del opt, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    {"profile": profile}[sys.argv[1]]()
