"""RMSNorm over the last dimension, optionally fused with a residual add.

    out = x * rsqrt(mean(x**2) + eps) * weight                      (rms_norm_kernel)
    s = x + residual; out = rms_norm(s)   -> (out, s)               (fused_add_rms_norm_kernel)

Dimensions:
    N: rows (any N >= 1).
    H: normalised size, 1 <= H <= MAX_HIDDEN (65536; the op wrapper checks the limit). Rows
       of up to ONE_PASS_MAX_HIDDEN (8192) stay in SBUF: one pass over HBM. Longer rows are
       streamed (see "Streamed rows").
Layout:
    Rows go on partitions. Rows are cut into blocks of 128 * J consecutive rows, partition p of
    a block holding rows [p*J, (p+1)*J): a block is one contiguous HBM range, so its load is one
    DMA of J*H elements per partition. J grows until a partition's transfer holds TARGET_COLS
    elements (>= 4 KiB in bf16) or the rows run out; the last < 128 rows form one [rows, 1, H]
    block. The weight is broadcast once to all 128 partitions ([128, H], stride-0 DMA).
Engines, per row:
    ScalarE  square(x / sqrt(H)) with add-reduction -> mean(x**2) in fp32 (one pass)
    ScalarE  rsqrt(mean + eps) on [P, J] (tiny)
    normalisation, split between three paths in the shares that leave the busiest engine
    least busy by the active generation's figures (_weighted_shares):
      VectorE  (x * rstd) * weight in one scalar_tensor_tensor (fp32 inside, one rounding)
      GpSimd   x * rstd into fp32 scratch (tensor_scalar), then scratch * weight
      ScalarE  x * rstd into fp32 scratch, then GpSimd scratch * weight
    Every path rounds once, to the output dtype. The split is by rows when a partition
    holds J > 1 rows, else by columns.
    Without weight: VectorE x * rstd (tensor_scalar) / ScalarE copy with scale: all on
    VectorE where its pass takes at most half of ScalarE's squares (_unweighted_vector_share:
    16-bit data on trn2 and trn3, VectorE's performance mode), else VECTOR_SHARE of it.
    fused:   VectorE x + residual rounded to the input dtype (stored as the second output and
             normalised from that rounded value, matching an eager add followed by rms_norm).
    The program's last block is normalised and stored in column chunks of >= 4 KiB per
    partition, each stored when made (_normalize_or_drain).
    Block i+1's load overlaps block i's compute: the loads run PREFETCH_AHEAD blocks ahead
    into fresh tiles, and the outputs go through a ring of OUT_RING_DEPTH tiles where SBUF
    holds it (_out_ring_depth; else fresh tiles per block). fused_add_rms_norm loads x and
    residual FUSED_PREFETCH_AHEAD blocks ahead where a block's two rows take at most
    PREFETCH_MAX_ROW_BYTES, else one (as far as SBUF holds them: _prefetch_ahead), its
    outputs in a tile per block.
Streamed rows (H > ONE_PASS_MAX_HIDDEN): tiles of 128 rows, in column chunks of
    STREAM_CHUNK, two passes:
      pass 1 per chunk: (fused: VectorE s = x + residual, stored) ScalarE
              square(x / sqrt(H)) with add-reduction -> one partial sum per chunk; then
              VectorE adds the partials, ScalarE rsqrt(mean + eps)
      pass 2 per chunk: normalised as above, stored. The chunks are kept in SBUF from
              pass 1 when the row tile takes <= RESIDENT_ROW_BYTES per partition (bf16 up
              to H = 32768, fp32 up to 16384: HBM read once), else reloaded from HBM
              (fused: s recomputed from x and residual, the same rounded values). Kept
              row tiles take ROW_SLOTS slots of one allocation in turn where they fit
              beside the weight and the chunk scratch (_row_slots_fit: bf16 to H = 16384
              on trn2), so the next tile's pass 1 overlaps this tile's pass 2.
    The weight stays in SBUF when its [128, H] copy takes <= RESIDENT_PARAM_BYTES per
    partition (bf16 up to H = 32768), else each chunk loads its columns.
Expected error:
    statistics and products in fp32; one rounding to the output dtype (bf16: <= 2**-8
    relative per element; fp32: ~1e-6 relative).
"""

