"""Backward of RMSNorm over the last dimension, optionally of fused_add_rms_norm.

    forward:  y = x * r * w,  r = rsqrt(mean(x**2) + eps)      (per row; w: weight [H])
    backward: g = dy * w
              c = sum(g * x)                                    (per row)
              dx = r * (g - x * (r**2 * c / H))  (+ dtotal)
              dw = sum over rows of dy * x * r                  (kernels/weight_grads.py)

fused_add_rms_norm: the forward's ``total = x + residual`` is the normalised ``x`` here; the
gradient of ``total`` is ``dx`` above plus the gradient of the ``total`` output
(``dtotal``), and is both ``d(input)`` and ``d(residual)``.

Dimensions:
    N: rows (any N >= 1).
    H: normalised size, 1 <= H <= BACKWARD_MAX_HIDDEN (8192; fp32: 4096, BACKWARD_MAX_ROW_BYTES: the forward's one-pass rows;
       the op wrapper runs the recompute backward beyond).
Layout:
    As the forward (kernels/rms_norm.py): rows on partitions, blocks of 128 * J
    consecutive rows (one DMA of J * H elements per partition per input), the tail block
    of < 128 rows with J = 1; each program takes its WORK_PARTS part(s) of the rows
    (tiling.program_row_parts), so blocks and results are the same at LNC=1 and LNC=2.
    dx is stored block by block; dw goes to one partial per part (weight_grads.py).
Engines, per block (16-bit input; fp32 the same in fp32):
    ScalarE  square(x / sqrt(H)) with add-reduction -> mean(x**2) per row; rsqrt -> r
    VectorE  xhat = x * r per row, TensorE dw += the diagonal of dy^T xhat (weight_grads.py);
             rows too long for a diagonal accumulator: VectorE p = dy * x, TensorE sums
             p * r over rows into dw
    VectorE / GpSimd  g = dy * w and q = g * x (16-bit; split by _block_plan)
    ScalarE  c = sum(q) per row (copy with add-accumulate, fp32)
    dx, a share of each row's columns (_block_plan) on VectorE, the rest:
    VectorE  a = x * (-r**2 c / H) (tensor_scalar, 16-bit perf mode)
    GpSimd   t = a + g (fp32)
    ScalarE  dx = t * r (one rounding) -- fused: ScalarE t * r (fp32), GpSimd + dtotal
    VectorE's share: a' = x * (-r**3 c / H), dx = g * r + a' (one scalar_tensor_tensor,
             one rounding) -- fused: dx = t * r + dtotal (one scalar_tensor_tensor)
    The program's last block makes a, t and dx per column chunk of 2 KiB per partition
    (tiling.drain_chunks) and stores each chunk when made (_back_drained): nothing follows
    it to hide its chain.
Expected error (16-bit): g, p, q and a (or a') are rounded to the input dtype (<= 2**-9 relative
    each, bf16), c and dw accumulate in fp32, dx rounds once more: |err| <= ~3 * 2**-9 *
    (|r g| + |a r|) elementwise; dw within ~2**-8 relative of its terms' norm. fp32: ~1e-6.
"""

import math

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .limits import NORM_BACKWARD_MAX_HIDDEN as BACKWARD_MAX_HIDDEN
from .limits import NORM_BACKWARD_MAX_ROW_BYTES as BACKWARD_MAX_ROW_BYTES
from .norm_backward_dx import split_dx
from .tiling import (DMA_RECOMMENDED_BYTES, PARTITIONS, WORK_PARTS, itemsize, block_rows, broadcast_rows, cdiv,
                     column_chunks, drain_chunks, fitting_ahead, fp32_column, load_block, pipelined_halves, row_blocks,
                     row_part, rows_per_partition, share, split_count, split_multiply)
from .weight_grads import (accumulate_columns, accumulate_diag, diag_fits, identity, new_accumulator,
                           new_diag_accumulator, new_partials, store_diag_partial, store_partial)

# Rows per partition: the least J whose transfer moves >= 2048 elements per partition
# (4 KiB bf16), as the forward.
TARGET_COLS = 2048
# Blocks loaded ahead of their compute (tiling.pipelined), as the forward: the DMA
# latency (~1.3 us) must be covered two blocks early. Fewer where the tiles of two blocks
# ahead would not fit the active generation's SBUF (_prefetch_ahead).
PREFETCH_AHEAD = 2
# [P, J] fp32 tiles (a block's statistics and factors: six per block, over the blocks in
# flight) that _prefetch_ahead's bound adds to its row-sized tiles.
SMALL_TILES = 16
# rms_norm's backward takes g = dy * w of its blocks from a ring of G_RING_DEPTH tiles (one
# allocation) where SBUF holds it beside _prefetch_ahead's bound (_g_ring_depth; else 3,
# else a tile per block). A tile per block rotates two buffers, so block i + 2's products
# waited for block i's t = a + g, which the software pipelining issues after block i + 1's
# first half. Modeled trn2 LNC=2 bf16 (session 58), Llama-7B [2048, 4096] 127.5 -> 115.4 us
# (three tiles: 120.6); the other shapes' figures in _g_ring_depth. Not in the fused
# backward: there GpSimd also adds dtotal to every row and the ring modeled slower
# (fused_add_rms_norm Llama-7B 156.9 -> 158.2 us with four tiles, 160.9 with three).
G_RING_DEPTH = 4
# Step of the grid of VectorE shares _block_plan searches.
SHARE_STEP = 0.05


