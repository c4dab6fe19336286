"""Softmax over the last dimension of a [N, C] tensor, any C.

Dimensions:
    N: rows (any N >= 1).
    C: row length (any C >= 1). Rows of at most ``max_cols`` elements (default MAX_COLS) are
       done on chip in one pass; longer rows use the online (streaming) form.
Layout:
    Rows on partitions. Short rows are packed J to a partition in blocks of 128 * J
    consecutive rows (one contiguous DMA of J*C elements per partition, J grown until a
    transfer holds TARGET_COLS elements); the last < 128 rows form one block with J = 1.
    The blocks' loads go through a ring of X_RING_DEPTH input tiles where the active
    generation's SBUF holds it (_x_ring_depth), so they run two blocks ahead of the compute.
    Long rows: tiles of up to 128 rows, the row read in column chunks of
    min(max_cols, ONLINE_CHUNK).
    Long rows in few row tiles (split form, NeuronCore-v3 and later, where it pays:
    _split_pays, _split_groups_pay): each of the WORK_PARTS even parts of the rows is taken
    in groups of G <= SPLIT_MAX_ROWS rows, in turn (_part_groups: one group for a part of
    at most 32 rows whose segments fit max_cols and divide its rows; else smaller groups,
    halving G until the segments do). Each row of a group is cut into S
    segments of W consecutive columns, one per partition (G * S <= 128 partitions), so the
    engines see about C / S elements per lane instead of C, and one group's scaling and
    stores overlap the next group's loads and exps, where a row tile's max, exp and scaling
    each span the whole row. S is a divisor of C in (64 // G, 128 // G] when there is one
    (the group is then one contiguous [G * S, W] DMA), else (groups of at most
    SPLIT_RAGGED_MAX_ROWS rows) W = ceil(C / (128 // G)) with a shorter last segment,
    loaded and stored row by row. (One row per partition left 127 lanes idle: [1, 32000]
    bf16 modeled 69.7 us on trn2, 7.4 us split; one 128-row tile per core left the exps
    and the stores end to end: [256, 32000] bf16 65.3 us online, 51.2 us in four groups.)
Engines:
    one pass (C <= max_cols), per block, in one of two forms (whichever the cost model's
    numbers for the active generation make faster: _block_exp_time / _row_exp_time):
    per-row form:
      VectorE  row max over all J rows at once (tensor_reduce, negated -> exp bias; in
               bf16 for a bf16 input, where it is exact and runs at N/2)
      ScalarE  e = exp(x - max) in fp32 with add-reduction -> row sum, one instruction per row
      VectorE  1 / sum on [P, J] (tiny)
      e * (1/sum), rounded once to the output dtype: ScalarE (copy with per-partition scale)
               for a share of the rows/columns, VectorE (tensor_scalar) for the rest
               (_scaling_vector_share), split by rows when J > 1, else by columns
    block form (J > 1 short rows, where ScalarE's fixed cost per instruction dominates the
    per-row exps, e.g. trn2's 360 cycles on ViT's 197-column rows):
      VectorE  row max over all J rows at once (as above)
      GpSimd   a bf16 max widened to fp32 (tensor_scalar's operand is fp32 only)
      GpSimd   x - max in fp32, one tensor_scalar per row (the max as a (P, 1) operand)
      ScalarE  e = exp(x - max) in fp32, one instruction per EXP_GROUPS group of rows
      VectorE  row sums of each group (tensor_reduce) and 1 / sum
      e * (1/sum) per row on VectorE, ScalarE or GpSimd (_block_scaling: a list schedule of
               the estimated engine times); each group's rows stored as soon as they are
               scaled (one store per group)
    online (C > max_cols), per row tile of up to 128 rows, in column chunks:
      pass 1 per chunk: VectorE the chunk's max; GpSimd clamps it at the lowest finite fp32
              and negates it; ScalarE e = exp(x - chunk max) with add-reduction -> chunk
              sum. Each chunk has its own max: no chunk waits for the previous one's
              statistics, and ScalarE takes one exp per chunk, no running rescale.
      then per row: VectorE -M (the least -chunk max), ScalarE every chunk's g = exp(chunk
              max - M) in one instruction, VectorE l = sum of g * chunk sum.
      pass 2 per chunk, resident: e * (g * (1 / l)) (one product makes the factors), rounded
              once to the output, on VectorE, GpSimd or ScalarE as a list schedule of the
              engines' estimated times gives each chunk (_online_scaling_engines).
              streaming: x reloaded, ScalarE exp(x - M) in fp32, GpSimd / l.
              (Not exp(x - M - ln l): M + ln l rounded to fp32 loses ln l when |M| is
              large.)
      resident (every chunk's e in fp32 fits RESIDENT_BYTES per partition, rows up to 32K
      elements, beside the staging ring and one output tile in the active generation's
      SBUF, _resident_fits): HBM sees one read and one write.
      streaming (longer rows): pass 2 reloads every chunk from HBM and recomputes it on
      ScalarE (3 HBM passes: read, read, write).
      Buffers: pass 1's chunks go through a staging ring (STAGING_BUFS) so the loads run
      ahead of the exps; resident pass-2 outputs go through a ring of OUT_BUFS tiles per
      row tile where the active generation's SBUF holds it (_output_ring_fits).
    split form, per group of G rows (one [G * S, W] tile, taken in K column chunks of every
    segment at once, K from _split_chunk_count: more chunks let the loads, maxima and exps
    overlap, and the scaling and stores, at more fixed costs):
      VectorE  each chunk's max (bf16 for a bf16 input); GpSimd clamps it at the lowest
               finite fp32 (a chunk of -inf or of padding then still has a finite shift)
               and negates it, in fp32 -> exp bias
      ScalarE  e = exp(x - chunk max) in fp32 with add-reduction -> chunk sum
      the row max, under the exps: VectorE takes each segment's least -max, TensorE
               transposes them onto one partition [1, G * S], VectorE takes each row's least
               (-M) and broadcasts it over its segments, TensorE transposes that back, and
               ScalarE makes every chunk's g = exp(chunk max - M) in (0, 1] (before the last
               chunk's exp when K > 1)
      the row sum: VectorE each segment's share (sum over its chunks of g * chunk sum),
               TensorE transposes the shares onto one partition, VectorE sums each row's and
               broadcasts the sum over its segments, TensorE transposes it back; VectorE the
               factors g * (1 / sum) (the reciprocal reads the sum from PSUM)
      e * factor, rounded once to the output dtype, chunk by chunk, each chunk stored when
               scaled, split between the engines in proportion to their rates
               (_split_scaling_shares): VectorE, GpSimd and ScalarE for a part in one
               group, VectorE and GpSimd for a part in several (ScalarE runs the next
               group's exps meanwhile)
      (TensorE transposes, not a matmul by a same-row 0/1 matrix, move the statistics
      between partitions: a transpose moves each value alone, where a matmul's zeros times
      one row's NaN, from a +inf or NaN input, would spread it to every row)
Expected error:
    fp32 statistics (a bf16 input's max is exact in bf16) and exponentials, one rounding
    to the output dtype (bf16: <= 2**-8 relative; fp32: ~1e-6 relative; the block form
    rounds x - max to fp32 before the exp, as ScalarE's bias add does in the per-row form;
    the online and split forms add three fp32 roundings, from g = exp(chunk max - M), 1 / sum
    and the product g * (1 / sum)).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .limits import SOFTMAX_MAX_COLS as MAX_COLS
from .limits import SOFTMAX_RESIDENT_BYTES as RESIDENT_BYTES
from .tiling import (PARTITIONS, WORK_PARTS, block_rows, cdiv, column_chunks, engine_segments, itemsize, load_block,
                     even_parts, path_segments, program_parts, program_row_blocks, program_rows, rows_per_partition)

# Row packing target: 2048 elements per partition per DMA = 4 KiB bf16 / 8 KiB fp32.
TARGET_COLS = 2048
# The final e * (1/sum) is split between VectorE and ScalarE by _scaling_vector_share, from
# the active generation's clocks and fixed costs per instruction (engine_costs.py). Per
# element alone (trn2: VectorE max reduce of bf16 0.52 ns, ScalarE exp 0.83 ns, scaling
# ScalarE 0.83 or VectorE 1.04 ns) VectorE would take 0.6 of it; with short rows the fixed
# costs decide: ViT's 197-column rows (10 per partition) cost ScalarE 197 + 360 cycles per
# exp, so all of the scaling would go to VectorE (on trn2 such rows take the block form).
# Column chunk of the online form: 4096 elements = 8 KiB bf16 per partition per DMA; small
# enough that ScalarE starts on a row tile after 1/8 of a 32K-wide row has arrived.
ONLINE_CHUNK = 4096
# Staging tiles of the online form's pass 1, one ring for the launch: a load runs up to this
# many chunks ahead of the exps that read them. Before the ring the chunks pass 1 read once
# shared the kept chunks' allocation site, and each load waited for the previous chunk's exp
# (modeled, when half of the chunks kept x and pass 2 recomputed their exps trn2 LNC=2, bf16 [256, 32000] 98.8 -> 80.4 us, [1024, 32000]
# 278.1 -> 246.8, [1000, 9000] 112.2 -> 98.6, fp32 [512, 24000] 186.2 -> 161.9, streaming
# [300, 50000] 255.5 -> 221.0; with 2 buffers the streaming row stays at 255.5, with 3
# [256, 32000] models 84.2).
STAGING_BUFS = 4
# Pass 2's output tiles: a ring of OUT_BUFS per row tile where it fits SBUF beside what the
# row tile keeps (_output_ring_fits), else fresh tiles per chunk (4 per row tile modeled the
# same at [256, 32000], 72.6 us, and slower at [1024, 32000], 256.2, in the form with half
# the chunks recomputed).
OUT_BUFS = 3
# Input tiles of the one-pass form loaded ahead, as a ring (_x_ring_depth; 2 where it does not
# fit). Modeled trn2 LNC=2, us, 2 -> 3 (session 53): ViT-B scores [18912, 197] bf16 42.7 ->
# 39.9, fp32 50.5 -> 46.6; bf16 [4096, 4096] 113.3 -> 103.0; fp32 [4096, 1000] 54.6 -> 46.6;
# 4 models no faster than 3 (ViT-B bf16 40.5). Every tile of the block at 3 buffers gave the
# same 39.9: the loads were what waited. A scan of 324 shapes (128-18912 rows x 64-8192
# columns, bf16 and fp32; trn2 and trn3 at LNC=2, trn1) finds 19 slower, by at most 4 % on
# trn2 (fp32 [4096, 4096] 190.9 -> 199.1: loads running ahead of DMA-bound stores) and 7 %
# on trn1 (fp32 [300, 3000] 34.4 -> 36.9).
X_RING_DEPTH = 3
# The clamp of a max (online and split forms): the most negative finite fp32 (finite, so
# exp(max - M) never sees inf - inf; the lowest value a row can hold other than -inf, so a
# row of finfo(float32).min, as transformers' masks build them, still finds its true max).
FP32_LOWEST = -3.4028234663852886e38


def _x_ring_depth(per, cols, itemsize):
    """Input tiles of the one-pass form held at once: X_RING_DEPTH where that ring fits the
    active generation's SBUF beside two buffers each of a block's other tiles (the fp32
    x - max of the block form, the fp32 exponentials and the output; statistics aside), else
    2 (the rotation of a tile allocated per block)."""
    x_bytes = per * cols * itemsize
    fp32_bytes = per * cols * 4
    need = X_RING_DEPTH * x_bytes + 2 * (2 * fp32_bytes + x_bytes)
    return X_RING_DEPTH if need <= active_engine_costs().sbuf_bytes_per_partition else 2


def _softmax_rows(x, out, n_rows, cols):
    per_max = rows_per_partition(cols, TARGET_COLS, MAX_COLS)
    depth = _x_ring_depth(per_max, cols, itemsize(x.dtype))
    ring = None
    if depth > 2:
        # one allocation of `depth` input tiles: a block's load waits only for the block
        # `depth` back, so the loads run further ahead of the compute than a tile allocated
        # per block allows (its rotation gives 2 buffers)
        ring = nl.ndarray((PARTITIONS, depth, per_max, cols), dtype=x.dtype, buffer=nl.sbuf)
    for b, (start, parts, per) in enumerate(program_row_blocks(n_rows, per_max)):
        if ring is None:
            x_tile = load_block(x, start, parts, per)
        else:
            x_tile = ring[:parts, b % depth, 0:per, :]
            nisa.dma_copy(dst=x_tile, src=block_rows(x, start, parts, per))
        # -max per row, all J rows in one VectorE instruction: [parts, per]. bf16 for a bf16
        # input: the max of bf16 values and its negation are exact in bf16, and a bf16 ->
        # bf16 max runs at N/2 where a bf16 -> fp32 one runs at N ([S] tensor_reduce: "both
        # input and output data types are bfloat16"); fp32 otherwise
        bf16_max = x.dtype == nl.bfloat16
        neg_max = nl.ndarray((parts, per), dtype=nl.bfloat16 if bf16_max else nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=x_tile, axis=2, negate=True)
        if _block_exp_time(per, cols, bf16_max) < _row_exp_time(per, cols, bf16_max):
            _block_exp(x, out, x_tile, neg_max, start, parts, per, cols)
            continue
        # e = exp(x - max) in fp32 with the row sum from ScalarE's accumulator
        exp_tile = nl.ndarray((parts, per, cols), dtype=nl.float32, buffer=nl.sbuf)
        row_sum = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(per):
            nisa.activation(dst=exp_tile[:, j, :], op=nl.exp, data=x_tile[:, j, :],
                            bias=neg_max[:, j:j + 1], reduce_op=nl.add,
                            reduce_res=row_sum[:, j:j + 1],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv_sum = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sum, data=row_sum)
        out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
        share = _scaling_vector_share(per, cols, bf16_max)
        for j, lo, hi, on_vector in engine_segments(per, cols, share):
            if on_vector:
                nisa.tensor_scalar(dst=out_tile[:, j, lo:hi], data=exp_tile[:, j, lo:hi],
                                   op0=nl.multiply, operand0=inv_sum[:, j:j + 1])
            else:
                nisa.activation(dst=out_tile[:, j, lo:hi], op=nl.copy, data=exp_tile[:, j, lo:hi],
                                scale=inv_sum[:, j:j + 1])
        nisa.dma_copy(dst=block_rows(out, start, parts, per), src=out_tile)


def _block_exp(x, out, x_tile, neg_max, start, parts, per, cols):
    """The rest of a block of short rows with one exp for all its rows (the block form):
    x - max per row on GpSimd, then a single ScalarE exp over [parts, per * cols], so that
    ScalarE pays its fixed cost once per block rather than once per row."""
    # x - max in fp32, one GpSimd tensor_scalar per row (its max is a (P, 1) operand, which
    # tensor_scalar takes in fp32 only: a bf16 max is widened first, exactly, on GpSimd)
    bf16_max = neg_max.dtype == nl.bfloat16   # as _softmax_rows chose it
    if bf16_max:
        neg_max32 = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=neg_max32, src=neg_max, engine=nisa.engine.gpsimd)
        neg_max = neg_max32
    shifted = nl.ndarray((parts, per, cols), dtype=nl.float32, buffer=nl.sbuf)
    for j in range(per):
        nisa.tensor_scalar(dst=shifted[:, j, :], data=x_tile[:, j, :], op0=nl.add,
                           operand0=neg_max[:, j:j + 1], engine=nisa.engine.gpsimd)
    # e = exp(x - max) in EXP_GROUPS ScalarE instructions over [parts, rows of the group, cols]
    # fp32, each followed by its rows' sums on VectorE (ScalarE's accumulator would add all
    # the rows of a partition into one)
    exp_tile = nl.ndarray((parts, per, cols), dtype=nl.float32, buffer=nl.sbuf)
    row_sum = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    groups = _exp_groups(per)
    for lo, hi in groups:
        nisa.activation(dst=exp_tile[:, lo:hi, :], op=nl.exp, data=shifted[:, lo:hi, :])
        nisa.tensor_reduce(dst=row_sum[:, lo:hi], op=nl.add, data=exp_tile[:, lo:hi, :], axis=2)
    # each group finished and stored as soon as its own sums are known (see EXP_GROUPS):
    # 1 / sum, then e * (1/sum) per row, rounded once to the output dtype, on the engine
    # _block_scaling picks, then the group's rows in one store
    inv_sum = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
    out_tile = nl.ndarray((parts, per, cols), dtype=x.dtype, buffer=nl.sbuf)
    engines = _block_scaling(per, cols, bf16_max)[0]
    for lo, hi in groups:
        nisa.reciprocal(dst=inv_sum[:, lo:hi], data=row_sum[:, lo:hi])
        for j in range(lo, hi):
            if engines[j] == SCALAR:
                nisa.activation(dst=out_tile[:, j, :], op=nl.copy, data=exp_tile[:, j, :],
                                scale=inv_sum[:, j:j + 1])
            else:
                nisa.tensor_scalar(dst=out_tile[:, j, :], data=exp_tile[:, j, :], op0=nl.multiply,
                                   operand0=inv_sum[:, j:j + 1],
                                   engine=nisa.engine.vector if engines[j] == VECTOR else nisa.engine.gpsimd)
        nisa.dma_copy(dst=block_rows(out, start, parts, per)[:, lo:hi, :], src=out_tile[:, lo:hi, :])


# The block form's exps: the block's rows in this many ScalarE instructions, so that the
# second group's GpSimd subtractions overlap the first group's exp and the first group's
# sums and scaling start sooner (modeled trn2, LNC=2, ViT-B scores [18912, 197] bf16, 10
# rows per partition, 2026-12-01: 1 group 48.6 us, 2 groups 41.4 (36.7-56.3), 3 groups 43.9;
# the per-row form 47.8 (45.2-62.6)).
EXP_GROUPS = 2
# Since session 56 each group is also finished (1 / sum, scaling) and stored on its own as
# soon as its sums are known, instead of the whole block after both: the first group's
# scaling and store overlap the second group's exp. Modeled (LNC=2, us), one store per
# block -> one per group: trn2 bf16 ViT-B scores [18912, 197] 39.93 -> 38.58, [4096, 197]
# 15.68 -> 14.52, CLIP text [16384, 77] 24.24 -> 23.02, [8192, 128] 20.02 -> 18.05; fp32
# [18912, 197] 46.57 -> 44.72, [4096, 64] 12.80 -> 11.06. A scan of 19 shapes (128-50000
# rows x 32-1000 columns; trn2 at LNC=2 and 1, trn3, trn1; bf16, fp16, fp32; 171 runs): 75
# faster, 93 unchanged (the shapes that take the per-row, online or split form), 3 slower:
# trn2 LNC=1 fp32 [12288, 257] 74.60 -> 76.91 (+3.1 %), trn3 bf16 [8192, 100] +2.1 %, ViT-B
# scores on trn3 +0.7 %. Three groups with the same finish model slower ([12288, 257] fp32 +22 %).
# Engines of the block form's per-row scaling (_block_scaling).
VECTOR, SCALAR, GPSIMD = 0, 1, 2


def _exp_groups(per):
    """[(first row, end row)] of the block form's EXP_GROUPS exps (non-empty groups only)."""
    bounds = [g * per // EXP_GROUPS for g in range(EXP_GROUPS + 1)]
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def _max_ns(elements, bf16_max):
    """Estimated ns of VectorE's row max (tensor_reduce) over ``elements`` per partition:
    bf16 in and out at the generation's bf16 reduce rate (engine_costs.py; the model's
    N/2), else one element per cycle."""
    c = active_engine_costs()
    return c.instruction_ns("vector", elements, c.vector_reduce_bf16_rate if bf16_max else 1)


def _block_base_ns(per, cols, bf16_max):
    """[VectorE, ScalarE, GpSimd] estimated ns of the block form before the scaling
    (``bf16_max``: the row max is a bf16 -> bf16 tensor_reduce, 2 elements per cycle)."""
    c = active_engine_costs()
    vector = (_max_ns(per * cols, bf16_max)                                       # max
              + c.instruction_ns("vector", c.vector_reciprocal_factor * per))      # 1/sum
    scalar = 0.0
    for lo, hi in _exp_groups(per):
        vector += c.instruction_ns("vector", (hi - lo) * cols)              # sums
        scalar += c.instruction_ns("scalar", (hi - lo) * cols)              # exp
    gpsimd = per * c.instruction_ns("gpsimd", cols)                          # x - max
    if bf16_max:
        gpsimd += c.instruction_ns("gpsimd", per)                            # max -> fp32
    return [vector, scalar, gpsimd]


def _row_scaling_ns(cols):
    """[VectorE, ScalarE, GpSimd] estimated ns of one row's e * (1/sum)."""
    c = active_engine_costs()
    return [c.instruction_ns(engine, cols) for engine in ("vector", "scalar", "gpsimd")]


def _block_scaling(per, cols, bf16_max):
    """(the engine of each row's scaling, [VectorE, ScalarE, GpSimd] estimated ns of the
    whole block) in the block form: rows go one by one to the engine that finishes it
    soonest after the work it already has (a list schedule of the estimates), so the three
    engines end the block together."""
    load = _block_base_ns(per, cols, bf16_max)
    cost = _row_scaling_ns(cols)
    engines = []
    for _ in range(per):
        best = min(range(3), key=lambda e: (load[e] + cost[e], e))
        load[best] += cost[best]
        engines.append(best)
    return engines, load


def _block_exp_time(per, cols, bf16_max):
    """Estimated ns of the busiest engine on one block in the block form (one row per
    partition gains nothing from it: inf)."""
    if per == 1:
        return float("inf")
    return max(_block_scaling(per, cols, bf16_max)[1])


def _row_form_ns(per, cols, bf16_max):
    """Estimated ns of a [P, per, cols] block's parts in the per-row form (cost-model rules
    with the active generation's numbers, engine_costs.py): (ScalarE's one pass over every
    row: the exps, or the scaling if ScalarE takes it all; VectorE's max over the block,
    bf16 -> bf16 at 2 elements per cycle, and 1 / sum at 8 cycles per element; all the scaling on
    VectorE, fp32 input at 1 element per cycle)."""
    c = active_engine_costs()
    on_scalar = per * c.instruction_ns("scalar", cols)
    vector = _max_ns(per * cols, bf16_max) + c.instruction_ns("vector", c.vector_reciprocal_factor * per)
    on_vector = per * c.instruction_ns("vector", cols)
    return on_scalar, vector, on_vector


def _row_exp_time(per, cols, bf16_max):
    """Estimated ns of the busiest engine on one block in the per-row form (one exp per row
    with its max as the bias, the scaling split by _scaling_vector_share)."""
    on_scalar, vector, on_vector = _row_form_ns(per, cols, bf16_max)
    f = _scaling_vector_share(per, cols, bf16_max)
    return max(on_scalar + (1 - f) * on_scalar, vector + f * on_vector)


def _scaling_vector_share(per, cols, bf16_max):
    """Share of a [P, per, cols] block's e * (1/sum) done on VectorE (rows when per > 1, else
    columns): the one that evens out the block's estimated VectorE and ScalarE time, in [0, 1]."""
    on_scalar, vector, on_vector = _row_form_ns(per, cols, bf16_max)
    # ScalarE's exps + (1 - f) of the scaling = VectorE's own work + f of it
    return min(1.0, max(0.0, (2 * on_scalar - vector) / (on_scalar + on_vector)))


def _resident_bytes(cols):
    """SBUF bytes per partition the resident online form keeps for one row tile: every
    chunk's e in fp32."""
    return cols * 4


def _online_sbuf_bytes(cols, chunk, itemsize, out_tiles):
    """SBUF bytes per partition the resident online form holds at once for a row tile:
    what it keeps, the staging ring, the per-chunk statistics (chunk max, -max, sum, shift,
    weighted sum and factor: at most 24 bytes a chunk, 8 more a row) and ``out_tiles``
    pass-2 output tiles."""
    stats = 24 * cdiv(cols, chunk) + 8
    return _resident_bytes(cols) + (STAGING_BUFS + out_tiles) * chunk * itemsize + stats


def _resident_fits(cols, chunk, itemsize):
    """Whether the resident online form fits the active generation's SBUF with one output
    tile at a time (trn1's 192 KiB does not hold fp32 rows of 32000 beside their staging
    ring: they stream there)."""
    return _online_sbuf_bytes(cols, chunk, itemsize, 1) <= active_engine_costs().sbuf_bytes_per_partition


def _output_ring_fits(cols, chunk, itemsize):
    """Whether a row tile's pass-2 output ring (OUT_BUFS tiles) fits the active generation's
    SBUF beside the row tile's kept chunks and the staging ring."""
    return _online_sbuf_bytes(cols, chunk, itemsize, OUT_BUFS) <= active_engine_costs().sbuf_bytes_per_partition


def _online_scaling_engines(widths):
    """The engine ("vector", "gpsimd" or "scalar") that scales each kept chunk of
    ``widths`` columns in pass 2: a list schedule of the active generation's estimated
    instruction times (engine_costs.py; fp32 e in, so VectorE at one element per cycle),
    each chunk to the engine that would finish it first."""
    c = active_engine_costs()
    done = {"vector": 0.0, "gpsimd": 0.0, "scalar": 0.0}
    engines = []
    for width in widths:
        ends = {e: done[e] + c.instruction_ns(e, width) for e in done}
        engine = min(ends, key=lambda e: (ends[e], e))
        done[engine] = ends[engine]
        engines.append(engine)
    return engines


def _chunk_stat_tiles(parts, n_chunks, dtype):
    """[parts, n_chunks] tiles of the online and split forms' per-chunk statistics: the
    chunk's max (in bf16 for a bf16 input: exact, and N/2, as the one-pass form's row max),
    its -max clamped in fp32 (the exp's bias), and the sum of exp(x - chunk max)."""
    chunk_max = nl.ndarray((parts, n_chunks), dtype=nl.bfloat16 if dtype == nl.bfloat16 else nl.float32,
                           buffer=nl.sbuf)
    chunk_neg_max = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    chunk_sum = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    return chunk_max, chunk_neg_max, chunk_sum


def _chunk_max(x_cols, chunk_max, chunk_neg_max, k):
    """Column k of the chunk statistics: VectorE's max of ``x_cols``, then GpSimd's -max
    clamped at the lowest finite fp32 (a chunk of -inf, or of padding alone, gets a finite
    shift: exp(-inf - shift) = 0, not exp(nan)). The clamp is on GpSimd, idle in both forms,
    so that VectorE goes on to the next chunk's max ([8, 128256] bf16 modeled 0.3 us faster
    when it was measured)."""
    nisa.tensor_reduce(dst=chunk_max[:, k:k + 1], op=nl.maximum, data=x_cols, axis=1)
    nisa.tensor_scalar(dst=chunk_neg_max[:, k:k + 1], data=chunk_max[:, k:k + 1], op0=nl.maximum,
                       operand0=FP32_LOWEST, op1=nl.multiply, operand1=-1.0, engine=nisa.engine.gpsimd)


def _chunk_exp(dst, x_cols, chunk_neg_max, chunk_sum, k):
    """ScalarE: ``dst`` = exp(x - chunk max) and its sum into column k of ``chunk_sum``."""
    nisa.activation(dst=dst, op=nl.exp, data=x_cols, bias=chunk_neg_max[:, k:k + 1],
                    reduce_op=nl.add, reduce_res=chunk_sum[:, k:k + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce)


def _weighted_chunk_sum(shifts, chunk_sum):
    """[P, 1] fp32: the sum over the chunks of g * chunk sum (one product when there is one
    chunk)."""
    parts, n_chunks = shifts.shape
    total = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    if n_chunks == 1:
        nisa.tensor_tensor(dst=total, data1=shifts, data2=chunk_sum, op=nl.multiply)
    else:
        weighted = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=weighted, data1=shifts, data2=chunk_sum, op=nl.multiply)
        nisa.tensor_reduce(dst=total, op=nl.add, data=weighted, axis=1)
    return total


# The online form before session 52 kept a running max (each chunk's exp waited for the
# previous chunk's statistics, and ScalarE took a rescaling exp per chunk in each pass) and
# kept half the chunks as x, recomputed on ScalarE in pass 2. Modeled trn2 LNC=2 (us), then
# -> now: bf16 [256, 32000] 74.5 -> 65.3, [1024, 32000] 235.0 -> 215.7, [1000, 9000] 104.3
# -> 70.8, [128, 18433] 49.7 -> 43.1, streaming [300, 50000] 245.0 -> 204.7; fp32 [256,
# 32768] (streamed before, kept now) 145.8 -> 108.9, [512, 24000] 161.6 -> 150.9, [128,
# 16385] 66.1 -> 62.2; slower: fp32 [300, 24576] 139.6 -> 145.1 (two row tiles per core).
def _softmax_online(x, out, n_rows, cols, chunk, resident):
    chunks = column_chunks(cols, chunk)
    n_chunks = len(chunks)
    row_lo, row_hi = program_rows(n_rows)    # this program's row tiles (LNC=2: half each)
    # Chunks pass 1 reads go through a ring of STAGING_BUFS tiles shared by the row tiles: a
    # load waits only for the instruction that last read its slot, STAGING_BUFS chunks back,
    # also across row tiles.
    # (one allocation of STAGING_BUFS slots: tiles from one allocation line are one family of
    # rotating buffers, where a slot a later chunk reuses held a buffer for the whole pass;
    # modeled trn2 LNC=2 fp32 [128, 16385] 81.1 -> 62.0 us, session 52's review)
    ring = nl.ndarray((PARTITIONS, STAGING_BUFS, chunk), dtype=x.dtype, buffer=nl.sbuf)
    staging = [ring[:, k, :] for k in range(STAGING_BUFS)]
    n_staged = 0
    out_ring = resident and _output_ring_fits(cols, chunk, itemsize(x.dtype))
    scaling_engines = _online_scaling_engines([hi - lo for lo, hi in chunks]) if resident else None
    for r0 in range(row_lo, row_hi, PARTITIONS):
        parts = min(PARTITIONS, n_rows - r0)
        outs = None
        if out_ring:
            outs = [nl.ndarray((PARTITIONS, chunk), dtype=x.dtype, buffer=nl.sbuf) for _ in range(OUT_BUFS)]
        # per chunk its own max and sum (no running max, so no chunk waits for the previous
        # one's statistics)
        chunk_max, chunk_neg_max, chunk_sum = _chunk_stat_tiles(parts, n_chunks, x.dtype)
        kept = []   # resident: each chunk's e in fp32
        # pass 1
        for c, (c0, c1) in enumerate(chunks):
            width = c1 - c0
            x_tile = staging[n_staged % STAGING_BUFS][:parts, 0:width]
            n_staged += 1
            nisa.dma_copy(dst=x_tile, src=x[r0:r0 + parts, c0:c1])
            _chunk_max(x_tile, chunk_max, chunk_neg_max, c)
            # e = exp(x - chunk max) and its sum; kept in fp32 when resident, else discarded
            exp_tile = nl.ndarray((parts, width), dtype=nl.float32 if resident else nl.bfloat16, buffer=nl.sbuf)
            _chunk_exp(exp_tile, x_tile, chunk_neg_max, chunk_sum, c)
            if resident:
                kept.append(exp_tile)
        # the row max M (-M: the least -chunk max), each chunk's g = exp(chunk max - M) in
        # (0, 1], the row sum l = sum of g * chunk sum, and each chunk's factor g * (1 / l).
        # The normalisation multiplies after the exp rather than folding ln l
        # into the exp's bias: -(M + ln l) rounded to fp32 loses ln l when |M| is large (at
        # |M| = 1e10 a two-way tie came out [1, 1]).
        neg_row_max = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_row_max, op=nl.minimum, data=chunk_neg_max, axis=1)
        shifts = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=shifts, op=nl.exp, data=chunk_neg_max, bias=neg_row_max, scale=-1.0)
        row_sum = _weighted_chunk_sum(shifts, chunk_sum)
        inv_sum = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sum, data=row_sum)
        if resident:
            factor = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=factor, data=shifts, op0=nl.multiply, operand0=inv_sum)
        # pass 2: normalised exponentials, into the output ring where it fits SBUF, else
        # fresh tiles per chunk
        for c, (c0, c1) in enumerate(chunks):
            width = c1 - c0
            if outs is not None:
                out_tile = outs[c % OUT_BUFS][:parts, 0:width]
            else:
                out_tile = nl.ndarray((parts, width), dtype=x.dtype, buffer=nl.sbuf)
            if resident:
                # e * g * (1 / l), rounded once, on the engine the list schedule gives the chunk
                if scaling_engines[c] == "scalar":
                    nisa.activation(dst=out_tile, op=nl.copy, data=kept[c], scale=factor[:, c:c + 1])
                else:
                    nisa.tensor_scalar(dst=out_tile, data=kept[c], op0=nl.multiply, operand0=factor[:, c:c + 1],
                                       engine=nisa.engine.gpsimd if scaling_engines[c] == "gpsimd" else nisa.engine.vector)
            else:
                # streaming: reload x, exp(x - M) in fp32 on ScalarE, / l on GpSimd
                x_tile = nl.ndarray((parts, width), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=x_tile, src=x[r0:r0 + parts, c0:c1])
                exp_full = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=exp_full, op=nl.exp, data=x_tile, bias=neg_row_max)
                nisa.tensor_scalar(dst=out_tile, data=exp_full, op0=nl.multiply, operand0=inv_sum,
                                   engine=nisa.engine.gpsimd)
            nisa.dma_copy(dst=out[r0:r0 + parts, c0:c1], src=out_tile)


