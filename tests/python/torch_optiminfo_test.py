"""muon.Muon under torch's generic optimizer conventions, driven by the
OptimizerInfo the installed torch ships for torch.optim.Muon
(torch.testing._internal.common_optimizers.optim_db): its constructor variants
(optim_inputs_func), its error inputs (optim_error_inputs_func: the exception
type, the message pattern and whether construction or step() raises) and its
LR schedulers (scheduler_inputs).

The checks are written here, none of torch's test code runs. Every generic
check runs on torch.optim.Muon as well as on muon.Muon ("impl"), so a check
that torch's own optimizer fails would show up as a failure, not as a pass:
- the state dict round-trips unchanged (no key added, none lost) and a
  loaded optimizer steps bit for bit like the one that saved it;
- copy.deepcopy and pickle give an optimizer that steps bit for bit like the
  original, on parameters of its own;
- parameters that are not contiguous (a strided slice, a transposed view) are
  stepped, bit for bit as their contiguous copies;
- the error inputs raise (or warn) as the OptimizerInfo says;
- each variant decreases the loss, with and without the info's schedulers;
- parameters without a gradient are not touched, zero gradients (no weight
  decay) change nothing, a tensor lr steps as the float.
A variant whose arguments muon.Muon does not take is reported as a skip that
names them, never as a pass.
"""

import collections
import copy
import importlib.util
import inspect
import pickle
import sys
import types
import unittest

import pytest
import torch
import torch.optim._muon as torch_muon

import muon
from real_torch_muon_test import newton_schulz


def _load_optim_db():
    # torch.testing._internal.common_utils imports expecttest (torch's test
    # dependency) for the base class of its TestCase, which these checks never
    # use; where it is not installed a stand-in lets the module load.
    if importlib.util.find_spec("expecttest") is None and "expecttest" not in sys.modules:
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase = unittest.TestCase
        stand_in.ACCEPT = False
        sys.modules["expecttest"] = stand_in
    from torch.testing._internal import common_optimizers
    return common_optimizers


common_optimizers = _load_optim_db()
INFO = next(info for info in common_optimizers.optim_db if info.optim_cls is torch.optim.Muon)
IMPLS = {"muon": muon.Muon, "torch": torch.optim.Muon}
VARIANTS = [oi.desc for oi in INFO.optim_inputs_func(device="cpu")]
ERRORS = [e.optimizer_error_input.desc
          for e in INFO.optim_error_inputs_func(device="cpu", dtype=torch.float32)]
STEPS = 10


def variant_kwargs(desc):
    """A fresh copy of a variant's constructor arguments (a tensor lr is mutated
    by schedulers, so every test takes its own)."""
    for oi in INFO.optim_inputs_func(device="cpu"):
        if oi.desc == desc:
            return dict(oi.kwargs)
    raise KeyError(desc)


def optimizer_class(impl, kwargs):
    """The class under test; a skip naming the arguments muon.Muon does not take."""
    cls = IMPLS[impl]
    accepted = inspect.signature(cls).parameters
    missing = sorted(k for k in kwargs if k not in accepted)
    if missing:
        pytest.skip("%s.%s takes no %s (asked by torch's OptimizerInfo)"
                    % (cls.__module__, cls.__name__, ", ".join(missing)))
    return cls


def loss_of(weights, x):
    """A loss over 2-D parameters only (torch.optim.Muon takes nothing else)."""
    return sum((w @ x).pow(2).sum() for w in weights)


def backward(opt, weights, x):
    opt.zero_grad()
    loss = loss_of(weights, x)
    loss.backward()
    return loss


