"""RMSNorm and LayerNorm for a few rows, each row spread over a group of G partitions.

    rms_norm:   out = x * rsqrt(mean(x**2) + eps) * weight
    layer_norm: out = (x - mean) * rsqrt(var + eps) * weight + bias

The other decode layout (norm_decode.py) puts every row on all 128 partitions, H / 128
columns each: partition p reads N runs of H / 128 elements, and a row's statistics vary
along the free dim, so every step is a tensor_tensor with the statistics broadcast
(stride 0) and the sums of a row need a pass of their own per statistic. Here row r of a
block takes partitions r*G .. r*G + G - 1, partition r*G + j holding the contiguous
columns j*F .. j*F + F - 1 (F = H / G):
    * the block is one contiguous HBM range, so its load and store move one run of F
      elements per partition (few, long DMA chunks: what the DMA guide's efficiency curve
      rewards, [D] in docs/cost-model.md "DMA");
    * a row's statistics are (P, 1) per-partition scalars, so ScalarE sums (x - K)**2 in
      its accumulator with K as the activation's bias, VectorE makes c = x - K and sums it
      in one tensor_scalar_reduce, and the last steps take the statistics as scalar
      operands of two-op instructions ((c - m2) * weight, then * rstd + bias);
    * TensorE sums a row's G partials and puts the result on each of its G partitions in one
      matmul: the stationary is 1/H where two partitions belong to the same row
      (_group_matrix), 0 elsewhere.
The rows are cut into two parts (tiling.share): at LNC=2 each program takes one, at LNC=1
the one program takes both in turn. G is the largest power of two with G * ceil(N / 2)
<= 128 (group_size), from the total row count, so each row gets the same G, partitions
and instructions at both degrees (the same bits; tests/ops/test_norm_decode.py). Which
shapes take this layout: ``takes`` (limits.py). The weight and bias [H] are loaded once
per program as [rows * G, F], the [G, F] view of the vector repeated for every row of a
part (a stride-0 DMA source, as nki-library's mlp_tkg loads its bias broadcast over
tokens), after the parts' x.

LayerNorm's statistics are those of norm_decode.py (its module docstring): each row is
centred on a shift K, the sums of c = x - K and c**2 give m2 = mean(c) and mean(c**2), and
var = mean(c**2) - m2**2, y = c - m2. K is the mean of 128 elements of the row (the first
128 / G of each of its partitions; _row_shift) for 16-bit x: (K - mean)**2 <= (H / 128) *
var by Cauchy-Schwarz (any 128 of the row's elements), as there; for fp32 x the row's mean (a VectorE pass and a matmul
first: the two-pass variance). eps is in the PSUM tile the statistics' matmul accumulates
onto, so var + eps is one VectorE instruction.
Each element takes the fp32 operations of norm_decode.py's LayerNorm forms, in the same
order (c = x - K; y = c - m2; y * weight; * rstd; + bias; one rounding to the output dtype),
but its row's sums are taken over other partial sums (F per partition, G partitions), so
the two layouts differ in the last bits.
"""

import nki.isa as nisa
import nki.language as nl

from .limits import NORM_DECODE_GROUPED_MIN_ELEMENTS as GROUPED_MIN_ELEMENTS
from .limits import NORM_DECODE_GROUPED_MIN_PARTITIONS as GROUPED_MIN_PARTITIONS
from .limits import NORM_DECODE_GROUPED_MIN_ROWS as GROUPED_MIN_ROWS
from .tiling import PARTITIONS, WORK_PARTS, cdiv, fp32_column, program_parts, share


def group_size(total_rows):
    """G: the largest power of two with G * ceil(N / 2) <= 128, N = ``total_rows``: the
    larger of the two parts the rows are cut into (one per program at LNC=2, both in turn
    at LNC=1) fills the partitions."""
    per_part = cdiv(total_rows, WORK_PARTS)
    g = PARTITIONS
    while g > 1 and g * per_part > PARTITIONS:
        g //= 2
    return g