# Most rows in one group of the split form (rows cut into segments over the partitions), so
# each row gets S >= 4 partitions; a part of more rows is taken in several groups in turn
# (_part_groups). Not 64 (S = 2): the form must be the same at LNC=1 and LNC=2
# (bit-identical outputs), and at LNC=1 the one program runs both parts in turn, so S = 2
# only halves each part's lanes' work to add it back (modeled trn2 LNC=1, bf16 [128, 2048]:
# 12.1 us split against 10.7; [128, 8193] 37.3 against 31.0; session 51's review).
SPLIT_MAX_ROWS = PARTITIONS // 4
# A group whose row length has no divisor near its S is cut into segments of ceil(C / S)
# columns, the last one shorter, loaded and stored row by row: two DMAs per row each way.
# Only groups of at most this many rows take that (16 DMAs, one per queue); more rows made it
# DMA-bound (modeled trn2 LNC=2 bf16 [128, 2049] 20.6 us split against 10.7; [64, 2051]
# 12.8 against 10.7, review of session 51). A scan of 1-64 rows x 1300-128256 columns
# (trn2 at LNC=2 and 1, trn3 at LNC=2; 408 bf16 and 360 fp32 shapes take the split, session
# 52) finds it slower on 7: on trn2 at LNC=1, bf16 ragged at 2049 columns with 2-5 rows by
# 0.4-1.1 us (9.0 against 8.6 .. 10.1 against 9.6), bf16 [4, 1537] by 0.3 and fp32 [2, 1312]
# by 0.06; on trn3 at LNC=2 bf16 [1, 1537] by 0.07.
SPLIT_RAGGED_MAX_ROWS = 4
# What the split form's chain adds to one row per partition's, each step after the previous
# (its whole fixed cost, then the dependency wait before the next reads its result): before
# the exp, the clamp of the segment max (GpSimd); after it, the shifts' exp (ScalarE), each
# segment's share of the row sum, the row sum, its broadcast over the row's segments and the
# factors g * (1 / sum) (VectorE; the reciprocal the row form has too), and the two TensorE
# transposes of the shares and of the sums. The row max's own two transposes, reduce and
# broadcast run on VectorE and TensorE under the exp and are not counted.
SPLIT_CHAIN_VECTOR = 4
SPLIT_CHAIN_SCALAR = 1
SPLIT_CHAIN_GPSIMD = 1
SPLIT_CHAIN_TRANSPOSES = 2
# Most column chunks a split-form segment is taken in (_split_chunk_count), a bound on the
# trace's length: past it a chunk's fixed costs outweigh what finer pipelining saves (modeled
# trn2 LNC=2 [64, 32000], segments of 8000 columns, session 52: bf16 4 chunks 22.9 us, 6 (the
# count picked) 22.5, 8 23.7, 12 27.7; fp32 8 (picked) 31.5, 12 31.0: the bound costs fp32
# 0.4 us there).
SPLIT_MAX_CHUNKS = 8
# What more than one chunk adds to the chain after the last exp: the sum over a segment's
# chunks of g * chunk sum (one VectorE reduce; the chunks' maxima are combined under the
# exps)
SPLIT_CHUNK_CHAIN_VECTOR = 1