import math

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .limits import NORM_MAX_HIDDEN as MAX_HIDDEN
from .limits import NORM_ONE_PASS_MAX_HIDDEN as ONE_PASS_MAX_HIDDEN
from .limits import NORM_RESIDENT_PARAM_BYTES as RESIDENT_PARAM_BYTES
from .limits import NORM_RESIDENT_ROW_BYTES as RESIDENT_ROW_BYTES
from .limits import NORM_STREAM_CHUNK as STREAM_CHUNK
from .tiling import (DMA_SATURATING_BYTES, PARTITIONS, block_rows, broadcast_rows, column_chunks, drain_chunks,
                     fitting_ahead, fp32_column, itemsize, load_block, load_blocks, param_columns, path_segments,
                     pipelined, program_row_blocks, resident_params, rows_per_partition, split_count)

# Rows are packed per partition until one transfer moves >= 2048 elements per partition:
# 4 KiB in bf16 / 8 KiB in fp32, the DMA guide's size for saturating bandwidth.
TARGET_COLS = 2048
# Row blocks loaded this many blocks ahead of their compute (tiling.pipelined): with the
# DMA latency (~1.3 us) on every load, a block's data must be on its way two blocks early
# to reach the engines in time (modeled on trn2: 1 ahead 120 us, 2 ahead 110 us for
# [2048, 4096] bf16 at LNC=1).
PREFETCH_AHEAD = 2
# ... for rows of at most this many bytes; longer rows (fp32 past 4096) load one block ahead:
# two [128, J, H] fp32 blocks in flight besides the block being computed, its fp32 scratch
# and output take more than trn2's 224 KiB per partition at H = 8192 (the simulator's
# capacity check, live ranges: 206 KiB in use before a third 32 KiB tile).
PREFETCH_MAX_ROW_BYTES = 16 * 1024
# Output tiles of the one-pass form, as a ring (_out_ring_depth; 2 where it does not fit):
# a block's output waits for the store OUT_RING_DEPTH blocks back, where a tile allocated
# per block rotates 2 buffers and so waited for the store of the block before last, issued
# only after the previous block's compute (tiling.pipelined) and 1.3 us in flight. Modeled
# trn2 LNC=2, us, 2 -> 3 (session 53): bf16 [2048, 4096] 58.4 -> 55.9, [2048, 8192] 111.1
# -> 104.9, [4096, 2048] 59.1 -> 57.8; 4 models the same as 3.
OUT_RING_DEPTH = 3
# fused_add_rms_norm's loads ahead of its compute (_prefetch_ahead; tiling.pipelined).
# Until session 59 it loaded each block just before its own compute. Modeled trn2 LNC=2 with
# a weight, us: bf16 [2048, 4096] 103.1 -> 97.3, [2048, 8192] (one block ahead) 207.8 ->
# 204.3, [4096, 1024] 56.5 -> 50.9, [6304, 768] 65.6 -> 58.2; 14 shapes x (trn2 LNC=2 and 1,
# trn3, trn1; bf16, fp16, fp32; with and without weight; 154 runs): geomean -3.2 to -7.5 % per
# configuration, none slower; outputs unchanged. Two blocks ahead at 8192 bf16 columns
# (DMA-bound: 191 us of transfers per core) modeled 230.9 against 204.3 at one: the queues
# took the early loads before the stores the last block's chain waits on.
FUSED_PREFETCH_AHEAD = 2
# [P, J] fp32 tiles of a block's statistics that _fused_live_bound adds to its row-sized tiles.
FUSED_SMALL_TILES = 4
# Streamed rows kept in SBUF between the passes (RESIDENT_ROW_BYTES): two row tiles' slots
# of one allocation where they fit (_row_slots_fit), else the chunks' own tiles. Per-chunk
# tiles of one allocation site rotate two buffers, so a row tile's first loads waited for
# the normalisation of the tile before. Modeled (session 59), with a weight, us: trn2 LNC=2
# bf16 [2048, 16384] 288.7 -> 214.0, [2048, 12288] 236.7 -> 165.0, [640, 10240] 84.7 ->
# 67.8, fused [2048, 16384] 419.9 -> 402.1; 80 runs (8 shapes of 128-2048 rows x 10240-32768
# columns; trn2 at LNC=2 and 1, trn3, trn1; bf16 and fp32; rms_norm and fused): geomean 0 to
# -17.7 % per configuration, none slower; outputs unchanged bit for bit.
ROW_SLOTS = 2
# Without a weight, the normalisation's share on VectorE where its tensor_scalar is not at
# most half of ScalarE's squares (_unweighted_vector_share).
VECTOR_SHARE = 0.5
# Step of the grid of shares _weighted_shares searches (1/20: trn1's and trn2's per-element
# balance, 0.5 and 0.25, lies on it; finer steps only matter for columns of a single row).
SHARE_STEP = 0.05