def takes(total_rows, cols):
    """Whether the grouped layout serves N = ``total_rows`` rows of H = ``cols`` (from the
    totals, so both degrees take the same form): the larger of the two parts (ceil(N / 2)
    rows) has at least GROUPED_MIN_ROWS rows, its groups fill at least
    GROUPED_MIN_PARTITIONS partitions, and the other layout would give each partition at
    least GROUPED_MIN_ELEMENTS of its elements (ceil(N / 2) * H / 128); limits.py says why."""
    per_part = cdiv(total_rows, WORK_PARTS)
    return (per_part >= GROUPED_MIN_ROWS and per_part * group_size(total_rows) >= GROUPED_MIN_PARTITIONS
            and per_part * (cols // PARTITIONS) >= GROUPED_MIN_ELEMENTS)


def _group_matrix(g, scales):
    """[128, 128] SBUF tiles, one per (value, dtype) of ``scales``: value where partitions
    p and q hold the same row (p // g == q // g), else 0. Same row means -g < g * (q // g) - p
    <= 0, an affine value over the pattern (q // g, q % g): two GpSimd affine_selects on a
    GpSimd memset give the first tile (on one engine: no hand-over between the three);
    ScalarE scales it into the others. All of it runs while x loads (the first tile is the
    one x's first matmul needs)."""
    value0, dtype0 = scales[0]
    fill = nl.ndarray((PARTITIONS, PARTITIONS), dtype=dtype0, buffer=nl.sbuf)
    nisa.memset(dst=fill, value=float(value0), engine=nisa.engine.gpsimd)
    pattern = [[g, PARTITIONS // g], [0, g]]                      # g * (q // g)
    upper = nl.ndarray((PARTITIONS, PARTITIONS), dtype=dtype0, buffer=nl.sbuf)
    nisa.affine_select(dst=upper, pattern=pattern, channel_multiplier=-1, on_true_tile=fill,
                       on_false_value=0.0, cmp_op=nl.less_equal)
    first = nl.ndarray((PARTITIONS, PARTITIONS), dtype=dtype0, buffer=nl.sbuf)
    nisa.affine_select(dst=first, pattern=pattern, channel_multiplier=-1, offset=g, on_true_tile=upper,
                       on_false_value=0.0, cmp_op=nl.greater)
    tiles = [first]
    for value, dtype in scales[1:]:
        tile = nl.ndarray((PARTITIONS, PARTITIONS), dtype=dtype, buffer=nl.sbuf)
        nisa.activation(dst=tile, op=nl.copy, data=first, scale=float(value) / float(value0))
        tiles.append(tile)
    return tiles


def _group_sums(dst, matrix, partials):
    """dst [P, K] PSUM += for each partition, the sum over its row's partitions of
    ``partials`` [P, K] times the matrix's value (TensorE)."""
    p = partials.shape[0]
    nisa.nc_matmul(dst=dst, stationary=matrix[0:p, 0:p], moving=partials, accumulate=True)


def _zero_eps_psum(p, eps):
    """[p, 2] fp32 PSUM holding [0, eps] on every partition, written by a matmul (a
    one-partition contraction) before x arrives, for the statistics' matmul to accumulate
    onto (matmuls accumulate onto what a matmul wrote)."""
    one = nl.ndarray((1, p), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=one, value=1.0)
    values = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=values, value=float(eps))
    nisa.memset(dst=values[:, 0:1], value=0.0)
    acc = nl.ndarray((p, 2), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=one, moving=values)
    return acc


def _row_shift(x_tile, g, shift_matrix, mean_matrix):
    """(P, 1) fp32 K of every partition's row, in PSUM or SBUF. 16-bit x: the mean of the
    first 128 / G elements of each of the row's G partitions, 128 elements in all (TensorE
    straight from x with ``shift_matrix``, 1/128 in x's dtype; VectorE adds the columns when
    there are several). fp32 x: the row's mean (VectorE sums each partition, TensorE the
    row with ``mean_matrix``, 1/H): the two-pass variance."""
    p = x_tile.shape[0]
    if x_tile.dtype == nl.float32:
        sums = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=sums, op=nl.add, data=x_tile, axis=1)
        mean = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=mean, stationary=mean_matrix[0:p, 0:p], moving=sums)
        return mean
    per_partition = PARTITIONS // g
    sums = nl.ndarray((p, per_partition), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=sums, stationary=shift_matrix[0:p, 0:p], moving=x_tile[:, 0:per_partition])
    if per_partition == 1:
        return sums
    shift = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=shift, op=nl.add, data=sums, axis=1)
    return shift