def _block_plan(per, cols, sixteen, dw, fused):
    """(VectorE share of g = dy * w and q = g * x, VectorE share of dx) for a [P, per, cols]
    block, each on a grid of SHARE_STEP: the pair that leaves the busiest of VectorE,
    ScalarE and GpSimd least busy over the block (_block_engine_ns; for rms_norm, that
    time plus the later part of q's product, its VectorE or its GpSimd columns). Ties go to
    the larger product share, then the smaller dx share.

    The products: the rest of their columns go to GpSimd. dx: the share of each row's
    columns made on VectorE in one scalar_tensor_tensor, fp32 inside and one rounding --
    rms_norm: dx = g * r + a' with a' = x * (-r^3 c / H) (VectorE, in place of a), instead
    of GpSimd's t = a + g and ScalarE's t * r; fused_add_rms_norm: dx = t * r + dtotal,
    instead of ScalarE's t * r and GpSimd's + dtotal (the same arithmetic, the same values).

    Per element on trn2, 16-bit, diagonal dw, fixed costs aside: VectorE's two-input pass
    1.04 ns (perf mode), GpSimd's 1.67 ns; VectorE also makes a (0.26) and xhat (0.26; or
    p = dy * x for column sums, 1.04); ScalarE squares, sums q and makes t * r (0.83 each);
    GpSimd t = a + g (1.67; fused also + dtotal, 1.67). VectorE's scalar_tensor_tensor
    costs 2.08 ns where it saves ScalarE 0.83 and GpSimd 1.67.
    Why q's later part for rms_norm: q -> its row sum (ScalarE) -> -r^3 c / H -> a' -> dx
    is the block's chain once VectorE makes dx, and a product share that leaves most of q
    on GpSimd (the throughput balance alone picks 0.1 for [P, 3, 768] blocks on trn2, all
    of dx on VectorE) starts it late: ViT-B-sized [1576, 768] modeled 30.7 -> 37.3 us
    without the term, 28.6 with it. For fused_add_rms_norm, whose VectorE makes dx from t
    (GpSimd's), the term modeled +0.4 % geomean (Llama-7B 141.5 -> 153.6 us): left out.

    Until session 62 the product share was a constant swept on trn2 bf16 and used for every
    dtype and generation (0.8; 0.6 with column sums; 1.0 fused) and dx was never on VectorE.
    Against that (the session's first step, the product share alone by the busier of
    VectorE and GpSimd, in brackets), modeled (us, with a weight; 12-14 shapes of 64-8192
    rows x 128-8192 columns): rms_norm's backward, trn2 LNC=2 bf16 geomean -7.7 % [+0.8 %]
    (Llama-7B [2048, 4096] 114.0 -> 107.3, [256, 2048] 21.8 -> 18.5, ViT-B-sized [1576,
    768] 30.7 -> 28.7; two shapes slower, by at most 0.4 %), LNC=1 -5.7 % ([1000, 3000]
    +2.1 %), fp32 0.0 % [-17.4 %] (at most +0.9 %), trn3 bf16 -5.7 % [+0.2 %], fp32 -0.6 %,
    trn1 bf16 +0.4 % [-17.4 %] ([1000, 3000] +6.0 %: the product share; dx stays off
    VectorE there), no weight -10.6 %; the gradients differ in the last bit where a' is
    rounded instead of a (both within the float64 tolerance, tests/). fused_add_rms_norm's
    backward (against the products all on VectorE and dx never there): trn2 bf16 -3.9 %
    (Llama-7B 152.4 -> 141.5, [3000, 2048] +2.2 % the only one slower), LNC=1 -1.9 %
    ([3000, 2048] +7.6 %), fp32 -4.3 %, trn3 -7.8 %, trn1 -8.3 % ([130, 2048] +4.2 %), no
    weight -10.8 %; gradients unchanged bit for bit (the same arithmetic either way)."""
    c = active_engine_costs()
    gp_two = c.gpsimd_two_input_rate()      # GpSimd: two full inputs per element
    two = c.vector_two_input_rate(sixteen)
    steps = round(1 / SHARE_STEP)
    best = None
    for i in range(steps, -1, -1):
        cut = split_count(cols, i / steps)
        # q's later part (rms_norm: the chain's first link, _block_plan's docstring)
        q_ns = 0.0 if fused else max(c.instruction_ns("vector", per * cut, rate=two) if cut else 0.0,
                                     c.instruction_ns("gpsimd", per * (cols - cut), rate=gp_two) if cut < cols else 0.0)
        for k in range(steps + 1):
            estimate = max(_block_engine_ns(per, cols, sixteen, dw, fused, i / steps, k / steps)) + q_ns
            if best is None or estimate < best[0] - 1e-6:
                best = (estimate, i / steps, k / steps)
    return best[1], best[2]


