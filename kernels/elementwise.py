"""Elementwise activations ``y = f(x)`` over a tensor of any shape: gelu (erf), gelu with
the tanh approximation, silu.

Dimensions:
    n: number of elements of ``x`` (any n >= 1).
Layout:
    The tensor is read as flat memory. The first ``128 * (n // 128)`` elements are viewed as
    ``[128, n // 128]`` (all 128 partitions busy, each partition a contiguous run) and
    processed in column chunks of up to ``COLS`` elements; the ``n % 128`` leftover
    elements are one ``[tail, 1]`` tile. At LNC=2 each core takes half of the columns
    (``program_share``) and the last core also the tail.
Engines:
    DMA loads a chunk HBM -> SBUF, ScalarE applies the activation (computing in fp32,
    rounding once to the output dtype), DMA stores it back. Each chunk gets fresh SBUF
    tiles, so the load of chunk i+1 can overlap the activation of chunk i.
Expected error:
    one rounding to the output dtype on top of ScalarE's fp32 activation (bf16: <= 2**-8
    relative; fp32: ~1e-6 relative).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .tiling import PARTITIONS, program_share

# 2048 elements per partition per transfer: 8 KiB (fp32) / 4 KiB (bf16) DMA per partition,
# at or above the 4 KiB the DMA guide gives for saturating bandwidth; in + out tiles of two
# chunks in flight use 32 KiB of trn2's 224 KiB SBUF partition.
COLS = 2048
# op name -> ScalarE activation function
FUNCTIONS = {"gelu": nl.gelu, "gelu_tanh": nl.gelu_apprx_tanh, "silu": nl.silu}


def _apply(dst_hbm, src_hbm, rows, cols, func):
    """dst = func(src) for one [rows, cols] HBM region (rows <= 128)."""
    tile = nl.ndarray((rows, cols), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src_hbm)
    result = nl.ndarray((rows, cols), dtype=dst_hbm.dtype, buffer=nl.sbuf)
    nisa.activation(dst=result, op=func, data=tile)  # ScalarE, fp32 inside
    nisa.dma_copy(dst=dst_hbm, src=result)


@nki.jit
def elementwise_kernel(x, op="gelu"):
    """Return ``op(x)`` with the same shape and dtype as ``x``.

    Args:
        x: HBM tensor, any shape, float32/bfloat16/float16.
        op: "gelu" (erf form), "gelu_tanh" or "silu".
    Returns:
        HBM tensor (shared_hbm), shape and dtype of ``x``.
    """
    assert op in FUNCTIONS, f"op={op!r}: expected one of {tuple(FUNCTIONS)}"
    func = FUNCTIONS[op]

    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = 1
    for size in x.shape:
        n *= size
    x_flat = x.reshape((n,))
    out_flat = out.reshape((n,))

    body_cols = n // PARTITIONS
    if body_cols > 0:
        body = PARTITIONS * body_cols
        x_body = x_flat[0:body].reshape((PARTITIONS, body_cols))
        out_body = out_flat[0:body].reshape((PARTITIONS, body_cols))
        col_lo, col_hi = program_share(body_cols)     # this program's columns
        for start in range(col_lo, col_hi, COLS):
            cols = min(COLS, col_hi - start)
            _apply(out_body[:, start:start + cols], x_body[:, start:start + cols], PARTITIONS, cols, func)

    tail = n - PARTITIONS * body_cols
    if tail > 0 and nl.program_id(0) == nl.num_programs() - 1:   # the last program takes the tail
        start = PARTITIONS * body_cols
        x_tail = x_flat[start:n].reshape((tail, 1))
        out_tail = out_flat[start:n].reshape((tail, 1))
        _apply(out_tail, x_tail, tail, 1, func)
    return out