def assert_same(a, b, where="state_dict"):
    """Exact equality of two state dicts: the same keys at every level, tensors
    of the same dtype, shape and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict), where
        assert sorted(a, key=repr) == sorted(b, key=repr), (where, sorted(a, key=repr),
                                                          sorted(b, key=repr))
        for k in a:
            assert_same(a[k], b[k], "%s[%r]" % (where, k))
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, "%s[%d]" % (where, k))
    else:
        assert a == b, (where, a, b)


def without_names(state_dict):
    out = copy.deepcopy(state_dict)
    for group in out["param_groups"]:
        group.pop("param_names", None)
    return out


def matrices(seed, shapes=((10, 5), (6, 5))):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def two_groups(weights, named=False):
    """The variant's options in the first group, a second group with its own lr."""
    def entries(ps, first):
        return [("w%d" % (first + k), p) for k, p in enumerate(ps)] if named else list(ps)
    return [{"params": entries(weights[:1], 0)}, {"params": entries(weights[1:], 1), "lr": 0.02}]


# ---------------------------------------------------------------------------
# What the OptimizerInfo says, and the keys of a param group
# ---------------------------------------------------------------------------


def test_the_info_is_the_one_these_checks_cover():
    """The flags these checks rely on. Should a newer torch change them (complex
    or sparse support, a closure, global flags such as foreach), this fails and
    says which, rather than leaving the new behaviour unchecked."""
    seen = dict(supports_complex=INFO.supports_complex, supports_sparse=INFO.supports_sparse,
                only_supports_sparse_grads=INFO.only_supports_sparse_grads,
                step_requires_closure=INFO.step_requires_closure,
                supported_impls=tuple(INFO.supported_impls),
                has_capturable_arg=INFO.has_capturable_arg,
                supports_param_groups=INFO.supports_param_groups)
    assert seen == dict(supports_complex=False, supports_sparse=False,
                        only_supports_sparse_grads=False, step_requires_closure=False,
                        supported_impls=(), has_capturable_arg=False,
                        supports_param_groups=True)
    assert len(VARIANTS) >= 1 and len(ERRORS) >= 1
    print("\n[torch's Muon OptimizerInfo] %d variants: %s; %d error inputs"
          % (len(VARIANTS), ", ".join(VARIANTS), len(ERRORS)))


# muon.Muon's own options, beyond torch.optim.Muon's (docs/python.md, muon.Muon).
OWN_KEYS = {"ns_dtype", "adamw_lr", "adamw_betas", "adamw_eps", "adamw_wd",
            "extra_scale_factor", "cautious_wd", "normuon", "normuon_beta2", "normuon_eps",
            "ns_algorithm", "gram_restarts", "skip_nonfinite_updates"}


def test_param_group_keys_are_torchs_plus_documented_ones():
    w = matrices(0)[0]
    theirs = torch.optim.Muon([w]).param_groups[0]
    ours = muon.Muon([w]).param_groups[0]
    assert set(theirs) <= set(ours)
    assert set(ours) - set(theirs) == OWN_KEYS
    for key in theirs:  # torch's defaults, value for value
        if key != "params":
            assert ours[key] == theirs[key], key


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_load_state_dict_adds_no_key(impl):
    w = matrices(1)[0]
    opt = IMPLS[impl]([w])
    w.grad = torch.ones_like(w)
    opt.step()
    keys = sorted(opt.param_groups[0])
    saved = opt.state_dict()
    opt.load_state_dict(copy.deepcopy(saved))
    assert sorted(opt.param_groups[0]) == keys
    assert_same(opt.state_dict(), saved)