def _split_scaling_shares(n_groups):
    """(VectorE, GpSimd, ScalarE) shares of the split form's e * factor, in proportion to
    each engine's rate on fp32 elements by the active generation's figures:
    over VectorE, GpSimd and ScalarE for a part taken as one group (its scaling follows
    its exps), over VectorE and GpSimd alone for a part of several groups (ScalarE then
    runs the next group's exps). Against session 52's even VectorE / ScalarE split, the
    one-group shares model faster on 462 of 630 runs of 1-64 rows x 1600-128256 columns
    (to -4.7 %; [8, 128256] bf16 15.6 -> 15.4 us) and slower on 6, all bf16 on trn2 with
    rows of 50257-100003 columns (to +2.2 %: [5, 50257] 11.07 -> 11.31; session 53's
    review)."""
    c = active_engine_costs()
    # rates from one 1000-element instruction each, fixed costs included
    engines = ("vector", "gpsimd", "scalar") if n_groups == 1 else ("vector", "gpsimd")
    rates = [1.0 / c.instruction_ns(e, 1000) for e in engines]
    shares = [r / sum(rates) for r in rates] + [0.0] * (3 - len(engines))
    return tuple(shares)


def _split_scaling_ns(n, n_groups):
    """Estimated ns of the split form's e * factor over ``n`` elements per lane, on the
    engines _split_scaling_shares gives a part of ``n_groups`` groups, side by side."""
    c = active_engine_costs()
    return max(c.instruction_ns(engine, n * share) if share > 0 else 0.0
               for engine, share in zip(("vector", "gpsimd", "scalar"), _split_scaling_shares(n_groups)))


