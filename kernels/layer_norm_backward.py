"""Backward of LayerNorm over the last dimension.

    forward:  xhat = (x - mean) * r,  r = rsqrt(var + eps),  y = xhat * w + b   (per row)
    backward: g = dy * w
              m1 = sum(g) / H,  m2 = sum(g * xhat) / H                     (per row)
              dx = r * (g - m1 - xhat * m2)
              dw = sum over rows of dy * xhat,  db = sum over rows of dy  (kernels/weight_grads.py)

Dimensions:
    N: rows (any N >= 1).
    H: normalised size, 1 <= H <= BACKWARD_MAX_HIDDEN (8192; fp32: 4096, BACKWARD_MAX_ROW_BYTES; the op wrapper runs the
       recompute backward beyond).
Statistics:
    mean and r per row come from the forward (kernels/layer_norm.py with save_stats: HBM
    [N, 2] fp32), as PyTorch's native_layer_norm_backward takes the forward's saved mean
    and rstd: one [P, J, 2] load per block instead of two ScalarE passes per row, a
    division and an rsqrt on the block's critical path (modeled trn2 LNC=2 bf16, ViT-B/16
    [1576, 768]: 36.5 -> 29.6 us; ViT-L/16 [1576, 1024]: 45.7 -> 35.0).
Layout:
    As the forward (kernels/layer_norm.py) and kernels/rms_norm_backward.py: rows on
    partitions in blocks of 128 * J rows, each program its WORK_PARTS part(s); dx stored
    per block, dw and db as one fp32 partial per part (weight_grads.py: TensorE sums the
    rows of dy * xhat and of dy against a ones column). Blocks of one row per partition
    are software-pipelined: each block's first half (_front) before the previous block's
    second half (_back), as kernels/rms_norm_backward.py does (tiling.pipelined_halves;
    the comment above its call).
Engines, per block (16-bit input; fp32 the same in fp32):
    VectorE  xhat = (x - mean) * r (tensor_scalar, 16-bit perf mode)
    VectorE / GpSimd  g = dy * w, q = g * xhat (16-bit; PRODUCT_VECTOR_SHARE)
    ScalarE / VectorE  sum(g) and sum(q) per row, fp32, each on ScalarE (a copy with
             add-accumulate per row) or VectorE (one tensor_reduce over the block):
             _row_sums_on_vector picks
    dx, each row's first _dx_vector_share of columns on VectorE, the rest:
    VectorE  a = xhat * (-m2) - m1 (tensor_scalar, perf mode)
    GpSimd   t = a + g (fp32);  ScalarE dx = t * r (one rounding)
    VectorE's share: a'' = xhat * (-m2 r) - m1 r (tensor_scalar), dx = g * r + a'' (one
             scalar_tensor_tensor, one rounding)
    The program's last block makes a, t and dx per column chunk of at least 2 KiB per
    partition (tiling.drain_chunks) and stores each chunk when made (_back).
    TensorE  dw += diagonal of dy^T xhat (weight_grads.py; rows of p = dy * xhat where the
             diagonal accumulator does not fit PSUM), db += rows of dy
Expected error (16-bit): xhat, g, q, p and a (or a'') are rounded to the input dtype (bf16: <= 2**-9
    relative each), the row sums and weight gradients accumulate in fp32, dx rounds once
    more. fp32: ~1e-6 relative.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .limits import NORM_BACKWARD_MAX_HIDDEN as BACKWARD_MAX_HIDDEN
from .limits import NORM_BACKWARD_MAX_ROW_BYTES as BACKWARD_MAX_ROW_BYTES
from .norm_backward_dx import split_dx
from .tiling import (DMA_RECOMMENDED_BYTES, PARTITIONS, WORK_PARTS, itemsize, block_rows, broadcast_rows, drain_chunks,
                     load_block, pipelined_halves, row_blocks, row_part, rows_per_partition, share, split_count,
                     split_multiply)
from .weight_grads import (accumulate_columns, accumulate_diag, diag_fits, identity, new_accumulator,
                           new_diag_accumulator, new_partials, store_diag_partial, store_partial)

# Rows per partition: the least J whose transfer moves >= 1024 elements per partition
# (2 KiB bf16). Fewer rows per block than the forward's 2048: the main job's ViT shapes
# have ~6 blocks per core then, which the pipeline needs to overlap loads, the engines and
# stores (modeled trn2, ViT-B/16 backward: 40 us at 1024 against 42 at 2048).
TARGET_COLS = 1024
# Blocks loaded ahead of their compute, as the forward.
PREFETCH_AHEAD = 2
# Share of the columns of the two products (g, q) on VectorE, the rest on GpSimd. Per
# element on trn2: VectorE 16-bit two-input pass 1.04 ns (perf mode), GpSimd 1.67 ns;
# VectorE also runs xhat, a (0.26 each) and sum(q) (1.04: a reduce into fp32 sums has no
# N/2): VectorE 1.56 + 2.08 s, GpSimd (t = a + g) 1.67 + 3.33 (1 - s): s = 0.64 balances
# them at 2.9 ns. Re-swept under that pricing (session 50; modeled trn2 LNC=2, ViT-B / ViT-L
# backward, us): 0.4 36.1/45.6, 0.5 36.4/44.9, 0.55 36.1/44.6, 0.6 36.5/45.7, 0.65 36.8/45.2,
# 0.7 37.3/45.1, 0.8 35.7/47.2: 0.6 is within 0.8 / 1.1 us of each row's best (0.8 / 0.55;
# 0.55 beats it on both by 0.4 / 1.1), and the sweep is not monotone (the list schedule's
# order, not the balance), so the balance's neighbour stays rather than a schedule accident.
PRODUCT_VECTOR_SHARE = 0.6
# Step of the grid of dx shares _dx_vector_share searches.
DX_SHARE_STEP = 0.05


def _row_sums_on_vector(per, cols, sixteen, no_dw_product):
    """(sum(g) on VectorE, sum(q) on VectorE) for a [P, per, cols] block: each row sum on
    VectorE (one tensor_reduce over the block) or ScalarE (one accumulating copy per row).
    Estimated block time of a placement (cost-model rules with the active generation's
    figures, engine_costs.py): the busier of ScalarE and VectorE, plus what the sums add to
    the block's chain q -> sums -> a -> t -> dx: a VectorE reduce the whole block's (no
    row's a starts before it), ScalarE's one row's. Rates: VectorE 16-bit perf mode where
    the generation has it (trn2, trn3: engine_costs.vector_two_input_rate for tensor_tensor,
    vector_16bit_rate for tensor_scalar; until session 62 assumed on trn1 too), one element
    per cycle for a tensor_reduce into the
    fp32 sums (its N/2 needs a bf16 output too: [S] tensor_reduce); ScalarE reads 16-bit g
    and q at the generation's 16-bit rate (2x on trn3). The least estimate wins (ties: more
    sums on VectorE). ``no_dw_product``: dw is taken on TensorE's diagonal (or there is no
    weight), so VectorE makes no p = dy * xhat.
    Modeled (us, bf16 with weight and bias): the rule is within 0.9 % of the best of
    (both on VectorE, g on ScalarE, both on ScalarE) on 11 of 13 shapes of 128-8192 columns
    on trn2 LNC=2 (ViT-B [1576, 768] 29.6, ViT-L [1576, 1024] 35.0: both on ScalarE), the
    others [512, 384] +8.0 % and [3000, 512] +5.7 %; on trn3 within 3.7 %, on trn1 (LNC=1)
    0.5 %. Without the chain term (the busier engine alone) ViT-L models 39.9."""
    c = active_engine_costs()
    two = c.vector_two_input_rate(sixteen)                          # tensor_tensor
    four = c.vector_one_input_rate(sixteen)                         # tensor_scalar
    cut = split_count(cols, PRODUCT_VECTOR_SHARE)
    products = 2 if no_dw_product else 3
    # ScalarE: dx per row (t is fp32)
    scalar = per * c.instruction_ns("scalar", cols)
    # VectorE: xhat and a per row, its share of the products
    vector = (2 * per * c.instruction_ns("vector", cols, four)
              + products * c.instruction_ns("vector", per * cut, two))
    on_scalar = per * c.instruction_ns("scalar", cols, c.scalar_rate(sixteen))
    on_vector = c.instruction_ns("vector", per * cols)
    best = None
    for placement in ((True, True), (False, True), (True, False), (False, False)):
        n_vector = sum(placement)
        busiest = max(scalar + (2 - n_vector) * on_scalar, vector + n_vector * on_vector)
        chain = (on_vector if n_vector else 0.0) + (on_scalar / per if n_vector < 2 else 0.0)
        if best is None or busiest + chain < best[0]:
            best = (busiest + chain, placement)
    return best[1]


def _dx_vector_share(per, cols, sixteen, products, placement):
    """Share of each row's dx made by one VectorE scalar_tensor_tensor, dx = g * r + a''
    with a'' = xhat * (-m2 r) - m1 r (VectorE, in place of a), instead of GpSimd's
    t = a + g and ScalarE's t * r (_back), on a grid of DX_SHARE_STEP: the share that leaves
    the busiest of VectorE, ScalarE and GpSimd least busy over a [P, per, cols] block by the
    cost model's rules with the active generation's figures (engine_costs.py), given the
    block's other work: ``products`` two-input products split at PRODUCT_VECTOR_SHARE,
    xhat and a per row on VectorE, the row sums where ``placement`` put them
    (_row_sums_on_vector). Ties go to the smaller share. VectorE's scalar_tensor_tensor
    costs 2.08 ns per element on trn2 where it saves ScalarE 0.83 and GpSimd 1.67: trn2
    takes 0.3-0.35 of a 4096-column bf16 row, trn1 none (no 16-bit performance mode: VectorE
    is already its busiest engine). Until session 62 dx was never on VectorE. Modeled (us,
    14 shapes of 64-8192 rows x 128-8192 columns, bf16 with weight and bias unless said):
    trn2 LNC=2 geomean -5.5 % (ViT-B/16 [1576, 768] 29.6 -> 28.4, ViT-L/16 [1576, 1024] 35.0
    -> 34.2, [2048, 2048] 74.8 -> 62.3; none slower), weight only -5.6 %, neither -5.0 % (at
    most +0.5 %), LNC=1 -5.4 %, fp32 -0.1 %, trn3 -10.4 % (none slower), trn1 unchanged; the
    gradients differ in the last bit where a'' is rounded instead of a (float64 tolerance
    as before). The main job's error bars widen at the high end (ViT-B/16 24.6-39.7 ->
    22.3-49.9 us, ViT-L/16 29.4-55.6 -> 26.1-62.4): the share is planned with the model's
    central figures, and VectorE's extra instructions weigh more under its pessimistic ones."""
    c = active_engine_costs()
    gp_two = c.gpsimd_two_input_rate()      # GpSimd: two full inputs per element
    two = c.vector_two_input_rate(sixteen)
    four = c.vector_one_input_rate(sixteen)
    cut = split_count(cols, PRODUCT_VECTOR_SHARE)
    vector = (per * c.instruction_ns("vector", cols, four)                          # xhat
              + (products * c.instruction_ns("vector", per * cut, two) if cut else 0.0)
              + sum(placement) * c.instruction_ns("vector", per * cols))           # row sums
    scalar = (2 - sum(placement)) * per * c.instruction_ns("scalar", cols, c.scalar_rate(sixteen))
    gpsimd = products * c.instruction_ns("gpsimd", per * (cols - cut), rate=gp_two) if cut < cols else 0.0
    steps = round(1 / DX_SHARE_STEP)
    best = None
    for k in range(steps + 1):
        cut_dx = split_count(cols, k / steps)
        rest = cols - cut_dx
        v = vector + per * (c.instruction_ns("vector", rest, four) if rest else 0.0)  # a
        v += per * (c.instruction_ns("vector", cut_dx, four) + c.instruction_ns("vector", cut_dx, c.vector_stt_rate())) \
            if cut_dx else 0.0                                                        # a'', dx's share
        sc = scalar + (per * c.instruction_ns("scalar", rest) if rest else 0.0)      # dx = t * r
        gp = gpsimd + (per * c.instruction_ns("gpsimd", rest, rate=gp_two) if rest else 0.0)  # t = a + g
        busiest = max(v, sc, gp)
        if best is None or busiest < best[0] - 1e-6:
            best = (busiest, k / steps)
    return best[1]


