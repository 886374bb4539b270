"""Refusals and error reporting through the ctypes package, and the binding's
struct layout against the library's."""

import ctypes
import gc
import os
import re

import numpy
import pytest
import torch

import muon
from muon import _lib


def _raises(status, *fragments):
    """Context manager: a MuonError with `status` whose message has every fragment."""

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(muon.MuonError)
            self.info = self._ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            suppressed = self._ctx.__exit__(*exc)
            err = self.info.value
            assert err.status == status, str(err)
            assert err.code == _lib.STATUS_CODES[status]
            for f in fragments:
                assert f in err.message, "%r not in %r" % (f, err.message)
            return suppressed

    return _Check()


# ---------------------------------------------------------------------------
# The binding itself
# ---------------------------------------------------------------------------


def test_struct_sizes_match_the_library():
    assert ctypes.sizeof(_lib.muon_options_t) == _lib.lib.muon_sizeof_options()
    assert ctypes.sizeof(_lib.muon_param_options_t) == _lib.lib.muon_sizeof_param_options()
    # DLPack's published layout on LP64: 8 + (4 + 4) + 4 + 4 + 8 + 8 + 8.
    assert ctypes.sizeof(_lib.DLTensor) == 48
    assert ctypes.sizeof(_lib.DLDataType) == 4 and ctypes.sizeof(_lib.DLDevice) == 8


def test_options_init_fills_every_field_at_its_offset():
    # The defaults documented in include/libmuon/muon.h, read back through the ctypes
    # mirror: a field at a wrong offset would read garbage here.
    o = _lib.muon_options_t()
    assert _lib.lib.muon_options_init(ctypes.byref(o), ctypes.sizeof(o)) == 0
    assert o.struct_size == ctypes.sizeof(o)
    assert (o.lr, o.weight_decay, o.momentum) == (1e-3, 0.1, 0.95)
    assert (o.nesterov, o.ns_steps) == (1, 5)
    assert (o.ns_a, o.ns_b, o.ns_c) == (3.4445, -4.7750, 2.0315)
    assert o.eps == 1e-7
    assert (o.ns_coefficients, o.adjust_lr, o.ns_dtype, o.momentum_fp32, o.reserved0) == (
        _lib.NS_COEFFICIENTS_FIXED, _lib.ADJUST_LR_ORIGINAL, _lib.NS_DTYPE_BF16, 0, 0)
    assert not o.ns_table
    po = _lib.muon_param_options_t()
    assert _lib.lib.muon_param_options_init(ctypes.byref(po), ctypes.sizeof(po)) == 0
    assert po.struct_size == ctypes.sizeof(po)
    assert po.name is None and po.matrix_view == _lib.MATRIX_VIEW_2D and po.reserved0 == 0


def test_options_round_trip_through_the_library():
    opt = muon.Optimizer(lr=0.5, weight_decay=0.25, momentum=0.5, nesterov=False,
                                 ns_steps=7, ns_coefficients=(2.0, -1.5, 0.5), eps=1e-6,
                                 adjust_lr="match_rms_adamw", ns_dtype="fp32",
                                 momentum_fp32=True)
    o = opt.options()
    assert (o["lr"], o["weight_decay"], o["momentum"], o["nesterov"], o["ns_steps"]) == (
        0.5, 0.25, 0.5, 0, 7)
    assert (o["ns_a"], o["ns_b"], o["ns_c"], o["eps"]) == (2.0, -1.5, 0.5, 1e-6)
    assert (o["adjust_lr"], o["ns_dtype"], o["momentum_fp32"]) == (
        _lib.ADJUST_LR_MATCH_RMS_ADAMW, _lib.NS_DTYPE_FP32, 1)
    opt.close()
    table = muon.Optimizer(ns_coefficients=[(1, 2, 3), (4, 5, 6)], adjust_lr=None)
    o = table.options()
    assert o["ns_coefficients"] == _lib.NS_COEFFICIENTS_TABLE and o["ns_table_rows"] == 2
    assert (o["ns_a"], o["ns_b"], o["ns_c"]) == (1.0, 2.0, 3.0)
    assert o["adjust_lr"] == _lib.ADJUST_LR_NONE
    table.close()


def test_version_matches_the_header():
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                          "libmuon", "muon.h")
    if not os.path.exists(header):
        pytest.skip("include/libmuon/muon.h is not next to the tests")
    text = open(header).read()
    expected = tuple(int(re.search(r"#define MUON_VERSION_%s (\d+)" % part, text).group(1))
                     for part in ("MAJOR", "MINOR", "PATCH"))
    assert muon.version() == expected
    assert muon.__version__ == "%d.%d.%d" % expected