def _weighted_shares(per, cols, sixteen, fused):
    """(VectorE share, GpSimd share) of a [P, per, cols] block's normalisation with a weight
    (the ScalarE + GpSimd path takes the rest), on a grid of SHARE_STEP: the shares whose
    block is least bound, i.e. the least max(the block's DMA time per queue, its busiest
    engine) (_block_engine_ns; ``fused``: VectorE's residual add counted), and of those
    bound alike (the DMA-bound ones) the one whose busiest engine, the add left out, is
    least busy. Ties go to the larger VectorE share, then the larger GpSimd share.

    Per element, fixed costs aside, the balance is VectorE 2a / f_v, ScalarE (1 / r + 1 -
    a - g) / f_s, GpSimd (g + 2 (1 - a)) / f_g (a, g the shares, r ScalarE's 16-bit rate):
    trn2 (0.96 / 1.2 / 1.2 GHz) a = 0.5, g = 0.25, 1.04 ns per element on each, under the
    1.39 ns bf16 HBM traffic takes (2 B read + 2 B written at 368 GB/s over 128 partitions);
    trn1 the same shares; trn3 (r = 2) a = 0.5, g = 0. The fixed costs move it (ScalarE's
    360 cycles per instruction on trn2 and trn3): a 4096-column bf16 row takes 0.55 / 0.35
    on trn2, 0.55 / 0.1 on trn3 (0.55 / 0.4 and 0.55 / 0.15 until the refit of 2026-12-06);
    [P, 4, 512] blocks 2 rows VectorE, 2 GpSimd, none ScalarE
    on trn2, 3 / 1 / 0 on trn3. The fused add is left out of the second key because it runs
    before the statistics, not beside the normalisation: with one key (the busiest engine,
    the add counted) fused_add_rms_norm modeled +2.4 % geomean on trn2 and +3.4 % on trn3
    (14 shapes), and with the add left out of both keys trn3 [8192, 512] modeled 38.4 ->
    48.4 us (VectorE then the busiest engine).

    Until session 62 the shares were constants swept on trn2 (0.5, 0.3). Against them,
    modeled (session 62, us, with a bf16 weight; 13-14 shapes of 64-8192 rows x 128-8192
    columns): rms_norm trn2 LNC=2 bf16 geomean -1.7 % ([8192, 512] 41.1 -> 36.6, [3000,
    2048] 45.5 -> 43.2; Llama-7B [2048, 4096] 54.7 -> 55.4 the slowest, +1.2 %), fp32 -0.1 %,
    LNC=1 -3.1 %, trn3 bf16 -7.2 % ([4096, 4096] 84.8 -> 72.2, none slower), fp32 -1.8 %
    (at most +1.9 %), trn1 -1.1 %; fused_add_rms_norm trn2 -0.2 % (at most +2.8 %), trn3
    -1.0 % ([1576, 768] +9.5 %: two blocks and a tail per core, the estimate's steady state
    not reached), trn1 -0.3 %. Streamed rows (10240-65536 columns, pass 2's chunks priced as
    blocks of one row): trn3 -4.8 %, trn1 +0.2 %, trn2 +2.5 % ([2048, 12288] 165.0 ->
    174.6, the largest). Outputs unchanged bit for bit (every path rounds once)."""
    steps = round(1 / SHARE_STEP)
    # the block's HBM traffic per DMA queue: x in, out back (fused: also residual in, total out)
    dma = active_engine_costs().queue_data_ns((4 if fused else 2) * per * cols * (2 if sixteen else 4))
    best = None
    for i in range(steps, -1, -1):
        for k in range(steps - i, -1, -1):
            with_add, without_add = _block_engine_ns(per, cols, sixteen, fused, i / steps, k / steps)
            estimate = (max(dma, max(with_add)), max(without_add))
            if best is None or estimate[0] < best[0][0] - 1e-6 or (
                    estimate[0] < best[0][0] + 1e-6 and estimate[1] < best[0][1] - 1e-6):
                best = (estimate, i / steps, k / steps)
    return best[1], best[2]