def _block_engine_ns(per, cols, sixteen, dw, fused, vector_share, dx_share=0.0):
    """Estimated (VectorE, ScalarE, GpSimd) ns of one [P, per, cols] block whose products g
    and q (without a weight, ``dw`` None: q alone) give ``vector_share`` of their columns
    to VectorE (split_count), by the cost model's rules with the active generation's
    figures (engine_costs.py; pass counts of simulator/cost/model.py): each product one
    instruction per engine over the block, tensor_tensor reading two full inputs
    (engine_costs.vector_two_input_rate on VectorE); VectorE's a = x * (-r^2 c / H) per row
    (tensor_scalar: vector_16bit_rate with 16-bit data) and xhat per row (``dw``
    "diagonal") or p = dy * x over the block ("columns"); ScalarE's squares and row sum of
    q per row (16-bit data at its 16-bit rate) and rsqrt; GpSimd's t = a + g per row (fp32
    out). dx: ``dx_share`` of each row's columns by VectorE's scalar_tensor_tensor (two
    passes: g * r + a', a' in place of a; fused, t * r + dtotal), the rest by GpSimd's
    t = a + g and ScalarE's t * r (fp32; fused, then GpSimd's + dtotal, in column halves
    past TARGET_COLS: _back)."""
    c = active_engine_costs()
    cut = split_count(cols, vector_share)
    gp_two = c.gpsimd_two_input_rate()                              # GpSimd tensor_tensor
    two = c.vector_two_input_rate(sixteen)                          # tensor_tensor
    four = c.vector_one_input_rate(sixteen)                         # tensor_scalar
    narrow = c.scalar_rate(sixteen)                                 # ScalarE over 16-bit data
    products = 1 if dw is None else 2
    vector = products * c.instruction_ns("vector", per * cut, rate=two) if cut else 0.0
    gpsimd = products * c.instruction_ns("gpsimd", per * (cols - cut), rate=gp_two) if cut < cols else 0.0
    cut_dx = split_count(cols, dx_share)
    if fused:
        vector += per * c.instruction_ns("vector", cols, rate=four)                  # a
    if dw == "columns":
        vector += c.instruction_ns("vector", per * cols, rate=two)                   # p = dy * x
    elif dw == "diagonal":
        vector += per * c.instruction_ns("vector", cols, rate=four)                  # xhat
    scalar = 2 * per * c.instruction_ns("scalar", cols, rate=narrow) + c.instruction_ns("scalar", per)
    if cut_dx:
        vector += per * c.instruction_ns("vector", cut_dx, rate=c.vector_stt_rate())    # dx's share
    if not fused:
        if cut_dx:
            vector += per * c.instruction_ns("vector", cut_dx, rate=four)            # a'
        if cut_dx < cols:
            rest = cols - cut_dx
            vector += per * c.instruction_ns("vector", rest, rate=four)              # a
            gpsimd += per * c.instruction_ns("gpsimd", rest, rate=gp_two)            # t = a + g
            scalar += per * c.instruction_ns("scalar", rest)                         # dx = t * r
        return vector, scalar, gpsimd
    halves = column_chunks(cols, cdiv(cols, 2)) if per == 1 and cols > TARGET_COLS else [(0, cols)]
    gpsimd += per * sum(c.instruction_ns("gpsimd", hi - lo, rate=gp_two) for lo, hi in halves)  # t = a + g
    for lo, hi in halves:
        if hi > cut_dx:
            width = hi - max(lo, cut_dx)
            scalar += per * c.instruction_ns("scalar", width)                                 # t * r
            gpsimd += per * c.instruction_ns("gpsimd", width, rate=gp_two)                    # + dtotal
    return vector, scalar, gpsimd


