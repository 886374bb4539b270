"""muon.Muon, the torch.optim.Optimizer, against an independent reference of
torch.optim.Muon (PyTorch >= 2.9) written here.

ReferenceMuon below follows torch.optim.Muon's step line by line (param
groups, state["momentum_buffer"] created at a parameter's first gradient,
parameters without a gradient skipped, decoupled weight decay with the plain
lr, the shape-adjusted lr), with the numerics of parity_test.py's reference:
lerp as ATen writes it and a Newton-Schulz that rounds every op to its dtype.
It shares no code with the library. Each side trains its own copy of a small
model on the same data, with the same schedule.
"""

import copy
import gc
import math
import weakref

import pytest
import torch

import muon
from muon import _lib
from parity_test import adjusted_lr, reference_lerp, reference_newton_schulz

STEPS = 50


class ReferenceMuon(torch.optim.Optimizer):
    """torch.optim.Muon's algorithm, with the Newton-Schulz dtype as a parameter."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
                 adjust_lr_fn=None, ns_dtype=torch.bfloat16):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad)
                buf = state["momentum_buffer"]
                buf.copy_(reference_lerp(buf, grad, 1 - mu))
                update = reference_lerp(grad, buf, mu) if group["nesterov"] else buf
                ortho = reference_newton_schulz(update, [group["ns_coefficients"]],
                                                group["ns_steps"], group["eps"],
                                                group["ns_dtype"])
                rows, cols = p.shape[:2]
                adjust = group["adjust_lr_fn"] or "original"
                p.mul_(1 - lr * wd)
                p.add_(ortho, alpha=-adjusted_lr(lr, adjust, rows, cols))


class Model(torch.nn.Module):
    """Three layers, plus `aux`, a matrix used only on some steps (its grad is
    None on the others after zero_grad(set_to_none=True))."""

    def __init__(self):
        super().__init__()
        self.w_in = torch.nn.Parameter(torch.randn(32, 16) / 4)
        self.w_mid = torch.nn.Parameter(torch.randn(24, 32) / 6)
        self.w_out = torch.nn.Parameter(torch.randn(8, 24) / 5)
        self.aux = torch.nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x, use_aux):
        if use_aux:
            x = x + torch.tanh(x @ self.aux.T)
        h = torch.tanh(x @ self.w_in.T)
        h = torch.tanh(h @ self.w_mid.T)
        return h @ self.w_out.T


def uses_aux(step):
    return step % 3 == 0


def make_data(steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(64, 16, generator=gen), torch.randn(64, 8, generator=gen))
            for _ in range(steps)]


def groups_of(model):
    """Two groups with their own lr (and more): the second keeps torch's defaults
    for the rest but changes momentum, nesterov and the lr adjustment."""
    return [
        {"params": [model.w_in, model.w_mid, model.aux], "lr": 0.02},
        {"params": [model.w_out], "lr": 0.01, "weight_decay": 0.05, "momentum": 0.9,
         "nesterov": False, "adjust_lr_fn": "match_rms_adamw"},
    ]


def make_muon(model, **kwargs):
    return muon.Muon(groups_of(model), ns_dtype="fp32", **kwargs)


def make_reference(model):
    return ReferenceMuon(groups_of(model), ns_dtype=torch.float32)


def train(model, opt, data, start, stop, set_to_none, sched, events=None):
    """Steps [start, stop) of the common schedule; `events(step, model, opt)` runs
    before the step (mid-run changes applied to both sides alike)."""
    for step in range(start, stop):
        x, y = data[step]
        opt.zero_grad(set_to_none=set_to_none)
        loss = torch.nn.functional.mse_loss(model(x, uses_aux(step)), y)
        loss.backward()
        if events is not None:
            events(step, model, opt)
        opt.step()
        sched.step()


def relative_difference(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_matches_reference_over_a_training_run(set_to_none):
    torch.manual_seed(0)
    lib_model = Model()
    ref_model = copy.deepcopy(lib_model)
    data = make_data(STEPS)
    lib = make_muon(lib_model)
    ref = make_reference(ref_model)
    lib_sched = torch.optim.lr_scheduler.StepLR(lib, step_size=10, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=10, gamma=0.5)

    def events(step, model, opt):
        if step == 20:  # param.data replaced by new storage: rebound, not lost
            model.w_mid.data = model.w_mid.data.clone()
        if step == 30:  # fixed options changed in a group: read from the group
            opt.param_groups[1]["ns_steps"] = 6
            opt.param_groups[1]["nesterov"] = True

    worst = 0.0
    for step in range(STEPS):
        aux_before = lib_model.aux.detach().clone()
        train(lib_model, lib, data, step, step + 1, set_to_none, lib_sched, events)
        train(ref_model, ref, data, step, step + 1, set_to_none, ref_sched, events)
        if set_to_none and not uses_aux(step):
            # No gradient: skipped entirely (no momentum, no weight decay), as torch does.
            assert lib_model.aux.grad is None
            assert torch.equal(lib_model.aux.detach(), aux_before)
        for (name, p), q in zip(lib_model.named_parameters(), ref_model.parameters()):
            worst = max(worst, relative_difference(p.detach(), q.detach()))
        assert worst <= 1e-5, (step, worst)
    print("\n[torch Muon] set_to_none=%s: largest relative difference over %d steps %.3e"
          % (set_to_none, STEPS, worst))
    # The schedule reached the library: the last step ran with both groups' lr
    # halved 4 times (the scheduler has halved them once more since).
    assert [g["lr"] for g in lib.param_groups] == [0.02 / 32, 0.01 / 32]
    assert [lib._groups[k].opt.lr for k in sorted(lib._groups)] == [0.02 / 16, 0.01 / 16]
    # The momentum buffers agree too, in torch's state_dict format.
    lib_state, ref_state = lib.state_dict()["state"], ref.state_dict()["state"]
    assert sorted(lib_state) == sorted(ref_state) == [0, 1, 2, 3]
    for k in ref_state:
        assert relative_difference(lib_state[k]["momentum_buffer"],
                                   ref_state[k]["momentum_buffer"]) <= 1e-5


def test_state_dict_round_trip_resumes_bit_identically():
    torch.manual_seed(1)
    data = make_data(24, seed=1)
    init = Model()

    def fresh():
        model = copy.deepcopy(init)
        opt = make_muon(model)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)

    model_a, opt_a, sched_a = fresh()
    train(model_a, opt_a, data, 0, 24, True, sched_a)

    model_b, opt_b, sched_b = fresh()
    train(model_b, opt_b, data, 0, 11, True, sched_b)
    saved = copy.deepcopy({"model": model_b.state_dict(), "opt": opt_b.state_dict(),
                           "sched": sched_b.state_dict()})
    # torch's format: state by parameter index, param groups with their options.
    assert set(saved["opt"]) == {"state", "param_groups"}
    assert set(saved["opt"]["state"]) == {0, 1, 2, 3}
    assert all(set(s) == {"momentum_buffer"} for s in saved["opt"]["state"].values())
    assert saved["opt"]["state"][3]["momentum_buffer"].shape == (8, 24)
    assert [g["params"] for g in saved["opt"]["param_groups"]] == [[0, 1, 2], [3]]
    assert saved["opt"]["param_groups"][1]["adjust_lr_fn"] == "match_rms_adamw"
    assert len(opt_b.state) == 0  # the live buffers are in the library
    del model_b, opt_b, sched_b

    model_c, opt_c, sched_c = fresh()
    model_c.load_state_dict(saved["model"])
    opt_c.load_state_dict(saved["opt"])
    sched_c.load_state_dict(saved["sched"])
    train(model_c, opt_c, data, 11, 24, True, sched_c)
    for (name, a), c in zip(model_a.named_parameters(), model_c.parameters()):
        assert torch.equal(a, c), name
    for k, s in opt_a.state_dict()["state"].items():
        assert torch.equal(s["momentum_buffer"], opt_c.state_dict()["state"][k]["momentum_buffer"])


def test_normuon_state_dict_resumes_bit_identically_and_copies():
    # The moments (one per row) are in the state, beside the momentum; a run
    # resumed from state_dict(), and a deepcopy, continue bit for bit.
    torch.manual_seed(2)
    data = make_data(16, seed=2)
    init = Model()

    def fresh():
        model = copy.deepcopy(init)
        opt = make_muon(model, normuon=True, normuon_beta2=0.9)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)

    model_a, opt_a, sched_a = fresh()
    train(model_a, opt_a, data, 0, 16, True, sched_a)
    model_b, opt_b, sched_b = fresh()
    train(model_b, opt_b, data, 0, 7, True, sched_b)
    saved = copy.deepcopy({"model": model_b.state_dict(), "opt": opt_b.state_dict(),
                           "sched": sched_b.state_dict()})
    state = saved["opt"]["state"]
    assert all(set(s) == {"momentum_buffer", "normuon_second_moment"} for s in state.values())
    moments = state[3]["normuon_second_moment"]  # w_out: 8 rows
    assert moments.shape == (8,) and moments.dtype == torch.float32
    assert (moments > 0).all()
    assert saved["opt"]["param_groups"][0]["normuon"] is True
    copied_model = copy.deepcopy(model_b)
    copied = copy.deepcopy(opt_b)  # its own params: the copied model's are rebound below
    model_c, opt_c, sched_c = fresh()
    model_c.load_state_dict(saved["model"])
    opt_c.load_state_dict(saved["opt"])
    sched_c.load_state_dict(saved["sched"])
    train(model_c, opt_c, data, 7, 16, True, sched_c)
    for (name, a), c in zip(model_a.named_parameters(), model_c.parameters()):
        assert torch.equal(a, c), name
    train(model_b, opt_b, data, 7, 16, True, sched_b)
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(a, b), name
    assert copied.state_dict()["state"][3]["normuon_second_moment"].equal(moments)
    del copied_model
    # Loading torch.optim.Muon's state (no moments) starts them at zero: the
    # same as a NorMuon run whose moments were never set.
    model_d, opt_d, _ = fresh()
    model_d.load_state_dict(saved["model"])
    plain = copy.deepcopy(saved["opt"])
    for s in plain["state"].values():
        del s["normuon_second_moment"]
    opt_d.load_state_dict(plain)
    assert opt_d.state_dict()["state"][3]["normuon_second_moment"].abs().max() == 0


def test_state_dict_interchanges_with_the_reference():
    # A checkpoint of the reference (torch's format, without ns_dtype in its
    # groups) loaded into muon.Muon continues like the reference, and back.
    torch.manual_seed(2)
    data = make_data(12, seed=2)
    ref_model = Model()
    ref = make_reference(ref_model)
    sched = torch.optim.lr_scheduler.StepLR(ref, step_size=100)
    train(ref_model, ref, data, 0, 6, True, sched)
    saved = ref.state_dict()
    for g in saved["param_groups"]:
        del g["ns_dtype"]  # torch.optim.Muon has no such option
    lib_model = copy.deepcopy(ref_model)
    lib = make_muon(lib_model)
    lib.load_state_dict(saved)
    assert all(g["ns_dtype"] == "fp32" for g in lib.param_groups)  # the constructor's
    for step in range(6, 12):
        x, y = data[step]
        for model, opt in ((lib_model, lib), (ref_model, ref)):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x, uses_aux(step)), y).backward()
            opt.step()
    for p, q in zip(lib_model.parameters(), ref_model.parameters()):
        assert relative_difference(p.detach(), q.detach()) <= 1e-5
    back = make_reference(copy.deepcopy(lib_model))
    back.load_state_dict(lib.state_dict())
    for k, s in lib.state_dict()["state"].items():
        assert torch.equal(back.state_dict()["state"][k]["momentum_buffer"],
                           s["momentum_buffer"])


def test_defaults_follow_torch():
    w = torch.nn.Parameter(torch.randn(6, 4))
    w.grad = torch.randn(6, 4)
    opt = muon.Muon([w])
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"], group["nesterov"],
            group["ns_coefficients"], group["eps"], group["ns_steps"],
            group["adjust_lr_fn"]) == (1e-3, 0.1, 0.95, True, (3.4445, -4.775, 2.0315), 1e-7,
                                       5, None)
    opt.step()
    options = opt._groups[0].opt.options()
    assert options["ns_dtype"] == _lib.NS_DTYPE_BF16  # torch.optim.Muon's bf16 Newton-Schulz
    assert options["adjust_lr"] == _lib.ADJUST_LR_ORIGINAL  # None means "original"
    assert (options["ns_a"], options["ns_b"], options["ns_c"]) == (3.4445, -4.775, 2.0315)
    fp32 = muon.Muon([torch.nn.Parameter(torch.randn(3, 3))], ns_dtype=torch.float32)
    assert fp32.param_groups[0]["ns_dtype"] == torch.float32


def test_extra_scale_factor_scales_the_update_not_the_decay():
    # Without decay, extra_scale_factor s at lr is the same step as lr * s; with
    # decay, the decay keeps the plain lr: p <- p (1 - lr wd) - lr s U.
    torch.manual_seed(3)
    start, grads = torch.randn(8, 5), [torch.randn(8, 5) for _ in range(3)]

    def run(**kwargs):
        w = torch.nn.Parameter(start.clone())
        opt = muon.Muon([w], ns_dtype="fp32", **kwargs)
        for g in grads:
            w.grad = g.clone()
            opt.step()
        return w.detach()

    scaled = run(lr=0.02, weight_decay=0.0, extra_scale_factor=0.5)
    assert (scaled - run(lr=0.01, weight_decay=0.0)).abs().max() < 1e-6
    assert (scaled - run(lr=0.02, weight_decay=0.0)).abs().max() > 1e-3  # it does act
    w = torch.nn.Parameter(start.clone())
    w.grad = grads[0].clone()
    plain = muon.Muon([w], lr=0.02, weight_decay=0.1, ns_dtype="fp32")
    plain.step()
    update = (start * (1 - 0.02 * 0.1) - w.detach()) / 0.02  # lr * ratio * U, over lr
    w2 = torch.nn.Parameter(start.clone())
    w2.grad = grads[0].clone()
    muon.Muon([w2], lr=0.02, weight_decay=0.1, ns_dtype="fp32", extra_scale_factor=3.0).step()
    want = start * (1 - 0.02 * 0.1) - 0.02 * 3.0 * update
    assert (w2.detach() - want).abs().max() < 1e-5


def test_cautious_wd_spares_the_elements_whose_update_opposes_them():
    # One step from zero momentum with ns_steps=0: the update is g / ||g||, so
    # its signs are g's. Where g * p < 0 the decay is skipped.
    torch.manual_seed(4)
    start, g = torch.randn(6, 5), torch.randn(6, 5)
    outs = {}
    for cautious in (False, True):
        w = torch.nn.Parameter(start.clone())
        w.grad = g.clone()
        muon.Muon([w], lr=0.1, weight_decay=0.5, ns_steps=0, nesterov=False, momentum=0.0,
                  ns_dtype="fp32", cautious_wd=cautious).step()
        outs[cautious] = w.detach()
    update = (start * (1 - 0.1 * 0.5) - outs[False]) / 0.1  # adjusted lr ratio folded in
    opposed = (g * start) < 0
    assert 0 < int(opposed.sum()) < g.numel()
    want = torch.where(opposed, start, start * (1 - 0.1 * 0.5)) - 0.1 * update
    assert (outs[True] - want).abs().max() < 1e-6
    assert (outs[True][opposed] - outs[False][opposed]).abs().min() > 1e-3


def test_push_hyperparameters_carries_a_scheduler_and_changes_nothing_else():
    # On the CPU no step is captured: pushing, before or between steps, moves the
    # scheduler's values to the library and leaves the run as without it.
    torch.manual_seed(4)
    init = torch.randn(8, 6)
    grads = [torch.randn(8, 6) for _ in range(3)]
    runs = []
    for push in (False, True):
        w = torch.nn.Parameter(init.clone())
        opt = muon.Muon([w], lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if push:
            opt.push_hyperparameters()  # before any step: nothing to push to yet
        for g in grads:
            w.grad = g.clone()
            opt.step()
            sched.step()
            if push:
                opt.push_hyperparameters()
                assert opt._groups[0].opt.lr == opt.param_groups[0]["lr"]
        runs.append(w.detach().clone())
    assert torch.equal(runs[0], runs[1])


def test_closure_and_groups_without_grads():
    torch.manual_seed(3)
    model = Model()
    opt = make_muon(model)
    before = [p.detach().clone() for p in model.parameters()]
    assert opt.step() is None  # no gradient anywhere: nothing happens, as in torch
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    x, y = make_data(1)[0]

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x, False), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() > 0
    assert not torch.equal(before[0], model.w_in.detach())
    assert torch.equal(before[3], model.aux.detach())  # aux had no gradient


def _run_steps(model, opt, data, step_fn=None, scaler=None):
    """Trains over `data`: opt.step (or step_fn) after each backward; with a
    GradScaler, the scaled loss and scaler.step."""
    for step, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x, uses_aux(step)), y)
        if scaler is None:
            loss.backward()
            (step_fn or opt.step)()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def test_a_compiled_step_is_the_eager_step_run_whole():
    """torch.compile(opt.step), as torch's docs compile an optimizer: Dynamo
    leaves the library's step to eager Python whole (one break, at the step)
    instead of tracing into its ctypes calls, and the result is the eager
    step's, bit for bit."""
    dynamo = pytest.importorskip("torch._dynamo")
    from torch._dynamo.utils import counters
    data = make_data(4)
    torch.manual_seed(5)
    eager_model = Model()
    compiled_model = copy.deepcopy(eager_model)
    eager, compiled = make_muon(eager_model), make_muon(compiled_model)
    dynamo.reset()
    counters.clear()
    _run_steps(eager_model, eager, data)
    _run_steps(compiled_model, compiled, data, step_fn=torch.compile(compiled.step))
    for a, b in zip(eager_model.parameters(), compiled_model.parameters()):
        assert torch.equal(a, b)
    # Before: ~100 frames, graph breaks on ctypes structures ("Dynamo does not
    # know how to trace method __new__ of class PyCStructType").
    breaks = list(counters["unimplemented"]) + list(counters["graph_break"])
    assert not [b for b in breaks if "ctypes" in b or "PyCStructType" in b], breaks
    assert any("torch.compiler.disable" in b for b in counters["graph_break"]), breaks