def _row_lane_ns(cols, bf16_max):
    """Estimated ns one lane spends on a row of ``cols`` elements in one row per partition:
    VectorE's max, ScalarE's exp and the scaling split evenly between VectorE and ScalarE."""
    c = active_engine_costs()
    return (_max_ns(cols, bf16_max) + c.instruction_ns("scalar", cols)
            + max(c.instruction_ns("vector", cols / 2), c.instruction_ns("scalar", cols / 2)))


def _split_lane_ns(width, bf16_max, n_groups):
    """Estimated ns one lane spends on a split-form segment of ``width`` elements: VectorE's
    max, ScalarE's exp and the scaling (_split_scaling_ns)."""
    c = active_engine_costs()
    return (_max_ns(width, bf16_max) + c.instruction_ns("scalar", width)
            + _split_scaling_ns(width, n_groups))


def _split_chain_ns(elements):
    """Estimated ns of the split form's combining chain (SPLIT_CHAIN_*) over a group of
    ``elements`` partitions, each step waiting for its predecessor's result."""
    c = active_engine_costs()
    return (SPLIT_CHAIN_VECTOR * (c.instruction_ns("vector", elements, reads_previous=True) + c.dependency_ns("vector"))
            + SPLIT_CHAIN_SCALAR * (c.instruction_ns("scalar", elements) + c.dependency_ns("scalar"))
            + SPLIT_CHAIN_GPSIMD * (c.instruction_ns("gpsimd", elements) + c.dependency_ns("gpsimd"))
            + SPLIT_CHAIN_TRANSPOSES * (c.fp32_transpose_ns(elements, 1) + c.dependency_ns("tensor")))