def _block_engine_ns(per, cols, sixteen, fused, vector_share, gpsimd_share):
    """Estimated (VectorE, ScalarE, GpSimd) ns of one [P, per, cols] block with a weight
    when the normalisation is split by ``vector_share`` and ``gpsimd_share``
    (tiling.path_segments' cuts), by the cost model's rules with the active generation's
    figures (engine_costs.py; pass counts of simulator/cost/model.py): ScalarE squares
    every row (16-bit data at its 16-bit rate: the squares keep the input's dtype) and
    takes rsqrt of the statistics; per segment VectorE's scalar_tensor_tensor reads two
    full inputs (2 cycles per element, no performance mode for it), GpSimd's tensor_scalar
    one and tensor_tensor two, ScalarE's copy into fp32 one. ``fused``: VectorE also adds
    the residual (a tensor_tensor over the block, 16-bit in its performance mode)."""
    c = active_engine_costs()
    gp_two = c.gpsimd_two_input_rate()      # GpSimd: two full inputs per element
    n = per if per > 1 else cols
    cuts = [0, split_count(n, vector_share), split_count(n, vector_share + gpsimd_share), n]
    # (instructions, elements each) per path: whole rows, or one column span of the row
    paths = [(hi - lo, cols) if per > 1 else (int(hi > lo), hi - lo) for lo, hi in zip(cuts, cuts[1:])]
    (n_vec, w_vec), (n_gp, w_gp), (n_sc, w_sc) = paths
    vector = n_vec * c.instruction_ns("vector", w_vec, rate=c.vector_stt_rate())
    scalar = n_sc * c.instruction_ns("scalar", w_sc)
    gpsimd = (n_gp * (c.instruction_ns("gpsimd", w_gp) + c.instruction_ns("gpsimd", w_gp, rate=gp_two))
              + n_sc * c.instruction_ns("gpsimd", w_sc, rate=gp_two))
    add = c.instruction_ns("vector", per * cols, rate=c.vector_two_input_rate(sixteen)) if fused else 0.0
    scalar += per * c.instruction_ns("scalar", cols, rate=c.scalar_rate(sixteen)) + c.instruction_ns("scalar", per)
    return (vector + add, scalar, gpsimd), (vector, scalar, gpsimd)


def _path_segments(per, cols, shares):
    """[(row j, first column, end column, path)] splitting a [P, per, cols] block's
    normalisation between the paths "vector", "gpsimd" and "scalar" in ``shares``
    (_normalization_shares): whole rows when a partition holds several rows, else the
    columns of its single row."""
    paths = ("vector", "gpsimd", "scalar")
    return [(j, lo, hi, paths[k]) for j, lo, hi, k in path_segments(per, cols, shares)]


def _normalization_shares(per, cols, with_weight, sixteen, fused):
    """(VectorE share, GpSimd share) of a [P, per, cols] block's normalisation, the
    ScalarE path taking the rest: _weighted_shares with a weight; without one
    _unweighted_vector_share and no GpSimd path (``sixteen``: 16-bit data in and out;
    ``fused``: fused_add_rms_norm's block, whose VectorE also adds the residual)."""
    if with_weight:
        return _weighted_shares(per, cols, sixteen, fused)
    return _unweighted_vector_share(cols, sixteen), 0.0


def _unweighted_vector_share(cols, sixteen):
    """Share of the normalisation without a weight (y = x * rstd) on VectorE (tensor_scalar),
    the rest on ScalarE (copy with scale): all of it where VectorE's pass over a row of
    ``cols`` takes at most half as long as the squares ScalarE makes of the same row for the
    statistics, else VECTOR_SHARE. By the active generation's figures (engine_costs.py):
    16-bit data in and out runs VectorE's tensor_scalar in its performance mode (4 elements
    per cycle on trn2 and trn3; a 4096-column bf16 row 1.2 us on trn2 against ScalarE's
    square 3.7 us, 0.9 against 2.0 on trn3), so 16-bit rows go to VectorE there; fp32 rows
    and trn1 (no such mode) keep the split. The margin of half: where the two passes cost
    about the same (fp32 on trn3, short fp32 rows on trn2), all on VectorE modeled up to
    11 % slower (trn3 LNC=2, fp32 [130, 8192] 30.0 -> 33.2 us): each block's normalisation
    then starts only when ScalarE's squares end, where in the split ScalarE makes its share
    right after them. Modeled LNC=2, no weight, us, split -> VectorE (session 54): trn2
    bf16 [2048, 2048] 34.4 -> 27.4, [2048, 4096] 58.4 -> 49.0, [4096, 256] 19.6 -> 16.5;
    trn3 bf16 [4096, 256] 16.2 -> 13.7; of 56 shapes (1-4096 rows x 256-16384 columns) 39
    faster on each of trn2 and trn3 and none slower (trn2 at LNC=1: 38 faster, none more
    than 0.1 % slower); fused_add_rms_norm (the same blocks) trn2 bf16 [2048, 4096] 100.4 ->
    97.0, [300, 8192] 51.2 -> 46.9."""
    c = active_engine_costs()
    vector = c.instruction_ns("vector", cols, rate=c.vector_one_input_rate(sixteen))
    square = c.instruction_ns("scalar", cols, rate=c.scalar_rate(sixteen))
    return 1.0 if 2 * vector <= square else VECTOR_SHARE