def _prefetch_ahead(per, cols, itemsize, inputs, weight_bytes, scratch=0):
    """Blocks loaded ahead of their compute: the most of PREFETCH_AHEAD, 1 and 0 whose tiles
    fit the active generation's SBUF.

    What is live per partition is at most the inputs of ahead + 2 blocks (block i - 1's
    second half is issued after block i's first half), two more block-sized tiles (g of
    two blocks, or one and a row temporary), the broadcast weight row (``weight_bytes``,
    in the weight's dtype), a few [P, J] fp32 statistics (SMALL_TILES) and ``scratch``
    bytes (rms_norm's a' tile, _a_prime_bytes). The
    simulator's liveness sweep meets this bound exactly at J = 1, bf16 (block = one row):
    rms_norm 2 (ahead + 2) + 2 blocks and the weight row, fused_add_rms_norm 3 (ahead + 2)
    + 2 and the weight row; so at the widest rows (16 KiB per partition) fused_add_rms_norm
    with a weight loads no block ahead on trn1 (192 KiB) and one on trn2 (224 KiB), and on
    trn3 (256 KiB) two with a 16-bit weight but one with an fp32 weight (32 KiB).
    tests/kernels/test_widest_rows_fit_sbuf.py runs the widest launches on every
    generation and checks the bound against the sweep."""
    return fitting_ahead(PREFETCH_AHEAD,
                         lambda ahead: _live_bound(per, cols, itemsize, inputs, weight_bytes, ahead, scratch))


def _live_bound(per, cols, itemsize, inputs, weight_bytes, ahead, scratch=0):
    """_prefetch_ahead's bound on the bytes per partition live at ``ahead`` blocks ahead."""
    return (inputs * (ahead + 2) + 2) * per * cols * itemsize + weight_bytes + SMALL_TILES * 4 * per + scratch


def _a_prime_bytes(per, cols, itemsize, dw):
    """Bytes per partition of rms_norm's a' tile (_plain_dx: the row's columns whose dx
    VectorE makes, in the input dtype), live beside t while ScalarE makes the rest of dx."""
    return split_count(cols, _block_plan(per, cols, itemsize == 2, dw, False)[1]) * itemsize


def _g_ring_depth(per, cols, itemsize, ahead, weight_bytes, scratch=0):
    """Tiles in the ring of g (rms_norm's backward, with a weight): G_RING_DEPTH, else 3,
    where the ring's extra tiles beyond the two a tile per block rotates fit the active
    generation's SBUF beside _prefetch_ahead's bound at ``ahead`` blocks ahead; else 0 (a
    tile per block). At the widest rows (8192 16-bit or 4096 fp32 columns: 16 KiB per
    block, two blocks ahead, 177 KiB in the bound) four tiles fit trn2 (224 KiB) and trn3
    (256), none trn1 (192). Modeled against a tile per block (session 58; 100 runs: bf16,
    fp16 and fp32, 9 shapes, trn2 at LNC=2 and 1, trn3, trn1): 52 faster (trn2 LNC=2 bf16
    [2048, 4096] 127.5 -> 115.4 us, [1024, 8192] 161.8 -> 147.6, [3000, 2048] 98.5 -> 92.4;
    up to 12.7 % at LNC=1), 5 slower by at most 1.7 % (trn2 LNC=1 fp32 [1576, 768]), the
    rest unchanged; outputs unchanged."""
    block = per * cols * itemsize
    bound = _live_bound(per, cols, itemsize, 2, weight_bytes, ahead, scratch)
    sbuf = active_engine_costs().sbuf_bytes_per_partition
    for depth in (G_RING_DEPTH, 3):
        if bound + (depth - 2) * block <= sbuf:
            return depth
    return 0