def _split_pays(cols, width, elements, bf16_max):
    """Whether cutting rows of ``cols`` into segments of ``width`` saves more engine time per
    lane (_row_lane_ns over the row against _split_lane_ns over a segment) than the combining
    chain costs (``elements`` per instruction: the group's partitions), by the active
    generation's figures (engine_costs.py). Modeled trn2 LNC=2, bf16, split against one row
    per partition, us (session 52; "-": not taken):
               C = 1536       2048       4096       8192       32000
      [1, C]   -  / 7.1   7.2 / 8.2  7.2 / 12.6  7.2 / 21.5  7.6 / 51.0
      [8, C]   -  / 9.0   7.3 / 10.7 7.3 / 17.6  7.6 / 31.5  9.4 / 61.0
    The rule splits bf16 rows from ~1590 columns on trn2 (~1540 on trn3) at 1 row per part
    (~1950 at 32), fp32 rows from ~1220 (~1520 at 32; session 53, the scaling over three
    engines): later than the modeled crossover (bf16 ~1300; session 51's review), so it
    seldom takes the split where it models slower (SPLIT_RAGGED_MAX_ROWS)."""
    saved = _row_lane_ns(cols, bf16_max) - _split_lane_ns(width, bf16_max, 1)
    return saved > _split_chain_ns(elements)