def test_a_grad_scaler_steps_as_unscaled_and_skips_an_overflowing_step():
    """torch.amp.GradScaler (mixed-precision recipes): the scaled loss's step
    is the unscaled one bit for bit (the scale is a power of two), and a step
    whose gradients overflow is skipped whole: the params and the step count
    stay, and the run goes on as if that batch had not been."""
    data = make_data(4)
    torch.manual_seed(6)
    plain_model = Model()
    scaled_model = copy.deepcopy(plain_model)
    plain, scaled = make_muon(plain_model), make_muon(scaled_model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1000)
    _run_steps(plain_model, plain, data[:2])
    _run_steps(scaled_model, scaled, data[:2], scaler=scaler)
    for a, b in zip(plain_model.parameters(), scaled_model.parameters()):
        assert torch.equal(a, b)
    before = [p.detach().clone() for p in scaled_model.parameters()]
    steps = scaled.stats()["steps"]
    assert steps == 2
    x, y = data[2]
    scaled.zero_grad()
    scaler.scale(torch.nn.functional.mse_loss(scaled_model(x, False), y) * float("inf")
                 ).backward()
    scaler.step(scaled)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 9  # the overflow was seen
    assert all(torch.equal(a, p) for a, p in zip(before, scaled_model.parameters()))
    assert scaled.stats()["steps"] == steps  # the library did not step
    _run_steps(plain_model, plain, data[2:])
    _run_steps(scaled_model, scaled, data[2:], scaler=scaler)
    for a, b in zip(plain_model.parameters(), scaled_model.parameters()):
        assert torch.equal(a, b)


