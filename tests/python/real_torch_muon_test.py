"""muon.Muon against the real torch.optim.Muon of the installed torch (not a
reference of ours), and muon's Newton-Schulz against torch's own
torch.optim._muon._zeropower_via_newtonschulz.

- fp32: torch's Newton-Schulz is replaced by the same iteration in float32
  (monkeypatched into torch.optim._muon); muon.Muon runs ns_dtype="fp32".
  Training runs (param groups, a scheduler, grads set to None) agree to 1e-5
  relative.
- bf16 (both sides' default): each trajectory is compared with a float64
  one (torch.optim.Muon with a float64 Newton-Schulz on float64 copies), on
  the same gradients; libmuon's is as close to it as torch's (see the test),
  on every bf16 engine this CPU runs (MUON_CPU_BF16: the AMX kernel, the
  AVX512-BF16 kernel, oneDNN, emulated), each asked for by name.
"""

import copy
import os

import pytest
import torch
import torch.optim._muon as torch_muon

import muon

STEPS = 40
A, B, C = 3.4445, -4.775, 2.0315


def newton_schulz(grad, ns_coefficients, ns_steps, eps, dtype):
    """torch's iteration (transpose tall, normalize, a X + (b A + c A^2) X), in `dtype`."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=dtype, copy=True)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return []


# Each bf16 engine of libmuon's CPU backend and the CPU flags it needs.
ENGINES = {"amx": ["avx512_bf16", "amx_bf16", "amx_tile"], "avx512_bf16": ["avx512_bf16"],
           "onednn": ["avx512_bf16"], "emulated": []}


@pytest.fixture(params=sorted(ENGINES))
def bf16_engine(request, monkeypatch):
    """Runs the test on one bf16 engine (MUON_CPU_BF16), skipped, naming what the
    CPU lacks, where it cannot run."""
    missing = [f for f in ENGINES[request.param] if f not in cpu_flags()]
    if missing:
        pytest.skip("this CPU has no %s for the %s engine" % (" ".join(missing), request.param))
    if os.environ.get("MUON_CPU_ISA"):
        pytest.skip("MUON_CPU_ISA=%s caps this CPU" % os.environ["MUON_CPU_ISA"])
    monkeypatch.setenv("MUON_CPU_BF16", request.param)
    return request.param


@pytest.fixture
def torch_ns(monkeypatch):
    """Sets torch.optim.Muon's Newton-Schulz dtype (None: torch's own, bf16)."""
    def use(dtype):
        if dtype is None:
            monkeypatch.undo()
            return
        monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz",
                            lambda g, co, steps, eps: newton_schulz(g, co, steps, eps, dtype))
    return use


@pytest.fixture
def fp32_torch_ns(monkeypatch):
    """torch.optim.Muon's Newton-Schulz in fp32 for the whole test (the tests of
    other files that compare with torch.optim.Muon import this fixture)."""
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz",
                        lambda g, co, steps, eps: newton_schulz(g, co, steps, eps, torch.float32))


class Model(torch.nn.Module):
    """Five matrices in a chain; `aux` is used on some steps only (its grad is
    None after zero_grad(set_to_none=True) on the others)."""

    SHAPES = {"w_in": (32, 16), "w_mid": (24, 32), "w_out": (8, 24), "w_out2": (8, 8),
              "aux": (16, 16)}

    def __init__(self):
        super().__init__()
        for name, (rows, cols) in self.SHAPES.items():
            setattr(self, name, torch.nn.Parameter(torch.randn(rows, cols) / cols ** 0.5))

    def forward(self, x, use_aux):
        if use_aux:
            x = x + torch.tanh(x @ self.aux.T)
        for w in (self.w_in, self.w_mid):
            x = torch.tanh(x @ w.T)
        return (x @ self.w_out.T) @ self.w_out2.T


def groups(model):
    return [{"params": [model.w_in, model.aux]},
            {"params": [model.w_mid], "lr": 0.01, "weight_decay": 0.05,
             "momentum": 0.9, "adjust_lr_fn": "match_rms_adamw"},
            {"params": [model.w_out, model.w_out2], "adjust_lr_fn": "spectral_unclamped"}]


def train(model, opt, data):
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    for step, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x, use_aux=step % 3 != 0), y)
        loss.backward()
        opt.step()
        sched.step()
    return model


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def test_training_matches_torch_optim_muon_in_fp32(torch_ns):
    torch.manual_seed(0)
    base = Model()
    data = [(torch.randn(64, 16), torch.randn(64, 8)) for _ in range(STEPS)]
    torch_ns(torch.float32)
    theirs = copy.deepcopy(base)
    train(theirs, torch.optim.Muon(groups(theirs), lr=0.02), data)
    ours = copy.deepcopy(base)
    train(ours, muon.Muon(groups(ours), lr=0.02, ns_dtype="fp32"), data)
    worst = max(relative(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))
    print("\n[real torch.optim.Muon, fp32 NS] largest relative difference %.3e" % worst)
    assert worst <= 1e-5


def test_bf16_is_as_close_to_float64_as_torch_is(torch_ns, bf16_engine):
    """Both run the same bf16 iteration and differ only in the order of the fp32
    accumulation inside each product, so their distances to the float64
    trajectory agree to a fraction of a percent (seed by seed, either may be the
    closer). Over three seeds libmuon's mean distance may exceed torch's by 1%
    at most."""
    shapes = [(48, 32), (32, 80), (64, 64), (96, 24)]
    ours, theirs = [], []
    for seed in range(3):
        torch.manual_seed(seed)
        init = [torch.randn(s) / s[1] ** 0.5 for s in shapes]
        grads = [[torch.randn(s) * (1 + 0.1 * t) for s in shapes] for t in range(STEPS)]

        def run(make, dtype):
            params = [torch.nn.Parameter(p.clone().to(dtype)) for p in init]
            opt = make(params)
            for step in range(STEPS):
                for p, g in zip(params, grads[step]):
                    p.grad = g.to(dtype)
                opt.step()
            return [p.detach().double() for p in params]

        torch_ns(torch.float64)
        exact = run(lambda ps: torch.optim.Muon(ps, lr=0.02), torch.float64)
        torch_ns(None)
        torch_bf16 = run(lambda ps: torch.optim.Muon(ps, lr=0.02), torch.float32)
        ours_bf16 = run(lambda ps: muon.Muon(ps, lr=0.02), torch.float32)
        theirs.append(sum(relative(p, q) for p, q in zip(torch_bf16, exact)) / len(shapes))
        ours.append(sum(relative(p, q) for p, q in zip(ours_bf16, exact)) / len(shapes))
    print("\n[bf16 NS vs a float64 trajectory] mean relative distance: libmuon (%s) %.4e, "
          "torch.optim.Muon %.4e" % (bf16_engine, sum(ours) / 3, sum(theirs) / 3))
    assert sum(ours) <= 1.01 * sum(theirs)


@pytest.mark.parametrize("shape", [(6, 10), (12, 5), (64, 64), (33, 130), (300, 520)])
def test_newton_schulz_matches_torchs_own(shape, bf16_engine):
    torch.manual_seed(2)
    g = torch.randn(shape)
    theirs = torch_muon._zeropower_via_newtonschulz(g, (A, B, C), 5, 1e-7)
    ours = muon._zeropower_via_newtonschulz(g, (A, B, C), 5, 1e-7)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and ours.shape == theirs.shape
    exact = newton_schulz(g.double(), (A, B, C), 5, 1e-7, torch.float64)
    # Both in bf16: as close to the float64 result as torch is, within a little.
    assert relative(ours.double(), exact) <= 1.1 * relative(theirs.double(), exact) + 1e-3
    fp32 = muon.zeropower_via_newtonschulz(g, ns_dtype="fp32")
    assert fp32.dtype == torch.float32
    assert relative(fp32.double(), exact) < 1e-5


def test_the_design_documents_call_forms():
    # The design's examples call _zeropower_via_newtonschulz(x, ns_steps) and
    # (x): torch.optim.Muon's defaults for what is left out; each equals
    # torch's four-argument call bit for bit (the same library call).
    torch.manual_seed(5)
    g = torch.randn(12, 20)
    four = muon._zeropower_via_newtonschulz(g, (A, B, C), 5, 1e-7)
    assert torch.equal(muon._zeropower_via_newtonschulz(g, 5), four)
    assert torch.equal(muon._zeropower_via_newtonschulz(g), four)
    three = muon._zeropower_via_newtonschulz(g, (A, B, C), 3, 1e-7)
    assert torch.equal(muon._zeropower_via_newtonschulz(g, 3), three)
    assert not torch.equal(three, four)
    theirs = torch_muon._zeropower_via_newtonschulz(g, (A, B, C), 3, 1e-7)
    exact = newton_schulz(g.double(), (A, B, C), 3, 1e-7, torch.float64)
    assert relative(three.double(), exact) <= 1.1 * relative(theirs.double(), exact) + 1e-3


def test_newton_schulz_batches_and_refuses_like_torch():
    g = torch.randn(3, 8, 5)
    batch = muon.zeropower_via_newtonschulz(g, ns_dtype="fp32")
    for k in range(3):
        single = muon.zeropower_via_newtonschulz(g[k], ns_dtype="fp32")
        assert torch.equal(batch[k], single)
    for call, message in [
        (lambda: muon._zeropower_via_newtonschulz(g, (A, B, C), 5, 1e-7), "2D matrix"),
        (lambda: muon._zeropower_via_newtonschulz(g[0], (A, B), 5, 1e-7), "exactly 3"),
        (lambda: muon._zeropower_via_newtonschulz(g[0], (A, B, C), 100, 1e-7), "less than 100"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()


class Net(torch.nn.Module):
    """Matrices, biases and a norm: what model.parameters() hands an optimizer."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.norm(torch.tanh(self.fc1(x))))