def _split_groups_pay(n_groups, cols, bf16_max):
    """Whether a part of more than SPLIT_MAX_ROWS rows (or of rows too long for one group's
    segments) is faster in ``n_groups`` split-form groups, taken in turn, than in row tiles
    of one row per partition. Both are pipelined (the groups through their tiles' buffers,
    the row tiles likewise), but a row tile's max, exp and scaling each span the whole row,
    so one tile's lane time (_row_lane_ns over ``cols``) is exposed at the start and end of
    the part, where a group's is a fraction of it; each group pays its combining chain
    (_split_chain_ns over 128 partitions, 2.9 us on trn2). The rule takes groups on trn2
    from 2873 bf16 / 2249 fp32 columns for 2 groups a part (33-64 rows), 5995 / 4692 for 4
    (a 128-row tile per core), 12239 / 9578 for 8 (2651 / 2057, 5506 / 4309, 11217 / 8778
    until the refit of 2026-12-06 made trn2's VectorE instructions 150 cycles, 80 of them
    behind an independent one; 2585 / 2023, 5440 / 4257, 11150 / 8726 until session 59,
    when the row tiles' estimates began to count VectorE's pipeline
    overlap: fp32 [64, 2051] now takes row tiles, 14.5 us, where groups model 9.4).
    Modeled trn2 LNC=2, us, row tiles -> groups (session 53): bf16 [128, 4096] 17.6 -> 11.5, [256, 32000] 65.3 -> 51.2, [1024,
    32000] 215.7 -> 189.6, [64, 128256] 254.8 -> 51.2; fp32 [300, 24576] 145.1 -> 91.5.
    A scan of 96-512 rows x 2048-32000 columns (trn2 at LNC=2 and 1, trn3 at LNC=2; 188 of
    288 shapes faster) and the review's of 15 x 13 shapes to 35M elements (211 taking
    groups: all faster at LNC=2 on trn2 and trn3) find groups slower only at LNC=1, where
    the one program runs both parts' groups against two row tiles: 13 shapes, 12 of them
    parts of two groups just past the threshold, bf16 [128, 2600] 12.6 -> 14.8 us (+18 %),
    [128, 3000] 13.9 -> 15.5 (+12 %), [96|100, 2600] +9 %, fp32 [96|100, 2048] +5-6 %, the
    rest under +5 % ([256, 5500] +4 %, fp32 [500, 11000] +1 %). The same shapes gain 20-30 %
    at LNC=2, the default launch on trn2 and trn3, and the form must be the same at both
    degrees; counting both parts' groups, as LNC=1 runs them, would give up 27 of the LNC=2
    gains, most of them 30-45 %. At LNC=2, and in fp32, the rule is conservative: groups
    also model faster at bf16 [192, 4096] (17.7 -> 15.0), [384, 8192] (41.8 -> 32.0) and
    fp32 [384, 6144] (53.1 -> 31.9; at LNC=1 61.2 -> 56.0), which it leaves as row tiles. (_row_lane_ns prices a row tile's scaling on
    VectorE and ScalarE; past 8192 columns the online form spreads it over three engines, so
    the rule leans a little towards groups there.)"""
    return n_groups * _split_chain_ns(PARTITIONS) < _row_lane_ns(cols, bf16_max)


def _split_chunk_count(width, dtype_bytes, bf16_max, n_groups):
    """How many column chunks the split form takes a [P, ``width``] segment tile in: the
    count (1 .. SPLIT_MAX_CHUNKS) whose estimated time is least, by the active generation's
    figures (engine_costs.py). Each half of the form is a pipeline over the chunks: the
    loads (one transfer per chunk, each DMA queue moving 8 partitions' share), VectorE's
    maxima and ScalarE's exps, then the scaling (_split_scaling_ns, on the engines a part of
    ``n_groups`` groups uses) and the stores; a pipeline of K items through stages of a, b,
    c takes a + b + c + (K - 1) * max(a, b, c). More chunks start each stage sooner and pay
    more fixed costs (the DMA transfer gap, each instruction's fixed cost) and the chunks'
    combining chain. Modeled
    trn2 LNC=2 (us; chunks 1 / 2 / 3 / 4, * the count picked; session 52):
      bf16 [8, 128256] (segments of 4008)   19.2 / 16.4 / 15.6* / 15.8
      fp32 [8, 128256] (4008)               27.0 / 22.5 / 20.9 / 20.4   (6: 20.0*)
      bf16 [32, 16384] (2048)               12.8 / 11.8* / 12.6 / 13.9
      fp32 [32, 16384] (2048)               16.7 / 14.9 / 14.4* / 14.9
      bf16 [8, 32000]  (1000)                9.4* / 10.5 / 11.8 / 13.3
      fp32 [8, 32000]  (1000)               11.3 / 11.4* / 12.4 / 13.8"""
    c = active_engine_costs()
    best_time, best_count = None, 1
    for count in range(1, SPLIT_MAX_CHUNKS + 1):
        cols = cdiv(width, count)
        transfer = c.dma_occupancy_ns(c.queue_data_ns(cols * dtype_bytes))
        maximum = _max_ns(cols, bf16_max)
        exp = c.instruction_ns("scalar", cols)
        scaling = _split_scaling_ns(cols, n_groups)
        first_half = transfer + maximum + exp + (count - 1) * max(transfer, maximum, exp)
        second_half = scaling + transfer + (count - 1) * max(scaling, transfer)
        chain = 0.0 if count == 1 else SPLIT_CHUNK_CHAIN_VECTOR * (
            c.instruction_ns("vector", count, reads_previous=True) + c.dependency_ns("vector"))
        time = first_half + chain + second_half
        if best_time is None or time < best_time:
            best_time, best_count = time, count
    return best_count


