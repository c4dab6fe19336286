"""RMSNorm over the last dimension, optionally fused with a residual add.

    out = x * rsqrt(mean(x**2) + eps) * weight                      (rms_norm_kernel)
    s = x + residual; out = rms_norm(s)   -> (out, s)               (fused_add_rms_norm_kernel)

Dimensions:
    N: rows (any N >= 1).
    H: normalised size, 1 <= H <= MAX_HIDDEN (8192 fp32 / bf16 rows fit SBUF with room for
       double buffering; the op wrapper checks the limit).
Layout:
    Rows go on partitions. Rows are cut into blocks of 128 * J consecutive rows, partition p of
    a block holding rows [p*J, (p+1)*J): a block is one contiguous HBM range, so its load is one
    DMA of J*H elements per partition. J grows until a partition's transfer holds TARGET_COLS
    elements (>= 4 KiB in bf16) or the rows run out; the last < 128 rows form one [rows, 1, H]
    block. The weight is broadcast once to all 128 partitions ([128, H], stride-0 DMA).
Engines, per row:
    ScalarE  square(x / sqrt(H)) with add-reduction -> mean(x**2) in fp32 (one pass)
    ScalarE  rsqrt(mean + eps) on [P, J] (tiny)
    normalisation, split between two paths so no engine outruns the DMA (VECTOR_SHARE):
      VectorE  (x * rstd) * weight in one scalar_tensor_tensor (fp32 inside, one rounding)
      ScalarE  x * rstd into fp32 scratch, then GpSimd scratch * weight (one rounding)
    The split is by rows when a partition holds J > 1 rows, else by columns.
    Without weight: VectorE x * rstd (tensor_scalar) / ScalarE copy with scale.
    fused:   VectorE x + residual rounded to the input dtype (stored as the second output and
             normalised from that rounded value, matching an eager add followed by rms_norm).
    Every block gets fresh SBUF tiles, so block i+1's load overlaps block i's compute.
Expected error:
    statistics and products in fp32; one rounding to the output dtype (bf16: <= 2**-8
    relative per element; fp32: ~1e-6 relative).
"""

import math

import nki
import nki.isa as nisa
import nki.language as nl

from .limits import NORM_MAX_HIDDEN as MAX_HIDDEN
from .tiling import (PARTITIONS, block_rows, broadcast_rows, engine_segments, load_block,
                     program_row_blocks, rows_per_partition)

# Rows are packed per partition until one transfer moves >= 2048 elements per partition:
# 4 KiB in bf16 / 8 KiB in fp32, the DMA guide's size for saturating bandwidth.
TARGET_COLS = 2048
# Share of the normalisation given to VectorE. Per element, on trn2 (cost-model rules):
# VectorE scalar_tensor_tensor reads 2 inputs at 0.96 GHz = 2.08 ns; the other path costs
# ScalarE 0.83 ns (1.2 GHz) + GpSimd 2 x 0.83 ns; ScalarE also squares every element
# (0.83 ns). With share a: VectorE 2.08a, ScalarE 0.83(2 - a), GpSimd 1.67(1 - a); a = 4/7
# balances VectorE and ScalarE at 1.19 ns, under the 1.39 ns per element that bf16 HBM
# traffic (2 B read + 2 B written per element at 368 GB/s over 128 partitions) takes.
VECTOR_SHARE = 4 / 7


def _scale_rows(dst, src, rstd_col, weight_cols, on_vector):
    """dst = src * rstd (* weight) for one [P, w] segment on the chosen path."""
    parts, width = src.shape[0], src.shape[-1]
    if on_vector:
        if weight_cols is None:
            nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=rstd_col)
        else:
            # (x * rstd) * weight on VectorE, fp32 inside, one rounding to the output dtype
            nisa.scalar_tensor_tensor(dst=dst, data=src, op0=nl.multiply, operand0=rstd_col,
                                      op1=nl.multiply, operand1=weight_cols)
    elif weight_cols is None:
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=rstd_col)
    else:
        scaled = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=scaled, op=nl.copy, data=src, scale=rstd_col)          # ScalarE
        nisa.tensor_tensor(dst=dst, data1=scaled, data2=weight_cols, op=nl.multiply,
                           engine=nisa.engine.gpsimd)                               # GpSimd