def _scale_rows(dst, src, rstd_col, weight_cols, path):
    """dst = src * rstd (* weight) for one [P, w] segment on ``path`` (_path_segments)."""
    parts, width = src.shape[0], src.shape[-1]
    if path == "gpsimd":                # (taken only with a weight: _path_segments)
        scaled = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=scaled, data=src, op0=nl.multiply, operand0=rstd_col, engine=nisa.engine.gpsimd)
        nisa.tensor_tensor(dst=dst, data1=scaled, data2=weight_cols, op=nl.multiply, engine=nisa.engine.gpsimd)
        return
    if path == "vector":
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


def _prefetch_ahead(per, cols, itemsize, weight_bytes):
    """Blocks fused_add_rms_norm loads ahead of their compute (x and residual each): the
    most of FUSED_PREFETCH_AHEAD, 1 and 0 whose tiles fit the active generation's SBUF
    (_fused_live_bound), two only where a block's x and residual rows together take at
    most PREFETCH_MAX_ROW_BYTES."""
    most = FUSED_PREFETCH_AHEAD if 2 * cols * itemsize <= PREFETCH_MAX_ROW_BYTES else 1
    return fitting_ahead(most, lambda ahead: _fused_live_bound(per, cols, itemsize, weight_bytes, ahead))


def _fused_live_bound(per, cols, itemsize, weight_bytes, ahead):
    """Bytes per partition fused_add_rms_norm's one-pass form holds at ``ahead`` blocks
    ahead: x and residual of ahead + 1 blocks, the sum and the output of the block being
    computed and of the one whose output is still to be stored (pipelined stores a block's
    output after the next block's compute), the broadcast weight row and FUSED_SMALL_TILES
    [P, J] fp32 statistics. The simulator's liveness sweep meets it to within those small
    tiles (tests/kernels/test_widest_rows_fit_sbuf.py): 114692 bytes at bf16 H = 8192 one
    block ahead (trn2 holds 224 KiB), 229380 for fp32 H = 8192, which therefore loads no
    block ahead on trn2."""
    block = per * cols * itemsize
    return (2 * (ahead + 1) + 2) * block + weight_bytes + FUSED_SMALL_TILES * 4 * per


def _out_ring_depth(per, cols, itemsize, ahead, weight_bytes):
    """Output tiles of the one-pass form held at once: OUT_RING_DEPTH where that ring fits
    the active generation's SBUF beside the ``ahead`` + 1 input blocks in flight, two
    buffers each of a block's scratch (the discarded squares and the fp32 products) and
    the broadcast weight (``weight_bytes`` per partition), else 2 (the rotation of a tile
    allocated per block)."""
    block = per * cols * itemsize
    need = (ahead + 1) * block + OUT_RING_DEPTH * block + 2 * (cols * itemsize + per * cols * 4) + weight_bytes
    return OUT_RING_DEPTH if need <= active_engine_costs().sbuf_bytes_per_partition else 2


