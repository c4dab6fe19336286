"""LayerNorm over the last dimension: ``(x - mean) * rsqrt(var + eps) * weight + bias``.

Dimensions:
    N: rows (any N >= 1).
    H: normalised size, 1 <= H <= MAX_HIDDEN (65536; checked by the op wrapper). Rows of up
       to ONE_PASS_MAX_HIDDEN (8192) stay in SBUF: one pass over HBM. Longer rows are
       streamed (see "Streamed rows").
Layout:
    Rows on partitions, in blocks of 128 * J consecutive rows (partition p holds rows
    [p*J, (p+1)*J) of the block: one contiguous DMA of J*H elements per partition, J the
    least that makes a transfer TARGET_BYTES_16 (4 KiB) / TARGET_BYTES_32 (8 KiB) long).
    The last < 128 rows form one block with J = 1, issued second (TAIL_POSITION) so its
    small store does not queue behind the last full block's. weight and bias are broadcast
    once to all 128 partitions (stride-0 DMA) right after the first block's load.
    Fresh SBUF tiles per block let block i+1's load overlap block i's compute. Each row's
    fp32 (mean, rstd) goes to its part's statistics tile (_stats_plan); with save_stats (the
    training forward) they are also stored, once per run of same-shaped blocks, for
    kernels/layer_norm_backward.py.
    The program's last block, when it holds J > 1 rows per partition and the work after
    its statistics outlasts the extra transfers (_drains_by_slot), is finished and stored
    row slot by row slot (DRAIN_BY_SLOT): each slot's store (one row of H elements per
    partition) starts when that slot's output is made, so the pipeline's drain is the last
    slot's affine step and store, not the whole block's. A 16-bit last block of one row per
    partition with a weight is so finished in column chunks of >= 4 KiB per partition
    (COLUMN_DRAIN).
16-bit input (bf16/fp16), per row slot (the j-th row of a partition in a block):
    statistics in fp32, on one of two engines (_scalar_stats_share of the slots on ScalarE):
      ScalarE  sum(x - x0) (copy with bias -x0, add-accumulate; x0 the row's first
               element, -x0 for every row slot of the block in one ScalarE instruction);
               GpSimd mean = sum * (1 / H) + x0 (a constant row's mean is exactly x0, so
               it centres to exactly 0, as in torch); ScalarE sum((x - mean)^2) (square
               of -x + mean, accumulate) -> rsqrt(. / H + eps): two-pass variance
      VectorE  bn_stats on <= 512-element chunks, bn_aggr, ScalarE rsqrt(var + eps)
    VectorE  y = (x - mean) * rstd, one tensor_scalar, rounded to the input dtype (16-bit
             in and out: perf mode)
    then y * weight and + bias as 16-bit tensor_tensor, in place, all J rows of the block
    per instruction (weight/bias viewed with a stride-0 row axis), columns split between
    VectorE and GpSimd so the two end together (_vector_share_16).
fp32 input, per row:
    VectorE  bn_stats / bn_aggr -> mean, variance; ScalarE rsqrt(var + eps); -mean * rstd
    then two paths, split by rows when a partition holds J > 1 rows, else by columns:
      VectorE path:  (x - mean) * weight, then (. * rstd) + bias: two scalar_tensor_tensor
      other path:    ScalarE y = x * rstd - mean * rstd (fp32), GpSimd y * weight, GpSimd + bias
    weight only: VectorE path (x - mean) * weight then ScalarE * rstd; other path ScalarE y,
    GpSimd y * weight. No weight/bias: ScalarE y only. Intermediates stay fp32.
    Bias only (any dtype): the op passes weight = ones.
Streamed rows (H > ONE_PASS_MAX_HIDDEN, any dtype): tiles of 128 rows, in column chunks of
    STREAM_CHUNK, two passes (the chunks kept in SBUF between them when the row tile takes
    <= RESIDENT_ROW_BYTES per partition: bf16 up to H = 32768, fp32 up to 16384; else
    reloaded from HBM):
      pass 1 per chunk: VectorE bn_stats per 512 columns into the row's statistics; then
              bn_aggr over the whole row -> mean, variance; ScalarE rsqrt(var + eps)
      pass 2 per chunk: the chunk, normalised as the fp32 input above (two paths
              split by columns, intermediates fp32, ONE rounding to the output dtype also
              for 16-bit input), stored.
    weight and bias stay in SBUF when their [128, H] copies take <= RESIDENT_PARAM_BYTES
    per partition together, else each chunk loads its columns.
Expected error:
    fp32: statistics and arithmetic in fp32, one rounding to the output (~1e-7 relative to
    the output scale). 16-bit: statistics in fp32, but y, y * weight and y * weight + bias
    are each rounded to the input dtype: three roundings instead of one (bf16: each
    <= 2**-9 relative; measured ||err|| / ||ref|| vs float64 2.5e-3 at [1576, 768] with
    weight and bias, against 1.7e-3 with a single rounding; no weight: one rounding).
    Streamed rows: one rounding for every dtype.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .limits import NORM_MAX_HIDDEN as MAX_HIDDEN
from .limits import NORM_ONE_PASS_MAX_HIDDEN as ONE_PASS_MAX_HIDDEN
from .limits import NORM_RESIDENT_PARAM_BYTES as RESIDENT_PARAM_BYTES
from .limits import NORM_RESIDENT_ROW_BYTES as RESIDENT_ROW_BYTES
from .limits import NORM_STREAM_CHUNK as STREAM_CHUNK
from .tiling import (DMA_SATURATING_BYTES, block_rows, broadcast_rows, cdiv, column_chunks, drain_chunks,
                     engine_segments, fitting_ahead, fp32_column, itemsize, load_block, param_columns, part_row_stats,
                     pipelined, program_row_blocks, program_row_parts, resident_params, row_blocks, rows_per_partition,
                     slot_stores_pay, split_count, spread)

# Row packing: the least J that makes a transfer this long per partition (the DMA guide's
# >= 4 KiB for bandwidth; more rows per block would only lengthen the pipeline fill/drain).
TARGET_BYTES_16 = 4096
TARGET_BYTES_32 = 8192
# Where the < 128-row tail block goes in the block order.
TAIL_POSITION = 1
# Row blocks loaded this many blocks ahead of their compute (tiling.pipelined; see
# rms_norm.py); fewer where their tiles would not fit the active generation's SBUF
# (_prefetch_ahead).
PREFETCH_AHEAD = 2
# The program's last block (J > 1 rows per partition) finished and stored one row slot at a
# time where that pays (_drains_by_slot): the affine step per slot (J instructions per engine
# instead of one, 16-bit columns split by _vector_share_16), each slot's store issued
# when it is made. Modeled (trn2 LNC=2, us): bf16 with weight and bias ViT-B [1576, 768]
# 21.46 -> 19.99, ViT-L [1576, 1024] 23.60 -> 22.58, [512, 384] 7.92 -> 7.07; weight only
# [1576, 1024] 23.29 -> 21.55; fp32 without weight [1576, 768] 24.14 -> 21.05. A scan of 28
# shapes (64-8192 rows x 64-8192 columns) on trn2 (LNC=2 and 1), trn3 and trn1, bf16 / fp16
# / fp32, with weight and bias, weight only and none (476 runs): 175 faster, 296 unchanged
# (among them every shape whose last block holds one row per partition), 5 slower, by at
# most 1.6 % (trn1 bf16 [2048, 256], 23.83 -> 24.20; on trn2 and trn3 at most 0.2 %).
# Without the check (every such block with a weight, or in fp32) rows of 128 columns
# modeled up to 27 % slower (trn3 fp32 [4096, 128] without weight). Only the program's last
# block: a part's last block mid-launch (LNC=1 runs both parts in turn) modeled up to 8 %
# slower, its per-slot instructions competing with the next block's work. Storing the slots
# instead of the block changes no value.
DRAIN_BY_SLOT = True
# Since session 58 the drain block's output tile is allocated apart from the other
# blocks' (one more block of SBUF, at most 16 KiB per partition: the drain takes blocks of
# J > 1 rows, shorter than 2048 elements). Modeled trn2 LNC=2 bf16 with weight and bias:
# ViT-B [1576, 768] 19.45 -> 18.83 us (its last block's y waited 2.5 us for the first
# block's store); 528 runs (22 shapes, trn1 / trn2 / trn3, bf16 / fp32, three affine
# kinds): 31 faster (up to 7.6 %), 9 slower by at most 0.8 %, outputs unchanged.
# 16-bit blocks of one row per partition with a weight: the program's last block's affine
# step made and stored in column chunks of at least 4 KiB per partition (_drain_pieces,
# tiling.DMA_SATURATING_BYTES: this kernel's stores set its time, so no transfer goes below
# the saturating size). Modeled (session 60, us, trn2 LNC=2 bf16 with weight and bias):
# [2048, 4096] 85.2 -> 83.8, [2048, 8192] 162.8 -> 156.9, [256, 4096] 21.0 -> 19.6; 22
# shapes x 8 configurations (bf16 and fp16; weight and bias, weight only, the training
# forward; trn2 at LNC=2 and 1, trn3, trn1): geomean -0.8 to -1.1 %, none slower; outputs
# unchanged (the ViT rows hold several rows per partition: unchanged). At 2 KiB: a run 0.7 %
# slower, geomean -0.8 to -1.6 %.
COLUMN_DRAIN = True
# bn_stats reads at most this many elements per partition (512 on trn2).
BN_CHUNK = nl.tile_size.bn_stats_fmax
BN_STATS_WIDTH = 6   # (count, mean, var*count) for even and odd elements
BN_AGGR_WIDTH = 2    # (mean, var)
# 16-bit input: which row slots take their statistics on ScalarE (_scalar_stats_share) and
# VectorE's share of the affine step's columns (_vector_share_16) come from the active
# generation's engine figures (engine_costs.py). Until session 58 they were constants swept
# under the model on trn2's ViT shapes and used on every generation: 0.6 of the slots on
# ScalarE, 0.55 of the columns on VectorE with weight and bias, 0.3 with a weight only.


def _stats_plan(stats, n_rows, per_max):
    """Where the blocks of this program write their statistics and, with ``stats`` (HBM
    [N, 2], save_stats), when they are stored: each part's (mean, rstd) in one on-chip
    tile (tiling.part_row_stats; with a tile per block, rotated through two buffers, block
    i + 2's first statistic waited for block i's last read: modeled trn2 LNC=2 bf16
    [2048, 4096] without weight 51.4 -> 55.0 us), each run of same-shaped blocks stored by
    one transfer after its last block, instead of one per block, each a 128-partition
    transfer holding the DMA queues at least dma_transfer_gap_ns (training forward [2048,
    4096] with weight and bias: 85.6 us with a store per block, 80.2 as inference).
    Returns ({block's first row: its [parts, per, 2] view}, {run's last block's first row:
    (HBM view, SBUF view)}; the latter empty without ``stats``)."""
    views, stores = {}, {}
    for lo, hi in program_row_parts(n_rows):
        part_views, runs = part_row_stats(stats, lo, hi, per_max, BN_AGGR_WIDTH)
        views.update(part_views)
        stores.update({last: (hbm, sbuf) for last, hbm, sbuf in runs})
    return views, stores


def _fp32_vector_share(n_params):
    """Share of the fp32 affine step (``n_params`` of weight and bias) on the VectorE path
    (_affine_segment), where VectorE and GpSimd end together by the active generation's
    clocks (engine_costs.py; the cost model's rates). Per element: VectorE makes the
    statistics (bn_stats, one pass) and, on its path, one two-input scalar_tensor_tensor
    per parameter (two cycles); the other path is ScalarE's y, the lighter load, and one
    two-input GpSimd tensor_tensor per parameter (two of its cycles):
        1/v + a 2n/v = (1 - a) 2n/g  ->  a = (2n/g - 1/v) / (2n/v + 2n/g)
    trn2 (v 0.96, g 1.2 GHz) and trn1 (1.12, 1.4): weight and bias 0.31, weight only 0.17;
    trn3 (1.2, 1.2): 0.38, 0.25. Both paths stay under fp32's HBM traffic per element
    (trn2: 2.3 and 1.4 ns against 2.78): DMA-bound. Until session 57 the trn2 figures,
    rounded (0.3, 0.2), were constants for every generation."""
    if not n_params:
        return 0.0
    c = active_engine_costs()
    v, g = 1.0 / c.vector_ghz, 1.0 / c.gpsimd_ghz
    return (2 * n_params * g - v) / (2 * n_params * v + 2 * n_params * g)


def _prefetch_ahead(per, cols, itemsize, param_bytes):
    """Row blocks loaded ahead: the most of PREFETCH_AHEAD, 1 and 0 whose tiles fit the
    active generation's SBUF. Live per partition: at most the input blocks in flight (ahead
    + 1), the output block and one more block of scratch, the broadcast weight and bias
    rows (``param_bytes``) and one fp32 row of the affine step's scratch. The simulator's
    liveness sweep stays within that (fp32 rows of 8192 with weight and bias: ahead + 5.7
    rows against the bound's ahead + 6); those rows (32 KiB per partition) load two blocks
    ahead on trn3, one on trn2 and none on trn1, where one ahead needed 214 KiB of its 192
    (tests/kernels/test_widest_rows_fit_sbuf.py runs them). The statistics tile
    (tiling.part_row_stats: 8 bytes per row slot, at most 4 KiB) fits the bound's slack of
    0.3 rows (10 KiB at those rows). The drain block's own output tile (see DRAIN_BY_SLOT)
    is live only at the program's end, when no block is loaded ahead."""
    block = per * cols * itemsize
    return fitting_ahead(PREFETCH_AHEAD, lambda ahead: (ahead + 3) * block + param_bytes + cols * 4)


def _vector_share_16():
    """VectorE's share of the 16-bit affine step's columns (y * weight, + bias), the rest on
    GpSimd: the share at which the two engines end the step together, by their clocks and
    rates (a two-input pass: VectorE at its 16-bit tensor_tensor rate, GpSimd at half an
    element per cycle; EngineCosts.vector_gpsimd_share): trn2 0.62, trn3 0.67, trn1 0.44.
    The step is a block's last before its store, so it is split to finish soonest, for
    every block and for the drain's row slots alike.
    Before session 58 a block's split was a constant that left VectorE room for the next
    block's statistics and y: 0.55 with weight and bias, 0.3 with a weight only, on every
    generation (figures of the change: _scalar_stats_share)."""
    c = active_engine_costs()
    return c.vector_gpsimd_share(c.vector_two_input_rate(True))


def _scalar_stats_share(per, cols, n_params):
    """Share of the 16-bit row slots whose statistics ScalarE takes (two passes and an
    rsqrt; the other slots VectorE's bn_stats / bn_aggr and ScalarE's rsqrt), for blocks of
    ``per`` rows per partition of ``cols`` elements with ``n_params`` of weight and bias.
    Estimated per slot by the cost model's rules with the active generation's figures
    (engine_costs.py): ScalarE S (its two passes at its 16-bit rate and the rsqrt), VectorE
    V (bn_stats per <= 512 columns, bn_aggr), ScalarE r (the rsqrt after VectorE's), VectorE
    y (the normalisation, 16-bit performance mode), and VectorE's affine share of a block.
    Two balances bracket the best split:
      latency: one block's statistics end soonest, ScalarE's and VectorE's together:
               s S + (1 - s) r = (1 - s) V;
      throughput: ScalarE's work per block equals VectorE's, which also makes the y's
               and its affine share: per (s S + (1 - s) r) = per ((1 - s) V + y) + affine.
    A launch holds a few blocks per core (ViT at LNC=2: 2-3), so its time is part one
    block's latency (the pipeline's fill and drain) and part the steady state's throughput;
    the split is the mean of the two. Short rows go mostly to VectorE (ScalarE's fixed
    cost per pass, 360 cycles on trn2, is most of a 256-column pass), long rows about
    half-half. Modeled with _vector_share_16 against the constants they replaced (0.6 of
    the slots; session 58; bf16 and fp16, 22 shapes of 64-8192 rows x 64-8192 columns;
    docs/cost-model.md "What the kernels plan with"), geomean and worst run with weight and
    bias / weight only / none: trn2 LNC=2 -4.9 % (+10.0 % at [8192, 1024]; ViT-B [1576,
    768] 19.99 -> 19.45 us, ViT-L [1576, 1024] 22.58 -> 23.13) / -16.3 % (none slower) /
    -13.2 % ([4096, 256] 21.7 -> 14.1 us); trn3 -10.0 % / -21.8 % / -12.3 %; trn1 (LNC=1)
    -7.0 % / +2.4 % (+7.8 %) / +0.7 % (+9.8 % at [512, 384]). Either balance alone was
    worse: latency up to +19.9 % (trn2 LNC=2 with weight and bias), throughput up to +20.7 %
    (session 54 tried the throughput side with the affine split in it)."""
    c = active_engine_costs()
    scalar_pass = c.instruction_ns("scalar", cols, rate=c.scalar_16bit_rate)
    rsqrt = c.instruction_ns("scalar", 1)
    scalar_slot = 2 * scalar_pass + rsqrt
    n_chunks = cdiv(cols, BN_CHUNK)
    vector_slot = (sum(c.instruction_ns("vector", min(BN_CHUNK, cols - k * BN_CHUNK)) for k in range(n_chunks))
                   + c.instruction_ns("vector", n_chunks * BN_STATS_WIDTH))
    y = c.instruction_ns("vector", cols, rate=c.vector_16bit_rate)
    affine = 0.0
    if n_params:
        affine = n_params * c.instruction_ns("vector", per * split_count(cols, _vector_share_16()),
                                             rate=c.vector_two_input_rate(True))
    # both balances solved for s: (... - r) / (S - r + V)
    per_share = scalar_slot - rsqrt + vector_slot
    latency = (vector_slot - rsqrt) / per_share
    throughput = (per * (vector_slot + y - rsqrt) + affine) / (per * per_share)
    return (min(1.0, max(0.0, latency)) + min(1.0, max(0.0, throughput))) / 2


def _slot_after_stats_ns(cols, sixteen, n_params):
    """Estimated ns of one row slot's work after its statistics, on its busiest engine (the
    cost model's rules with the active generation's figures, engine_costs.py), as the
    module docstring lays it out: 16-bit, y on VectorE (performance mode) and the
    ``n_params`` (weight, bias) passes of the affine step split between VectorE and GpSimd;
    fp32, the row's path (VectorE's scalar_tensor_tensor per parameter for a share of the
    rows, else ScalarE's y and GpSimd's passes)."""
    c = active_engine_costs()
    gp_two = c.gpsimd_two_input_rate()      # GpSimd: two full inputs per element
    if sixteen:
        cut = split_count(cols, _vector_share_16())
        vector = c.instruction_ns("vector", cols, rate=c.vector_16bit_rate)
        if n_params:
            vector += n_params * c.instruction_ns("vector", cut, rate=c.vector_two_input_rate(True))
        gpsimd = n_params * c.instruction_ns("gpsimd", cols - cut, rate=gp_two) if n_params else 0.0
        return max(vector, gpsimd)
    a = _fp32_vector_share(n_params)
    vector = a * n_params * c.instruction_ns("vector", cols, rate=c.vector_stt_rate())
    scalar = (1 - a) * c.instruction_ns("scalar", cols)
    gpsimd = (1 - a) * n_params * c.instruction_ns("gpsimd", cols, rate=gp_two)
    return max(vector, scalar, gpsimd)


def _drains_by_slot(per, cols, itemsize, n_params, sixteen):
    """Whether the program's last block, of ``per`` rows per partition, is finished and
    stored row slot by row slot (DRAIN_BY_SLOT): where the slots' work after the
    statistics (_slot_after_stats_ns) outlasts the queue time the extra transfers cost
    (tiling.slot_stores_pay). ViT-B [1576, 768] bf16 with weight and bias on trn2: two
    slots of y and the affine step, 1.3 us each (the second overlaps the first's store),
    against 0.6 us more of queue time for two stores than one; not rows of
    128 columns (16 slots of 256 B, a transfer gap apiece), nor 16-bit rows without a
    weight shorter than 1024 columns (y alone follows the statistics)."""
    return DRAIN_BY_SLOT and slot_stores_pay(per, cols, itemsize, _slot_after_stats_ns(cols, sixteen, n_params))


def _drain_pieces(per, cols, itemsize):
    """[(row slot j, c0, c1)] in which the drained last block's affine step is made and
    stored: its row slots; one row per partition, the row in column chunks of at least
    DMA_SATURATING_BYTES per partition where it holds two or more (COLUMN_DRAIN)."""
    if per == 1:
        return drain_chunks(1, cols, itemsize, DMA_SATURATING_BYTES) or [(0, 0, cols)]
    return [(j, 0, cols) for j in range(per)]


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


def _block_16bit(x_tile, out_tile, stats_tile, parts, per, cols, weight_tile, bias_tile, eps_tile, slot0,
                 stats_share, store_slot=None):
    """One block of a 16-bit input: statistics in fp32 into ``stats_tile`` [parts, per, 2]
    (mean, rstd per row), y rounded once to the input dtype, then y * weight and + bias in
    the input dtype, in place in ``out_tile``. Row slot ``slot0 + j`` takes its statistics
    on ScalarE or VectorE (``stats_share`` of the slots on ScalarE, spread evenly:
    _scalar_stats_share).
    ``store_slot(j, c0, c1)``, when given, is called as soon as slot j's columns [c0, c1) of
    the output are made (the affine step then runs per slot, or with one row per partition
    per column chunk: _drain_pieces; without a weight, right after the slot's y;
    DRAIN_BY_SLOT, COLUMN_DRAIN)."""
    n_chunks = cdiv(cols, BN_CHUNK)
    mean, rstd = stats_tile[:, :, 0], stats_tile[:, :, 1]
    on_scalar = [j for j in range(per) if spread(slot0 + j, stats_share)]
    centre = {}   # per row j: (op, [P, 1] operand) with y = (x op operand) * rstd
    # Two-pass statistics of the ScalarE rows (discarded activation outputs go to a scratch
    # tile of their own: in out_tile they would make the statistics wait for the buffer the
    # output shares with an earlier block's, i.e. for that block's store). First every row's
    # sum(x - x0) on ScalarE (x0: the row's first element) and mean = sum * (1/H) + x0 on
    # GpSimd (each runs while ScalarE sums the next row). Not sum(x) * (1/H): 1/H is inexact
    # in fp32 for most H, so rows of 1000.0 would get the mean 999.99994 and y = 0.019 where
    # torch gives exactly 0; and not sum(x) / H: NKI's ISA has no divide operator (the
    # "Supported Math Operators for NKI ISA" table, nki.api.shared). Shifted by x0, a
    # constant row sums to exactly 0 and its mean is x0 itself; other rows lose at most an
    # ulp of max(|mean|, |mean - x0|) to the shift (the variance pass is unchanged).
    discard = nl.ndarray((parts, cols), dtype=x_tile.dtype, buffer=nl.sbuf)
    neg_x0 = None
    if on_scalar:
        # -x0 of every row slot of the block ([P, per] fp32: the sums' bias operand), one
        # ScalarE instruction ahead of the sums (on GpSimd it waited for the previous block's
        # affine share there: modeled trn2 LNC=2 ViT-B/16 [1576, 768] 20.2 us against 19.1)
        neg_x0 = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=neg_x0, op=nl.copy, data=x_tile[:, :, 0], scale=-1.0)
    for j in on_scalar:
        row_sum = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=discard, op=nl.copy, data=x_tile[:, j, :], bias=neg_x0[:, j:j + 1],
                        reduce_op=nl.add, reduce_res=row_sum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.tensor_scalar(dst=mean[:, j:j + 1], data=row_sum, op0=nl.multiply, operand0=1.0 / cols,
                           op1=nl.subtract, operand1=neg_x0[:, j:j + 1], engine=nisa.engine.gpsimd)
        centre[j] = (nl.subtract, mean[:, j:j + 1])
    # ... then sum((mean - x)^2) (square of -x + mean: ScalarE's scale and bias; the same
    # square as (x - mean)^2 bit for bit), accumulated -> rsqrt(. / H + eps)
    for j in on_scalar:
        sq_sum = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=discard, op=nl.square, data=x_tile[:, j, :], scale=-1.0,
                        bias=mean[:, j:j + 1], reduce_op=nl.add, reduce_res=sq_sum,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=rstd[:, j:j + 1], op=nl.rsqrt, data=sq_sum, scale=1.0 / cols,
                        bias=eps_tile[0:parts, :])
    # The other rows: bn_stats per <= 512 columns and bn_aggr on VectorE, rsqrt on ScalarE.
    for j in range(per):
        if j in centre:
            continue
        stats = nl.ndarray((parts, n_chunks * BN_STATS_WIDTH), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(n_chunks):
            c0 = c * BN_CHUNK
            nisa.bn_stats(dst=stats[:, c * BN_STATS_WIDTH:(c + 1) * BN_STATS_WIDTH],
                          data=x_tile[:, j, c0:min(cols, c0 + BN_CHUNK)])
        # (mean, var) into the row's stats slot; rsqrt turns var into rstd in place
        nisa.bn_aggr(dst=stats_tile[:, j, :], data=stats)
        nisa.activation(dst=rstd[:, j:j + 1], op=nl.rsqrt, data=rstd[:, j:j + 1],
                        bias=eps_tile[0:parts, :])
        centre[j] = (nl.subtract, mean[:, j:j + 1])
    # y = (x - mean) * rstd, rounded once to the input dtype: VectorE, all 16-bit (perf mode)
    for j in range(per):
        nisa.tensor_scalar(dst=out_tile[:, j, :], data=x_tile[:, j, :], op0=centre[j][0],
                           operand0=centre[j][1], op1=nl.multiply, operand1=rstd[:, j:j + 1])
        if weight_tile is None and store_slot is not None:
            store_slot(j, 0, cols)
    if weight_tile is None:
        return
    # all J rows of a partition at once, or, draining, row slot by row slot (one row per
    # partition: column chunk by column chunk, _drain_pieces), each stored when made
    pieces = [(None, 0, cols)] if store_slot is None else _drain_pieces(per, cols, itemsize(x_tile.dtype))
    share = _vector_share_16()
    for j, c0, c1 in pieces:
        cut = c0 + split_count(c1 - c0, share)
        for lo, hi, engine in ((c0, cut, nisa.engine.vector), (cut, c1, nisa.engine.gpsimd)):
            if hi <= lo:
                continue
            operands = [(t[0:parts, lo:hi], op) for t, op in ((weight_tile, nl.multiply), (bias_tile, nl.add))
                        if t is not None]
            if j is None:       # [P, J, w], weight / bias viewed with a stride-0 row axis
                seg = out_tile[:, :, lo:hi]
                operands = [(t.expand_dim(1).broadcast_to((parts, per, hi - lo)), op) for t, op in operands]
            else:               # one slot: [P, w]
                seg = out_tile[:, j, lo:hi]
            for operand, op in operands:
                nisa.tensor_tensor(dst=seg, data1=seg, data2=operand, op=op, engine=engine)
        if j is not None:
            store_slot(j, c0, c1)


def _affine_share(weight, bias):
    """Share of the affine step on the VectorE path (fp32 arithmetic, _affine_segment)."""
    return _fp32_vector_share(sum(p is not None for p in (weight, bias)))


def _layer_norm_streamed(x, out, weight, bias, eps_tile):
    """layer_norm of rows longer than the one-pass limit: 128-row tiles, column chunks, two
    passes (module docstring, "Streamed rows")."""
    n_rows, cols = x.shape
    assert STREAM_CHUNK % BN_CHUNK == 0, \
        f"STREAM_CHUNK={STREAM_CHUNK} must hold whole bn_stats pieces of BN_CHUNK={BN_CHUNK} columns"
    chunks = column_chunks(cols, STREAM_CHUNK)
    n_pieces = cdiv(cols, BN_CHUNK)
    weight_res, bias_res = resident_params([weight, bias], cols, RESIDENT_PARAM_BYTES)
    share = _affine_share(weight, bias)
    resident = cols * itemsize(x.dtype) <= RESIDENT_ROW_BYTES
    for start, parts, _ in program_row_blocks(n_rows, 1):       # 128-row tiles, J = 1
        # pass 1: bn_stats of every 512-column piece of the row, then bn_aggr over all; the
        # chunks kept in SBUF for pass 2 when the row tile fits
        kept = []
        stats = nl.ndarray((parts, n_pieces * BN_STATS_WIDTH), dtype=nl.float32, buffer=nl.sbuf)
        for c0, c1 in chunks:
            x_tile = nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=x_tile, src=x[start:start + parts, c0:c1])
            if resident:
                kept.append(x_tile)
            for b0 in range(c0, c1, BN_CHUNK):
                k = b0 // BN_CHUNK
                nisa.bn_stats(dst=stats[:, k * BN_STATS_WIDTH:(k + 1) * BN_STATS_WIDTH],
                              data=x_tile[:, b0 - c0:min(c1, b0 + BN_CHUNK) - c0])
        mean_var = nl.ndarray((parts, BN_AGGR_WIDTH), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mean_var, data=stats)
        rstd = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=mean_var[:, 1:2], bias=eps_tile[0:parts, :])
        neg_mean_rstd = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=neg_mean_rstd, data=mean_var[:, 0:1], op0=nl.multiply,
                                  operand0=-1.0, op1=nl.multiply, operand1=rstd)
        row_stats = (mean_var[:, 0:1], rstd, neg_mean_rstd)
        # pass 2: the kept or reloaded chunk, normalised in fp32, rounded once, stored
        for c, (c0, c1) in enumerate(chunks):
            if resident:
                x_tile = kept[c]
            else:
                x_tile = nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=x_tile, src=x[start:start + parts, c0:c1])
            w_cols = param_columns(weight, weight_res, c0, c1)
            b_cols = param_columns(bias, bias_res, c0, c1)
            out_tile = nl.ndarray((parts, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
            for _, lo, hi, on_vector in engine_segments(1, c1 - c0, share):
                _affine_segment(out_tile[:, lo:hi], x_tile[:, lo:hi], row_stats,
                                None if w_cols is None else w_cols[0:parts, lo:hi],
                                None if b_cols is None else b_cols[0:parts, lo:hi], on_vector)
            nisa.dma_copy(dst=out[start:start + parts, c0:c1], src=out_tile)


def _block_32bit(x_tile, out_tile, stats_tile, parts, per, cols, weight_tile, bias_tile, eps_tile, store_slot=None):
    """One block of an fp32 input: bn_stats / bn_aggr statistics into ``stats_tile``
    [parts, per, 2] (mean, rstd per row), then the affine step split between the VectorE
    path and the ScalarE + GpSimd path (module docstring).
    ``store_slot(j, 0, cols)``, when given, is called as soon as row slot j's output is made
    (with J > 1 rows per partition each row takes one path; DRAIN_BY_SLOT)."""
    n_chunks = cdiv(cols, BN_CHUNK)
    # mean / variance per row: bn_stats per <= 512-element chunk, bn_aggr per row (VectorE).
    stats = nl.ndarray((parts, per, n_chunks * BN_STATS_WIDTH), dtype=nl.float32, buffer=nl.sbuf)
    mean_var = stats_tile    # (mean, var) per row; rsqrt turns var into rstd in place
    for j in range(per):
        for c in range(n_chunks):
            c0 = c * BN_CHUNK
            c1 = min(cols, c0 + BN_CHUNK)
            nisa.bn_stats(dst=stats[:, j, c * BN_STATS_WIDTH:(c + 1) * BN_STATS_WIDTH],
                          data=x_tile[:, j, c0:c1])
        nisa.bn_aggr(dst=mean_var[:, j, :], data=stats[:, j, :])
    # rstd = rsqrt(var + eps) for all J rows at once: [parts, per] fp32 on ScalarE.
    rstd = stats_tile[:, :, 1]
    nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd, bias=eps_tile[0:parts, :])

    # -mean * rstd, the ScalarE bias that centres and scales in one pass
    neg_mean_rstd = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=neg_mean_rstd, data=mean_var[:, :, 0], op0=nl.multiply,
                              operand0=-1.0, op1=nl.multiply, operand1=rstd)

    share = _affine_share(weight_tile, bias_tile)
    for j, lo, hi, on_vector in engine_segments(per, cols, share):
        stats = (mean_var[:, j, 0:1], rstd[:, j:j + 1], neg_mean_rstd[:, j:j + 1])
        _affine_segment(out_tile[:, j, lo:hi], x_tile[:, j, lo:hi], stats,
                        None if weight_tile is None else weight_tile[0:parts, lo:hi],
                        None if bias_tile is None else bias_tile[0:parts, lo:hi], on_vector)
        if store_slot is not None and per > 1:      # per > 1: the segment is the whole row j
            store_slot(j, 0, cols)