def _front(dy_tile, x_tile, stats_tile, parts, per, cols, weight_tile, ones, acc_w, acc_b, first):
    """The first half of one [parts, per, cols] block, from its rows' saved statistics
    ``stats_tile`` [parts, per, 2] (mean, r): xhat, g = dy * w, q = g * xhat, the row sums
    as -m1, -m2 per row, and the dw / db partial sums into the accumulators (None when
    there is no weight / bias). Returns what _back needs: (xhat, g, -m, r, dx_share)."""
    f32 = nl.float32
    shape = (parts, per, cols)
    # the forward's statistics: stats_tile [parts, per, 2] fp32 (mean, r) per row
    mean, rstd = stats_tile[:, :, 0], stats_tile[:, :, 1]
    # scratch for the ScalarE row sums' discarded copies
    discard = nl.ndarray((parts, cols), dtype=x_tile.dtype, buffer=nl.sbuf)
    # xhat = (x - mean) * r, in the input dtype
    xhat = nl.ndarray(shape, dtype=x_tile.dtype, buffer=nl.sbuf)
    for j in range(per):
        nisa.tensor_scalar(dst=xhat[:, j, :], data=x_tile[:, j, :], op0=nl.subtract, operand0=mean[:, j:j + 1],
                           op1=nl.multiply, operand1=rstd[:, j:j + 1])
    cut = split_count(cols, PRODUCT_VECTOR_SHARE)
    dy_cols = lambda lo, hi: dy_tile[:, :, lo:hi]  # noqa: E731
    xhat_cols = lambda lo, hi: xhat[:, :, lo:hi]  # noqa: E731
    if weight_tile is not None:
        w_rows = lambda lo, hi: weight_tile[0:parts, lo:hi].expand_dim(1).broadcast_to((parts, per, hi - lo))  # noqa: E731
        g = nl.ndarray(shape, dtype=x_tile.dtype, buffer=nl.sbuf)
        split_multiply(g, dy_cols, w_rows, cut)
        if len(acc_w.shape) == 3:
            # dw: the diagonal of dy^T xhat on TensorE, no product pass (weight_grads.py)
            for j in range(per):
                accumulate_diag(acc_w, dy_tile[:, j, :], xhat[:, j, :], first and j == 0)
        else:
            p = nl.ndarray(shape, dtype=x_tile.dtype, buffer=nl.sbuf)
            split_multiply(p, dy_cols, xhat_cols, cut)
            for j in range(per):
                accumulate_columns(acc_w, p[:, j, :], ones[0:parts, :], first and j == 0)
    else:
        g = dy_tile
    q = nl.ndarray(shape, dtype=x_tile.dtype, buffer=nl.sbuf)
    split_multiply(q, lambda lo, hi: g[:, :, lo:hi], xhat_cols, cut)
    if acc_b is not None:
        for j in range(per):
            accumulate_columns(acc_b, dy_tile[:, j, :], ones[0:parts, :], first and j == 0)
    # m1 = sum(g) / H, m2 = sum(q) / H per row, in fp32, each on ScalarE (copy with
    # add-accumulate, per row) or VectorE (one tensor_reduce over the block):
    # _row_sums_on_vector estimates which placement leaves the busier engine least busy
    sums = nl.ndarray((parts, 2 * per), dtype=f32, buffer=nl.sbuf)
    no_dw_product = acc_w is None or len(acc_w.shape) == 3
    placement = _row_sums_on_vector(per, cols, itemsize(x_tile.dtype) == 2, no_dw_product)
    products = 1 if weight_tile is None else 2 if no_dw_product else 3
    dx_share = _dx_vector_share(per, cols, itemsize(x_tile.dtype) == 2, products, placement)
    for k, (data, on_vector) in enumerate(zip((g, q), placement)):
        if on_vector:
            nisa.tensor_reduce(dst=sums[:, k * per:(k + 1) * per], op=nl.add, data=data, axis=2)
            continue
        for j in range(per):
            nisa.activation(dst=discard, op=nl.copy, data=data[:, j, :], reduce_op=nl.add,
                            reduce_res=sums[:, k * per + j:k * per + j + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    neg_m = nl.ndarray((parts, 2 * per), dtype=f32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_m, data=sums, op0=nl.multiply, operand0=-1.0 / cols)
    return xhat, g, neg_m, rstd, dx_share


def _back(dx_tile, parts, pieces, front, store_piece=None):
    """The second half of a block: dx into ``dx_tile`` from _front's (xhat, g, -m, r, dx share), per
    (row slot j, first column, end column) of ``pieces``: the block's whole rows, or for the
    program's last block the column chunks of tiling.drain_chunks (at least 2 KiB per
    partition), each stored by ``store_piece(j, lo, hi)`` as soon as it is made, as
    kernels/rms_norm_backward.py does: nothing follows that block to hide its chain.

    The drained last block, modeled (session 60, us, trn2 LNC=2 bf16 with weight and bias):
    [2048, 4096] 141.0 -> 137.9, [1024, 8192] 162.3 -> 149.4, [64, 4096] 35.4 -> 30.1; ViT-B
    / ViT-L unchanged (rows of 768 and 1024 bf16 columns: at most one chunk per row). 9
    configurations x 13-14 shapes (bf16, fp16, fp32; weight and bias, weight only, none;
    trn2 at LNC=2 and 1, trn3, trn1): geomean -2.4 to -5.3 % per configuration, up to
    -20.7 %, none slower; outputs unchanged bit for bit."""
    f32 = nl.float32
    xhat, g, neg_m, rstd, dx_share = front
    per = xhat.shape[1]
    cols = xhat.shape[-1]
    neg_m1, neg_m2 = neg_m[:, 0:per], neg_m[:, per:2 * per]
    # each row's first row_cut columns of dx on VectorE, whether the row is made whole or in
    # chunks (the same columns either way: results independent of the launch's degree)
    row_cut = split_count(cols, dx_share)
    if row_cut:
        # -m1 r and -m2 r per row: a'' = xhat * (-m2 r) - m1 r
        neg_mr = nl.ndarray((parts, 2 * per), dtype=f32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=neg_mr[:, 0:per], data1=neg_m1, data2=rstd, op=nl.multiply)
        nisa.tensor_tensor(dst=neg_mr[:, per:2 * per], data1=neg_m2, data2=rstd, op=nl.multiply)
    for j, first, end in pieces:
        # a = xhat * (-m2) - m1; VectorE's share before row_cut through a'' = xhat * (-m2 r) - m1 r
        prime = (neg_mr[:, per + j:per + j + 1], neg_mr[:, j:j + 1]) if row_cut else None
        split_dx(dx_tile[:, j, :], xhat[:, j, :], g[:, j, :], rstd[:, j:j + 1],
                 (neg_m2[:, j:j + 1], neg_m1[:, j:j + 1]), prime, first, end, row_cut)
        if store_piece is not None:
            store_piece(j, first, end)


@nki.jit
def layer_norm_backward_kernel(dy, x, stats, weight=None, with_bias=False):
    """Gradients of ``layer_norm(x) * weight + bias`` given the output gradient ``dy``.

    Args:
        dy: HBM [N, H], dtype of ``x``.
        x: HBM [N, H], float32/bfloat16/float16, H <= BACKWARD_MAX_HIDDEN.
        stats: HBM [N, 2] fp32, each row's (mean, rsqrt(var + eps)) as the forward saved
            them (kernels/layer_norm.py, save_stats).
        weight: HBM [H] of any float dtype, or None (the op passes ones for a bias alone).
        with_bias: whether to return the bias gradient.
    Returns:
        (dx, dw_partials, db_partials): dx HBM [N, H] in x's dtype; the partials HBM
        [WORK_PARTS, 128, ceil(H / 128)] fp32 (weight_grads.py), dw_partials only with a
        weight and db_partials only with ``with_bias`` (a tuple of what is returned).
    """
    n_rows, cols = x.shape
    assert cols <= BACKWARD_MAX_HIDDEN, f"H={cols} exceeds BACKWARD_MAX_HIDDEN={BACKWARD_MAX_HIDDEN}"
    assert cols * itemsize(x.dtype) <= BACKWARD_MAX_ROW_BYTES, \
        f"a row of H={cols} {x.dtype} exceeds BACKWARD_MAX_ROW_BYTES={BACKWARD_MAX_ROW_BYTES}"
    dx = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    dw_parts = None if weight is None else new_partials(cols, WORK_PARTS)
    db_parts = new_partials(cols, WORK_PARTS) if with_bias else None
    assert tuple(stats.shape) == (n_rows, 2) and stats.dtype == nl.float32, \
        f"stats: shape {tuple(stats.shape)} {stats.dtype}; expected ({n_rows}, 2) float32 (mean, rstd per row)"
    ones = nl.ndarray((PARTITIONS, 1), dtype=x.dtype, buffer=nl.sbuf)    # moving column of the row sums
    nisa.memset(dst=ones, value=1.0)
    per_max = rows_per_partition(cols, TARGET_COLS, BACKWARD_MAX_HIDDEN)
    params = {}
    # accumulators once per program, restarted by each part's first matmuls (at LNC=1 the
    # two parts take them in turn); dw as a diagonal accumulator where it fits PSUM beside
    # db's bank
    diag = diag_fits(cols, other_banks=1)
    acc_w = None if dw_parts is None else (new_diag_accumulator(cols) if diag else new_accumulator(cols))
    acc_b = None if db_parts is None else new_accumulator(cols)
    first_part, end_part = share(WORK_PARTS, nl.program_id(0), nl.num_programs())
    for part in range(first_part, end_part):
        lo, hi = row_part(n_rows, part, WORK_PARTS)
        blocks = row_blocks(hi, per_max, first_row=lo) if hi > lo else []
        done = []

        def load(block):
            start, parts, per = block
            tiles = (load_block(dy, start, parts, per), load_block(x, start, parts, per),
                     load_block(stats, start, parts, per))
            if weight is not None and "weight" not in params:
                params["weight"] = broadcast_rows(weight, cols)
            return tiles

        # Blocks of one row per partition (rows of >= TARGET_COLS elements) are software-
        # pipelined as in kernels/rms_norm_backward.py (tiling.pipelined_halves): block i's
        # first half (_front: xhat, the products, the row sums, the weight-gradient sums) is
        # issued before block i - 1's second half (_back: a, t, dx), but for the part's last
        # block. A block then does not wait, engine by engine, for its predecessor's chain
        # sums -> a -> t -> dx. Modeled (us; 123 runs over 20 shapes, trn1/trn2/trn3,
        # bf16/fp32): 8 faster, e.g. trn2 LNC=2 bf16 [1024, 8192] 192.6 -> 162.3, fp32
        # [2048, 4096] 261.3 -> 229.4, trn2 LNC=1 bf16 [1024, 8192] 353.7 -> 283.5; 112
        # unchanged (ViT-L's [1576, 1024] among them); 3 slower: fp32 [512, 4096] +3.1 %,
        # trn2 LNC=1 bf16 [2048, 4096] +1.1 %, trn1 +0.2 %. With two or more rows per
        # partition it is not taken: trn3 bf16 [8192, 768] +10.8 %, ViT-B +3.6 %.
        def front(block, tiles):
            _, parts, per = block
            state = _front(*tiles, parts, per, cols, params.get("weight"), ones, acc_w, acc_b, not done)
            done.append(block)
            return state

        def back(block, tiles, state):
            start, parts, per = block
            dx_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
            last = part == end_part - 1 and block == blocks[-1]             # the program's last block
            chunks = drain_chunks(per, cols, itemsize(x.dtype), DMA_RECOMMENDED_BYTES) if last else []
            if chunks:
                def store_chunk(j, c0, c1):
                    nisa.dma_copy(dst=block_rows(dx, start, parts, per)[:, j, c0:c1], src=dx_tile[:, j, c0:c1])
                _back(dx_tile, parts, chunks, state, store_chunk)
                return None      # stored
            _back(dx_tile, parts, [(j, 0, cols) for j in range(per)], state)
            return dx_tile

        def store(block, dx_tile):
            start, parts, per = block
            if dx_tile is not None:
                nisa.dma_copy(dst=block_rows(dx, start, parts, per), src=dx_tile)

        pipelined_halves(blocks, load, front, back, store, PREFETCH_AHEAD, interleave=per_max == 1)
        if dw_parts is not None and diag:
            store_diag_partial(dw_parts, part, acc_w, cols, bool(done), identity())
        elif dw_parts is not None:
            store_partial(dw_parts, part, acc_w, cols, bool(done))
        if db_parts is not None:
            store_partial(db_parts, part, acc_b, cols, bool(done))
    outs = [dx] + [t for t in (dw_parts, db_parts) if t is not None]
    return outs[0] if len(outs) == 1 else tuple(outs)
