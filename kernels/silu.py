"""SiLU ``x * sigmoid(x)``, elementwise over a tensor of any shape (the ``SiLU`` layer of
transformers' Llama MLP when the gate product is not fused).

Dimensions:
    n: number of elements (any n >= 1).
Layout:
    Flat memory: the first 128 * (n // 128) elements are viewed as [128, n // 128] (all
    partitions busy, each partition a contiguous run) and streamed in equal column chunks of
    at most COLS;
    the n % 128 leftover elements are one [tail, 1] tile.
Engines:
    DMA in, ScalarE silu (fp32 inside, one rounding), DMA out; fresh tiles per chunk so
    the next load overlaps the current activation.
Expected error:
    one rounding to the output dtype (bf16: <= 2**-8 relative; fp32: ~1e-6 relative).
"""

import nki
import nki.isa as nisa
import nki.language as nl

PARTITIONS = 128
# 4096 elements per partition per transfer: 8 KiB bf16 / 16 KiB fp32, above the 4 KiB that
# saturates DMA; two in-flight chunks of in+out tiles use <= 64 KiB of the 224 KiB partition.
COLS = 4096


@nki.jit
def silu_kernel(x):
    """Return ``silu(x)``, shape and dtype of ``x`` (HBM, float32/bfloat16/float16)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = 1
    for size in x.shape:
        n *= size
    x_flat = x.reshape((n,))
    out_flat = out.reshape((n,))
    body_cols = n // PARTITIONS
    pieces = []
    if body_cols > 0:
        x_body = x_flat[0:PARTITIONS * body_cols].reshape((PARTITIONS, body_cols))
        out_body = out_flat[0:PARTITIONS * body_cols].reshape((PARTITIONS, body_cols))
        # equal chunks of at most COLS columns (no short last chunk with a small DMA)
        n_chunks = -(-body_cols // COLS)
        step = -(-body_cols // n_chunks)
        for c0 in range(0, body_cols, step):
            width = min(step, body_cols - c0)
            pieces.append((x_body[:, c0:c0 + width], out_body[:, c0:c0 + width], PARTITIONS, width))
    tail = n - PARTITIONS * body_cols
    if tail > 0:
        pieces.append((x_flat[n - tail:n].reshape((tail, 1)), out_flat[n - tail:n].reshape((tail, 1)), tail, 1))
    for src, dst, parts, width in pieces:
        x_tile = nl.ndarray((parts, width), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_tile, src=src)
        y_tile = nl.ndarray((parts, width), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y_tile, op=nl.silu, data=x_tile)
        nisa.dma_copy(dst=dst, src=y_tile)
    return out