ADAMW = dict(adamw_lr=3e-3, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, adamw_wd=0.01)


def fit(model, step, data):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        step(loss)
    return model


def plain(opt):
    def step(loss):
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def test_one_optimizer_takes_model_parameters_as_torch_muon_plus_adamw(torch_ns):
    torch.manual_seed(3)
    base = Net()
    data = [(torch.randn(32, 16), torch.randn(32, 8)) for _ in range(20)]
    torch_ns(torch.float32)
    theirs = copy.deepcopy(base)
    matrices = [p for p in theirs.parameters() if p.ndim == 2]
    others = [p for p in theirs.parameters() if p.ndim < 2]
    t_muon = torch.optim.Muon(matrices, lr=0.02)
    t_adamw = torch.optim.AdamW(others, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

    def both(loss):
        t_muon.zero_grad()
        t_adamw.zero_grad()
        loss.backward()
        t_muon.step()
        t_adamw.step()
    fit(theirs, both, data)
    ours = copy.deepcopy(base)
    fit(ours, plain(muon.Muon(ours.parameters(), lr=0.02, ns_dtype="fp32", **ADAMW)), data)
    worst = max(relative(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))
    print("\n[model.parameters(): Muon + AdamW vs torch's] largest relative difference %.3e"
          % worst)
    assert worst <= 1e-5


def net_and_data(seed, steps):
    """A Net, its data, and a copy trained on all of it without interruption."""
    torch.manual_seed(seed)
    base = Net()
    data = [(torch.randn(32, 16), torch.randn(32, 8)) for _ in range(steps)]
    straight = copy.deepcopy(base)
    fit(straight, plain(muon.Muon(straight.parameters(), lr=0.02, **ADAMW)), data)
    return base, data, straight


def test_state_dict_holds_both_and_resumes_bit_for_bit():
    base, data, straight = net_and_data(4, 12)

    first = copy.deepcopy(base)
    opt = muon.Muon(first.parameters(), lr=0.02, **ADAMW)
    fit(first, plain(opt), data[:6])
    saved = copy.deepcopy(opt.state_dict())
    kinds = [sorted(entry) for entry in saved["state"].values()]
    assert ["momentum_buffer"] in kinds and ["exp_avg", "exp_avg_sq", "step"] in kinds, kinds
    assert saved["param_groups"][0]["adamw_betas"] == (0.9, 0.95)

    resumed = copy.deepcopy(first)
    opt2 = muon.Muon(resumed.parameters(), lr=0.02, **ADAMW)
    opt2.load_state_dict(saved)
    fit(resumed, plain(opt2), data[6:])
    for p, q in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(p, q)


def test_grad_scaler_steps_it_and_skips_non_finite_steps():
    base, data, unscaled = net_and_data(5, 8)

    scaled = copy.deepcopy(base)
    opt = muon.Muon(scaled.parameters(), lr=0.02, **ADAMW)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)

    def step(loss):
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    fit(scaled, step, data)
    for p, q in zip(scaled.parameters(), unscaled.parameters()):
        assert torch.equal(p, q)  # power-of-two scaling is exact

    # A step whose gradients overflow is skipped, and the scale backs off.
    before = [p.detach().clone() for p in scaled.parameters()]
    opt.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(scaled(data[0][0]), data[0][1])).backward()
    scaled.fc1.weight.grad[0, 0] = float("inf")
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(p, b) for p, b in zip(scaled.parameters(), before))
    assert scaler.get_scale() < scale
