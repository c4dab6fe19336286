"""LayerNorm over the last dimension: ``(x - mean) * rsqrt(var + eps) * weight + bias``.

Dimensions:
    N: rows (any N >= 1).
    H: normalised size, 1 <= H <= MAX_HIDDEN (8192; checked by the op wrapper).
Layout:
    Rows on partitions, in blocks of 128 * J consecutive rows (partition p holds rows
    [p*J, (p+1)*J) of the block: one contiguous DMA of J*H elements per partition, J grown
    until a transfer holds TARGET_COLS elements). The last < 128 rows form one block with
    J = 1. weight and bias are broadcast once to all 128 partitions (stride-0 DMA).
Engines, per row:
    VectorE  bn_stats on <= 512-element chunks, bn_aggr -> mean and (population) variance, fp32
    ScalarE  rsqrt(var + eps) on [P, J]; VectorE -mean * rstd on [P, J] (tiny)
    then two paths, split by rows when a partition holds J > 1 rows, else by columns, so
    that no engine outruns the others (shares derived at the constants below):
      VectorE path:  (x - mean) * weight, then (. * rstd) + bias: two scalar_tensor_tensor
      other path:    ScalarE y = x * rstd - mean * rstd (fp32), GpSimd y * weight, GpSimd + bias
    weight only: VectorE path (x - mean) * weight then ScalarE * rstd; other path ScalarE y,
    GpSimd y * weight. No weight/bias: ScalarE y only. Bias only: the op passes weight = ones.
    Intermediates stay fp32; fresh SBUF tiles per block let block i+1's load overlap block
    i's compute.
Expected error:
    statistics and arithmetic in fp32, intermediates kept in fp32, one rounding to the output
    dtype (bf16: <= 2**-8 relative; fp32: ~1e-6 relative to the output scale).
"""

import nki
import nki.isa as nisa
import nki.language as nl

PARTITIONS = 128
# Row packing target: 2048 elements per partition per DMA = 4 KiB bf16 / 8 KiB fp32.
TARGET_COLS = 2048
# Largest H: [128, 8192] fp32 tiles are 32 KiB per partition; input, fp32 scratch, output,
# weight and bias for one block plus the next block's input stay under trn2's 224 KiB.
MAX_HIDDEN = 8192
# bn_stats reads at most 512 elements per partition (nl.tile_size.bn_stats_fmax).
BN_CHUNK = 512
BN_STATS_WIDTH = 6   # (count, mean, var*count) for even and odd elements
BN_AGGR_WIDTH = 2    # (mean, var)
# Shares of the affine step given to the VectorE path. Per element on trn2 (cost-model
# rules): VectorE one input pass 1.04 ns (0.96 GHz), two-input pass 2.08 ns; ScalarE pass
# 0.83 ns; GpSimd two-input pass 1.67 ns (1.2 GHz). VectorE always runs bn_stats (1.04).
#   weight + bias: VectorE 1.04 + 4.17a, GpSimd 3.33(1 - a)  -> a = 0.3, both 2.31 ns
#   weight only:   VectorE 1.04 + 2.08a, GpSimd 1.67(1 - a)  -> a = 0.2, both 1.46 ns
# In fp32 (2.78 ns of HBM traffic per element) both stay DMA-bound; in bf16 (1.39 ns) the
# affine case is engine-bound: 2.31 ns is the least this engine split can reach.
VECTOR_SHARE_AFFINE = 0.3
VECTOR_SHARE_WEIGHT = 0.2