def test_zero_grad_set_to_none_releases_the_old_gradient():
    w = torch.nn.Parameter(torch.randn(8, 8))
    opt = muon.Muon([w], lr=0.01)
    w.grad = torch.randn(8, 8)
    opt.step()
    gone = weakref.ref(w.grad)
    opt.zero_grad(set_to_none=True)
    gc.collect()
    assert gone() is None  # the library no longer holds it
    w.grad = torch.randn(8, 8)  # a new tensor: rebound at the next step
    before = w.detach().clone()
    opt.step()
    assert not torch.equal(before, w.detach())


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 4)])
def test_non_2d_params_are_refused_at_construction(shape):
    # (Parameters with fewer than 2 dims go to AdamW: real_torch_muon_test.py.)
    p = torch.nn.Parameter(torch.zeros(shape))
    with pytest.raises(ValueError, match=r"Muon only supports 2D parameters whereas we found a "
                                         r"parameter with size: torch\.Size\(\[%s\]\)"
                                         % ", ".join(str(d) for d in shape)):
        muon.Muon([torch.nn.Parameter(torch.zeros(4, 4)), p])


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(lr=-0.1), ValueError, "Learning rate should be >= 0 but is: -0.1"),
    (dict(lr="fast"), TypeError, "lr must be a real number, got str"),
    (dict(lr=float("nan")), ValueError, "Learning rate"),
    (dict(momentum=1.0), ValueError, r"momentum should be in \[0, 1\) but is: 1.0"),
    (dict(weight_decay=-1), ValueError, "weight decay should be >= 0"),
    (dict(nesterov=True, ns_steps=2.5), TypeError, "ns_steps must be an int"),
    (dict(ns_steps=100), ValueError, "ns_steps"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(adjust_lr_fn="sqrt"), ValueError, "Adjust learning rate function sqrt is not "
                                            "supported"),
    (dict(ns_dtype="fp8"), ValueError, "ns_dtype 'fp8' is not supported"),
    (dict(ns_coefficients=(1.0, float("inf"), 0.0)), ValueError, "non-finite"),
    (dict(ns_coefficients=(1.0, 2.0)), ValueError, "ns_coefficients"),
    (dict(distributed_config=object()), TypeError, "distributed_config must provide"),
    (dict(extra_scale_factor=-0.5), ValueError, "extra_scale_factor should be a finite"),
    (dict(extra_scale_factor=float("inf")), ValueError, "extra_scale_factor"),
    (dict(normuon=True, normuon_beta2=-0.1), ValueError,
     r"normuon_beta2 should be in \[0, 1\) but is: -0.1"),
    (dict(normuon=True, normuon_beta2=1.0), ValueError, "normuon_beta2"),
    (dict(normuon=True, normuon_eps=0.0), ValueError, "normuon_eps should be a finite number"),
])
def test_invalid_options_raise_clear_exceptions(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        muon.Muon([torch.nn.Parameter(torch.zeros(4, 4))], **kwargs)


def test_invalid_params_raise_clear_exceptions():
    with pytest.raises(TypeError, match="Tensors"):
        muon.Muon([[1.0, 2.0]])
    with pytest.raises(TypeError, match="float64"):
        muon.Muon([torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))])
    # (A parameter that is not contiguous is stepped: torch_optiminfo_test.py.)
    opt = muon.Muon([torch.nn.Parameter(torch.zeros(4, 4))])
    with pytest.raises(ValueError, match=r"size: torch\.Size\(\[3, 3, 3\]\)"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3, 3))]})
    with pytest.raises(ValueError, match="Learning rate"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3))], "lr": -1})
    assert len(opt.param_groups) == 1  # nothing half-added
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, 3))], "lr": 0.5})
    assert len(opt.param_groups) == 2