def test_muon_error_is_a_runtime_error():
    err = muon.MuonError(3, "lr: bad")
    assert isinstance(err, RuntimeError)
    assert (err.status, err.code, err.message) == ("INVALID_ARGUMENT", 3, "lr: bad")
    assert str(err) == "INVALID_ARGUMENT: lr: bad"
    assert muon.MuonError("FAILED_PRECONDITION", "x").code == 9


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(lr=-0.1), "lr"),
    (dict(lr=float("nan")), "lr"),
    (dict(weight_decay=-1.0), "weight_decay"),
    (dict(momentum=1.0), "momentum"),
    (dict(ns_steps=100), "ns_steps"),
    (dict(ns_steps=-1), "ns_steps"),
    (dict(eps=0.0), "eps"),
    (dict(ns_coefficients=[]), "ns_table_rows"),
    (dict(ns_coefficients=(1.0, float("inf"), 0.0)), "non-finite"),
])
def test_invalid_options_are_refused(kwargs, fragment):
    with _raises("INVALID_ARGUMENT", fragment):
        muon.Optimizer(**kwargs)


def test_ns_steps_99_is_the_largest_accepted():
    muon.Optimizer(ns_steps=99).close()


@pytest.mark.parametrize("kwargs", [
    dict(adjust_lr="sqrt"),
    dict(ns_dtype="fp8"),
    dict(ns_coefficients="fastest"),
    dict(ns_coefficients=[(1.0, 2.0)]),
])
def test_unknown_choices_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        muon.Optimizer(**kwargs)


def test_setters_validate_and_keep_the_old_value():
    with muon.Optimizer(lr=0.01) as opt:
        with _raises("INVALID_ARGUMENT", "lr", "-1"):
            opt.lr = -1.0
        assert opt.lr == 0.01
        with _raises("INVALID_ARGUMENT", "momentum"):
            opt.momentum = 1.5
        with _raises("INVALID_ARGUMENT", "weight_decay"):
            opt.weight_decay = float("inf")
        opt.lr, opt.weight_decay, opt.momentum = 0.5, 0.0, 0.0
        assert (opt.lr, opt.weight_decay, opt.momentum) == (0.5, 0.0, 0.0)


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


def test_1d_param_is_refused_pointing_to_adamw():
    with muon.Optimizer() as opt:
        bias = torch.zeros(8)
        with _raises("INVALID_ARGUMENT", "AdamW", "fc1.bias"):
            opt.register(bias, torch.zeros(8), name="fc1.bias")
        with _raises("INVALID_ARGUMENT", "AdamW", "scale"):
            opt.register(torch.zeros(()), torch.zeros(()), name="scale")
        assert opt.num_params == 0  # nothing half-registered


def test_shape_and_dtype_mismatch():
    with muon.Optimizer() as opt:
        with _raises("INVALID_ARGUMENT", "fc.weight", "shape", "[4, 6]", "[6, 4]"):
            opt.register(torch.zeros(4, 6), torch.zeros(6, 4), name="fc.weight")
        with _raises("INVALID_ARGUMENT", "fc.weight", "dtype", "bfloat16", "float32"):
            opt.register(torch.zeros(4, 6), torch.zeros(4, 6, dtype=torch.bfloat16),
                         name="fc.weight")
        with _raises("INVALID_ARGUMENT", "fc.weight"):
            opt.register(torch.zeros(4, 6, dtype=torch.float64),
                         torch.zeros(4, 6, dtype=torch.float64), name="fc.weight")
        with _raises("INVALID_ARGUMENT", "np.weight"):
            opt.register(numpy.zeros((4, 6)), numpy.zeros((4, 6)), name="np.weight")  # float64
        assert opt.num_params == 0


def test_non_contiguous_tensors_are_refused_not_copied():
    with muon.Optimizer() as opt:
        w = torch.zeros(6, 4).t()
        with _raises("INVALID_ARGUMENT", "proj.weight", "contiguous"):
            opt.register(w, torch.zeros(4, 6), name="proj.weight")
        with _raises("INVALID_ARGUMENT", "proj.weight", "grad", "contiguous"):
            opt.register(torch.zeros(4, 6), torch.zeros(6, 4).t(), name="proj.weight")
        a = numpy.zeros((6, 4), numpy.float32).T
        with _raises("INVALID_ARGUMENT", "np.weight", "contiguous"):
            opt.register(a, numpy.zeros((4, 6), numpy.float32), name="np.weight")
        sliced = torch.zeros(8, 8)[:, :4]
        with _raises("INVALID_ARGUMENT", "sliced", "contiguous"):
            opt.register(sliced, torch.zeros(8, 4), name="sliced")
        assert opt.num_params == 0
        # A contiguous view at an offset is fine: it is the caller's memory.
        rows = torch.zeros(8, 4)[2:6]
        opt.register(rows, torch.ones(4, 4), name="rows")
        opt.step()
        assert rows.abs().sum() > 0


