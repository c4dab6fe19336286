"""RMSNorm and LayerNorm for a few rows (token generation: 1-40 tokens), hidden on partitions.

    rms_norm:   out = x * rsqrt(mean(x**2) + eps) * weight
    layer_norm: out = (x - mean) * rsqrt(var + eps) * weight + bias

With rows on partitions (kernels/rms_norm.py, layer_norm.py) a decode step of N < 128
tokens uses N lanes and every engine pass costs the whole row H per instruction: ScalarE
and VectorE take ~H cycles for a few tokens. Here the hidden dim goes on the partitions
instead, so all 128 lanes work and each pass costs N * H / 128 cycles. Every TensorE sum
over the partitions uses a stationary with no zeros (all 1/H or 1/128), so a row's
statistics never take another row's values: a NaN or inf stays in its row. Where the rows
fill the partitions in groups (8 or more rows a part whose groups fill at least 120
partitions, and at least 256 elements a partition in this layout: kernels/limits.py,
kernels/norm_decode_grouped.py ``takes``), the kernels hand the launch to the grouped
layout instead: each row on a group of partitions, one contiguous run each, its
statistics per-partition scalars, its sums NaN-safe too (that module's docstring).

Dimensions:
    N: rows (tokens), 1 <= N <= DECODE_MAX_ROWS.
    H: normalised size, a multiple of 128 (H = 128 * H1), N * H1 <= DECODE_MAX_ELEMENTS.
Layout:
    x [N, H] in HBM is read as [128, N, H1]: partition p holds columns p*H1 .. p*H1 + H1 - 1
    of every row (one DMA; each partition reads N runs of H1 elements). weight / bias [H]
    are [128, H1] (contiguous per partition). The output is written back the same way.
Statistics:
    per-partition partial sums over H1 (VectorE tensor_reduce or a ScalarE accumulator) ->
    [128, N] fp32; TensorE sums them over the partitions: stationary [128, 128] all 1/H,
    moving the partials -> [128, N] fp32 PSUM, every partition holding each row's mean (an
    fp32 matmul). The engines read these means straight from PSUM.
    LayerNorm centres each row on a value K (_row_shifts: fp32 rows their mean, a first
    pass; 16-bit rows the mean of 128 samples of the row, one matmul from x), then takes
    the sums of c = x - K and of c**2; the residual mean m2 = mean(c) corrects for K
    (var = mean(c**2) - m2**2, y = c - m2), so rows with a large mean keep their variance
    (K near the mean: little of mean(c**2) cancels; _row_shifts bounds it). TensorE also
    adds eps and -m2**2 into the PSUM tile the rstd step reads (one VectorE
    max(., eps) ** -0.5: the clamp keeps a variance that rounds below 0 from giving NaN);
    for a program of one row, TensorE adds eps, and VectorE subtracts m2**2 (below).
RMSNorm has two paths, chosen by the total row count (not by a program's share, so LNC=1
and LNC=2 give the same bits); LayerNorm's forms are chosen by a program's share and keep
the per-element arithmetic (below, and limits.py):
    few rows (RMSNorm, N <= ROW_LOOP_MAX_ROWS): a decode step is a chain of small dependent
        instructions, each costing mostly its fixed overhead, so per row the kernel issues
        instructions that take the row's statistics as (P, 1) operands, fusing steps:
        sum(x**2) in ScalarE's accumulator, rsqrt, (x * rstd) * weight in one
        scalar_tensor_tensor.
    more rows (RMSNorm), two rows or more in a program (LayerNorm): one instruction per step
        over all rows, the per-row statistics broadcast along H1 (stride 0) as tensor_tensor
        operands; c**2 on ScalarE, m2**2 on ScalarE while VectorE still sums the squares;
        (c - m2) * weight before rsqrt is known, so after rsqrt only * rstd (+ bias)
        remain. LayerNorm with at most PER_ROW_MAX_ROWS rows in a program (up to 4 tokens
        at LNC=2) centres each row with its sum in one VectorE instruction (or all rows in
        one pass and one reduce, when the model's figures say that is sooner:
        _row_sums_per_row) and sums each row's squares on ScalarE, and ends with one
        y * rstd + bias per row (limits.py says why that keeps the bits). A per-row
        LayerNorm chain like RMSNorm's was 0.15 us slower at 1-2 rows at the central cost
        (limits.py). Where the cost figures say so (_split_rows: more rows of wider H),
        LayerNorm's element-wise steps (c = x - K, c - m2, * weight, * rstd, + bias) are
        split by rows between VectorE and GpSimd, which work at once
        (_layer_rows_split; the same fp32 operations per element, so no bit changes).
    one row in a program (LayerNorm: 1 token, 2 at LNC=2): the per-row statistics above, but
        one matmul gives m2 and mean(c**2) + eps together and one VectorE instruction makes
        var + eps from them, so no matmul waits on m2**2; ScalarE makes -y meanwhile
        (_layer_one_row).
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

from .engine_costs import active as active_engine_costs
from .limits import NORM_DECODE_MAX_ELEMENTS as DECODE_MAX_ELEMENTS
from .limits import NORM_DECODE_MAX_ROWS as DECODE_MAX_ROWS
from .limits import NORM_DECODE_ROW_LOOP_MAX_ROWS as ROW_LOOP_MAX_ROWS
from .limits import NORM_DECODE_PER_ROW_MAX_ROWS as PER_ROW_MAX_ROWS
from .norm_decode_grouped import layer_norm_grouped, rms_norm_grouped
from .norm_decode_grouped import takes as grouped_takes
from .tiling import PARTITIONS, fp32_column, program_share



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


def _mean_matrix(count, dtype=nl.float32):
    """[128, 128] SBUF of 1/``count`` in ``dtype``: the stationary that turns per-partition
    partial sums into every partition's row means (memset on VectorE while the input loads;
    1/H in fp32 for the statistics, 1/128 in x's dtype for the shift of _row_shifts)."""
    inv = nl.ndarray((PARTITIONS, PARTITIONS), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=inv, value=1.0 / count)
    return inv