# ---------------------------------------------------------------------------
# state_dict: deterministic and resumable
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("named", [(False, False), (True, False), (False, True)],
                         ids=["unnamed", "named_source", "named_target"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_state_dict_round_trips_and_resumes_bit_for_bit(impl, variant, named):
    kwargs = variant_kwargs(variant)
    cls = optimizer_class(impl, kwargs)
    x = torch.randn(5, generator=torch.Generator().manual_seed(7))
    weights = matrices(2)
    opt = cls(two_groups(weights, named[0]), **kwargs)
    for _ in range(STEPS):
        backward(opt, weights, x)
        opt.step()

    with torch.no_grad():
        twins = [torch.nn.Parameter(w.clone()) for w in weights]
    twin = cls(two_groups(twins, named[1]), **variant_kwargs(variant))
    saved = opt.state_dict()
    untouched = copy.deepcopy(saved)
    twin.load_state_dict(copy.deepcopy(saved))
    assert_same(saved, untouched)  # state_dict() handed out copies
    assert_same(without_names(twin.state_dict()), without_names(saved))
    for mine, theirs in zip(twin.param_groups, opt.param_groups):
        # (param_names: the loaded ones where the state dict has them, else its own)
        assert set(mine) - {"param_names"} == set(theirs) - {"param_names"}

    for _ in range(STEPS):
        backward(opt, weights, x)
        backward(twin, twins, x)
        opt.step()
        twin.step()
        for w, t in zip(weights, twins):
            assert torch.equal(w, t)
    assert_same(without_names(twin.state_dict()), without_names(opt.state_dict()))
    # A group listed twice is written the same way (torch's state_dict numbers
    # parameters by first appearance).
    twin.param_groups.extend(twin.param_groups)
    assert_same(without_names(twin.state_dict())["param_groups"][-1],
                without_names(opt.state_dict())["param_groups"][-1])


# ---------------------------------------------------------------------------
# copy.deepcopy and pickle
# ---------------------------------------------------------------------------


def public_attrs(obj):
    return {k for k in obj.__dict__ if not k.startswith("_")}


def copied(opt, how):
    if how == "deepcopy":
        return copy.deepcopy(opt)
    return pickle.loads(pickle.dumps(opt))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_copy_steps_like_the_original(impl, variant, how):
    kwargs = variant_kwargs(variant)
    cls = optimizer_class(impl, kwargs)
    x = torch.randn(5, generator=torch.Generator().manual_seed(8))
    weights, never_copied = matrices(3), matrices(3)
    opt = cls(two_groups(weights), **kwargs)
    twin = cls(two_groups(never_copied), **variant_kwargs(variant))
    for _ in range(3):
        for o, ws in ((opt, weights), (twin, never_copied)):
            backward(o, ws, x)
            o.step()

    dup = copied(opt, how)
    assert type(dup) is cls
    assert public_attrs(dup) == public_attrs(opt)
    dup_weights = [p for group in dup.param_groups for p in group["params"]]
    for w, d in zip(weights, dup_weights):
        assert d is not w and d.data_ptr() != w.data_ptr()  # parameters of its own
        assert torch.equal(d, w)
    assert_same(dup.state_dict(), opt.state_dict())

    for _ in range(STEPS):
        for o, ws in ((opt, weights), (dup, dup_weights), (twin, never_copied)):
            backward(o, ws, x)
            o.step()
        for w, d, t in zip(weights, dup_weights, never_copied):
            assert torch.equal(d, w) and torch.equal(w, t)
    assert_same(dup.state_dict(), opt.state_dict())
    assert_same(opt.state_dict(), twin.state_dict())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_copy_taken_before_the_first_step_carries_loaded_state(impl, how):
    """Right after construction, and right after load_state_dict (muon.Muon
    holds the loaded momentum until its first step builds the library's)."""
    cls = IMPLS[impl]
    x = torch.randn(5, generator=torch.Generator().manual_seed(23))
    source_weights = matrices(24)
    source = cls(two_groups(source_weights))
    for _ in range(3):
        backward(source, source_weights, x)
        source.step()
    fresh = copied(cls(two_groups(matrices(25))), how)
    assert fresh.state_dict()["state"] == {}
    with torch.no_grad():
        weights = [torch.nn.Parameter(w.clone()) for w in source_weights]
    opt = cls(two_groups(weights))
    opt.load_state_dict(source.state_dict())
    dup = copied(opt, how)
    dup_weights = [p for group in dup.param_groups for p in group["params"]]
    assert_same(dup.state_dict(), source.state_dict())
    for _ in range(3):
        for o, ws in ((source, source_weights), (dup, dup_weights)):
            backward(o, ws, x)
            o.step()
        for w, d in zip(source_weights, dup_weights):
            assert torch.equal(w, d)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_muon_with_adamw_params_steps_like_the_original(how):
    """model.parameters(): matrices in the library, biases and norms in AdamW's
    state; a copy taken mid-run carries both."""
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3))
    data = [(torch.randn(16, 6), torch.randn(16, 3)) for _ in range(8)]
    opt = muon.Muon(model.parameters(), lr=0.02, adamw_lr=3e-3)

    def train(m, o, batches):
        for x, y in batches:
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()

    train(model, opt, data[:4])
    dup_model, dup_opt = copied((model, opt), how)  # one copy: the same parameters in both
    assert [p is q for p, q in zip(dup_model.parameters(), dup_opt.param_groups[0]["params"])] \
        == [True] * 6
    train(model, opt, data[4:])
    train(dup_model, dup_opt, data[4:])
    for p, q in zip(model.parameters(), dup_model.parameters()):
        assert torch.equal(p, q)
    assert_same(dup_opt.state_dict(), opt.state_dict())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_distributed_optimizer_refuses_to_be_copied(how):
    class Config:  # attached at the first step only, which never comes
        def _options(self):
            return {}

        def _attach(self, optimizer, named_params):
            raise AssertionError("not reached")

    opt = muon.Muon(matrices(4), distributed_config=Config())
    with pytest.raises(TypeError, match="distributed_config cannot be copied or pickled"):
        copied(opt, how)