def _stats(x_tile, parts, per, cols, eps_tile):
    """r = rsqrt(mean(x^2) + eps) per row of a block (ScalarE), as the forward: [parts, per] fp32."""
    mean_sq = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    squares = nl.ndarray((parts, cols), dtype=x_tile.dtype, buffer=nl.sbuf)      # discarded
    for j in range(per):
        nisa.activation(dst=squares, op=nl.square, data=x_tile[:, j, :], scale=1.0 / math.sqrt(cols),
                        reduce_op=nl.add, reduce_res=mean_sq[:, j:j + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rstd = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_sq, bias=eps_tile[0:parts, :])
    return rstd


def _front(dy_tile, x_tile, rstd, parts, per, cols, weight_tile, acc, first, fused, g_tile=None,
           program_first=False):
    """The first half of one [parts, per, cols] block after its statistics: g (into
    ``g_tile``, a slot of the ring, when given), c and the dw sums (into ``acc``: a diagonal
    accumulator when it is 3-D, else column sums; None without weight). ``program_first``:
    the program's first block (split by the two engines' rates when ``fused``). Returns
    what ``_back`` needs: (rstd, neg_k, g, the VectorE share of dx (_block_plan), and
    -r^3 c / H per row where rms_norm's VectorE makes a share of dx, else None)."""
    f32 = nl.float32
    shape = (parts, per, cols)
    column_sums = weight_tile is not None and len(acc.shape) != 3     # dw from p = dy * x (VectorE)
    dw = None if weight_tile is None else "columns" if column_sums else "diagonal"
    sixteen = itemsize(x_tile.dtype) == 2
    share, dx_share = _block_plan(per, cols, sixteen, dw, fused)
    if fused and program_first:
        # GpSimd has no earlier block's t = a + g and + dtotal to run yet (it sat idle for
        # the first ~30 us of Llama-7B's backward), so the program's first block splits its
        # products by the two engines' rates (engine_costs.vector_gpsimd_share: trn2 0.62
        # for 16-bit, 0.44 for fp32). With dtotal loaded after the weight, modeled (session
        # 60, us, trn2 LNC=2 bf16 with a weight): Llama-7B [2048, 4096] 155.4 -> 152.4,
        # [512, 4096] 67.3 -> 57.0, [64, 4096] 44.2 -> 35.0. In rms_norm's backward, whose
        # GpSimd takes a share of every block's products, the same split of its first block
        # modeled Llama-7B 113.0 -> 116.4: not taken there.
        c = active_engine_costs()
        share = c.vector_gpsimd_share(c.vector_two_input_rate(sixteen))
    cut = split_count(cols, share)
    dy_cols = lambda lo, hi: dy_tile[:, :, lo:hi]  # noqa: E731
    x_cols = lambda lo, hi: x_tile[:, :, lo:hi]  # noqa: E731
    if weight_tile is None:
        g = dy_tile
    else:
        w_rows = lambda lo, hi: weight_tile[0:parts, lo:hi].expand_dim(1).broadcast_to((parts, per, hi - lo))  # noqa: E731
        g = nl.ndarray(shape, dtype=x_tile.dtype, buffer=nl.sbuf) if g_tile is None else g_tile
        split_multiply(g, dy_cols, w_rows, cut)
        _weight_grad(acc, dy_tile, x_tile, rstd, parts, per, cols, first)
    # c = sum(g * x) per row: the product on VectorE / GpSimd, its row sum on ScalarE
    # (copy with add-accumulate, fp32): VectorE is the busier engine
    q = nl.ndarray(shape, dtype=x_tile.dtype, buffer=nl.sbuf)
    split_multiply(q, lambda lo, hi: g[:, :, lo:hi], x_cols, cut)
    c = nl.ndarray((parts, per), dtype=f32, buffer=nl.sbuf)
    for j in range(per):
        # the copy's output is discarded: written over q itself, so that no row-wide
        # scratch tile is live beside the block's (16 KiB per partition at the widest rows)
        nisa.activation(dst=q[:, j, :], op=nl.copy, data=q[:, j, :], reduce_op=nl.add, reduce_res=c[:, j:j + 1],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
    r2 = nl.ndarray((parts, per), dtype=f32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r2, data1=rstd, data2=rstd, op=nl.multiply)
    neg_k = nl.ndarray((parts, per), dtype=f32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=neg_k, data=c, op0=nl.multiply, operand0=-1.0 / cols, op1=nl.multiply,
                              operand1=r2)
    neg_kr = None
    if not fused and split_count(cols, dx_share):
        # a' = x * (-r^3 c / H): the factor of the columns whose dx VectorE makes (_plain_dx)
        neg_kr = nl.ndarray((parts, per), dtype=f32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=neg_kr, data1=neg_k, data2=rstd, op=nl.multiply)
    return rstd, neg_k, g, dx_share, neg_kr


def _back(x_tile, dt_tile, dx_tile, parts, per, cols, front):
    """The second half of a block: dx from ``_front``'s (rstd, neg_k, g, dx share, neg_kr)."""
    f32 = nl.float32
    rstd, neg_k, g, dx_share, neg_kr = front
    for j in range(per):
        # a = -x r^2 c / H (VectorE, perf mode); t = a + g (GpSimd, fp32); dx = t * r (ScalarE)
        a = nl.ndarray((parts, cols), dtype=x_tile.dtype, buffer=nl.sbuf)
        t = nl.ndarray((parts, cols), dtype=f32, buffer=nl.sbuf)
        if dt_tile is None:
            _plain_dx(dx_tile[:, j, :], x_tile[:, j, :], g[:, j, :], rstd[:, j:j + 1], neg_k[:, j:j + 1], neg_kr, j,
                      0, cols, split_count(cols, dx_share), a, t)
            continue
        nisa.tensor_scalar(dst=a, data=x_tile[:, j, :], op0=nl.multiply, operand0=neg_k[:, j:j + 1])
        # fused: GpSimd's + dtotal waits for ScalarE's t * r, and GpSimd has no other work
        # of the block then; rows longer than TARGET_COLS (one row per partition) go in two
        # column halves, so that t * r of the first half runs while GpSimd makes t of the
        # second (modeled trn2 LNC=2 bf16 [2048, 4096] 174.9 -> 156.9 us, [4096, 8192]
        # 624.4 -> 540.7; at 2048 columns the extra fixed costs outweigh it in a pipeline
        # already balanced: [2048, 2048] 78.8 -> 83.0)
        halves = column_chunks(cols, cdiv(cols, 2)) if per == 1 and cols > TARGET_COLS else [(0, cols)]
        for lo, hi in halves:
            nisa.tensor_tensor(dst=t[:, lo:hi], data1=a[:, lo:hi], data2=g[:, j, lo:hi], op=nl.add,
                               engine=nisa.engine.gpsimd)
        # fused: the row's first dx_share of columns t * r + dtotal in one VectorE
        # scalar_tensor_tensor (fp32 inside, one rounding); the rest t * r on ScalarE (fp32,
        # in place: no second fp32 row beside t), then + dtotal on GpSimd (one rounding)
        cutf = split_count(cols, dx_share)
        if cutf:
            nisa.scalar_tensor_tensor(dst=dx_tile[:, j, 0:cutf], data=t[:, 0:cutf], op0=nl.multiply,
                                      operand0=rstd[:, j:j + 1], op1=nl.add, operand1=dt_tile[:, j, 0:cutf])
        rest = [(max(lo, cutf), hi) for lo, hi in halves if hi > cutf]
        for lo, hi in rest:
            nisa.activation(dst=t[:, lo:hi], op=nl.copy, data=t[:, lo:hi], scale=rstd[:, j:j + 1])
        for lo, hi in rest:
            nisa.tensor_tensor(dst=dx_tile[:, j, lo:hi], data1=t[:, lo:hi], data2=dt_tile[:, j, lo:hi], op=nl.add,
                               engine=nisa.engine.gpsimd)


def _plain_dx(dx, x_row, g_row, r, neg_k, neg_kr, j, first, end, cut, a, t):
    """rms_norm's dx = (a + g) * r over columns [first, end) of row slot ``j``
    (norm_backward_dx.split_dx): a = x * (-r^2 c / H) (``neg_k``), VectorE's share before
    ``cut`` through a' = x * (-r^3 c / H) (``neg_kr``, the block's [P, per] column of it);
    ``a`` and ``t`` the caller's tiles."""
    prime = None if neg_kr is None else (neg_kr[:, j:j + 1], None)
    split_dx(dx, x_row, g_row, r, (neg_k, None), prime, first, end, cut, a, t)


def _back_drained(x_tile, dt_tile, dx_tile, parts, chunks, front, store_chunk):
    """_back for the program's last block: per (row slot, column chunk) of ``chunks``
    (tiling.drain_chunks: at least 2 KiB per partition), a -> t -> dx and the chunk's
    store, so the engines and the DMA queues work on different chunks at once and the
    launch ends one chunk's chain after the last t, not a whole row's: for a row of 4096
    bf16 columns that chain took ~14 us of the launch's end on trn2 (GpSimd's fp32 t alone
    6.9 us, then ScalarE's t * r 3.7, then the store). ``store_chunk(j, lo, hi)`` stores row
    slot j's columns [lo, hi) of ``dx_tile``.

    Modeled (session 60, us, trn2 LNC=2 bf16 with a weight): Llama-7B [2048, 4096] 115.4 ->
    113.0, Llama-70B [2048, 8192] 244.3 -> 231.4, [1024, 8192] 147.6 -> 134.7, [64, 4096]
    36.0 -> 31.9; 14 configurations x 12-14 shapes (rms_norm and fused_add_rms_norm; bf16,
    fp16, fp32; with and without a weight; trn2 at LNC=2 and 1, trn3, trn1): geomean -1.9
    to -5.6 % per configuration, up to -18.8 %, one run slower by 0.4 %; outputs unchanged
    bit for bit. Chunks of 512 and 2048 bf16 columns modeled within 1 % of 1024's."""
    f32 = nl.float32
    rstd, neg_k, g, dx_share, neg_kr = front
    row_cut = split_count(dx_tile.shape[-1], dx_share)        # rms_norm: the row's VectorE columns of dx
    for j, lo, hi in chunks:
        a = nl.ndarray((parts, hi - lo), dtype=x_tile.dtype, buffer=nl.sbuf)
        t = nl.ndarray((parts, hi - lo), dtype=f32, buffer=nl.sbuf)
        if dt_tile is None:
            _plain_dx(dx_tile[:, j, :], x_tile[:, j, :], g[:, j, :], rstd[:, j:j + 1], neg_k[:, j:j + 1], neg_kr, j,
                      lo, hi, row_cut, a, t)
        else:
            nisa.tensor_scalar(dst=a, data=x_tile[:, j, lo:hi], op0=nl.multiply, operand0=neg_k[:, j:j + 1])
            nisa.tensor_tensor(dst=t, data1=a, data2=g[:, j, lo:hi], op=nl.add, engine=nisa.engine.gpsimd)
            # the chunk's first dx_share of columns on VectorE, the rest ScalarE + GpSimd (the
            # same values either way, so unlike rms_norm's, per chunk: every chunk's dx is
            # then made by two engines at once); t holds the chunk's columns from 0, dx and
            # dtotal the row's
            w = hi - lo
            cutf = split_count(w, dx_share)
            mid = lo + cutf
            if cutf:
                nisa.scalar_tensor_tensor(dst=dx_tile[:, j, lo:mid], data=t[:, 0:cutf], op0=nl.multiply,
                                          operand0=rstd[:, j:j + 1], op1=nl.add, operand1=dt_tile[:, j, lo:mid])
            if cutf < w:
                nisa.activation(dst=t[:, cutf:w], op=nl.copy, data=t[:, cutf:w], scale=rstd[:, j:j + 1])
                nisa.tensor_tensor(dst=dx_tile[:, j, mid:hi], data1=t[:, cutf:w], data2=dt_tile[:, j, mid:hi],
                                   op=nl.add, engine=nisa.engine.gpsimd)
        store_chunk(j, lo, hi)


def _weight_grad(acc, dy_tile, x_tile, rstd, parts, per, cols, first):
    """dw += sum over the block's rows of dy * x * r on TensorE: the diagonal of dy^T (x r)
    (xhat = x * r in the input dtype: |xhat| <= sqrt(H), no fp16 overflow), or, for rows
    too long for a diagonal accumulator, column sums of p = dy * x (16-bit: bf16) against
    r."""
    if len(acc.shape) == 3:
        for j in range(per):
            xhat = nl.ndarray((parts, cols), dtype=x_tile.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=xhat, data=x_tile[:, j, :], op0=nl.multiply, operand0=rstd[:, j:j + 1])
            accumulate_diag(acc, dy_tile[:, j, :], xhat, first and j == 0)
        return
    mm_dtype = nl.bfloat16 if x_tile.dtype != nl.float32 else nl.float32    # bf16: fp32 range for r
    p = nl.ndarray((parts, per, cols), dtype=mm_dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=p, data1=dy_tile, data2=x_tile, op=nl.multiply)
    r_mm = nl.ndarray((parts, per), dtype=mm_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r_mm, src=rstd)
    for j in range(per):
        accumulate_columns(acc, p[:, j, :], r_mm[:, j:j + 1], first and j == 0)


def _backward(dy, x, weight, eps, dtotal):
    n_rows, cols = x.shape
    assert cols <= BACKWARD_MAX_HIDDEN, f"H={cols} exceeds BACKWARD_MAX_HIDDEN={BACKWARD_MAX_HIDDEN}"
    assert cols * itemsize(x.dtype) <= BACKWARD_MAX_ROW_BYTES, \
        f"a row of H={cols} {x.dtype} exceeds BACKWARD_MAX_ROW_BYTES={BACKWARD_MAX_ROW_BYTES}"
    dx = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    partials = None if weight is None else new_partials(cols, WORK_PARTS)
    eps_tile = fp32_column(eps)
    per_max = rows_per_partition(cols, TARGET_COLS, BACKWARD_MAX_HIDDEN)
    weight_bytes = 0 if weight is None else cols * itemsize(weight.dtype)
    # one accumulator per program, restarted by each part's first matmul (at LNC=1 the two
    # parts take it in turn; two diagonal accumulators would not fit PSUM)
    diag = diag_fits(cols)
    dw = None if weight is None else "diagonal" if diag else "columns"
    scratch = _a_prime_bytes(per_max, cols, itemsize(x.dtype), dw) if dtotal is None else 0
    ahead = _prefetch_ahead(per_max, cols, itemsize(x.dtype), 2 if dtotal is None else 3, weight_bytes, scratch)
    params = {}
    acc = None if weight is None else (new_diag_accumulator(cols) if diag else new_accumulator(cols))
    blocks_begun = []     # every part's blocks, in order: the ring slot of the next one
    g_depth = _g_ring_depth(per_max, cols, itemsize(x.dtype), ahead, weight_bytes, scratch) \
        if weight is not None and dtotal is None else 0
    g_ring = nl.ndarray((PARTITIONS, g_depth, per_max, cols), dtype=x.dtype, buffer=nl.sbuf) if g_depth else None
    first_part, end_part = share(WORK_PARTS, nl.program_id(0), nl.num_programs())
    for part in range(first_part, end_part):
        lo, hi = row_part(n_rows, part, WORK_PARTS)
        blocks = row_blocks(hi, per_max, first_row=lo) if hi > lo else []
        done = []

        def load(block):
            start, parts, per = block
            dy_tile, x_tile = load_block(dy, start, parts, per), load_block(x, start, parts, per)
            if weight is not None and "weight" not in params:
                # after the first block's loads, which the first compute waits for
                params["weight"] = broadcast_rows(weight, cols)
            return dy_tile, x_tile, None if dtotal is None else load_block(dtotal, start, parts, per)

        # Software pipelining across blocks: each engine runs its instructions in program
        # order, so a block's chain stats -> g, q -> c -> a -> t -> dx would leave engines
        # waiting. Program order per block i is instead: stats(i) (ScalarE), the first half
        # of block i (g, q, c, dw sums), then the second half of block i - 1 (a, t, dx: its
        # inputs are ready), then block i - 1's store (tiling.pipelined_halves).
        # The first half of block i goes before the second half of block i - 1 because the
        # other order closes a loop from block to block: c(i - 1) -> a(i - 1) -> t(i - 1)
        # -> GpSimd's g(i), q(i) -> c(i), each waiting on the one before on its engine, so
        # a block took that chain's length rather than its busiest engine's time (modeled
        # trn2 LNC=2 [2048, 8192] bf16: 36 us per block against GpSimd's 25; 325.7 -> 267.4
        # us for the launch, docs/history.md). The last block keeps the other order: no
        # block follows it to fill the engines, and block i - 1's dx leaves sooner.
        def front(block, tiles):
            _, parts, per = block
            dy_tile, x_tile, _ = tiles
            rstd = _stats(x_tile, parts, per, cols, eps_tile)
            g_tile = None if g_ring is None else g_ring[0:parts, len(blocks_begun) % g_depth, 0:per, :]
            blocks_begun.append(block)
            state = _front(dy_tile, x_tile, rstd, parts, per, cols, params.get("weight"), acc, not done,
                           dtotal is not None, g_tile, program_first=len(blocks_begun) == 1)
            done.append(block)
            return state

        def back(block, tiles, state):
            start, parts, per = block
            dx_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
            last = part == end_part - 1 and block == blocks[-1]             # the program's last block
            chunks = drain_chunks(per, cols, itemsize(x.dtype), DMA_RECOMMENDED_BYTES) if last else []
            if chunks:
                def store_chunk(j, lo, hi):
                    nisa.dma_copy(dst=block_rows(dx, start, parts, per)[:, j, lo:hi], src=dx_tile[:, j, lo:hi])
                _back_drained(tiles[1], tiles[2], dx_tile, parts, chunks, state, store_chunk)
                return None      # stored
            _back(tiles[1], tiles[2], dx_tile, parts, per, cols, state)
            return dx_tile

        def store(block, dx_tile):
            start, parts, per = block
            if dx_tile is not None:
                nisa.dma_copy(dst=block_rows(dx, start, parts, per), src=dx_tile)

        pipelined_halves(blocks, load, front, back, store, ahead)
        if partials is not None and diag:
            store_diag_partial(partials, part, acc, cols, bool(done), identity())
        elif partials is not None:
            store_partial(partials, part, acc, cols, bool(done))
    return dx, partials


@nki.jit
def rms_norm_backward_kernel(dy, x, weight=None, eps=1e-6):
    """Gradients of ``rms_norm(x) * weight`` given the output gradient ``dy``.

    Args:
        dy: HBM [N, H], dtype of ``x``.
        x: HBM [N, H], float32/bfloat16/float16, H <= BACKWARD_MAX_HIDDEN.
        weight: HBM [H] of any float dtype, or None.
        eps: float, the forward's.
    Returns:
        dx: HBM [N, H] (shared_hbm), dtype of ``x``; with a weight also
        dw_partials: HBM [WORK_PARTS, 128, ceil(H / 128)] fp32, one partial column sum
        per work part, column h at [part, h % 128, h // 128] (weight_grads.py); the
        caller sums the parts.
    """
    dx, partials = _backward(dy, x, weight, eps, None)
    return dx if partials is None else (dx, partials)


@nki.jit
def fused_add_rms_norm_backward_kernel(dy, dtotal, total, weight=None, eps=1e-6):
    """Gradient of ``total`` (= of ``input`` = of ``residual``) for fused_add_rms_norm,
    given the gradients of its two outputs, and the weight gradient.

    Args:
        dy: HBM [N, H], gradient of the normalised output, dtype of ``total``.
        dtotal: HBM [N, H], gradient of the ``total`` output, dtype of ``total``.
        total: HBM [N, H], the forward's ``input + residual`` (float32/bfloat16/float16).
        weight: HBM [H] of any float dtype, or None.
        eps: float, the forward's.
    Returns:
        as ``rms_norm_backward_kernel``: dtotal_in [N, H] (and dw_partials).
    """
    dx, partials = _backward(dy, total, weight, eps, dtotal)
    return dx if partials is None else (dx, partials)