def _row_means(inv, partials):
    """[128, K] fp32 PSUM: per column, the sum of ``partials`` [128, K] over the partitions
    divided by H, on every partition (TensorE)."""
    means = nl.ndarray((PARTITIONS, partials.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=means, stationary=inv, moving=partials)
    return means


def _col(t, j):
    """Column j of a [128, K] tile as a (128, 1) operand."""
    return t[:, j:j + 1]


def _along_h1(stat, h1):
    """[128, N] per-row statistics as a [128, N, H1] operand (stride 0 over H1)."""
    return stat.expand_dim(2).broadcast(2, h1)


def _along_rows(vec, n_rows):
    """[128, H1] weight / bias as a [128, N, H1] operand (stride 0 over N)."""
    return vec.expand_dim(1).broadcast(1, n_rows)


# ----------------------------------------------------------------------------- RMSNorm

def _rms_rows(x_tile, out_tile, weight_tile, cols, eps):
    """Few rows: per row, sum(x**2) on ScalarE's accumulator; rsqrt; one VectorE pass
    (x * rstd) * weight into the output dtype."""
    n_rows, h1 = x_tile.shape[1], x_tile.shape[2]
    inv, eps_tile = _mean_matrix(cols), fp32_column(eps)
    discard = nl.ndarray((PARTITIONS, h1), dtype=nl.float32, buffer=nl.sbuf)
    sum_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    for r in range(n_rows):
        nisa.activation(dst=discard, op=nl.square, data=x_tile[:, r, :], reduce_op=nl.add,
                        reduce_res=_col(sum_sq, r), reduce_cmd=nisa.reduce_cmd.reset_reduce)
    mean_sq = _row_means(inv, sum_sq)                                  # PSUM [128, N]
    rstd = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    for r in range(n_rows):
        nisa.activation(dst=_col(rstd, r), op=nl.rsqrt, data=_col(mean_sq, r), bias=eps_tile)
        if weight_tile is None:
            nisa.tensor_scalar(dst=out_tile[:, r, :], data=x_tile[:, r, :], op0=nl.multiply,
                               operand0=_col(rstd, r))
        else:
            nisa.scalar_tensor_tensor(dst=out_tile[:, r, :], data=x_tile[:, r, :], op0=nl.multiply,
                                      operand0=_col(rstd, r), op1=nl.multiply, operand1=weight_tile)


def _rms_all(x_tile, out_tile, weight_tile, cols, eps):
    """More rows: x**2 on ScalarE, its sum over H1 on VectorE, rsqrt; x * weight on GpSimd
    meanwhile, then one multiply by rstd."""
    n_rows, h1 = x_tile.shape[1], x_tile.shape[2]
    inv, eps_tile = _mean_matrix(cols), fp32_column(eps)
    squares = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=squares, op=nl.square, data=x_tile)
    sum_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=sum_sq, op=nl.add, data=squares, axis=2)
    scaled = x_tile
    if weight_tile is not None:
        scaled = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=scaled, data1=x_tile, data2=_along_rows(weight_tile, n_rows), op=nl.multiply,
                           engine=nisa.engine.gpsimd)
    mean_sq = _row_means(inv, sum_sq)                                  # PSUM [128, N]
    rstd = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_sq, bias=eps_tile)
    nisa.tensor_tensor(dst=out_tile, data1=scaled, data2=_along_h1(rstd, h1), op=nl.multiply)


