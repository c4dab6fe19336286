"""Helpers shared by the test modules (imported as ``from tests._helpers import ...``)."""

from __future__ import annotations

import torch

# (atol, rtol) per dtype, and why:
# * float32: engines compute in fp32; errors come from fp32 rounding of a few operations
#   and ScalarE transcendentals, ~1e-6 relative -> 1e-5 / 1e-4 as peers use.
# * bfloat16: 8 significant bits; one final rounding is <= 2**-8 = 3.9e-3 relative, and a
#   bf16 input rounding feeds through -> 2e-2 as peers use for bf16 kernels.
# * float16: 11 significant bits, rounding <= 2**-11 -> 2e-3 / 2e-3 with the same margin.
TOLERANCES = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64."""
    a, e = actual.double(), expected.double()
    return float((a - e).norm() / e.norm().clamp_min(1e-300))
