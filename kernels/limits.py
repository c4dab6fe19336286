"""The shapes the NKI kernels accept: one place for the kernels and the op layer.

Imports nothing, so the op layer (``nki_kernels._kernel_sources.limits()``) can check
arguments against these numbers on any host, with or without AWS's toolchain. Sizes per
partition below are for trn2 (224 KiB of SBUF per partition, 8 PSUM banks of 2 KiB).
"""

# Norms (layer_norm, rms_norm, fused_add_rms_norm): largest normalised size H kept on chip
# for one pass over HBM. A row tile [128, 8192] fp32 is 32 KiB per partition; with the
# weight, input, output and the next block in flight this stays under trn2's 224 KiB per
# partition.
NORM_ONE_PASS_MAX_HIDDEN = 8192
# Norms: largest normalised size H. Longer rows than the one-pass limit are streamed in
# column chunks of NORM_STREAM_CHUNK, in two passes (statistics, then the normalisation):
# over SBUF-resident chunks when the row tile fits NORM_RESIDENT_ROW_BYTES, else over HBM
# (read twice). SBUF use does not grow with H except for the per-row statistics
# (layer_norm: 6 fp32 per 512 columns, 3 KiB per partition at 65536) and the weight/bias,
# kept resident up to NORM_RESIDENT_PARAM_BYTES per partition, else loaded per chunk.
# 65536 covers every released model (Llama-3.1-405B: 16384) four times over.
NORM_MAX_HIDDEN = 65536
# Columns per chunk of a streamed row: 4096 = 8 KiB bf16 / 16 KiB fp32 per partition per
# DMA (above the 4 KiB that saturates DMA bandwidth); input, fp32 scratch, weight and
# output chunks of two chunks in flight take <= 128 KiB per partition in fp32.
NORM_STREAM_CHUNK = 4096
# A streamed row tile [128, H] kept in SBUF between its two passes (so HBM sees one read)
# when it takes at most this many bytes per partition: bf16 rows up to H = 32768, fp32 up
# to 16384; with resident weights (64 KiB) and the chunks in flight it fits 224 KiB.
NORM_RESIDENT_ROW_BYTES = 64 * 1024
# Weight (+ bias) of a streamed norm kept in SBUF for the whole kernel when their [128, H]
# broadcast copies take at most this many bytes per partition (bf16 weight up to H = 32768,
# fp32 up to 16384), so the chunks in flight (<= 128 KiB) still fit trn2's 224 KiB.
NORM_RESIDENT_PARAM_BYTES = 64 * 1024

# softmax: longest row done in one on-chip pass. A [128, 8192] fp32 exp tile is 32 KiB per
# partition; with the input and output tiles of two blocks in flight it fits 224 KiB.
SOFTMAX_MAX_COLS = 8192
# softmax: largest row tile the online form keeps resident in SBUF (per partition): 128 KiB,
# every chunk's exponentials in fp32 for rows of up to 32768 elements, beside the staging
# ring of its chunks (softmax.STAGING_BUFS x 4096 elements: 32 KiB bf16, 64 KiB fp32) and
# its output tiles, under trn2's 224 KiB. The kernel also checks the active generation's
# SBUF (softmax._resident_fits): on trn1 (192 KiB) fp32 rows past ~28600 elements stream.
# (The simulator's capacity check passes at the limits: fp32 and bf16 [300, 32768].)
SOFTMAX_RESIDENT_BYTES = 128 * 1024

# attention: q/k and v head dims D, Dv. Q·Kᵀ contracts over D on TensorE's partition dim
# (<= 128 per matmul): D <= 256 takes two accumulating matmuls. P·[V | 1] writes Dv + 1
# <= 257 fp32 columns, within one PSUM bank (512). 256 covers Gemma 2/3.
ATTENTION_MAX_HEAD_DIM = 256
# attention: the single-pass kernel keeps a [128, Sk] fp32 score row in 4 of the 8 PSUM
# banks (512 fp32 each: two rotating pieces of up to 1024 keys, or one tile under a user
# mask; attention_blocks.S_PIECE_KEYS); longer key sequences use the flash kernel.
ATTENTION_SINGLE_PASS_MAX_KEYS = 2048