def _rows_view(t, first_row, rows, g):
    """[rows * G, F] view of rows [first_row, first_row + rows) of an HBM [N, H] tensor:
    partition r * G + j holds row r's columns j * F .. j * F + F - 1 (one contiguous run)."""
    cols = t.shape[1]
    return t[first_row:first_row + rows, :].reshape((rows * g, cols // g))


def _vector_per_row(v, g, rows):
    """[rows * G, F] SBUF copy of an HBM [H] vector laid out like _rows_view for each of
    ``rows`` rows (or None): one DMA from the [G, F] view repeated over the rows (stride 0)."""
    if v is None:
        return None
    f = v.shape[0] // g
    tile = nl.ndarray((rows * g, f), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=v.reshape((1, g, f)).broadcast(0, rows))
    return tile


def _run(x, vectors, block_body, scales, eps):
    """What both norms do around a block: the group matrices (``scales``), the per-row
    weight / bias tiles, then per block of this program's rows: load, ``block_body``
    (x_tile, out_tile, vector tiles, g, matrices, eps), store. Returns the shared_hbm output."""
    total_rows, cols = x.shape
    assert cols % PARTITIONS == 0, f"H={cols} is not a multiple of {PARTITIONS}"
    out = nl.ndarray((total_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    g = group_size(total_rows)
    # the rows' two parts: one per program at LNC=2, both in turn at LNC=1 (the same
    # blocks, so the same bits)
    parts = [share(total_rows, part, WORK_PARTS) for part in range(WORK_PARTS)]
    blocks = [(lo, hi - lo) for lo, hi in program_parts(parts) if hi > lo]
    if not blocks:
        return out
    f = cols // g
    most = max(rows for _, rows in blocks)
    matrices = _group_matrix(g, scales)
    # every block's x first (their statistics come first), weight / bias after
    x_tiles = []
    for first_row, rows in blocks:
        x_tile = nl.ndarray((rows * g, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_tile, src=_rows_view(x, first_row, rows, g))
        x_tiles.append(x_tile)
    vector_tiles = [_vector_per_row(v, g, most) for v in vectors]
    for (first_row, rows), x_tile in zip(blocks, x_tiles):
        p = rows * g
        out_tile = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        block_body(x_tile, out_tile, [None if t is None else t[0:p, :] for t in vector_tiles], g, matrices, eps)
        nisa.dma_copy(dst=_rows_view(out, first_row, rows, g), src=out_tile)
    return out


# ----------------------------------------------------------------------------- RMSNorm

def _rms_block(x_tile, out_tile, vector_tiles, g, matrices, eps):
    """sum(x**2) per partition in ScalarE's accumulator; TensorE the row's mean; rsqrt on
    ScalarE; (x * rstd) * weight in one VectorE instruction."""
    (weight_tile,), (mean_matrix,) = vector_tiles, matrices
    p, f = x_tile.shape
    discard = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    sum_sq = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=discard, op=nl.square, data=x_tile, reduce_op=nl.add, reduce_res=sum_sq,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    mean_sq = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=mean_sq, stationary=mean_matrix[0:p, 0:p], moving=sum_sq)
    rstd = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_sq, bias=fp32_column(eps)[0:p, :])
    if weight_tile is None:
        nisa.tensor_scalar(dst=out_tile, data=x_tile, op0=nl.multiply, operand0=rstd)
    else:
        nisa.scalar_tensor_tensor(dst=out_tile, data=x_tile, op0=nl.multiply, operand0=rstd,
                                  op1=nl.multiply, operand1=weight_tile)


def rms_norm_grouped(x, weight, eps):
    """RMSNorm of x [N, H] (H a multiple of 128) in the grouped layout; HBM [N, H] out."""
    cols = x.shape[1]
    return _run(x, (weight,), _rms_block, ((1.0 / cols, nl.float32),), eps)


# ----------------------------------------------------------------------------- LayerNorm

def _layer_block(x_tile, out_tile, vector_tiles, g, matrices, eps):
    """K (_row_shift); c = x - K with its per-partition sum on VectorE while ScalarE sums
    (K - x)**2 = c**2; TensorE gives m2 = mean(c) and mean(c**2) + eps on each of the row's
    partitions; var + eps = that - m2 * m2 and rstd = max(var + eps, eps) ** -0.5 on VectorE
    (the max: var can round below 0 for constant rows of large values); then
    (c - m2) * weight and * rstd + bias, two ops per VectorE instruction."""
    weight_tile, bias_tile = vector_tiles
    shift_matrix, mean_matrix = matrices[0], matrices[-1]
    p, f = x_tile.shape
    stats = _zero_eps_psum(p, eps)                                      # PSUM [p, 2]: [0, eps]
    shift = _row_shift(x_tile, g, shift_matrix, mean_matrix)            # (p, 1): K
    partials = nl.ndarray((p, 2), dtype=nl.float32, buffer=nl.sbuf)     # [sum c, sum c**2]
    centred = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=centred, data=x_tile, op0=nl.subtract, operand0=shift, reduce_op=nl.add,
                              reduce_res=partials[:, 0:1])
    discard = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=discard, op=nl.square, data=x_tile, scale=-1.0, bias=shift, reduce_op=nl.add,
                    reduce_res=partials[:, 1:2], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    _group_sums(stats, mean_matrix, partials)                           # [m2, mean(c**2) + eps]
    m2, mean_sq_eps = stats[:, 0:1], stats[:, 1:2]
    var_eps = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=var_eps, data=m2, op0=nl.multiply, operand0=m2,
                       op1=nl.subtract, operand1=mean_sq_eps, reverse1=True)
    rstd = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=rstd, data=var_eps, op0=nl.maximum, operand0=float(eps), op1=nl.power, operand1=-0.5)
    if weight_tile is not None:
        # y * weight, y = c - m2 (fp32)
        nisa.scalar_tensor_tensor(dst=centred, data=centred, op0=nl.subtract, operand0=m2,
                                  op1=nl.multiply, operand1=weight_tile)
        if bias_tile is None:
            nisa.tensor_scalar(dst=out_tile, data=centred, op0=nl.multiply, operand0=rstd)
        else:
            nisa.scalar_tensor_tensor(dst=out_tile, data=centred, op0=nl.multiply, operand0=rstd,
                                      op1=nl.add, operand1=bias_tile)
        return
    if bias_tile is None:
        nisa.tensor_scalar(dst=out_tile, data=centred, op0=nl.subtract, operand0=m2, op1=nl.multiply,
                           operand1=rstd)
        return
    nisa.tensor_scalar(dst=centred, data=centred, op0=nl.subtract, operand0=m2, op1=nl.multiply, operand1=rstd)
    nisa.tensor_tensor(dst=out_tile, data1=centred, data2=bias_tile, op=nl.add)


def layer_norm_grouped(x, weight, bias, eps):
    """LayerNorm of x [N, H] (H a multiple of 128) in the grouped layout; HBM [N, H] out."""
    cols = x.shape[1]
    # the shift's matrix first (x's first matmul), unless x is fp32 (its mean's)
    scales = ((1.0 / cols, nl.float32),)
    if x.dtype != nl.float32:
        scales = ((1.0 / PARTITIONS, x.dtype),) + scales
    return _run(x, (weight, bias), _layer_block, scales, eps)
