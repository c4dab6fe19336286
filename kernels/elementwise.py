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
    rounding once to the output dtype), DMA stores it back. The chunks' input and output
    tiles are rings of RING, so up to RING loads and stores are in flight around the
    activation.
Expected error:
    one rounding to the output dtype on top of ScalarE's fp32 activation (bf16: <= 2**-8
    relative; fp32: ~1e-6 relative).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .tiling import PARTITIONS, program_share

# 2048 elements per partition per transfer: 8 KiB (fp32) / 4 KiB (bf16) DMA per partition,
# at or above the 4 KiB the DMA guide gives for saturating bandwidth.
COLS = 2048
# Chunks in flight: the input and output tiles are rings of this many (one allocation each),
# so a chunk's load waits only for the activation RING chunks back and its result for the
# store RING chunks back, where a tile allocated per chunk rotates 2 buffers and each DMA's
# ~1.3 us latency showed between chunks. Modeled trn2 LNC=2, us, 2 -> 3 -> 4 (session 53):
# gelu ViT-B MLP [1576, 3072] bf16 32.8 -> 30.1 -> 28.8, ViT-L [1576, 4096] 42.1 -> 38.3 ->
# 37.7, silu Llama-7B gate [1024, 11008] 70.5 -> 65.4 -> 64.9; 6 as 4. At fp32 the two rings
# take 64 KiB of a partition. A scan of gelu and silu (8 shapes, bf16 and fp32; trn2 and trn3
# at LNC=2, trn1): 22 of 96 runs faster (to -18 %), 60 the same (one or two chunks), 14
# slower: fp32 on trn2 at [1576, 3072] and [1024, 11008] (+2.7 %, +1.7 %: 1 MiB chunks,
# DMA-bound, their loads run ahead of the stores), fp32 on trn3 at [1024, 11008] (+0.8 %) and
# bf16 on trn1 (+0.6 .. +2.0 %).
RING = 4
# op name -> ScalarE activation function
FUNCTIONS = {"gelu": nl.gelu, "gelu_tanh": nl.gelu_apprx_tanh, "silu": nl.silu}


def _apply(dst_hbm, src_hbm, rows, cols, func, tile=None, result=None):
    """dst = func(src) for one [rows, cols] HBM region (rows <= 128), through ``tile`` and
    ``result`` (SBUF [rows, cols] views) when given, else fresh tiles."""
    if tile is None:
        tile = nl.ndarray((rows, cols), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src_hbm)
    if result is None:
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
        in_ring = nl.ndarray((PARTITIONS, RING, COLS), dtype=x.dtype, buffer=nl.sbuf)
        out_ring = nl.ndarray((PARTITIONS, RING, COLS), dtype=x.dtype, buffer=nl.sbuf)
        for i, start in enumerate(range(col_lo, col_hi, COLS)):
            cols = min(COLS, col_hi - start)
            _apply(out_body[:, start:start + cols], x_body[:, start:start + cols], PARTITIONS, cols, func,
                   in_ring[:, i % RING, 0:cols], out_ring[:, i % RING, 0:cols])

    tail = n - PARTITIONS * body_cols
    if tail > 0 and nl.program_id(0) == nl.num_programs() - 1:   # the last program takes the tail
        start = PARTITIONS * body_cols
        x_tail = x_flat[start:n].reshape((tail, 1))
        out_tail = out_flat[start:n].reshape((tail, 1))
        _apply(out_tail, x_tail, tail, 1, func)
    return out
