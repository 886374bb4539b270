"""Gram Newton-Schulz and fp16 Newton-Schulz against a reference we did not
write: Dao-AILab's gram-newton-schulz 0.1.6 (PyPI, installed --no-deps; its
plain-torch backend runs on the CPU). Both computations are measured against
the same iteration in float64; libmuon must land at least as close as the
reference's own fp16 result (within 1.25x, or a small floor)."""

import pytest
import torch

import muon

import gram_newton_schulz as gns  # tools/deps.sh installs it (tools/python-nodeps.txt)

COEFFICIENTS = [tuple(float(v) for v in row) for row in gns.POLAR_EXPRESS_COEFFICIENTS]
EPS = 1e-7


def float64_iteration(x, restarts=()):
    """The standard iteration in float64 (restarts do not change its math)."""
    w = x.double()
    tall = w.shape[0] > w.shape[1]
    if tall:
        w = w.T
    w = w / (w.norm() + EPS)
    for a, b, c in COEFFICIENTS:
        g = w @ w.T
        w = a * w + (b * g + c * g @ g) @ w
    return w.T if tall else w


def error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


SHAPES = [(256, 256), (128, 448), (448, 128), (128, 1024), (1024, 128)]


@pytest.mark.parametrize("rows, cols", SHAPES)
@pytest.mark.parametrize("algorithm", ["gram", "standard"])
def test_fp16_lands_as_close_as_gram_newton_schulz(rows, cols, algorithm):
    gen = torch.Generator().manual_seed(rows * 7 + cols)
    x = torch.randn(rows, cols, generator=gen)
    want = float64_iteration(x)
    if algorithm == "gram":
        theirs = gns.GramNewtonSchulz(ns_use_kernels=False, compile_kwargs=None,
                                      ns_coefficients=COEFFICIENTS, ns_epsilon=EPS,
                                      gram_newton_schulz_reset_iterations=[2])
    else:
        theirs = gns.StandardNewtonSchulz(ns_use_kernels=False, compile_kwargs=None,
                                          ns_coefficients=COEFFICIENTS, ns_epsilon=EPS)
    reference = theirs(x.clone())
    with muon.Optimizer(ns_dtype="fp16", ns_algorithm=algorithm, ns_coefficients=COEFFICIENTS,
                        ns_steps=len(COEFFICIENTS), eps=EPS, gram_restarts=[2]) as opt:
        ours = opt.orthogonalize(x)
    # fp16 values, as the reference's tensors hold them.
    assert torch.equal(ours, ours.half().float())
    got, yard = error(ours, want), error(reference, want)
    print("\n[gram] %s %dx%d fp16: libmuon %.3e, gram-newton-schulz %.3e"
          % (algorithm, rows, cols, got, yard))
    assert got <= max(1.25 * yard, 2.0 ** -11)


@pytest.mark.parametrize("rows, cols", SHAPES[1:])
def test_gram_in_fp32_is_the_standard_iteration(rows, cols):
    gen = torch.Generator().manual_seed(rows + cols)
    x = torch.randn(rows, cols, generator=gen)
    want = float64_iteration(x)
    with muon.Optimizer(ns_dtype="fp32", ns_algorithm="gram", ns_coefficients=COEFFICIENTS,
                        ns_steps=len(COEFFICIENTS), eps=EPS, gram_restarts=[2, 3]) as opt:
        ours = opt.orthogonalize(x)
    assert error(ours, want) < 1e-4


def test_gram_options_are_checked():
    with pytest.raises(ValueError, match="unknown ns_algorithm 'fast'"):
        muon.Optimizer(ns_algorithm="fast")
    with pytest.raises(ValueError, match="gram_restarts holds iteration 64"):
        muon.Optimizer(ns_algorithm="gram", gram_restarts=[64])
    with pytest.raises(ValueError, match="ns_algorithm 'fast' is not supported"):
        muon.Muon([torch.nn.Parameter(torch.zeros(4, 4))], ns_algorithm="fast")