def _normalize_block(out_tile, x_tile, parts, per, cols, weight_tile, eps_tile):
    """out_tile[p, j, :] = rms_norm(x_tile[p, j, :]) * weight for a [parts, per, cols] block."""
    # mean(x^2) per row: ScalarE squares x / sqrt(H) and add-reduces along the free axis (fp32).
    # The squared values themselves are not needed: they land in out_tile, overwritten below.
    mean_sq = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    inv_sqrt_cols = 1.0 / math.sqrt(cols)
    for j in range(per):
        nisa.activation(dst=out_tile[:, j, :], op=nl.square, data=x_tile[:, j, :],
                        scale=inv_sqrt_cols, reduce_op=nl.add, reduce_res=mean_sq[:, j:j + 1],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
    # rstd = rsqrt(mean + eps): [parts, per] fp32, ScalarE, eps as a per-partition bias.
    rstd = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_sq, bias=eps_tile[0:parts, :])
    weight = None if weight_tile is None else weight_tile[0:parts, :]
    for j, lo, hi, on_vector in engine_segments(per, cols, VECTOR_SHARE):
        _scale_rows(out_tile[:, j, lo:hi], x_tile[:, j, lo:hi], rstd[:, j:j + 1],
                    None if weight is None else weight[:, lo:hi], on_vector)


def _eps_tile(eps):
    tile = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=eps)
    return tile


@nki.jit
def rms_norm_kernel(x, weight=None, eps=1e-6):
    """Return ``x * rsqrt(mean(x**2, -1) + eps) * weight``.

    Args:
        x: HBM [N, H], float32/bfloat16/float16.
        weight: HBM [H] of any float dtype, or None (no scaling).
        eps: float added to the mean square.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    n_rows, cols = x.shape
    assert cols <= MAX_HIDDEN, f"H={cols} exceeds MAX_HIDDEN={MAX_HIDDEN}"
    out = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    eps_tile = _eps_tile(eps)
    weight_tile = None
    blocks = program_row_blocks(n_rows, rows_per_partition(cols, TARGET_COLS, MAX_HIDDEN))
    for i, (start, parts, per) in enumerate(blocks):
        x_tile = load_block(x, start, parts, per)
        if i == 0 and weight is not None:
            # after the first block's load, so that load (which compute waits for) goes first
            weight_tile = broadcast_rows(weight, cols)
        out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        _normalize_block(out_tile, x_tile, parts, per, cols, weight_tile, eps_tile)
        nisa.dma_copy(dst=block_rows(out, start, parts, per), src=out_tile)
    return out


@nki.jit
def fused_add_rms_norm_kernel(x, residual, weight=None, eps=1e-6):
    """Return ``(rms_norm(x + residual) * weight, x + residual)``.

    Args:
        x: HBM [N, H], float32/bfloat16/float16.
        residual: HBM [N, H], dtype of ``x``.
        weight: HBM [H] of any float dtype, or None.
        eps: float added to the mean square.
    Returns:
        (normed, total): two HBM [N, H] tensors (shared_hbm) in the dtype of ``x``; ``total``
        is ``x + residual`` rounded to that dtype, and ``normed`` is computed from it.
    """
    n_rows, cols = x.shape
    assert cols <= MAX_HIDDEN, f"H={cols} exceeds MAX_HIDDEN={MAX_HIDDEN}"
    out = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    total = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    weight_tile = None if weight is None else broadcast_rows(weight, cols)
    eps_tile = _eps_tile(eps)
    for start, parts, per in program_row_blocks(n_rows, rows_per_partition(cols, TARGET_COLS, MAX_HIDDEN)):
        x_tile = load_block(x, start, parts, per)
        r_tile = load_block(residual, start, parts, per)
        # x + residual in fp32 on VectorE, rounded once to the input dtype.
        s_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s_tile, data1=x_tile, data2=r_tile, op=nl.add)
        nisa.dma_copy(dst=block_rows(total, start, parts, per), src=s_tile)
        out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        _normalize_block(out_tile, s_tile, parts, per, cols, weight_tile, eps_tile)
        nisa.dma_copy(dst=block_rows(out, start, parts, per), src=out_tile)
    return out, total