# ---------------------------------------------------------------------------
# Parameters that are not contiguous
# ---------------------------------------------------------------------------


def layout(kind, rows, cols, gen):
    """A (rows, cols) parameter over memory that is not contiguous, and its base."""
    if kind == "strided_slice":
        base = torch.randn(rows, cols, 2, generator=gen)
        return base, base[..., 0]
    if kind == "transposed":
        base = torch.randn(cols, rows, generator=gen)
        return base, base.t()
    if kind == "column_slice":
        base = torch.randn(rows, cols + 3, generator=gen)
        return base, base[:, 1:cols + 1]
    raise ValueError(kind)


LAYOUTS = ["strided_slice", "transposed", "column_slice"]


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_non_contiguous_params_step_as_their_contiguous_copies(impl, variant, kind):
    kwargs = variant_kwargs(variant)
    cls = optimizer_class(impl, kwargs)
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(5, generator=gen)
    bases, views = zip(*(layout(kind, r, 5, gen) for r in (10, 6)))
    weights = [torch.nn.Parameter(v) for v in views]
    assert not any(w.is_contiguous() for w in weights)
    strides = [w.stride() for w in weights]
    pointers = [w.data_ptr() for w in weights]
    with torch.no_grad():
        plain = [torch.nn.Parameter(w.contiguous()) for w in weights]
    opt = cls(two_groups(weights), **kwargs)
    ref = cls(two_groups(plain), **variant_kwargs(variant))
    first = loss_of(weights, x).item()
    for _ in range(STEPS):
        # The same gradient values on both sides (a product over a view sums in
        # another order), each laid out as autograd lays out a parameter's
        # gradient: like the parameter where it is dense (transposed), else
        # contiguous.
        backward(ref, plain, x)
        opt.zero_grad()
        for w, p in zip(weights, plain):
            w.grad = torch.empty_like(w).copy_(p.grad)
            assert w.grad.is_contiguous() == (kind != "transposed")
        opt.step()
        ref.step()
        for w, p in zip(weights, plain):
            assert torch.equal(w, p)
    # Updated in place: the same view of the same memory, its base sees it.
    assert [w.stride() for w in weights] == strides
    assert [w.data_ptr() for w in weights] == pointers
    for b, w in zip(bases, weights):
        assert torch.equal(layout_view(kind, b, w.shape), w)
    assert_same(opt.state_dict(), ref.state_dict())
    assert loss_of(weights, x).item() < first