def _normalize_block(out_tile, x_tile, parts, per, cols, weight_tile, eps_tile, fused, drain=None):
    """out_tile[p, j, :] = rms_norm(x_tile[p, j, :]) * weight for a [parts, per, cols] block
    (``fused``: of fused_add_rms_norm, for _normalization_shares).
    ``drain`` (the program's last block): (chunks, store_chunk): the normalisation goes
    chunk by chunk of tiling.drain_chunks, each chunk stored by store_chunk(j, c0, c1) when
    made (_normalize_or_drain)."""
    # mean(x^2) per row: ScalarE squares x / sqrt(H) and add-reduces along the free axis (fp32).
    # The squared values themselves are not needed: they go to a scratch tile of their own
    # (written into out_tile they would make this block's statistics wait for the buffer the
    # block's output shares with an earlier block's, i.e. for that block's store).
    mean_sq = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    inv_sqrt_cols = 1.0 / math.sqrt(cols)
    squares = nl.ndarray((parts, cols), dtype=x_tile.dtype, buffer=nl.sbuf)      # discarded
    for j in range(per):
        nisa.activation(dst=squares, op=nl.square, data=x_tile[:, j, :],
                        scale=inv_sqrt_cols, reduce_op=nl.add, reduce_res=mean_sq[:, j:j + 1],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
    # rstd = rsqrt(mean + eps): [parts, per] fp32, ScalarE, eps as a per-partition bias.
    rstd = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_sq, bias=eps_tile[0:parts, :])
    weight = None if weight_tile is None else weight_tile[0:parts, :]
    sixteen = itemsize(x_tile.dtype) == 2
    if drain is not None:
        # each chunk of a row split in the shares of the whole row
        chunks, store_chunk = drain
        row_shares = _normalization_shares(1, cols, weight is not None, sixteen, fused)
        for j, c0, c1 in chunks:
            for _, lo, hi, path in _path_segments(1, c1 - c0, row_shares):
                lo, hi = c0 + lo, c0 + hi
                _scale_rows(out_tile[:, j, lo:hi], x_tile[:, j, lo:hi], rstd[:, j:j + 1],
                            None if weight is None else weight[:, lo:hi], path)
            store_chunk(j, c0, c1)
        return
    shares = _normalization_shares(per, cols, weight is not None, sixteen, fused)
    for j, lo, hi, path in _path_segments(per, cols, shares):
        _scale_rows(out_tile[:, j, lo:hi], x_tile[:, j, lo:hi], rstd[:, j:j + 1],
                    None if weight is None else weight[:, lo:hi], path)


def _normalize_or_drain(out, out_tile, src_tile, block, last, weight_tile, eps_tile, fused=False):
    """Normalise one row block of ``src_tile`` into ``out_tile`` and return it for its store
    (_store_block); the program's last block (``last``), where its rows are long enough to
    cut into transfers of >= 4 KiB per partition (tiling.DMA_SATURATING_BYTES: these
    kernels are DMA-bound), is stored here chunk by chunk as it is made: returns None.

    Modeled (session 60, us, trn2 LNC=2 bf16 with a weight): Llama-7B [2048, 4096] 55.9 ->
    54.7, [1024, 8192] 68.0 -> 64.7, [512, 4096] 23.3 -> 22.1; fused [2048, 8192] 204.3 ->
    200.7. 14 configurations x 13-14 shapes (rms_norm and fused_add_rms_norm; bf16, fp16,
    fp32; with and without a weight; trn2 at LNC=2 and 1, trn3, trn1): geomean +0.1 to -2.5 %
    per configuration, up to -9.5 %; two runs slower, by at most 0.9 % (trn1 bf16); outputs
    unchanged bit for bit. Cut at 2 KiB: trn2 bf16 -2.3 % geomean, but fp32 and trn1 runs up
    to 1.9 % and 4.3 % slower (more transfers where the DMA queues set the time)."""
    start, parts, per = block
    cols = out_tile.shape[-1]
    chunks = drain_chunks(per, cols, itemsize(out_tile.dtype), DMA_SATURATING_BYTES) if last else []
    if not chunks:
        _normalize_block(out_tile, src_tile, parts, per, cols, weight_tile, eps_tile, fused)
        return out_tile

    def store_chunk(j, c0, c1):
        nisa.dma_copy(dst=block_rows(out, start, parts, per)[:, j, c0:c1], src=out_tile[:, j, c0:c1])

    _normalize_block(out_tile, src_tile, parts, per, cols, weight_tile, eps_tile, fused, (chunks, store_chunk))
    return None


def _store_block(out, block, out_tile):
    """Store a block's output tile to its rows of ``out`` (None: already stored)."""
    start, parts, per = block
    if out_tile is not None:
        nisa.dma_copy(dst=block_rows(out, start, parts, per), src=out_tile)