def _split_segments(rows, cols, max_cols, bf16_max):
    """(S, W, exact) of the split form for a group of ``rows`` rows: S segments per row of W
    columns each (the last one shorter unless ``exact``: S * W == cols, the group then one
    contiguous [rows * S, W] view of HBM), or None when the form does not apply or does not
    pay (_split_pays)."""
    if not 1 <= rows <= SPLIT_MAX_ROWS:
        return None
    most = PARTITIONS // rows
    segments = None
    for seg in range(most, max(1, most // 2), -1):      # a divisor of C near the most
        if cols % seg == 0 and cols // seg <= max_cols:
            segments = (seg, cols // seg, True)
            break
    if segments is None and rows <= SPLIT_RAGGED_MAX_ROWS:
        width = cdiv(cols, most)
        if width <= max_cols:
            segments = (cdiv(cols, width), width, False)
    if segments is None or not _split_pays(cols, segments[1], rows * segments[0], bf16_max):
        return None
    return segments


def _split_pairs(hbm, tile, r0, rows, seg, width, exact, lo, hi):
    """[(HBM view, tile view)] that together move columns lo .. hi - 1 of every segment of
    rows r0 .. r0 + rows - 1 of an HBM [N, C] tensor to or from their [rows * seg, width]
    split-form tile: the whole part in one pair when ``exact`` (C == seg * width), else per
    row its full segments and (where the columns reach it) its last, shorter one."""
    cols = hbm.shape[1]
    if exact:
        return [(hbm[r0:r0 + rows, :].reshape((rows * seg, width))[:, lo:hi], tile[:, lo:hi])]
    tail = cols - (seg - 1) * width
    pairs = []
    for g in range(rows):
        p0 = g * seg
        if seg > 1:
            pairs.append((hbm[r0 + g, 0:(seg - 1) * width].reshape((seg - 1, width))[:, lo:hi],
                          tile[p0:p0 + seg - 1, lo:hi]))
        if lo < tail:
            end = min(hi, tail)
            pairs.append((hbm[r0 + g:r0 + g + 1, (seg - 1) * width + lo:(seg - 1) * width + end],
                          tile[p0 + seg - 1:p0 + seg, lo:end]))
    return pairs


def _combine_row_segments(column, op, rows, seg):
    """[P, 1] fp32 PSUM: ``op`` (nl.minimum or nl.add) over each row's ``seg`` segments of
    the [P, 1] fp32 SBUF ``column`` (segment s of row g on partition g * seg + s), on every
    partition of the row. TensorE transposes the column onto one partition [1, P], VectorE
    reduces each row's segments and broadcasts the result over them, and TensorE transposes
    it back. (Not one matmul by a same-row 0/1 matrix: its zeros times another row's NaN,
    from a +inf or NaN input, would make every row NaN; a TensorE transpose moves each value
    alone, bit-exact on NeuronCore-v3 and later, nki.isa.nc_transpose.)"""
    parts = rows * seg
    row = nl.ndarray((1, parts), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=row, data=column, engine=nisa.engine.tensor)
    per_row = nl.ndarray((1, rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=per_row, op=op, data=row.reshape((1, rows, seg)), axis=2)
    per_segment = nl.ndarray((1, rows, seg), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=per_segment, src=per_row.expand_dim(2).broadcast_to((1, rows, seg)))
    back = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=back, data=per_segment.reshape((1, parts)), engine=nisa.engine.tensor)
    return back


def _split_max_shifts(chunk_neg_max, rows, seg):
    """[P, K] fp32 g = exp(chunk max - row max) in (0, 1] of every chunk of every segment,
    from its -max (``chunk_neg_max``, [P, K]): each segment's least -max, each row's least
    (-M) on its partitions (_combine_row_segments), and ScalarE's exp(-(-chunk max) + (-M))."""
    parts, n_chunks = chunk_neg_max.shape
    if n_chunks == 1:
        seg_neg_max = chunk_neg_max
    else:
        seg_neg_max = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=seg_neg_max, op=nl.minimum, data=chunk_neg_max, axis=1)
    neg_row_max_psum = _combine_row_segments(seg_neg_max, nl.minimum, rows, seg)
    # the bias read from PSUM: "starting NeuronCore-v3, bias can either be a compile-time
    # constant scalar or a [N, 1] vector similar to scale", and scale may be "a [N, 1] vector
    # from SBUF/PSUM" (NKI 0.7 nki.isa.activation); the split form runs on v3 and later only
    shifts = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=shifts, op=nl.exp, data=chunk_neg_max, bias=neg_row_max_psum, scale=-1.0)
    return shifts


def _softmax_split(x, out, r0, rows, seg, width, exact, chunk, shares):
    """softmax of rows r0 .. r0 + rows - 1 (one group), each cut into ``seg`` segments of
    ``width`` columns, segment s of row g on partition g * seg + s, each segment's columns
    taken in chunks of ``chunk``, the scaling split between VectorE, GpSimd and ScalarE by
    ``shares`` (_split_scaling_shares; module docstring, split form)."""
    cols = x.shape[1]
    parts = rows * seg
    tail = cols - (seg - 1) * width            # the last segment's columns (== width if exact)
    chunks = column_chunks(width, chunk)
    n_chunks = len(chunks)
    # the group's [parts, width] tiles, each chunk a column range of them (one allocation
    # each: every chunk's load, exp and scaling has its own columns, so nothing waits for a
    # buffer to come free)
    x_tile = nl.ndarray((parts, width), dtype=x.dtype, buffer=nl.sbuf)
    exp_tile = nl.ndarray((parts, width), dtype=nl.float32, buffer=nl.sbuf)
    out_tile = nl.ndarray((parts, width), dtype=x.dtype, buffer=nl.sbuf)
    if tail < width:
        # the last segment's missing columns: -inf, which the max ignores and exp sends to 0
        # (memset on every partition from 0: an engine access starts on a quadrant; the
        # full segments' loads then overwrite their own partitions)
        nisa.memset(dst=x_tile[:, tail:width], value=-float("inf"))
    # per chunk of each segment its own max and sum
    chunk_max, chunk_neg_max, chunk_sum = _chunk_stat_tiles(parts, n_chunks, x.dtype)
    shifts = None
    for k, (lo, hi) in enumerate(chunks):
        for hbm_view, tile_view in _split_pairs(x, x_tile, r0, rows, seg, width, exact, lo, hi):
            nisa.dma_copy(dst=tile_view, src=hbm_view)
        _chunk_max(x_tile[:, lo:hi], chunk_max, chunk_neg_max, k)
        if k == n_chunks - 1 and n_chunks > 1:
            # every chunk's max is known before the last chunk's exp: ScalarE takes the
            # shifts' exp there, so that after the exps only the sums remain
            shifts = _split_max_shifts(chunk_neg_max, rows, seg)
        _chunk_exp(exp_tile[:, lo:hi], x_tile[:, lo:hi], chunk_neg_max, chunk_sum, k)
    if shifts is None:
        shifts = _split_max_shifts(chunk_neg_max, rows, seg)
    # each partition's share of its row's sum: sum over its chunks of g * chunk sum
    share = _weighted_chunk_sum(shifts, chunk_sum)
    # the row's sum on each of its partitions
    row_sum_col = _combine_row_segments(share, nl.add, rows, seg)
    # each chunk's factor g / row sum: the reciprocal (VectorE reads the sum from PSUM), then
    # the product (not one division: nl.divide is not in NKI 0.7's table of ISA operators)
    inv_sum = nl.ndarray((parts, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_sum, data=row_sum_col)
    factor = nl.ndarray((parts, n_chunks), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=factor, data=shifts, op0=nl.multiply, operand0=inv_sum)
    # e * factor, rounded once to the output dtype, chunk by chunk (each chunk's store
    # starts when its columns are scaled)
    for k, (lo, hi) in enumerate(chunks):
        for _, a, b, path in path_segments(1, hi - lo, shares):
            if path == 2:
                nisa.activation(dst=out_tile[:, lo + a:lo + b], op=nl.copy, data=exp_tile[:, lo + a:lo + b],
                                scale=factor[:, k:k + 1])
            else:
                nisa.tensor_scalar(dst=out_tile[:, lo + a:lo + b], data=exp_tile[:, lo + a:lo + b], op0=nl.multiply,
                                   operand0=factor[:, k:k + 1],
                                   engine=nisa.engine.vector if path == 0 else nisa.engine.gpsimd)
        for hbm_view, tile_view in _split_pairs(out, out_tile, r0, rows, seg, width, exact, lo, hi):
            nisa.dma_copy(dst=hbm_view, src=tile_view)


def _split_groups(rows, most):
    """[(first row offset, rows)] of the fewest groups of at most ``most`` rows a part of
    ``rows`` rows is cut into, of even size (sizes differ by at most one)."""
    n = cdiv(rows, most)
    bounds = [g * rows // n for g in range(n + 1)]
    return [(lo, hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _part_groups(r0, rows, cols, max_cols, dtype):
    """[(first row, rows, S, W, exact, chunk)] of the groups the split form takes the part of
    ``rows`` rows from row ``r0`` in, in turn, or None when it does not take the part. The
    group size is the largest of SPLIT_MAX_ROWS (each row gets S >= 4 partitions; fewer
    when a row's segments would exceed ``max_cols``) and its halvings at which every group
    finds its segments (_split_segments: a divisor of the row length near its S, or ragged
    segments for groups of at most SPLIT_RAGGED_MAX_ROWS rows): rows of 50257 columns
    (GPT-2's vocabulary, 29 x 1733) have no divisor in (4, 8] or (8, 16] but 29 in (16, 32],
    so they go in groups of 4 rows (modeled trn2 LNC=2 bf16 [32, 50257]: 108.1 us as 16-row
    tiles of the online form). More than one group must also pay (_split_groups_pay), ragged
    groups priced as LNC=1 runs them, both parts' groups in turn: their rows load and store
    one by one, and priced per part they modeled up to 64 % slower at LNC=1 (bf16 [128,
    32001], 16 groups of 4 rows a part: 65.0 -> 106.7 us; 56.7 at LNC=2). A scan of 1-256
    rows x 30522-151936 columns (7 vocabulary-like lengths; bf16 and fp32; trn2 at LNC=2 and
    1, trn3) against session 53's first grouped form: 209 of 420 runs faster, 137 of them
    more than 2x ([32, 151936] bf16 300.3 -> 44.1 us, [64, 100003] 201.4 -> 55.6), 9 slower:
    bf16 [256, 50257] on trn3 +12 % (32 groups), fp32 [100, 32001] at LNC=1 +15 %, bf16
    [256, 30522] +3 % (trn2 LNC=2) to +12 % (LNC=1), [256, 151936] on trn3 +7 %, and four
    LNC=1 runs +3-4 %."""
    bf16_max = dtype == nl.bfloat16
    most = max(1, min(SPLIT_MAX_ROWS, PARTITIONS // cdiv(cols, max_cols)))
    while most >= 1:
        bounds = _split_groups(rows, most)
        # groups differ in size by at most one row: plan each size once (a part of 80,000
        # one-column rows has 2,500 groups of 32 rows, then 5,000 of 16, ... 80,000 of 1)
        by_size = {n: _split_segments(n, cols, max_cols, bf16_max) for n in {n for _, n in bounds}}
        segments = [by_size[group_rows] for _, group_rows in bounds]
        if all(seg is not None for seg in segments):
            # ragged groups (their rows loaded and stored one by one) are priced as LNC=1
            # runs them: both parts' groups in turn
            priced = len(bounds) * (1 if all(seg[2] for seg in segments) else WORK_PARTS)
            if len(bounds) > 1 and not _split_groups_pay(priced, cols, bf16_max):
                return None
            groups = []
            chunks = {seg[1]: cdiv(seg[1], _split_chunk_count(seg[1], itemsize(dtype), bf16_max, len(bounds)))
                      for seg in set(segments)}
            for (offset, group_rows), seg in zip(bounds, segments):
                chunk = chunks[seg[1]]
                groups.append((r0 + offset, group_rows) + seg + (chunk,))
            return groups
        most //= 2
    return None


def _split_plan(n_rows, cols, max_cols, dtype):
    """Per each of the WORK_PARTS even parts of the rows, the [(first row, rows, S, W, exact,
    chunk)] of the groups it is taken in by the split form (_part_groups; an empty part has
    none; ``chunk``: the columns of each segment's column chunks, _split_chunk_count), or
    None when a part does not take it. The plan covers every part, whichever program runs:
    the form is chosen for the whole launch and is the same at LNC=1 and LNC=2.
    NeuronCore-v2 (trn1) never takes it: its TensorE transposes are "not bit-accurate if the
    input data contains NaN/Inf" (NKI 0.7 nki.isa.nc_transpose), and a row's inf or NaN
    statistic would then reach the other rows of its group."""
    if nisa.get_nc_version() == nisa.nc_version.gen2:
        return None
    plan = []
    for lo, hi in even_parts(n_rows):
        groups = _part_groups(lo, hi - lo, cols, max_cols, dtype) if hi > lo else []
        if groups is None:
            return None
        plan.append(groups)
    return plan


@nki.jit
def softmax_kernel(x, max_cols=MAX_COLS, resident_bytes=RESIDENT_BYTES, split_rows=True):
    """Return ``softmax(x, dim=-1)``.

    Args:
        x: HBM [N, C], float32/bfloat16/float16.
        max_cols: longest row done in one on-chip pass (and the chunk width of the online
            form, at most ONLINE_CHUNK; and the longest segment of the split form);
            1 <= max_cols <= MAX_COLS.
        resident_bytes: the online form keeps a row tile in SBUF when it needs at most this
            many bytes per partition (0: always stream). Tests lower both to exercise every
            form.
        split_rows: take the split form where it applies (_split_plan); False: never (tests
            of the other forms on few long rows).
    Returns:
        HBM [N, C] (shared_hbm), dtype of ``x``.
    """
    assert 1 <= max_cols <= MAX_COLS, f"max_cols={max_cols} outside [1, {MAX_COLS}]"
    assert 0 <= resident_bytes <= RESIDENT_BYTES, f"resident_bytes={resident_bytes} outside [0, {RESIDENT_BYTES}]"
    n_rows, cols = x.shape
    out = nl.ndarray((n_rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    plan = _split_plan(n_rows, cols, max_cols, x.dtype) if split_rows else None
    if plan is not None:
        for groups in program_parts(plan):
            shares = _split_scaling_shares(len(groups))[:2]   # path_segments: ScalarE takes the rest
            for group in groups:
                _softmax_split(x, out, *group, shares)
    elif cols <= max_cols:
        _softmax_rows(x, out, n_rows, cols)
    else:
        chunk = min(max_cols, ONLINE_CHUNK)
        resident = _resident_bytes(cols) <= resident_bytes and _resident_fits(cols, chunk, itemsize(x.dtype))
        _softmax_online(x, out, n_rows, cols, chunk, resident)
    return out