def layout_view(kind, base, shape):
    rows, cols = shape
    if kind == "strided_slice":
        return base[..., 0]
    if kind == "transposed":
        return base.t()
    return base[:, 1:cols + 1]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_non_contiguous_params_match_torch_optim_muon_in_fp32(kind, monkeypatch):
    """Against the installed torch.optim.Muon, both computing Newton-Schulz in
    float32 (torch's replaced by the same iteration in float32, as in
    real_torch_muon_test.py), on the same non-contiguous parameters: as close
    as on contiguous ones there."""
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz",
                        lambda g, co, steps, eps: newton_schulz(g, co, steps, eps,
                                                                torch.float32))
    x = torch.randn(5, generator=torch.Generator().manual_seed(11))

    def views():
        gen = torch.Generator().manual_seed(12)
        return [torch.nn.Parameter(layout(kind, r, 5, gen)[1]) for r in (10, 6)]
    ours, theirs = views(), views()  # the same values and layouts, memory of their own
    assert not any(t.is_contiguous() for t in theirs + ours)
    mine = muon.Muon(two_groups(ours), lr=0.02, ns_dtype="fp32")
    ref = torch.optim.Muon(two_groups(theirs), lr=0.02)
    for _ in range(20):
        backward(mine, ours, x)
        backward(ref, theirs, x)
        mine.step()
        ref.step()
    worst = max(((a - b).norm() / b.norm()).item() for a, b in zip(ours, theirs))
    print("\n[%s params vs torch.optim.Muon, fp32 NS] largest relative difference %.3e"
          % (kind, worst))
    assert worst <= 1e-5


def test_non_contiguous_grads_are_read_as_given():
    """A gradient that is not contiguous (set by hand) is stepped as its
    contiguous copy; a later contiguous one replaces it."""
    gen = torch.Generator().manual_seed(12)
    w = torch.nn.Parameter(torch.randn(6, 4, generator=gen))
    v = torch.nn.Parameter(w.detach().clone())
    opt, ref = muon.Muon([w], lr=0.05), muon.Muon([v], lr=0.05)
    for step in range(4):
        g = torch.randn(4, 6, generator=gen)
        w.grad = g.t() if step % 2 == 0 else g.t().contiguous()
        v.grad = g.t().contiguous()
        opt.step()
        ref.step()
        assert torch.equal(w, v)
    assert_same(opt.state_dict(), ref.state_dict())


# ---------------------------------------------------------------------------
# Errors, as the OptimizerInfo pins them
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("desc", ERRORS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_error_inputs(impl, desc):
    entry = next(e for e in INFO.optim_error_inputs_func(device="cpu", dtype=torch.float32)
                 if e.optimizer_error_input.desc == desc)
    params = entry.optimizer_error_input.params
    kwargs = entry.optimizer_error_input.kwargs
    cls = optimizer_class(impl, kwargs)
    if issubclass(entry.error_type, Warning):
        expect = pytest.warns(entry.error_type, match=entry.error_regex)
    else:
        expect = pytest.raises(entry.error_type, match=entry.error_regex)
    if entry.error_on == common_optimizers.OptimizerErrorEnum.CONSTRUCTION_ERROR:
        with expect:
            cls(params, **kwargs)
    else:
        opt = cls(params, **kwargs)  # constructs; the step refuses
        with expect:
            opt.step()


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_complex_param_without_grad_is_skipped_not_refused(impl):
    """torch.optim.Muon refuses a complex parameter only when it would step it."""
    c = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.complex64))
    w = matrices(13)[0]
    opt = IMPLS[impl]([w, c])
    w.grad = torch.ones_like(w)
    before = w.detach().clone()
    opt.step()
    assert not torch.equal(w, before)
    c.grad = torch.ones_like(c)
    with pytest.raises(RuntimeError, match="Muon does not support complex parameters"):
        opt.step()


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=-1e-3), "Learning rate should be >= 0 but is: -0.001"),
    (dict(momentum=-0.5), "momentum should be >= 0 but is: -0.5"),
    (dict(weight_decay=-0.1), "weight decay should be >= 0 but is: -0.1"),
])
def test_negative_options_are_refused_with_torchs_messages(impl, kwargs, message):
    with pytest.raises(ValueError, match=message):
        IMPLS[impl](matrices(14), **kwargs)