# Norms for a few rows (kernels/norm_decode.py, token generation): the hidden-on-partitions
# kernel takes up to this many rows. Its engine passes cost ~N * H / 128 cycles against ~H
# for the row kernels (kernels/rms_norm.py, layer_norm.py).
NORM_DECODE_MAX_ROWS = 64
# Which kernel the ops pick (ops/norms.py), from the modeled crossovers (trn2, LNC=2, bf16,
# central values, 2026-12-01 at the per-engine fixed costs; decode / row kernel, us): the
# decode kernel is ahead for H >= 768 and level at 512 (LayerNorm [40, 512] 6.1 / 6.2,
# [40, 768] 6.3 / 7.4) and behind below for LayerNorm ([40, 384] 6.0 / 5.7, [40, 256]
# 5.9 / 5.1, [8, 128] 5.5 / 4.8); up to 40 rows for every such H, and up to 64 for
# H >= 768 ([64, 768] 7.1 / 7.4, [64, 4096] 15.5 / 22.0; RMSNorm [64, 8192] 15.6 / 32.5).
# RMSNorm alone would take the decode kernel lower too ([40, 384] 4.7 / 5.4, [40, 256]
# 4.7 / 4.9); one threshold serves both ops. Past 64 rows the crossovers (~72 rows at
# H = 1024, ~90 at 2048, at 220 cycles) are near enough that the row kernels keep them.
NORM_DECODE_MIN_HIDDEN = 512
NORM_DECODE_PICK_ROWS = 40
NORM_DECODE_WIDE_HIDDEN = 768
NORM_DECODE_WIDE_PICK_ROWS = 64
# ... when H is a multiple of 128 and a partition's share N * H / 128 is at most this many
# elements: the input, two fp32 scratch tiles and the output then take <= 112 KiB of trn2's
# 224 KiB SBUF partition (and the row totals [128, N] fp32 fit one PSUM bank).
NORM_DECODE_MAX_ELEMENTS = 8192
# Up to this many rows (in total, so that both LNC degrees take the same path and give the
# same bits) the RMSNorm decode kernel issues per-row instructions that take a row's
# statistics as (P, 1) operands: ScalarE accumulation, activation bias/scale, two-op VectorE
# instructions fuse the steps. At these sizes an instruction costs mostly its fixed
# overhead, so the shorter per-row chain wins while the row count keeps the engine queues
# short; above it, one instruction per step over all rows is faster (modeled trn2, fp16,
# H = 2048..8192, 2026-12-01 at the per-engine fixed costs: at 2 rows the per-row path is
# 0.22 us faster at LNC=2 and 0.3-0.5 us slower at LNC=1; at 3 rows 0.3-0.5 us slower at
# LNC=2). It was 3 while the fixed cost was one shared 220 cycles. LayerNorm no longer has
# such a path: its all-rows form, with the per-row statistics below, is 0.15-0.2 us faster
# at 1-2 rows at the central value (LNC=2, bf16/fp32, H = 512..16384; [1, 4096] 5.02
# (3.33-6.29) against 5.17 (3.54-6.12) us; 1 us faster at 2 rows at LNC=1) and ~0.15 us
# slower at the pessimistic end.
NORM_DECODE_ROW_LOOP_MAX_ROWS = 2
# LayerNorm's decode kernel gives a program of at most this many rows (at LNC=2: a decode
# step of 1 to 5 tokens) per-row instructions for its statistics and its last step
# (norm_decode._centre_rows; out = y * rstd + bias in one scalar_tensor_tensor per row):
# each row's sums are ready one fixed overhead sooner than after a VectorE pass over all rows
# and a reduce, which is most of a 2-row step (modeled trn2, LNC=2, fp16 LayerNorm [4, H]
# with weight and bias, us, 2026-12-01 at the per-engine fixed costs: H = 2048 5.53 -> 5.47,
# 8192 6.09 -> 5.80; nki-library's layernorm_tkg at [4, 4096], run at LNC=1 then (the
# side-by-side script launched it as a plain call until 2026-12-07): ours 5.5 (3.9-7.2), AWS's
# 5.7 (4.2-7.4)). A third row makes the per-row chain longer than the all-rows pass
# ([6, 2048] at LNC=2: 6.08 against 5.59 us; [6, 8192] level, 6.62 against 6.64). Since
# the cost model charges tensor_scalar_reduce its accumulator read-out (2026-12-02, its ISA
# cost text), the rows' sums come per row only where that is sooner than one pass and one
# reduce over the rows (norm_decode._row_sums_per_row: [4, 4096] 5.55 (3.76-7.36) -> 5.52
# (3.76-7.33) us, under AWS's 5.72 (4.22-7.35), at LNC=1, again; [4, 8192] stays per row, 5.84).
# Chosen by the program's rows,
# unlike ROW_LOOP above, because both forms do the same fp32 operations per element: c = x - m
# and its sum over the H / 128 elements of a partition on VectorE (tensor_scalar_reduce, or
# tensor_tensor then tensor_reduce), y * rstd rounded to fp32, + bias (on GpSimd in the
# all-rows form), rounded once to the output dtype. The simulator gives the same bits at
# both degrees (tests/kernels/test_lnc.py); on hardware this assumes VectorE's two
# reductions add a partition's elements in the same order, which no AWS document states.
NORM_DECODE_PER_ROW_MAX_ROWS = 2
# The grouped decode layout (kernels/norm_decode_grouped.py: each row on G partitions, one
# contiguous run each) serves N rows of H when the larger of its two parts (ceil(N / 2)
# rows: one per program at LNC=2, both in turn at LNC=1) has at least MIN_ROWS rows, its
# groups fill at least MIN_PARTITIONS partitions, and the hidden-on-partitions layout
# (norm_decode.py) would give a partition at least MIN_ELEMENTS elements of the part
# (ceil(N / 2) * H / 128). The bounds were set on 2026-12-07 for a first version of the
# layout (block-diagonal sums, removed the same day: not NaN-safe) and kept for the
# NaN-safe one, whose select before each sum costs ~0.4 us more on the statistics' chain:
# LayerNorm with weight and bias, RMSNorm with weight, fp16 / bf16 / fp32, N in {15, 16,
# 17, 20, 24, 31, 32, 33, 40, 48, 56, 57, 64} x H in {512, 768, 1024, 2048, 3072, 4096,
# 5120, 8192, 12288, 16384} (the 192 of them the rule takes), modeled against that layout
# on each target (MODELED, 2026-12-07):
#   * central value: all 192 faster on trn2 LNC=2 and trn3; on trn2 LNC=1 and trn1 190,
#     and 16-bit LayerNorm [15, 5120] 1-2 % slower (parts of 8 and 7 rows run in turn);
#   * pessimistic end: all faster at LNC=2 (by 9-38 %; RMSNorm fp16 [64, 1024] 38 % on
#     trn2); at LNC=1 all but trn1's 16-bit LayerNorm [15, 5120] (0.2 % slower);
#   * optimistic end: all faster at LNC=1; 17 of 192 slower on trn2 LNC=2 (and 17 on trn3), by
#     0.03-0.05 us (at most 1.5 %: RMSNorm at 512-1024 elements a partition, fp32
#     LayerNorm at [31-32, 12288] on trn2 and [15-16, 4096] on trn3), where the shorter
#     DMA runs no longer pay for the select.
# The layout forced on the shapes the rule leaves (N in 2..64, G <= 32, F >= 128: 888
# shapes) was slower at the central value on 717 of them on trn2 LNC=2; the regions faster
# at all three points on all four targets are mostly 16-bit RMSNorm at 56-57 rows with
# H >= 4096 and RMSNorm at 7-8 rows with H >= 12288 (not taken: a rule of its own for a
# few shapes).
# Each bound has the first version's losses behind it: at 2-4 rows a part the group
# matrices, built before x arrives, were later than x at the optimistic end (up to 10 %
# slower there); at 57 rows (29 a part, G = 4: 116 of 128 partitions) each partition holds
# more than in the other layout and LayerNorm at H >= 8192 was up to 3 % slower; at LNC=1
# the two parts run in turn, doubling the instructions, which at <= 192 elements (e.g.
# [16, 2048]) cost more than the other layout's passes (RMSNorm [16, 512] on trn1 22 %
# slower).
NORM_DECODE_GROUPED_MIN_ROWS = 8
NORM_DECODE_GROUPED_MIN_PARTITIONS = 120
NORM_DECODE_GROUPED_MIN_ELEMENTS = 256

# Norm backward kernels (kernels/rms_norm_backward.py, kernels/layer_norm_backward.py):
# largest normalised size H. One pass over rows kept in SBUF, as the forward's one-pass
# rows: a block's dy, x and their 16-bit/fp32 products of two blocks in flight stay
# under trn2's 224 KiB per partition; the weight-gradient accumulator [128, H / 128] fp32
# fits one PSUM bank (512 fp32) up to H = 65536. Longer rows take the recompute backward
# (PyTorch ops), which the op layer chooses.
NORM_BACKWARD_MAX_HIDDEN = 8192
# ... and a row of at most this many bytes (bf16/fp16 up to 8192, fp32 up to 4096): a
# block's inputs, its 16-bit/fp32 scratch (g, g * x, the centred terms, t) and the next
# block in flight take ~9 row tiles per partition, which at 16 KiB each fits trn2's
# 224 KiB (fp32 at 8192, 32 KiB each, does not).
NORM_BACKWARD_MAX_ROW_BYTES = 16 * 1024