def test_matrix_views():
    with muon.Optimizer() as opt:
        with _raises("INVALID_ARGUMENT", "conv.weight", "matrix view"):
            opt.register(torch.zeros(4, 3, 3), torch.zeros(4, 3, 3), name="conv.weight")
        with _raises("INVALID_ARGUMENT", "experts", "BATCHED_LEADING"):
            opt.register(torch.zeros(4, 3), torch.zeros(4, 3), name="experts",
                         matrix_view="batched_leading")
        with pytest.raises(ValueError):
            opt.register(torch.zeros(4, 3), torch.zeros(4, 3), matrix_view="diagonal")
        assert opt.register(torch.zeros(4, 3, 3), torch.zeros(4, 3, 3), name="conv.weight",
                            matrix_view="flatten_trailing") == 0


def test_duplicate_name_and_storage():
    with muon.Optimizer() as opt:
        w = torch.zeros(4, 4)
        assert opt.register(w, torch.zeros(4, 4), name="w") == 0
        with _raises("ALREADY_EXISTS", "'w'"):
            opt.register(torch.zeros(4, 4), torch.zeros(4, 4), name="w")
        with _raises("INVALID_ARGUMENT", "'w_again'", "'w'"):  # storage registered as 'w'
            opt.register(w, torch.zeros(4, 4), name="w_again")
        shared = torch.zeros(4, 4)
        with _raises("INVALID_ARGUMENT", "'same'"):  # param and grad in one storage
            opt.register(shared, shared, name="same")
        assert opt.register(torch.zeros(2, 2), torch.zeros(2, 2)) == 1  # named "param1"
        assert opt.num_params == 2 and len(opt) == 2


def test_read_only_numpy_param_is_refused():
    a = numpy.zeros((4, 4), numpy.float32)
    a.setflags(write=False)
    with muon.Optimizer() as opt:
        with pytest.raises(ValueError, match="read-only"):
            opt.register(a, numpy.zeros((4, 4), numpy.float32), name="frozen")


def test_other_types_are_type_errors():
    with muon.Optimizer() as opt:
        with pytest.raises(TypeError):
            opt.register([[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]])
        with pytest.raises(TypeError):
            opt.register(torch.zeros(2, 2, dtype=torch.complex64),
                         torch.zeros(2, 2, dtype=torch.complex64))
        # A placement that is not one of the three, named by its position.
        with pytest.raises(TypeError, match=r"placement 0 is \(0, 1\); use muon.Shard"):
            opt.register(torch.zeros(2, 2), torch.zeros(2, 2), global_shape=(2, 2),
                         placements=[(0, 1)])
        assert len(opt) == 0  # nothing registered


# ---------------------------------------------------------------------------
# Stepping
# ---------------------------------------------------------------------------


def test_step_with_no_params_fails():
    with muon.Optimizer() as opt:
        with _raises("FAILED_PRECONDITION", "no parameters"):
            opt.step()
        assert opt.step_count == 0


def test_register_after_step_fails():
    with muon.Optimizer() as opt:
        opt.register(torch.zeros(4, 4), torch.ones(4, 4), name="w")
        opt.step()
        with _raises("FAILED_PRECONDITION", "late", "registration is closed"):
            opt.register(torch.zeros(4, 4), torch.ones(4, 4), name="late")
        assert opt.num_params == 1 and opt.step_count == 1


def test_replaced_torch_grad_is_detected():
    w = torch.nn.Parameter(torch.zeros(4, 6))
    w.grad = torch.zeros(4, 6)
    with muon.Optimizer() as opt:
        opt.register(w, w.grad, name="fc.weight")
        opt.step()
        w.grad = torch.ones(4, 6)  # what zero_grad(set_to_none=True) + backward amount to
        with _raises("FAILED_PRECONDITION", "fc.weight", ".grad"):
            opt.step()
        w.grad = None
        with _raises("FAILED_PRECONDITION", "fc.weight"):
            opt.step()
        assert opt.step_count == 1