def test_errors_at_step():
    w = torch.nn.Parameter(torch.zeros(4, 4))
    opt = muon.Muon([w])
    w.grad = torch.zeros(4, 4).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    # (A gradient that is not contiguous is stepped as its contiguous copy:
    # torch_optiminfo_test.py.)
    w.grad = torch.ones(4, 4)
    opt.param_groups[0]["lr"] = -1.0  # a schedule gone wrong
    with pytest.raises(muon.MuonError, match="lr"):
        opt.step()
    opt.param_groups[0]["lr"] = 0.1
    opt.step()
    assert w.abs().sum() > 0 and math.isfinite(w.sum().item())


# ---------------------------------------------------------------------------
# distributed_config: the protocol muon.Muon drives
# ---------------------------------------------------------------------------


class RowShardConfig:
    """A minimal distributed config: each rank holds rows [r*k, (r+1)*k) of every
    matrix, registered as a Shard of dim 0 over the world (in-process adapter)."""

    def __init__(self, comm, size):
        self.comm, self.size = comm, size
        self.attached = []

    def _options(self):
        return {"prefetch_count": 0}

    def _attach(self, optimizer, named_params):
        world = optimizer.set_world(self.comm)  # one communicator for every group
        for name, p in named_params:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            optimizer.register(p, grad, name=name, global_shape=(p.shape[0] * self.size,
                                                                 p.shape[1]),
                               placements=[muon.Shard(world, 0)])
            self.attached.append(name)