def _load_rows(x, residual, total, start, parts, c0, c1, store, into=None):
    """[parts, c1 - c0] SBUF tile of rows start:start+parts, columns c0:c1 of x, or of
    s = x + residual (VectorE, fp32 inside, rounded once to x's dtype; stored to ``total``
    when ``store``); into ``into`` (a [parts, c1 - c0] view) when given."""
    x_tile = into if into is not None and residual is None else nl.ndarray((parts, c1 - c0), dtype=x.dtype,
                                                                            buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=x[start:start + parts, c0:c1])
    if residual is None:
        return x_tile
    r_tile = nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=r_tile, src=residual[start:start + parts, c0:c1])
    s_tile = into if into is not None else nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s_tile, data1=x_tile, data2=r_tile, op=nl.add)
    if store:
        nisa.dma_copy(dst=total[start:start + parts, c0:c1], src=s_tile)
    return s_tile


def _row_slots_fit(cols, itemsize, weight_bytes, fused):
    """Whether the streamed form's resident row tiles can take ROW_SLOTS slots of one
    allocation: those rows, the resident weight (``weight_bytes``) and two buffers of each
    chunk-sized tile (the output, the discarded squares, the fp32 products; fused: x and the
    residual) within the active generation's SBUF. bf16 rows of 16384 with a bf16 weight:
    160 KiB (fused 192); 32768: 256 KiB, so one row tile at a time there."""
    chunk = STREAM_CHUNK * itemsize
    scratch = 2 * (2 * chunk + STREAM_CHUNK * 4 + (2 * chunk if fused else 0))
    need = ROW_SLOTS * cols * itemsize + weight_bytes + scratch
    return need <= active_engine_costs().sbuf_bytes_per_partition


def _rms_norm_streamed(x, out, weight, eps_tile, residual=None, total=None):
    """rms_norm (fused with the residual add when ``residual`` is given) of rows too long
    for SBUF: 128-row tiles, column chunks, two passes over HBM (module docstring)."""
    n_rows, cols = x.shape
    chunks = column_chunks(cols, STREAM_CHUNK)
    inv_sqrt_cols = 1.0 / math.sqrt(cols)
    weight_res = resident_params([weight], cols, RESIDENT_PARAM_BYTES)[0]
    resident = cols * itemsize(x.dtype) <= RESIDENT_ROW_BYTES
    weight_bytes = 0 if weight_res is None else cols * itemsize(weight.dtype)
    # resident row tiles: one allocation of two rows' slots where they fit (_row_slots_fit),
    # the tiles taken in turn, so a tile's pass 1 loads while the tile before is normalised
    two_rows = resident and _row_slots_fit(cols, itemsize(x.dtype), weight_bytes, residual is not None)
    rows_ring = nl.ndarray((PARTITIONS, ROW_SLOTS, cols), dtype=x.dtype, buffer=nl.sbuf) if two_rows else None
    for t, (start, parts, _) in enumerate(program_row_blocks(n_rows, 1)):       # 128-row tiles, J = 1
        # pass 1: sum over chunks of (x / sqrt(H))^2, one partial per chunk; the chunks
        # (fused: of s) kept in SBUF for pass 2 when the row tile fits
        kept = []
        partial = nl.ndarray((parts, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
        for c, (c0, c1) in enumerate(chunks):
            into = None if rows_ring is None else rows_ring[0:parts, t % ROW_SLOTS, c0:c1]
            s_tile = _load_rows(x, residual, total, start, parts, c0, c1, store=True, into=into)
            if resident:
                kept.append(s_tile)
            squares = nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)   # discarded
            nisa.activation(dst=squares, op=nl.square, data=s_tile, scale=inv_sqrt_cols,
                            reduce_op=nl.add, reduce_res=partial[:, c:c + 1],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
        mean_sq = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mean_sq, op=nl.add, data=partial, axis=1)
        rstd = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_sq, bias=eps_tile[0:parts, :])
        # pass 2: normalise the kept chunks, or reload them (fused: recompute s from x and
        # residual: the same rounded values), store
        for c, (c0, c1) in enumerate(chunks):
            s_tile = kept[c] if resident else _load_rows(x, residual, total, start, parts, c0, c1, store=False)
            w_cols = param_columns(weight, weight_res, c0, c1)
            out_tile = nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
            shares = _normalization_shares(1, c1 - c0, w_cols is not None, itemsize(x.dtype) == 2,
                                           residual is not None)
            for _, lo, hi, path in _path_segments(1, c1 - c0, shares):
                _scale_rows(out_tile[:, lo:hi], s_tile[:, lo:hi], rstd,
                            None if w_cols is None else w_cols[0:parts, lo:hi], path)
            nisa.dma_copy(dst=out[start:start + parts, c0:c1], src=out_tile)