def _decode(x, vectors, rows_body, all_body, eps, grouped):
    """What both kernels do around their statistics: the shape contract (_check), then
    either the grouped layout's ``grouped`` (x, *vectors, eps) where its rule takes the shape
    (norm_decode_grouped.takes), or this layout: this program's rows of x [N, H] into SBUF as
    [128, n, H1], the per-column ``vectors`` (weight, bias; None stays None) as [128, H1],
    ``rows_body`` (total rows <= ROW_LOOP_MAX_ROWS; None: never) or ``all_body`` (x_tile,
    out_tile, *vector tiles, H, eps), the result stored back. Returns the shared_hbm output
    [N, H]."""
    total_rows, cols, h1 = _check(x)
    if grouped_takes(total_rows, cols):
        return grouped(x, *vectors, eps)
    out = nl.ndarray((total_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    lo, hi = program_share(total_rows)          # this program's rows
    if hi == lo:
        return out
    n_rows = hi - lo
    x, out_rows = x[lo:hi, :], out[lo:hi, :]
    x_tile = nl.ndarray((PARTITIONS, n_rows, h1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=_hidden_on_partitions(x, h1))
    vector_tiles = [None if v is None else _vector_on_partitions(v, h1) for v in vectors]
    out_tile = nl.ndarray((PARTITIONS, n_rows, h1), dtype=x.dtype, buffer=nl.sbuf)
    body = rows_body if rows_body is not None and total_rows <= ROW_LOOP_MAX_ROWS else all_body
    body(x_tile, out_tile, *vector_tiles, cols, eps)
    nisa.dma_copy(dst=_hidden_on_partitions(out_rows, h1), src=out_tile)
    return out


@nki.jit
def rms_norm_decode_kernel(x, weight=None, eps=1e-6):
    """Return ``x * rsqrt(mean(x**2, -1) + eps) * weight`` for a few rows.

    Args:
        x: HBM [N, H], N <= DECODE_MAX_ROWS, H a multiple of 128, N * H / 128 <=
            DECODE_MAX_ELEMENTS; float32/bfloat16/float16.
        weight: HBM [H] of any float dtype, or None.
        eps: float added to the mean square.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    return _decode(x, (weight,), _rms_rows, _rms_all, eps, rms_norm_grouped)


# ----------------------------------------------------------------------------- LayerNorm

def _row_sums_per_row(n_rows, h1):
    """Whether c = x - K and its per-partition sums are sooner from one tensor_scalar_reduce
    per row (a pass plus the accumulator read-out each, its ISA cost text "max(MIN_II, N) +
    MIN_II") than from one tensor_tensor over all rows and one tensor_reduce (two dependent
    passes): VectorE cycles, the cost model's figures (engine_costs.py). Either way the same
    fp32 operations (limits.py)."""
    costs = active_engine_costs()
    ii, fixed = costs.min_instruction_cycles, costs.vector_instr_cycles
    per_row = n_rows * (max(ii, h1) + costs.vector_reduce_readout_cycles + fixed)
    return per_row <= 2 * (max(ii, n_rows * h1) + fixed)


def _centre_rows(x_tile, centred, shift, sum_c, sum_sq):
    """c = x - K with its per-partition sums on VectorE, per row or over all rows
    (_row_sums_per_row); per row, the sum of (K - x)**2 = c**2 on ScalarE's accumulator
    (square with bias K, scale -1 on x: the same fp32 value as c**2). ``shift`` (K): [128, n]
    PSUM; ``sum_c``, ``sum_sq``: [128, n] SBUF."""
    n_rows, h1 = x_tile.shape[1], x_tile.shape[2]
    if _row_sums_per_row(n_rows, h1):
        for r in range(n_rows):
            nisa.tensor_scalar_reduce(dst=centred[:, r, :], data=x_tile[:, r, :], op0=nl.subtract,
                                      operand0=_col(shift, r), reduce_op=nl.add, reduce_res=_col(sum_c, r))
    else:
        nisa.tensor_tensor(dst=centred, data1=x_tile, data2=_along_h1(shift, h1), op=nl.subtract)
        nisa.tensor_reduce(dst=sum_c, op=nl.add, data=centred, axis=2)
    discard = nl.ndarray((PARTITIONS, h1), dtype=nl.float32, buffer=nl.sbuf)
    for r in range(n_rows):
        nisa.activation(dst=discard, op=nl.square, data=x_tile[:, r, :], scale=-1.0, bias=_col(shift, r),
                        reduce_op=nl.add, reduce_res=_col(sum_sq, r), reduce_cmd=nisa.reduce_cmd.reset_reduce)


def _centred_sums(centred, sum_c, sum_sq):
    """Per partition and row, the sums of c and of c**2 over H1 into ``sum_c`` / ``sum_sq``
    [128, N] (c = ``centred`` [128, N, H1], fp32): c**2 on ScalarE while VectorE sums c, then
    VectorE sums the squares."""
    squares = nl.ndarray(centred.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=squares, op=nl.square, data=centred)
    nisa.tensor_reduce(dst=sum_c, op=nl.add, data=centred, axis=2)
    nisa.tensor_reduce(dst=sum_sq, op=nl.add, data=squares, axis=2)


def _neg_first():
    """[128, 128] fp32 stationary: -1 on partition 0, 0 elsewhere (GpSimd memsets): adds minus
    row 0 of the moving tile (exactly) to every partition's accumulator."""
    neg_first = nl.ndarray((PARTITIONS, PARTITIONS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=neg_first, value=0.0, engine=nisa.engine.gpsimd)
    nisa.memset(dst=neg_first[0:1, :], value=-1.0, engine=nisa.engine.gpsimd)
    return neg_first


def _eps_in_psum(neg_first, n_zero, n_eps, eps):
    """[128, n_zero + n_eps] fp32 PSUM holding 0 in its first n_zero columns and eps in the
    rest, on every partition, written by TensorE before x arrives (the moving tile's row 0,
    the only row ``neg_first`` reads, is -eps / 0; GpSimd memsets) for later matmuls to
    accumulate onto."""
    cols = n_zero + n_eps
    neg_eps = nl.ndarray((PARTITIONS, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=neg_eps, value=-eps, engine=nisa.engine.gpsimd)
    if n_zero:
        nisa.memset(dst=neg_eps[:, 0:n_zero], value=0.0, engine=nisa.engine.gpsimd)
    acc = nl.ndarray((PARTITIONS, cols), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=neg_first, moving=neg_eps, accumulate=False)
    return acc


def _x_row_means(inv, x_tile):
    """[128, n] fp32 PSUM: each row's mean of x [128, n, H1] on every partition (VectorE sums
    over H1, then TensorE over the partitions)."""
    sums = nl.ndarray((PARTITIONS, x_tile.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=sums, op=nl.add, data=x_tile, axis=2)
    return _row_means(inv, sums)


def _row_shifts(inv, x_tile):
    """[128, n] fp32 PSUM: the value K each row of x [128, n, H1] is centred on (c = x - K),
    on every partition. The statistics are exact for any K (var = mean(c**2) - mean(c)**2,
    y = c - mean(c)); K only bounds how much mean(c)**2 cancels.

    fp32 x: the row's mean (VectorE sums over H1, TensorE over the partitions): the
    two-pass variance, mean(c) ~ rounding.
    16-bit x: the mean of the row's 128 samples x[p, r, 0] (columns 0, H1, 2*H1, ...), one
    TensorE matmul straight from x (stationary all 1/128 in x's dtype, exact), so no VectorE
    pass over x comes first. By Cauchy-Schwarz (K - mean)**2 <= (H / 128) * var, so
    mean(c**2) <= (1 + H1) * var: the cancellation amplifies the fp32 rounding error of
    mean(c**2) (sums of H1 terms per partition, then the matmul over 128) by at most
    1 + H1, about 7 bits at H = 16384; worst case near 2**-10 relative on the variance,
    typically far less (tests/ops/test_norm_decode.py puts the samples 60 sigma out and
    checks the 16-bit tolerance). A one-pass E[x**2] - E[x]**2 loses up to
    2 * log2(|mean| / std) bits instead (AWS's layernorm_tkg, nki-library
    core/subkernels/layernorm_tkg.py "Var(X) = E[X^2] - E[X]^2")."""
    if x_tile.dtype == nl.float32:
        return _x_row_means(inv, x_tile)
    sample_mean = _mean_matrix(PARTITIONS, x_tile.dtype)
    shifts = nl.ndarray((PARTITIONS, x_tile.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=shifts, stationary=sample_mean, moving=x_tile[:, :, 0])
    return shifts


def _layer_all(x_tile, out_tile, weight_tile, bias_tile, cols, eps):
    """Two rows or more in the program (one: _layer_one_row): K (_row_shifts); c = x - K
    (K read from PSUM); c**2 on ScalarE while VectorE sums c (a program of at most
    PER_ROW_MAX_ROWS rows: per row, _centre_rows); m2 = mean(c) and m2**2 (ScalarE) while
    VectorE sums the squares; TensorE accumulates var + eps = eps + mean(c**2) - m2**2 in one
    PSUM tile; y = (c - m2) (* weight on GpSimd) meanwhile; rstd = max(var + eps, eps) ** -0.5;
    out = y * rstd (+ bias: per row in one scalar_tensor_tensor up to PER_ROW_MAX_ROWS rows,
    else on GpSimd). Where GpSimd taking some rows' element-wise steps is modeled sooner
    (_split_rows), _layer_rows_split instead."""
    n_rows, h1 = x_tile.shape[1], x_tile.shape[2]
    if n_rows == 1:
        _layer_one_row(x_tile, out_tile, weight_tile, bias_tile, cols, eps)
        return
    if n_rows > PER_ROW_MAX_ROWS:
        vector_rows = _split_rows(n_rows, h1, weight_tile is not None, bias_tile is not None)
        if vector_rows < n_rows:
            _layer_rows_split(x_tile, out_tile, weight_tile, bias_tile, cols, eps, vector_rows)
            return
    inv, neg_first = _mean_matrix(cols), _neg_first()
    var_eps = _eps_in_psum(neg_first, 0, n_rows, eps)                 # PSUM [128, N]: eps
    shift = _row_shifts(inv, x_tile)                                    # PSUM [128, N]: K
    centred = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
    sum_c = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    sum_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    if n_rows <= PER_ROW_MAX_ROWS:
        _centre_rows(x_tile, centred, shift, sum_c, sum_sq)
    else:
        nisa.tensor_tensor(dst=centred, data1=x_tile, data2=_along_h1(shift, h1), op=nl.subtract)
        _centred_sums(centred, sum_c, sum_sq)
    m2 = _row_means(inv, sum_c)                                        # PSUM [128, N]: m2
    m2_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=m2_sq, op=nl.square, data=m2)
    nisa.tensor_tensor(dst=centred, data1=centred, data2=_along_h1(m2, h1), op=nl.subtract)
    nisa.nc_matmul(dst=var_eps, stationary=inv, moving=sum_sq, accumulate=True)       # + mean(c**2)
    nisa.nc_matmul(dst=var_eps, stationary=neg_first, moving=m2_sq, accumulate=True)  # - m2**2
    # rstd = max(var + eps, eps) ** -0.5 on VectorE (the max: var = mean(c**2) - m2**2 can
    # round below 0 for constant rows of large values, where eps cannot lift it), into PSUM:
    # a VectorE tensor_tensor with one input in PSUM costs N, not 2N
    rstd = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_scalar(dst=rstd, data=var_eps, op0=nl.maximum, operand0=float(eps), op1=nl.power, operand1=-0.5)
    if weight_tile is not None:
        nisa.tensor_tensor(dst=centred, data1=centred, data2=_along_rows(weight_tile, n_rows), op=nl.multiply,
                           engine=nisa.engine.gpsimd)
    if bias_tile is None:
        nisa.tensor_tensor(dst=out_tile, data1=centred, data2=_along_h1(rstd, h1), op=nl.multiply)
        return
    if n_rows <= PER_ROW_MAX_ROWS:
        for r in range(n_rows):
            nisa.scalar_tensor_tensor(dst=out_tile[:, r, :], data=centred[:, r, :], op0=nl.multiply,
                                      operand0=_col(rstd, r), op1=nl.add, operand1=bias_tile)
        return
    nisa.tensor_tensor(dst=centred, data1=centred, data2=_along_h1(rstd, h1), op=nl.multiply)
    nisa.tensor_tensor(dst=out_tile, data1=centred, data2=_along_rows(bias_tile, n_rows), op=nl.add,
                       engine=nisa.engine.gpsimd)


def _vectors_in_psum(h1, vector_tiles):
    """fp32 PSUM copies [128, H1] (H1 <= one PSUM bank of fp32) of weight / bias (None stays
    None) made by ScalarE, so that VectorE's y * weight and + bias read one input from PSUM
    (N cycles, not 2N: the cost model's tensor_tensor rule, [S])."""
    copies = []
    for v in vector_tiles:
        if v is None:
            copies.append(None)
            continue
        ps = nl.ndarray((PARTITIONS, h1), dtype=nl.float32, buffer=nl.psum)
        nisa.activation(dst=ps, op=nl.copy, data=v)
        copies.append(ps)
    return copies


def _split_rows(n_rows, h1, has_weight, has_bias):
    """How many of the program's rows VectorE takes for the element-wise steps (c = x - K,
    y = c - m2, y * weight, y * rstd, + bias) in _layer_rows_split; GpSimd takes the rest
    (n_rows: none, the all-rows form of _layer_all). VectorE's sums of c and c**2 wait for
    every row's c, and the output for every row's last step, so the two engines are
    balanced on those steps alone (engine_costs.py: the cost model's figures): VectorE
    reads its statistics, and weight / bias where they fit one PSUM bank, from PSUM (one
    input pass per step; two where weight / bias stay in SBUF); GpSimd reads two inputs per
    step and waits for ScalarE's SBUF copies of K and rstd (an instruction and its
    dependency latency each; m2's copy is made while VectorE sums the squares). A split
    counts only where it is sooner than the all-rows form by more than the copies of K and
    rstd take (they queue on ScalarE beside c**2 and m2**2, which the estimate does not
    schedule), and where GpSimd's instructions would do at least their fixed cost's worth
    of elements. ScalarE's PSUM copies of weight and bias for VectorE are not priced: they
    can run while x loads."""
    c = active_engine_costs()
    copies = 2 * (c.instruction_ns("scalar", n_rows) + c.dependency_ns("scalar"))
    vector_passes = [1, 1, 1] + [1 if h1 <= nl.tile_size.psum_bank_fmax else 2] * (has_weight + has_bias)
    n_steps = 3 + has_weight + has_bias
    # the all-rows form: VectorE's three steps over every row (statistics from PSUM), and
    # GpSimd's * weight and + bias between them, each waiting for the one before
    all_rows = (3 * c.instruction_ns("vector", n_rows * h1)
                + (has_weight + has_bias) * c.instruction_ns("gpsimd", n_rows * h1, rate=c.gpsimd_two_input_rate()))
    best, best_time = n_rows, all_rows
    for a in range(n_rows - 1, -1, -1):
        g = n_rows - a
        if g * h1 / c.gpsimd_two_input_rate() < c.gpsimd_instr_cycles:
            # GpSimd's instructions would be mostly their fixed cost (modeled trn2 LNC=1,
            # fp32 [64, 768]: 11 rows of 6 elements, 10.36 -> 10.70 us with them)
            continue
        vector = sum(c.instruction_ns("vector", a * h1, rate=1 / p) for p in vector_passes) if a else 0.0
        gpsimd = copies + n_steps * c.instruction_ns("gpsimd", g * h1, rate=c.gpsimd_two_input_rate())
        # the copies also queue on ScalarE beside c**2 and m2**2: the split must save more
        # than they cost once more
        t = max(vector, gpsimd) + copies
        if t < best_time:
            best, best_time = a, t
    return best


def _layer_rows_split(x_tile, out_tile, weight_tile, bias_tile, cols, eps, a):
    """More than PER_ROW_MAX_ROWS rows in the program. Statistics as in _layer_all (K,
    the sums of c and c**2 on VectorE over all rows, c**2 on ScalarE, TensorE over the
    partitions); the element-wise steps c = x - K, y = c - m2, y * weight, y * rstd, + bias
    split by rows between VectorE (rows [0, a)) and GpSimd (rows [a, N)), which work at
    once (_split_rows picks a). GpSimd cannot read PSUM: ScalarE copies its rows' K, m2 and
    rstd to SBUF. Each element takes the same fp32 operations in the same order on either
    engine (and as in the per-row and one-row forms), so the split changes no bit."""
    n_rows, h1 = x_tile.shape[1], x_tile.shape[2]
    inv, neg_first = _mean_matrix(cols), _neg_first()
    var_eps = _eps_in_psum(neg_first, 0, n_rows, eps)                 # PSUM [128, N]: eps
    vectors_fit_psum = h1 <= nl.tile_size.psum_bank_fmax
    g_rows = slice(a, n_rows)

    def gpsimd_copy(stat):
        """[128, N - a] fp32 SBUF copy of GpSimd's rows of a PSUM statistic (ScalarE)."""
        tile = nl.ndarray((PARTITIONS, n_rows - a), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=tile, op=nl.copy, data=stat[:, g_rows])
        return tile

    shift = _row_shifts(inv, x_tile)                                    # PSUM [128, N]: K
    centred = nl.ndarray((PARTITIONS, n_rows, h1), dtype=nl.float32, buffer=nl.sbuf)
    if a:
        nisa.tensor_tensor(dst=centred[:, 0:a, :], data1=x_tile[:, 0:a, :], data2=_along_h1(shift[:, 0:a], h1),
                           op=nl.subtract)
    if a < n_rows:
        shift_g = gpsimd_copy(shift)
        nisa.tensor_tensor(dst=centred[:, g_rows, :], data1=x_tile[:, g_rows, :], data2=_along_h1(shift_g, h1),
                           op=nl.subtract, engine=nisa.engine.gpsimd)
    sum_c = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    sum_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    _centred_sums(centred, sum_c, sum_sq)
    m2 = _row_means(inv, sum_c)                                        # PSUM [128, N]: m2
    m2_g = gpsimd_copy(m2) if a < n_rows else None
    m2_sq = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=m2_sq, op=nl.square, data=m2)
    nisa.nc_matmul(dst=var_eps, stationary=inv, moving=sum_sq, accumulate=True)       # + mean(c**2)
    nisa.nc_matmul(dst=var_eps, stationary=neg_first, moving=m2_sq, accumulate=True)  # - m2**2
    # ScalarE's copies of weight / bias for VectorE (needed last; the compiler's scheduler
    # may run them as soon as weight / bias arrive, as the cost model does: docs/cost-model.md
    # "Program order per engine")
    weight_v, bias_v = (_vectors_in_psum(h1, (weight_tile, bias_tile)) if vectors_fit_psum
                        else (weight_tile, bias_tile))
    # rstd = max(var + eps, eps) ** -0.5 (the max: var = mean(c**2) - m2**2 can round below
    # 0 for constant rows of large values, where eps cannot lift it), into PSUM
    rstd = nl.ndarray((PARTITIONS, n_rows), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_scalar(dst=rstd, data=var_eps, op0=nl.maximum, operand0=float(eps), op1=nl.power, operand1=-0.5)
    parts = []
    if a:
        parts.append((slice(0, a), a, nisa.engine.vector, m2[:, 0:a], rstd[:, 0:a], weight_v, bias_v))
    if a < n_rows:
        parts.append((g_rows, n_rows - a, nisa.engine.gpsimd, m2_g, gpsimd_copy(rstd), weight_tile, bias_tile))
    for rows, n, engine, m2_part, rstd_part, weight_part, bias_part in parts:
        c = centred[:, rows, :]
        nisa.tensor_tensor(dst=c, data1=c, data2=_along_h1(m2_part, h1), op=nl.subtract, engine=engine)
        if weight_part is not None:
            nisa.tensor_tensor(dst=c, data1=c, data2=_along_rows(weight_part, n), op=nl.multiply, engine=engine)
        if bias_part is None:
            nisa.tensor_tensor(dst=out_tile[:, rows, :], data1=c, data2=_along_h1(rstd_part, h1), op=nl.multiply,
                               engine=engine)
            continue
        nisa.tensor_tensor(dst=c, data1=c, data2=_along_h1(rstd_part, h1), op=nl.multiply, engine=engine)
        nisa.tensor_tensor(dst=out_tile[:, rows, :], data1=c, data2=_along_rows(bias_part, n), op=nl.add,
                           engine=engine)


def _layer_one_row(x_tile, out_tile, weight_tile, bias_tile, cols, eps):
    """One row in the program (a decode step of 1 token; 2 at LNC=2): a chain of small
    dependent instructions, each mostly fixed cost. The steps of _centre_rows; then ONE
    matmul gives m2 = mean(c) and mean(c**2) + eps side by side in PSUM (eps put there before
    x arrives), and one VectorE tensor_scalar makes var + eps = (mean(c**2) + eps) - m2 * m2
    from them: no matmul waits on m2**2 (the all-rows form has a second dependent matmul
    after m2, a TensorE pass and its PSUM latency, 200-600 cycles across the cost model's
    range: modeled trn2, LNC=2, fp16 [1, 4096], 4.90 (2.96-7.01) us against 4.92 (2.93-7.41)
    for the all-rows form; [1, 8192] 5.07 (3.10-7.14) against 5.03 (3.03-7.54)).
    Meanwhile ScalarE makes m2 - c = -y (scale -1, bias m2) and GpSimd
    multiplies it by weight; the last step is bias - (-y * weight) * rstd. Every sign flip
    is exact, so each element takes the same fp32 roundings as in the all-rows form
    (tests/ops/test_norm_decode.py compares the bits of 2 rows at LNC=1 and LNC=2).
    A second row would add a VectorE instruction per row to the chain after m2, which is
    later than the all-rows form's ScalarE square and matmul (modeled trn2, LNC=2, fp16
    [4, 4096], session 43 before the throttle counted FLOPs: 5.76 (3.59-8.93) -> 6.08
    (3.95-8.94) us)."""
    h1 = x_tile.shape[2]
    inv, neg_first = _mean_matrix(cols), _neg_first()
    stats = _eps_in_psum(neg_first, 1, 1, eps)                         # PSUM [128, 2]: [0, eps]
    shift = _row_shifts(inv, x_tile)                                    # PSUM [128, 1]: K
    centred = nl.ndarray((PARTITIONS, 1, h1), dtype=nl.float32, buffer=nl.sbuf)
    partials = nl.ndarray((PARTITIONS, 2), dtype=nl.float32, buffer=nl.sbuf)  # [sum c, sum c**2]
    _centre_rows(x_tile, centred, shift, partials[:, 0:1], partials[:, 1:2])
    nisa.nc_matmul(dst=stats, stationary=inv, moving=partials, accumulate=True)  # [m2, mean(c**2) + eps]
    m2, mean_sq_eps = _col(stats, 0), _col(stats, 1)
    var_eps = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=var_eps, data=m2, op0=nl.multiply, operand0=m2,
                       op1=nl.subtract, operand1=mean_sq_eps, reverse1=True)
    # the max: var + eps can round below eps (constant rows of large values), below 0 at eps=0
    rstd = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_scalar(dst=rstd, data=var_eps, op0=nl.maximum, operand0=float(eps), op1=nl.power, operand1=-0.5)
    neg_y = nl.ndarray((PARTITIONS, h1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=neg_y, op=nl.copy, data=centred[:, 0, :], scale=-1.0, bias=m2)
    if weight_tile is not None:
        nisa.tensor_tensor(dst=neg_y, data1=neg_y, data2=weight_tile, op=nl.multiply, engine=nisa.engine.gpsimd)
    if bias_tile is None:
        nisa.tensor_scalar(dst=out_tile[:, 0, :], data=neg_y, op0=nl.multiply, operand0=rstd,
                           op1=nl.multiply, operand1=-1.0)
    else:
        nisa.scalar_tensor_tensor(dst=out_tile[:, 0, :], data=neg_y, op0=nl.multiply, operand0=rstd,
                                  op1=nl.subtract, operand1=bias_tile, reverse1=True)


@nki.jit
def layer_norm_decode_kernel(x, weight=None, bias=None, eps=1e-5):
    """Return ``layer_norm(x, (H,), weight, bias, eps)`` for a few rows.

    Args:
        x: HBM [N, H], N <= DECODE_MAX_ROWS, H a multiple of 128, N * H / 128 <=
            DECODE_MAX_ELEMENTS; float32/bfloat16/float16.
        weight, bias: HBM [H] of any float dtype, or None (each independently).
        eps: float added to the variance.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    return _decode(x, (weight, bias), None, _layer_all, eps, layer_norm_grouped)