# ---------------------------------------------------------------------------
# Direction, missing and zero gradients, tensor lr, hooks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_lrsched", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_loss_goes_down(impl, variant, contiguous, with_lrsched):
    schedules = INFO.scheduler_inputs if with_lrsched else [[]]
    for makers in schedules:
        kwargs = variant_kwargs(variant)
        cls = optimizer_class(impl, kwargs)
        gen = torch.Generator().manual_seed(15)
        if contiguous:
            w = torch.nn.Parameter(torch.randn(10, 5, generator=gen))
        else:
            w = torch.nn.Parameter(torch.randn(10, 5, 2, generator=gen)[..., 0])
        x = torch.randn(5, generator=gen)
        opt = cls([w], **kwargs)
        scheds = [make(opt) for make in makers]
        first = loss_of([w], x).item()
        for _ in range(20):
            loss = backward(opt, [w], x)
            opt.step()
            for s in scheds:
                if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    s.step(loss.detach())
                else:
                    s.step()
        assert loss_of([w], x).item() < first, (variant, makers)
        repr(opt)  # printable


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_params_without_grads_are_left_alone(impl, variant):
    kwargs = variant_kwargs(variant)
    cls = optimizer_class(impl, kwargs)
    # No gradient anywhere: step(closure) returns the closure's value, nothing moves.
    still = [torch.randn(2, 3, generator=torch.Generator().manual_seed(16)) for _ in range(2)]
    before = [p.clone() for p in still]
    opt = cls(still, **kwargs)
    assert opt.step(lambda: torch.tensor([1.0])).item() == 1.0
    assert all(torch.equal(p, b) for p, b in zip(still, before))
    assert opt.state_dict()["state"] == {}

    # One of two has a gradient: the other keeps its values and gets no state,
    # also after zero_grad() dropped the first one's gradient.
    w, idle = matrices(17)
    opt = cls([w, idle], **variant_kwargs(variant))
    idle_before = idle.detach().clone()
    w.grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(18))
    opt.step()
    assert torch.equal(idle, idle_before)
    assert sorted(opt.state_dict()["state"]) == [0]
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    w_before = w.detach().clone()
    opt.zero_grad(set_to_none=True)
    opt.step()
    assert torch.equal(w, w_before)
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_zero_grads_without_weight_decay_change_nothing(impl, variant):
    kwargs = variant_kwargs(variant)
    kwargs["weight_decay"] = 0.0
    cls = optimizer_class(impl, kwargs)
    w = matrices(19)[0]
    before = w.detach().clone()
    opt = cls([w], **kwargs)
    w.grad = torch.zeros_like(w)
    opt.step()
    assert torch.equal(w, before)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_tensor_lr_steps_as_the_float(impl, variant):
    kwargs = variant_kwargs(variant)
    kwargs.pop("lr", None)
    cls = optimizer_class(impl, kwargs)
    x = torch.randn(5, generator=torch.Generator().manual_seed(20))
    a, b = matrices(21, shapes=((10, 5),)), matrices(21, shapes=((10, 5),))
    opt_a = cls(a, lr=1e-3, **kwargs)
    opt_b = cls(b, lr=torch.tensor(1e-3), **kwargs)
    for _ in range(5):
        for o, ws in ((opt_a, a), (opt_b, b)):
            backward(o, ws, x)
            o.step()
        # float32's 1e-3 is not the float's: equal within float32's tolerance
        # (torch.optim.Muon computes 1 - lr * weight_decay in float32 then).
        torch.testing.assert_close(a[0], b[0])


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_step_hooks_fire_and_are_not_copied(impl):
    w = matrices(22)[0]
    opt = IMPLS[impl]([w])
    calls = collections.Counter()
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.update(["pre"]))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.update(["post"]))
    w.grad = torch.ones_like(w)
    opt.step()
    opt.step()
    assert calls == {"pre": 2, "post": 2}
    dup = copy.deepcopy(opt)  # torch copies no hooks
    dup.step()
    assert calls == {"pre": 2, "post": 2}