# ---------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------


def test_state_errors():
    with muon.Optimizer() as opt:
        w = torch.zeros(4, 6)
        opt.register(w, torch.ones(4, 6), name="fc.weight")
        opt.step()
        with _raises("NOT_FOUND", "param_id 5"):
            opt.get_state(5)
        with _raises("NOT_FOUND"):
            opt.set_state(-1, torch.zeros(4, 6))
        with _raises("INVALID_ARGUMENT", "fc.weight", "shape"):
            opt.set_state(0, torch.zeros(6, 4))
        with _raises("INVALID_ARGUMENT", "fc.weight", "dtype"):
            opt.set_state(0, torch.zeros(4, 6, dtype=torch.bfloat16))
        with _raises("INVALID_ARGUMENT", "contiguous"):
            opt.get_state(0, out=torch.zeros(6, 4).t())

        before = opt.state_bytes()
        with _raises("INVALID_ARGUMENT", "state blob"):
            opt.load_state_bytes(b"not a muon checkpoint")
        with _raises("INVALID_ARGUMENT", "state blob"):
            opt.load_state_bytes(before[:-3])
        with muon.Optimizer() as other:
            other.register(torch.zeros(6, 4), torch.ones(6, 4), name="fc.weight")
            other.step()
            other.step()
            with _raises("INVALID_ARGUMENT", "fc.weight"):
                opt.load_state_bytes(other.state_bytes())
        assert opt.state_bytes() == before  # failed loads changed nothing
        assert opt.step_count == 1


# ---------------------------------------------------------------------------
# Lifetime
# ---------------------------------------------------------------------------


def test_close_context_manager_and_finalizer():
    w, g = torch.zeros(4, 4), torch.ones(4, 4)
    with muon.Optimizer() as opt:
        opt.register(w, g)
        assert not opt.closed
    assert opt.closed
    with pytest.raises(ValueError, match="closed"):
        opt.step()
    with pytest.raises(ValueError, match="closed"):
        opt.lr = 0.1
    opt.close()  # idempotent
    assert "closed" in repr(opt)

    opt = muon.Optimizer()
    opt.register(torch.zeros(4, 4), torch.ones(4, 4))
    del opt  # the finalizer destroys the handle
    gc.collect()


def test_registered_tensors_stay_alive_with_the_optimizer():
    opt = muon.Optimizer(lr=0.1, weight_decay=0.0)
    opt.register(torch.zeros(8, 8), torch.ones(8, 8), name="anonymous")
    gc.collect()
    # The caller kept no reference: the optimizer's own keeps the memory valid.
    opt.step()
    state = opt.get_state(0)
    assert torch.allclose(state, torch.full((8, 8), 1 - 0.95))
    opt.close()


def test_cpu_engine_settings_refuse_before_anything_steps(monkeypatch):
    """MUON_CPU_BF16 naming an engine the CPU (here capped to AVX2 by
    MUON_CPU_ISA) cannot run, or a value libmuon does not know, fails the
    first step with the fix named; the parameter and the state are untouched,
    and the same optimizer steps once the setting is fixed."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(32, 48))
    p.grad = torch.randn(32, 48)
    before = p.detach().clone()
    monkeypatch.setenv("MUON_CPU_ISA", "avx2")
    monkeypatch.setenv("MUON_CPU_BF16", "amx")
    opt = muon.Muon([p], lr=0.02)
    with _raises("FAILED_PRECONDITION", "MUON_CPU_BF16=amx", "has no", "unset MUON_CPU_BF16",
                 "MUON_CPU_ISA=avx2"):
        opt.step()
    assert torch.equal(p.detach(), before)
    assert not opt.state_dict()["state"]
    monkeypatch.setenv("MUON_CPU_BF16", "avx512bf16")
    with _raises("INVALID_ARGUMENT", 'MUON_CPU_BF16="avx512bf16"', "avx512_bf16"):
        muon.Muon([p], lr=0.02).step()
    monkeypatch.setenv("MUON_CPU_ISA", "avx-2")
    monkeypatch.delenv("MUON_CPU_BF16")
    with _raises("INVALID_ARGUMENT", 'MUON_CPU_ISA="avx-2"', "avx2, baseline"):
        muon.Muon([p], lr=0.02).step()
    assert torch.equal(p.detach(), before)
    monkeypatch.setenv("MUON_CPU_ISA", "avx2")
    opt.step()
    assert not torch.equal(p.detach(), before)
    assert opt.state_dict()["state"]