@nki.jit
def rms_norm_kernel(x, weight=None, eps=1e-6):
    """Return ``x * rsqrt(mean(x**2, -1) + eps) * weight``.

    Args:
        x: HBM [N, H], float32/bfloat16/float16, H <= MAX_HIDDEN.
        weight: HBM [H] of any float dtype, or None (no scaling).
        eps: float added to the mean square.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``.
    """
    n_rows, cols = x.shape
    assert cols <= MAX_HIDDEN, f"H={cols} exceeds MAX_HIDDEN={MAX_HIDDEN}"
    out = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    eps_tile = fp32_column(eps)
    if cols > ONE_PASS_MAX_HIDDEN:
        _rms_norm_streamed(x, out, weight, eps_tile)
        return out
    params = {}
    blocks = program_row_blocks(n_rows, rows_per_partition(cols, TARGET_COLS, ONE_PASS_MAX_HIDDEN))

    def load(block):
        start, parts, per = block
        x_tile = load_block(x, start, parts, per)
        if weight is not None and "weight" not in params:
            # after the first block's load, so that load (which compute waits for) goes first
            params["weight"] = broadcast_rows(weight, cols)
        return x_tile

    ahead = PREFETCH_AHEAD if cols * itemsize(x.dtype) <= PREFETCH_MAX_ROW_BYTES else 1
    per_max = max((per for _, _, per in blocks), default=1)
    weight_bytes = 0 if weight is None else cols * itemsize(weight.dtype)
    depth = _out_ring_depth(per_max, cols, itemsize(x.dtype), ahead, weight_bytes)
    # output tiles: one allocation of `depth` where it fits (a block's output then waits only
    # for the store `depth` blocks back), else a tile per block (rotating 2 buffers)
    out_ring = None
    if depth > 2:
        out_ring = nl.ndarray((PARTITIONS, depth, per_max, cols), dtype=x.dtype, buffer=nl.sbuf)
    computed = []

    def compute(block, x_tile):
        start, parts, per = block
        if out_ring is None:
            out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        else:
            out_tile = out_ring[:parts, len(computed) % depth, 0:per, :]
        computed.append(block)
        return _normalize_or_drain(out, out_tile, x_tile, block, block == blocks[-1], params.get("weight"), eps_tile)

    pipelined(blocks, load, compute, lambda block, out_tile: _store_block(out, block, out_tile), ahead)
    return out


@nki.jit
def fused_add_rms_norm_kernel(x, residual, weight=None, eps=1e-6):
    """Return ``(rms_norm(x + residual) * weight, x + residual)``.

    Args:
        x: HBM [N, H], float32/bfloat16/float16, H <= MAX_HIDDEN.
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
    if cols > ONE_PASS_MAX_HIDDEN:
        _rms_norm_streamed(x, out, weight, fp32_column(eps), residual=residual, total=total)
        return out, total
    eps_tile = fp32_column(eps)
    blocks = program_row_blocks(n_rows, rows_per_partition(cols, TARGET_COLS, ONE_PASS_MAX_HIDDEN))
    per_max = max((per for _, _, per in blocks), default=1)
    weight_bytes = 0 if weight is None else cols * itemsize(weight.dtype)

    # the weight first: with it after the first block's loads (rms_norm's order) the first
    # sums start sooner, but the last block's sum then came after the previous block's
    # normalisation on VectorE (modeled trn2 LNC=2, bf16 [512, 8192] 63.3 -> 70.6 us)
    weight_tile = None if weight is None else broadcast_rows(weight, cols)

    def compute(block, tiles):
        start, parts, per = block
        x_tile, r_tile = tiles
        # x + residual in fp32 on VectorE, rounded once to the input dtype, stored at once
        s_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s_tile, data1=x_tile, data2=r_tile, op=nl.add)
        nisa.dma_copy(dst=block_rows(total, start, parts, per), src=s_tile)
        out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        return _normalize_or_drain(out, out_tile, s_tile, block, block == blocks[-1], weight_tile, eps_tile,
                                   fused=True)

    pipelined(blocks, lambda block: load_blocks(block, x, residual), compute,
              lambda block, out_tile: _store_block(out, block, out_tile),
              _prefetch_ahead(per_max, cols, itemsize(x.dtype), weight_bytes))
    return out, total
