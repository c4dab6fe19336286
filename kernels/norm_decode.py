"""RMSNorm and LayerNorm for a few rows (token generation: 1-64 tokens), hidden on partitions.

    rms_norm:   out = x * rsqrt(mean(x**2) + eps) * weight
    layer_norm: out = (x - mean) * rsqrt(var + eps) * weight + bias

With rows on partitions (kernels/rms_norm.py, layer_norm.py) a decode step of N < 128
tokens uses N lanes and every engine pass costs the whole row H per instruction: ScalarE
and VectorE take ~H cycles for a few tokens. Here the hidden dim goes on the partitions
instead, so all 128 lanes work and each pass costs N * H / 128 cycles.

Dimensions:
    N: rows (tokens), 1 <= N <= DECODE_MAX_ROWS.
    H: normalised size, a multiple of 128 (H = 128 * H1), N * H1 <= DECODE_MAX_ELEMENTS.
Layout:
    x [N, H] in HBM is read as [128, N, H1]: partition p holds columns p*H1 .. p*H1 + H1 - 1
    of every row (one DMA; each partition reads N runs of H1 elements). weight / bias [H]
    are [128, H1] (contiguous per partition). The output is written back the same way.
Engines:
    VectorE  per-partition partial sums over H1: sum(x) and/or sum(x**2) -> [128, N] fp32
    TensorE  the sum over partitions: ones[128, 128]ᵀ · partials [128, N] -> [128, N] fp32
             PSUM, every partition holding each row's total (fp32 matmul: exact accumulation
             order aside, the partials stay fp32)
    ScalarE  rsqrt(total / H + eps) -> [128, N] fp32 (reads PSUM)
    VectorE / GpSimd  x * rstd (broadcast over H1), then * weight (+ bias), fp32 inside, one
             rounding to the output dtype
    LayerNorm takes two passes (mean, then the centred squares) like the row kernel's
    ScalarE path: exact for rows with a large mean.
LNC:
    each program takes a contiguous half of the rows (``program_share``); rows are
    independent, so both degrees give the same output.
Expected error:
    as the row kernels: statistics in fp32, one rounding to the output dtype (bf16 <= 2**-8
    relative; fp32 ~1e-6).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .limits import NORM_DECODE_MAX_ELEMENTS as DECODE_MAX_ELEMENTS
from .limits import NORM_DECODE_MAX_ROWS as DECODE_MAX_ROWS
from .tiling import PARTITIONS, program_share


def _check(x):
    n_rows, cols = x.shape
    assert cols % PARTITIONS == 0, f"H={cols} is not a multiple of {PARTITIONS}"
    assert n_rows <= DECODE_MAX_ROWS, f"N={n_rows} exceeds DECODE_MAX_ROWS={DECODE_MAX_ROWS}"
    assert n_rows * (cols // PARTITIONS) <= DECODE_MAX_ELEMENTS, \
        f"N * H / 128 = {n_rows * (cols // PARTITIONS)} exceeds DECODE_MAX_ELEMENTS={DECODE_MAX_ELEMENTS}"
    return n_rows, cols, cols // PARTITIONS


def _hidden_on_partitions(t, h1):
    """[128, N, H1] view of an HBM [N, H] tensor (partition p: columns p*H1 .. p*H1+H1-1)."""
    return t.reshape((t.shape[0], PARTITIONS, h1)).permute((1, 0, 2))


def _vector_on_partitions(v, h1):
    """[128, H1] SBUF copy of an HBM [H] vector laid out like _hidden_on_partitions."""
    tile = nl.ndarray((PARTITIONS, h1), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=v.reshape((PARTITIONS, h1)))
    return tile


def _row_totals(partials, n_rows):
    """[128, N] fp32 PSUM: every partition holds, per row, the sum of ``partials`` [128, N]
    over the 128 partitions (TensorE with a ones stationary)."""
    ones = nl.ndarray((PARTITIONS, PARTITIONS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    totals = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=totals, stationary=ones, moving=partials)
    return totals


def _partial_sums(data, n_rows, h1, square):
    """[128, N] fp32: per partition and row, the sum over H1 of data (or data**2)."""
    partials = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    if square:
        sq = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=sq, data1=data, data2=data, op=nl.multiply)
        nisa.tensor_reduce(dst=partials, op=nl.add, data=sq, axis=2)
    else:
        nisa.tensor_reduce(dst=partials, op=nl.add, data=data, axis=2)
    return partials


def _rstd(sum_sq, cols, eps):
    """[128, N] fp32 SBUF: rsqrt(sum_sq / H + eps) on ScalarE (sum_sq in PSUM)."""
    n_rows = sum_sq.shape[1]
    eps_tile = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_tile, value=eps)
    rstd = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=sum_sq, scale=1.0 / cols, bias=eps_tile)
    return rstd


def _scale_and_affine(out_tile, centred, rstd, weight_tile, bias_tile, n_rows, h1):
    """out = centred * rstd (* weight) (+ bias), fp32 inside, one rounding into out_tile."""
    shape = (PARTITIONS, n_rows, h1)
    rstd_b = rstd.expand_dim(2).broadcast(2, h1)                # [128, N, H1], stride 0 over H1
    if weight_tile is None and bias_tile is None:
        nisa.tensor_tensor(dst=out_tile, data1=centred, data2=rstd_b, op=nl.multiply)
        return
    scaled = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=scaled, data1=centred, data2=rstd_b, op=nl.multiply)
    last = weight_tile is not None and bias_tile is None
    if weight_tile is not None:
        w_b = weight_tile.expand_dim(1).broadcast(1, n_rows)      # [128, N, H1], stride 0 over N
        dst = out_tile if last else scaled
        nisa.tensor_tensor(dst=dst, data1=scaled, data2=w_b, op=nl.multiply, engine=nisa.engine.gpsimd)
    if bias_tile is not None:
        b_b = bias_tile.expand_dim(1).broadcast(1, n_rows)
        nisa.tensor_tensor(dst=out_tile, data1=scaled, data2=b_b, op=nl.add, engine=nisa.engine.gpsimd)


@nki.jit
def rms_norm_decode_kernel(x, weight=None, eps=1e-6):
    """Return ``x * rsqrt(mean(x**2, -1) + eps) * weight`` for a few rows.

    Args:
        x: HBM [N, H], N <= DECODE_MAX_ROWS, H a multiple of 128; float32/bfloat16/float16.
        weight: HBM [H] of any float dtype, or None.
        eps: float added to the mean square.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    total_rows, cols, h1 = _check(x)
    out = nl.ndarray((total_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    lo, hi = program_share(total_rows)          # this program's rows
    if hi == lo:
        return out
    n_rows = hi - lo
    x, out_rows = x[lo:hi, :], out[lo:hi, :]
    x_tile = nl.ndarray((PARTITIONS, n_rows, h1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=_hidden_on_partitions(x, h1))
    weight_tile = None if weight is None else _vector_on_partitions(weight, h1)
    totals = _row_totals(_partial_sums(x_tile, n_rows, h1, square=True), n_rows)
    rstd = _rstd(totals, cols, eps)
    out_tile = nl.ndarray((PARTITIONS, n_rows, h1), dtype=x.dtype, buffer=nl.sbuf)
    _scale_and_affine(out_tile, x_tile, rstd, weight_tile, None, n_rows, h1)
    nisa.dma_copy(dst=_hidden_on_partitions(out_rows, h1), src=out_tile)
    return out


@nki.jit
def layer_norm_decode_kernel(x, weight=None, bias=None, eps=1e-5):
    """Return ``layer_norm(x, (H,), weight, bias, eps)`` for a few rows.

    Args:
        x: HBM [N, H], N <= DECODE_MAX_ROWS, H a multiple of 128; float32/bfloat16/float16.
        weight, bias: HBM [H] of any float dtype, or None (each independently).
        eps: float added to the variance.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    total_rows, cols, h1 = _check(x)
    out = nl.ndarray((total_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    lo, hi = program_share(total_rows)          # this program's rows
    if hi == lo:
        return out
    n_rows = hi - lo
    x, out_rows = x[lo:hi, :], out[lo:hi, :]
    x_tile = nl.ndarray((PARTITIONS, n_rows, h1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=_hidden_on_partitions(x, h1))
    weight_tile = None if weight is None else _vector_on_partitions(weight, h1)
    bias_tile = None if bias is None else _vector_on_partitions(bias, h1)
    # pass 1: the mean per row, on every partition (its fp32 sum can be off by ~H ulps)
    sums = _row_totals(_partial_sums(x_tile, n_rows, h1, square=False), n_rows)
    neg_mean = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=neg_mean, op=nl.copy, data=sums, scale=-1.0 / cols)    # ScalarE, reads PSUM
    # pass 2: c = x - mean; the sums of c and c**2 in one matmul; the small residual mean m2
    # of c corrects pass 1: var = mean(c**2) - m2**2, y = (c - m2) * rstd (exact for rows
    # with a large mean, like the row kernel's two-pass statistics)
    centred = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=centred, data1=x_tile, data2=neg_mean.expand_dim(2).broadcast(2, h1), op=nl.add)
    partials = nl.ndarray((PARTITIONS, 2 * n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=partials[:, 0:n_rows], op=nl.add, data=centred, axis=2)
    squares = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=squares, data1=centred, data2=centred, op=nl.multiply)
    nisa.tensor_reduce(dst=partials[:, n_rows:2 * n_rows], op=nl.add, data=squares, axis=2)
    totals = _row_totals(partials, 2 * n_rows)                  # [128, 2N] fp32 PSUM: sum c | sum c**2
    neg_m2 = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=neg_m2, op=nl.copy, data=totals[:, 0:n_rows], scale=-1.0 / cols)
    m2_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=m2_sq, data1=neg_m2, data2=neg_m2, op=nl.multiply)
    var = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=var, data=totals[:, n_rows:2 * n_rows], op0=nl.multiply, operand0=1.0 / cols,
                              op1=nl.subtract, operand1=m2_sq)
    eps_tile = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_tile, value=eps)
    rstd = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=var, bias=eps_tile)
    nisa.tensor_tensor(dst=centred, data1=centred, data2=neg_m2.expand_dim(2).broadcast(2, h1), op=nl.add)
    out_tile = nl.ndarray((PARTITIONS, n_rows, h1), dtype=x.dtype, buffer=nl.sbuf)
    _scale_and_affine(out_tile, centred, rstd, weight_tile, bias_tile, n_rows, h1)
    nisa.dma_copy(dst=_hidden_on_partitions(out_rows, h1), src=out_tile)
    return out
