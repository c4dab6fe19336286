"""dx of the norm backwards over a run of one row's columns, split between two ways
(kernels/rms_norm_backward.py and kernels/layer_norm_backward.py, which share it).

Both backwards end each row in the same form: dx = (a + g) * r, with g = dy * w, r the
row's rsqrt, and a per-row affine function of the row's source (RMSNorm: a = x * (-r**2 c /
H); LayerNorm: a = xhat * (-m2) - m1). A row's columns before ``cut`` (the VectorE share the
kernel's block plan picks) and the others go two ways:

    VectorE  a' = a * r  (tensor_scalar of the source, the input dtype; one rounding)
    VectorE  dx = g * r + a'  (scalar_tensor_tensor: fp32 inside, one rounding)
and
    VectorE  a (tensor_scalar, 16-bit perf mode; one rounding)
    GpSimd   t = a + g (fp32)
    ScalarE  dx = t * r (activation copy with a [P, 1] scale; one rounding)

A column takes the same way whether its row is made whole or in the column chunks of the
program's last block, so results do not depend on the launch's degree (LNC=1 or 2).
"""

import nki.isa as nisa
import nki.language as nl


def split_dx(dx, src, g, r, a_factors, prime_factors, first, end, cut, a=None, t=None):
    """dx = (a + g) * r over columns [first, end) of one row: the columns before ``cut`` the
    VectorE way, the others the three-engine way (module docstring).

    ``dx``, ``src``, ``g``: the row's [P, cols] views (SBUF; dx in the output dtype, src and g
    in the input dtype). ``r``: the row's [P, 1] fp32 rsqrt. ``a_factors``: (scale, shift) of
    a = src * scale (+ shift), each a [P, 1] fp32 column, shift None for no addition;
    ``prime_factors`` the same of a' = a * r (None where no column is before ``cut``).
    ``a`` ([P, >= end - mid], the input dtype) and ``t`` ([P, >= end - mid], fp32): the
    caller's tiles for a and t, or None to allocate them here (each call path is its own
    allocation site either way).

    Order, for SBUF's live bytes: a' first in a tile of its own (the source's last reads
    stay where a alone had them), then a, t and ScalarE's dx (dx's tile first written
    there, t's last read), then VectorE's dx: beside t only the narrow a' lives longer."""
    parts = src.shape[0]
    mid = min(max(cut, first), end)
    a_prime = None
    if mid > first:
        a_prime = nl.ndarray((parts, mid - first), dtype=src.dtype, buffer=nl.sbuf)
        _affine(a_prime, src[:, first:mid], prime_factors)
    if end > mid:
        width = end - mid
        a = nl.ndarray((parts, width), dtype=src.dtype, buffer=nl.sbuf) if a is None else a[:, 0:width]
        _affine(a, src[:, mid:end], a_factors)
        t = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf) if t is None else t[:, 0:width]
        nisa.tensor_tensor(dst=t, data1=a, data2=g[:, mid:end], op=nl.add, engine=nisa.engine.gpsimd)
        nisa.activation(dst=dx[:, mid:end], op=nl.copy, data=t, scale=r)
    if a_prime is not None:
        nisa.scalar_tensor_tensor(dst=dx[:, first:mid], data=g[:, first:mid], op0=nl.multiply, operand0=r,
                                  op1=nl.add, operand1=a_prime)


def _affine(dst, src, factors):
    """dst = src * scale (+ shift): one VectorE tensor_scalar (``factors`` = (scale, shift))."""
    scale, shift = factors
    if shift is None:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale)
    else:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale, op1=nl.add, operand1=shift)