def _row_blocks(n_rows, cols):
    """[(first_row, partitions, rows_per_partition)] covering rows [0, n_rows)."""
    per_max = max(1, min(-(-TARGET_COLS // cols), MAX_HIDDEN // cols))
    blocks = []
    start = 0
    while n_rows - start >= PARTITIONS:
        per = min(per_max, (n_rows - start) // PARTITIONS)
        blocks.append((start, PARTITIONS, per))
        start += PARTITIONS * per
    if start < n_rows:
        blocks.append((start, n_rows - start, 1))
    return blocks


def _broadcast_rows(vec_hbm, cols):
    """[128, cols] SBUF copy of a [cols] HBM vector on every partition (one stride-0 DMA)."""
    tile = nl.ndarray((PARTITIONS, cols), dtype=vec_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=vec_hbm.reshape((1, cols)).broadcast(0, PARTITIONS))
    return tile


def _split(n, share):
    """Index splitting range(n) into a VectorE-path part [0, cut) and the other path."""
    return min(n, max(0, int(round(n * share))))


def _affine_segment(dst, src, stats, weight, bias, on_vector):
    """dst = (src - mean) * rstd (* weight) (+ bias) for one [P, w] segment."""
    mean, rstd, neg_mean_rstd = stats
    parts, width = src.shape[0], src.shape[-1]
    if weight is None:
        # y = x * rstd - mean * rstd in one ScalarE pass, rounded once
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=rstd, bias=neg_mean_rstd)
        return
    scratch = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf)
    if on_vector:
        # (x - mean) * weight on VectorE
        nisa.scalar_tensor_tensor(dst=scratch, data=src, op0=nl.subtract, operand0=mean,
                                  op1=nl.multiply, operand1=weight)
        if bias is None:
            nisa.activation(dst=dst, op=nl.copy, data=scratch, scale=rstd)       # ScalarE
        else:
            nisa.scalar_tensor_tensor(dst=dst, data=scratch, op0=nl.multiply, operand0=rstd,
                                      op1=nl.add, operand1=bias)                    # VectorE
        return
    nisa.activation(dst=scratch, op=nl.copy, data=src, scale=rstd, bias=neg_mean_rstd)  # ScalarE
    if bias is None:
        nisa.tensor_tensor(dst=dst, data1=scratch, data2=weight, op=nl.multiply,
                           engine=nisa.engine.gpsimd)
        return
    scaled = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=scaled, data1=scratch, data2=weight, op=nl.multiply,
                       engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=dst, data1=scaled, data2=bias, op=nl.add, engine=nisa.engine.gpsimd)


@nki.jit
def layer_norm_kernel(x, weight=None, bias=None, eps=1e-5):
    """Return ``layer_norm(x, (H,), weight, bias, eps)``.

    Args:
        x: HBM [N, H], float32/bfloat16/float16.
        weight: HBM [H] (any float dtype) or None.
        bias: HBM [H] (any float dtype) or None; needs ``weight`` (the op passes ones).
        eps: float added to the variance.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    n_rows, cols = x.shape
    assert cols <= MAX_HIDDEN, f"H={cols} exceeds MAX_HIDDEN={MAX_HIDDEN}"
    assert bias is None or weight is not None, "bias without weight: pass weight=ones"
    out = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    weight_tile = None if weight is None else _broadcast_rows(weight, cols)
    bias_tile = None if bias is None else _broadcast_rows(bias, cols)
    eps_tile = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_tile, value=eps)
    n_chunks = -(-cols // BN_CHUNK)

    for start, parts, per in _row_blocks(n_rows, cols):
        rows = parts * per
        x_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_tile, src=x[start:start + rows, :].reshape((parts, per, cols)))

        # mean / variance per row: bn_stats per <= 512-element chunk, bn_aggr per row (VectorE).
        stats = nl.ndarray((parts, per, n_chunks * BN_STATS_WIDTH), dtype=nl.float32, buffer=nl.sbuf)
        mean_var = nl.ndarray((parts, per, BN_AGGR_WIDTH), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(per):
            for c in range(n_chunks):
                c0 = c * BN_CHUNK
                c1 = min(cols, c0 + BN_CHUNK)
                nisa.bn_stats(dst=stats[:, j, c * BN_STATS_WIDTH:(c + 1) * BN_STATS_WIDTH],
                              data=x_tile[:, j, c0:c1])
            nisa.bn_aggr(dst=mean_var[:, j, :], data=stats[:, j, :])
        # rstd = rsqrt(var + eps) for all J rows at once: [parts, per] fp32 on ScalarE.
        rstd = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_var[:, :, 1], bias=eps_tile[0:parts, :])

        # -mean * rstd, the ScalarE bias that centres and scales in one pass
        neg_mean_rstd = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=neg_mean_rstd, data=mean_var[:, :, 0], op0=nl.multiply,
                                  operand0=-1.0, op1=nl.multiply, operand1=rstd)

        out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        share = 0.0 if weight_tile is None else (
            VECTOR_SHARE_WEIGHT if bias_tile is None else VECTOR_SHARE_AFFINE)
        if per > 1:
            cut = _split(per, share)
            segments = [(j, 0, cols, j < cut) for j in range(per)]
        else:
            cut = _split(cols, share)
            segments = [(0, lo, hi, on_vector) for lo, hi, on_vector in ((0, cut, True), (cut, cols, False))
                        if hi > lo]
        for j, lo, hi, on_vector in segments:
            stats = (mean_var[:, j, 0:1], rstd[:, j:j + 1], neg_mean_rstd[:, j:j + 1])
            _affine_segment(out_tile[:, j, lo:hi], x_tile[:, j, lo:hi], stats,
                            None if weight_tile is None else weight_tile[0:parts, lo:hi],
                            None if bias_tile is None else bias_tile[0:parts, lo:hi], on_vector)
        nisa.dma_copy(dst=out[start:start + rows, :].reshape((parts, per, cols)), src=out_tile)
    return out