def test_distributed_config_steps_like_single_process():
    import threading

    n, steps = 2, 6
    gen = torch.Generator().manual_seed(4)
    shapes = [(8, 6), (6, 10), (4, 4)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(steps)]

    def missing(step, k):  # the second matrix has no gradient on some steps
        return k == 1 and step % 3 == 2

    def groups(params):
        return [{"params": params[:2], "lr": 0.02}, {"params": params[2:], "lr": 0.05}]

    # Single process: a missing gradient counts as zero on every rank.
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    ref_opt = muon.Muon(groups(ref), ns_dtype="fp32")
    for step in range(steps):
        for k, p in enumerate(ref):
            p.grad = torch.zeros_like(p) if missing(step, k) else grads[step][k].clone()
        ref_opt.step()

    world = muon.InProcessWorld(n)
    out, errors = [None] * n, [None] * n

    def rank_body(rank):
        try:
            rows = [slice(rank * s[0] // n, (rank + 1) * s[0] // n) for s in shapes]
            local = [torch.nn.Parameter(t[r].clone()) for t, r in zip(init, rows)]
            config = RowShardConfig(world.comm(rank), n)
            opt = muon.Muon(groups(local), ns_dtype="fp32", distributed_config=config)
            for step in range(steps):
                opt.zero_grad(set_to_none=True)
                for k, p in enumerate(local):
                    if not missing(step, k):
                        p.grad = grads[step][k][rows[k]].clone()  # a new tensor each step
                opt.step()
            out[rank] = (rows, local, opt.state_dict(), config.attached)
        except BaseException as e:  # noqa: B902
            errors[rank] = e

    threads = [threading.Thread(target=rank_body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "ranks hung"
    for e in errors:
        if e is not None:
            raise e
    ref_state = ref_opt.state_dict()["state"]
    for rank, (rows, local, state, attached) in enumerate(out):
        assert attached == ["group0.param0", "group0.param1", "group1.param0"]
        for k, (p, r) in enumerate(zip(local, rows)):
            assert torch.equal(p.detach(), ref[k].detach()[r]), (rank, k)
            assert torch.equal(state["state"][k]["momentum_buffer"],
                               ref_state[k]["momentum_buffer"][r]), (rank, k)


def test_stats_count_every_matrix_once_across_param_groups():
    torch.manual_seed(3)
    a = torch.nn.Parameter(torch.randn(6, 4))
    b = torch.nn.Parameter(torch.randn(3, 5))
    c = torch.nn.Parameter(torch.randn(5, 5))
    opt = muon.Muon([{"params": [a, b]}, {"params": [c], "lr": 0.5}], lr=0.1)
    for p in (a, b, c):
        p.grad = torch.randn_like(p)
    opt.step()
    stats = opt.stats()
    assert stats["steps"] == 1
    assert stats["matrices_total"] == 3
    assert stats["matrices_orthogonalized"] == 3
    assert stats["bytes_sent"] == 0 and stats["bytes_received"] == 0  # one process moves nothing


def test_a_group_can_send_its_matrices_to_adamw():
    # Muon recipes step embeddings and output heads with AdamW: a group with
    # "adamw": True. Its matrix steps exactly as the same values held as a 1-D
    # tensor (which AdamW steps element by element), and Muon never sees it.
    torch.manual_seed(3)
    emb = torch.nn.Parameter(torch.randn(6, 4))
    twin = torch.nn.Parameter(emb.detach().clone().reshape(-1))
    w = torch.nn.Parameter(torch.randn(5, 4))
    opt = muon.Muon([{"params": [emb], "adamw": True}, {"params": [w]}], lr=0.02,
                    ns_dtype="fp32", adamw_lr=3e-3, adamw_wd=0.01)
    ref = muon.Muon([twin], lr=0.02, ns_dtype="fp32", adamw_lr=3e-3, adamw_wd=0.01)
    for step in range(3):
        g = torch.randn(6, 4)
        emb.grad, twin.grad = g.clone(), g.clone().reshape(-1)
        w.grad = torch.randn(5, 4)
        opt.step()
        ref.step()
    assert torch.equal(emb.detach().reshape(-1), twin.detach())
    assert set(opt.state[emb]) == {"step", "exp_avg", "exp_avg_sq"}
    assert opt.stats()["matrices_orthogonalized"] == 1  # w alone
    assert opt.state_dict()["param_groups"][0]["adamw"] is True
    with pytest.raises(TypeError, match='"adamw" must be True'):
        muon.Muon([{"params": [emb], "adamw": "yes"}], lr=0.02)


def _kimi_factors(logits, tau, alpha, per_group):
    """Kimi K2's QK-Clip factors, written here in float64: gamma = tau / S for
    heads over tau (others, and S <= 0 or not finite, 1); MHA: q gamma^alpha,
    k gamma^(1 - alpha); a GQA group's shared key takes its smallest gamma and
    each query head the rest of its own, so its logits scale by its gamma."""
    s = torch.tensor(logits, dtype=torch.float64)
    gamma = torch.where(torch.isfinite(s) & (s > tau), tau / s, torch.ones_like(s))
    groups = gamma.view(-1, per_group)
    k = groups.min(dim=1).values ** (1 - alpha)
    q = gamma ** alpha if per_group == 1 else gamma / k.repeat_interleave(per_group)
    return q, k, gamma


def test_qk_clip_matches_the_kimi_formula():
    torch.manual_seed(5)
    hd = 3
    qkv = torch.nn.Parameter(torch.randn((4 + 2 + 2) * hd, 8))   # GQA: 4 q heads, 2 kv heads, then v
    wq = torch.nn.Parameter(torch.randn(3 * 4, 8))                # MLA: 3 heads of 3 + 1 rotary rows
    wkv = torch.nn.Parameter(torch.randn(3 * 5, 8))               # per head: 3 key rows, 2 value rows
    params = [qkv, wq, wkv]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = muon.Muon(params, lr=0.02, ns_dtype="fp32")
    opt.step()
    fused = opt.register_qk(qkv, num_heads=4, num_kv_heads=2, q_head_rows=hd,
                            k_first_row=4 * hd, k_head_rows=hd, alpha=0.3)
    mla = opt.register_qk(wq, wkv, num_heads=3, q_rotary_rows=1, k_head_rows=3,
                          k_head_stride=5)
    before = [p.detach().clone().double() for p in params]
    fused_logits = [150.0, 50.0, 200.0, -3.0]
    mla_logits = [90.0, 400.0, float("nan")]
    assert opt.qk_clip({fused: fused_logits, mla: mla_logits}, tau=100.0) == 3

    want = [b.clone() for b in before]
    q, k, _ = _kimi_factors(fused_logits, 100.0, 0.3, per_group=2)
    for h in range(4):
        want[0][h * hd:(h + 1) * hd] *= q[h]
    for g in range(2):
        want[0][(4 + g) * hd:(5 + g) * hd] *= k[g]
    q, k, gamma = _kimi_factors(mla_logits, 100.0, 0.5, per_group=1)
    for h in range(3):
        want[1][h * 4:h * 4 + 3] *= q[h]          # the non-rotary rows: gamma^alpha
        want[1][h * 4 + 3] *= gamma[h]            # the rotary row: gamma
        want[2][h * 5:h * 5 + 3] *= k[h]          # keys; the value rows stay
    for name, p, w, b in zip(("qkv", "wq", "wkv"), params, want, before):
        assert (p.detach().double() - w).abs().max() <= 1e-6 * w.abs().max(), name
    # GQA: head 1 (under tau) shares its key with head 0 (clipped): its query
    # rows make up for the key's share, so its logits keep their scale.
    q, k, _ = _kimi_factors(fused_logits, 100.0, 0.3, per_group=2)
    assert abs(q[1] * k[0] - 1) < 1e-12 and q[1] > 1
    # What no clip touches is bit for bit as it was: the value rows, MHA heads
    # under tau or with a NaN logit.
    assert torch.equal(qkv.detach()[6 * hd:].double(), before[0][6 * hd:])
    assert torch.equal(wq.detach()[0:4].double(), before[1][0:4])
    assert torch.equal(wq.detach()[8:12].double(), before[1][8:12])
    assert torch.equal(wkv.detach()[3:5].double(), before[2][3:5])
    assert not torch.equal(qkv.detach().double(), before[0])


def test_qk_clip_refuses_what_it_cannot_clip():
    w = torch.nn.Parameter(torch.randn(12, 8))
    bias = torch.nn.Parameter(torch.randn(12))
    other = torch.nn.Parameter(torch.randn(12, 8))
    for p in (w, bias):
        p.grad = torch.randn_like(p)
    opt = muon.Muon([w, bias], lr=0.02)
    with pytest.raises(ValueError, match="q_param is not a matrix this optimizer steps with Muon"):
        opt.register_qk(bias, num_heads=2)
    with pytest.raises(ValueError, match="k_param is not a matrix"):
        opt.register_qk(w, other, num_heads=2)
    layer = opt.register_qk(w, num_heads=2, q_head_rows=3, k_first_row=6)
    with pytest.raises(RuntimeError, match="call it after a step"):
        opt.qk_clip([[200.0, 1.0]], tau=100.0)
    opt.step()
    before = w.detach().clone()
    with pytest.raises(muon.MuonError, match="max_logits: 3 given; QK-Clip layer 0 has 2"):
        opt.qk_clip({layer: [200.0, 1.0, 5.0]}, tau=100.0)
    with pytest.raises(muon.MuonError, match="tau: -1 is invalid"):
        opt.qk_clip({layer: [200.0, 1.0]}, tau=-1.0)
    bad = opt.register_qk(w, num_heads=5)  # 12 rows do not split into 5 heads
    with pytest.raises(muon.MuonError, match="do not split into 5 heads; give q_head_rows"):
        opt.qk_clip({bad: [1.0] * 5}, tau=100.0)
    overlap = opt.register_qk(w, num_heads=2, q_head_rows=3, k_first_row=4, k_head_rows=3)
    with pytest.raises(muon.MuonError, match="meet key head"):
        opt.qk_clip({overlap: [200.0, 1.0]}, tau=100.0)
    assert torch.equal(w.detach(), before)


def test_skip_nonfinite_updates_keeps_the_params_of_an_overflowing_step():
    # Coefficients that overflow fp32 by the second iteration: every update
    # is non-finite; the guard keeps the parameter, and the step is counted
    # as skipped. Without it, the parameter turns non-finite (as torch's).
    outs = {}
    for guard in (False, True):
        w = torch.nn.Parameter(torch.full((6, 4), 0.25))
        w.grad = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
        opt = muon.Muon([w], lr=0.02, ns_coefficients=(1e30, 0.0, 0.0), ns_steps=3,
                        ns_dtype="fp32", skip_nonfinite_updates=guard)
        opt.step()
        outs[guard] = (w.detach().clone(), opt.stats()["steps_skipped"])
    assert not torch.isfinite(outs[False][0]).all()
    assert torch.equal(outs[True][0], torch.full((6, 4), 0.25)) and outs[True][1] == 1


def test_split_blocks_with_normuon_resume_bit_identically():
    # Column blocks keep a moment per row of each block (rows x blocks); the
    # state dict carries them, and a resumed run continues bit for bit.
    gen = torch.Generator().manual_seed(4)
    init = [torch.randn(6, 12, generator=gen), torch.randn(12, 8, generator=gen)]
    grads = [[torch.randn(x.shape, generator=gen) for x in init] for _ in range(8)]

    def fresh():
        params = [torch.nn.Parameter(x.clone()) for x in init]
        opt = muon.Muon([{"params": [params[0]], "split_sizes": [4, 2], "split_dim": 1},
                         {"params": [params[1]], "split_sizes": [2, 1]}],
                        lr=0.02, normuon=True, ns_dtype="fp32")
        return params, opt

    def run(params, opt, first, last):
        for step in range(first, last):
            for p, g in zip(params, grads[step]):
                p.grad = g.clone()
            opt.step()

    a, opt_a = fresh()
    run(a, opt_a, 0, 8)
    b, opt_b = fresh()
    run(b, opt_b, 0, 3)
    saved = copy.deepcopy(opt_b.state_dict())
    assert saved["state"][0]["normuon_second_moment"].shape == (12,)  # 6 rows x 2 blocks
    assert saved["state"][1]["normuon_second_moment"].shape == (12,)  # the rows
    assert saved["param_groups"][0]["split_sizes"] == [4, 2]
    c, opt_c = fresh()
    with torch.no_grad():
        for p, q in zip(c, b):
            p.copy_(q)
    opt_c.load_state_dict(saved)
    run(c, opt_c, 3, 8)
    for x, y in zip(a, c):
        assert torch.equal(x, y)
    # A checkpoint whose groups name no split (torch.optim.Muon's, or older)
    # keeps the split the optimizer was built with.
    d, opt_d = fresh()
    with torch.no_grad():
        for p, q in zip(d, b):
            p.copy_(q)
    older = copy.deepcopy(saved)
    for group in older["param_groups"]:
        group.pop("split_sizes")
        group.pop("split_dim", None)
    opt_d.load_state_dict(older)
    assert opt_d.param_groups[0]["split_sizes"] == [4, 2]
    run(d, opt_d, 3, 8)
    for x, y in zip(a, d):
        assert torch.equal(x, y)
