"""Newton-Schulz on its own, on libmuon's backend: the orthogonalization
torch.optim.Muon applies to each update (muon_orthogonalize).

  zeropower_via_newtonschulz(G, ...)  any matrix or batch of matrices, host
                                      or CUDA, in bf16 (as torch) or fp32
  _zeropower_via_newtonschulz(grad, ns_coefficients, ns_steps, eps)
                                      torch.optim._muon's private function,
                                      same signature, checks and bf16 result;
                                      also (grad, ns_steps) and (grad), the
                                      design documents' call forms
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import _optimizer

if TYPE_CHECKING:
    from ._options import Coefficients

_DEFAULT_COEFFICIENTS = (3.4445, -4.775, 2.0315)


def zeropower_via_newtonschulz(G: torch.Tensor,
                               ns_coefficients: Coefficients = _DEFAULT_COEFFICIENTS,
                               ns_steps: int = 5, eps: float = 1e-7,
                               ns_dtype: str | torch.dtype = "bf16",
                               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Orthogonalizes G (a torch tensor with at least 2 dims; the leading dims of a
    3-D or larger G are a batch of matrices) with `ns_steps` Newton-Schulz
    iterations of (a, b, c) = ns_coefficients (or a list of such rows, or
    'polar_express'), norm clamp `eps`, computed in `ns_dtype` ("bf16" as
    torch, or "fp32"). Returns a new tensor of G's shape and device, of
    `out_dtype` (default: bfloat16 for bf16, float32 for fp32)."""
    if not isinstance(G, torch.Tensor):
        raise TypeError("zeropower_via_newtonschulz: G must be a torch tensor, got %s"
                        % type(G).__name__)
    if G.ndim < 2:
        raise ValueError("zeropower_via_newtonschulz: G has %d dimension(s); Newton-Schulz "
                         "orthogonalizes matrices" % G.ndim)
    if out_dtype is None:
        out_dtype = torch.float32 if str(ns_dtype).lower() in ("fp32", "float32",
                                                               "torch.float32") else torch.bfloat16
    src = G.detach()
    if src.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        src = src.to(torch.float32)
    src = src.contiguous()
    out = torch.empty(src.shape, dtype=out_dtype, device=src.device)
    with _optimizer.Optimizer(ns_steps=ns_steps, ns_coefficients=ns_coefficients, eps=eps,
                              ns_dtype=ns_dtype) as opt:
        opt.orthogonalize(src, out, matrix_view="2d" if src.ndim == 2 else "batched_leading")
    return out


_DEFAULT_STEPS = 5
_DEFAULT_EPS = 1e-7


def _zeropower_via_newtonschulz(grad: torch.Tensor,
                                ns_coefficients: tuple[float, float, float] | int | None = None,
                                ns_steps: int | None = None,
                                eps: float = _DEFAULT_EPS) -> torch.Tensor:
    """torch.optim._muon._zeropower_via_newtonschulz on libmuon's backend: the same
    arguments, the same ValueErrors, a bfloat16 result. The design documents
    call it as (grad, ns_steps) and (grad) too: an int second argument is the
    iteration count, and what is left out is torch.optim.Muon's default
    ((3.4445, -4.775, 2.0315), 5 iterations, eps 1e-7)."""
    if isinstance(ns_coefficients, int) and ns_steps is None:  # (grad, ns_steps)
        ns_coefficients, ns_steps = None, ns_coefficients
    coefficients: Any = _DEFAULT_COEFFICIENTS if ns_coefficients is None else ns_coefficients
    if ns_steps is None:
        ns_steps = _DEFAULT_STEPS
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    return zeropower_via_newtonschulz(grad, tuple(coefficients), ns_steps, eps)