@nki.jit
def layer_norm_kernel(x, weight=None, bias=None, eps=1e-5, save_stats=False):
    """Return ``layer_norm(x, (H,), weight, bias, eps)``.

    Args:
        x: HBM [N, H], float32/bfloat16/float16, H <= MAX_HIDDEN.
        weight: HBM [H] (any float dtype) or None.
        bias: HBM [H] (any float dtype) or None; needs ``weight`` (the op passes ones).
        eps: float added to the variance.
        save_stats: also return each row's statistics for the backward
            (kernels/layer_norm_backward.py), as PyTorch's native_layer_norm saves its mean
            and rstd; rows of at most ONE_PASS_MAX_HIDDEN.
    Returns:
        HBM [N, H] (shared_hbm), dtype of ``x``; with ``save_stats`` also HBM [N, 2] fp32
        (mean, rstd = rsqrt(var + eps)) per row: (out, stats).
    """
    n_rows, cols = x.shape
    assert cols <= MAX_HIDDEN, f"H={cols} exceeds MAX_HIDDEN={MAX_HIDDEN}"
    assert bias is None or weight is not None, "bias without weight: pass weight=ones"
    assert not save_stats or cols <= ONE_PASS_MAX_HIDDEN, \
        f"save_stats: H={cols} exceeds ONE_PASS_MAX_HIDDEN={ONE_PASS_MAX_HIDDEN} (streamed rows save none)"
    out = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    stats = nl.ndarray((n_rows, BN_AGGR_WIDTH), dtype=nl.float32, buffer=nl.shared_hbm) if save_stats else None
    eps_tile = fp32_column(eps)
    if cols > ONE_PASS_MAX_HIDDEN:
        _layer_norm_streamed(x, out, weight, bias, eps_tile)
        return out

    sixteen = x.dtype in (nl.bfloat16, nl.float16)
    target_bytes = TARGET_BYTES_16 if sixteen else TARGET_BYTES_32
    per_max = rows_per_partition(cols, target_bytes // itemsize(x.dtype), ONE_PASS_MAX_HIDDEN)
    blocks = []   # (first row, partitions, rows per partition, row slot within its part)
    for lo, hi in program_row_parts(n_rows):    # the same parts and blocks at LNC=1 and 2
        slot = 0
        for start, parts, per in row_blocks(hi, per_max, TAIL_POSITION, first_row=lo):
            blocks.append((start, parts, per, slot))
            slot += per
    stats_views, stats_stores = _stats_plan(stats, n_rows, per_max)
    params = {}

    def load(block):
        start, parts, per, _ = block
        x_tile = load_block(x, start, parts, per)
        if not params:
            # weight and bias after the first block's load, so that load is not queued behind them
            params["weight"] = None if weight is None else broadcast_rows(weight, cols)
            params["bias"] = None if bias is None else broadcast_rows(bias, cols)
        return x_tile

    # the program's last block, stored row slot by row slot where that pays (DRAIN_BY_SLOT)
    n_params = sum(p is not None for p in (weight, bias))
    stats_share = _scalar_stats_share(per_max, cols, n_params) if sixteen else None
    drain = blocks[-1] if blocks and _drains_by_slot(blocks[-1][2], cols, itemsize(x.dtype), n_params, sixteen) \
        else None
    if COLUMN_DRAIN and blocks and sixteen and n_params and blocks[-1][2] == 1 \
            and len(_drain_pieces(1, cols, itemsize(x.dtype))) > 1:
        drain = blocks[-1]      # one 16-bit row per partition, long enough to cut (COLUMN_DRAIN)

    def compute(block, x_tile):
        start, parts, per, slot = block
        if block == drain:
            # allocated on a line of its own, so the drain block's output has a buffer of its
            # own: from the blocks' shared line it would take the buffer of the block two
            # back (the compiler's rotation of two) and its first y would wait for that
            # block's store (see DRAIN_BY_SLOT)
            out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        else:
            out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        stats_tile = stats_views[start]
        store_slot = None
        if block == drain:
            def store_slot(j, c0, c1):
                nisa.dma_copy(dst=block_rows(out, start, parts, per)[:, j, c0:c1], src=out_tile[:, j, c0:c1])
        if sixteen:
            _block_16bit(x_tile, out_tile, stats_tile, parts, per, cols, params["weight"], params["bias"],
                         eps_tile, slot, stats_share, store_slot)
        else:
            _block_32bit(x_tile, out_tile, stats_tile, parts, per, cols, params["weight"], params["bias"],
                         eps_tile, store_slot)
        if start in stats_stores:
            nisa.dma_copy(dst=stats_stores[start][0], src=stats_stores[start][1])
        return None if block == drain else out_tile      # None: already stored

    def store(block, out_tile):
        start, parts, per, _ = block
        if out_tile is not None:
            nisa.dma_copy(dst=block_rows(out, start, parts, per), src=out_tile)

    param_bytes = sum(cols * itemsize(p.dtype) for p in (weight, bias) if p is not None)
    pipelined(blocks, load, compute, store, _prefetch_ahead(per_max, cols, itemsize(x.dtype), param_bytes))
    return out if stats is None else (out, stats)
