"""How an op's output is compared with its float64 oracle in the fuzz tier.

Every op states, per element, a bound on |out - exact| derived from how the op computes
(the derivations are in ``ops.py``, next to each op's generator). The bounds are built from:

* ``unit(dtype)``: the unit roundoff u of a dtype, the largest relative error of one
  round-to-nearest (fp32 2**-24, bf16 2**-8, fp16 2**-11). Both CPU backends compute in
  fp32 and round the result to the output dtype, so every bound has a term u_out * |exact|.
* ``U32 = 2**-24``: fp32 arithmetic inside the op; K roundings of fp32 arithmetic on the
  way to a value v cost at most ~K * U32 * |v| (first order; Higham, "Accuracy and
  Stability of Numerical Algorithms", ch. 3). Sums of n terms are charged
  ``sum_roundings(n)`` = 16 + 6 sqrt(n) roundings: the probabilistic bound of Higham and
  Mary ("A new approach to probabilistic rounding error analysis", SISC 2019: the error of
  a recursive sum stays below lambda sqrt(n) u with probability >= 1 - 2 exp(-lambda**2 / 2)
  ... per term; lambda = 6), since torch's fp32 reductions (the reference backend's sums,
  e.g. softmax's over 70001 columns: ~170 u measured) accumulate sequentially in vector
  lanes. The worst case, n - 1, would make fp32 bounds of long rows useless.
* ``floor(dtype)``: errors smaller than these are ignored: half the dtype's smallest
  subnormal spacing (the rounding of a result that underflows) plus 2**-120, the size of
  results that fp32's own subnormal range flushes or loses (e.g. silu(-100) = -3.7e-42
  is 0 once exp(100) overflows in fp32).

Special values: the output must be NaN exactly where the oracle is NaN. Where the exact
result lies beyond the output dtype's largest finite value (or within one rounding of it)
the output must be that value or infinity of the same sign; an infinite exact result needs
the same infinity.
"""

from __future__ import annotations

import math

import torch

U32 = 2.0 ** -24
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
_SMALLEST_SUBNORMAL = {torch.float32: 2.0 ** -149, torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24}
FP32_FLUSH = 2.0 ** -120


def unit(dtype: torch.dtype) -> float:
    return UNIT[dtype]


def floor(dtype: torch.dtype) -> float:
    return _SMALLEST_SUBNORMAL[dtype] / 2 + FP32_FLUSH


def sum_roundings(n: int) -> float:
    """Roundings charged to an fp32 sum of n terms (probabilistic bound, see above)."""
    return 16.0 + 6.0 * math.sqrt(max(n, 1))


def compare(out: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, name: str = "out") -> str | None:
    """None if ``out`` (its dtype) matches the float64 ``exact`` within the elementwise
    ``bound`` (float64, broadcastable) under the rules above; else a short description of
    the worst mismatch."""
    if tuple(out.shape) != tuple(exact.shape):
        return f"{name}: shape {tuple(out.shape)}, expected {tuple(exact.shape)}"
    if out.numel() == 0:
        return None
    o = out.double()
    e = exact.double()
    bound = torch.broadcast_to(bound.double(), e.shape)
    nan_o, nan_e = torch.isnan(o), torch.isnan(e)
    if (nan_o != nan_e).any():
        idx = tuple(int(i) for i in torch.nonzero(nan_o != nan_e)[0])
        return f"{name}{list(idx)}: {o[idx].item()!r}, expected {e[idx].item()!r} (NaN mismatch)"
    big = float(torch.finfo(out.dtype).max)
    u = UNIT[out.dtype]
    # beyond (or within one rounding of) the largest finite value: that value or inf, same sign
    edge = ~nan_e & (e.abs() >= big * (1 - 2 * u))
    ok_edge = (torch.sign(o) == torch.sign(e)) & ((o.abs() == big) | torch.isinf(o) | ((o - e).abs() <= bound))
    ok_edge &= ~torch.isinf(e) | (o == e)
    bad = edge & ~ok_edge
    finite = ~nan_e & ~edge
    err = torch.where(finite, (o - e).abs(), torch.zeros_like(e))
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)   # inf - inf
    bad |= finite & (err > bound)
    if not bad.any():
        return None
    excess = torch.where(bad, torch.where(finite, err / bound.clamp_min(1e-300), torch.full_like(e, math.inf)),
                         torch.zeros_like(e))
    idx = tuple(int(i) for i in torch.nonzero(excess == excess.max())[0])
    return (f"{name}{list(idx)}: {o[idx].item()!r}, expected {e[idx].item()!r}, |err| "
            f"{(o[idx] - e[idx]).abs().item():.3g} > bound {bound[idx].item():.3g} "
            f"({int(bad.sum())} of {bad.numel()} elements out of bound)")
