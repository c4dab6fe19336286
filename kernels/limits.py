"""The shapes the NKI kernels accept: one place for the kernels and the op layer.

Imports nothing, so the op layer (``nki_kernels._kernel_sources.limits()``) can check
arguments against these numbers on any host, with or without AWS's toolchain. Sizes per
partition below are for trn2 (224 KiB of SBUF per partition, 8 PSUM banks of 2 KiB).
"""

# Norms (layer_norm, rms_norm, fused_add_rms_norm): largest normalised size H. A row tile
# [128, 8192] fp32 is 32 KiB per partition; with the weight, input, output and the next
# block in flight this stays under trn2's 224 KiB per partition.
NORM_MAX_HIDDEN = 8192

# softmax: longest row done in one on-chip pass. A [128, 8192] fp32 exp tile is 32 KiB per
# partition; with the input and output tiles of two blocks in flight it fits 224 KiB.
SOFTMAX_MAX_COLS = 8192
# softmax: largest row tile the online form keeps resident in SBUF (per partition): 96 KiB,
# twice that with the next row tile in flight, plus ~24 KiB of chunk scratch, under 224 KiB.
SOFTMAX_RESIDENT_BYTES = 96 * 1024

# attention: q/k (and v) head dim. Q·Kᵀ contracts over D on the partition dim of TensorE.
ATTENTION_MAX_HEAD_DIM = 128
# attention: the single-pass kernel keeps a [128, Sk] fp32 score row in 4 of the 8 PSUM
# banks (512 fp32 each); longer key sequences use the flash kernel.
ATTENTION_SINGLE_PASS_MAX_KEYS = 2048

# Norms for a few rows (kernels/norm_decode.py, token generation): rows up to this many use
# the hidden-on-partitions kernel. Its engine passes cost ~N * H / 128 cycles against ~H for
# the row kernels, so the two cross near N = 48 (modeled on trn2 for H = 1024..8192); 40
# keeps the decode kernel where it is clearly ahead...
NORM_DECODE_MAX_ROWS = 40
# ... when H is a multiple of 128 and a partition's share N * H / 128 is at most this many
# elements: the input, two fp32 scratch tiles and the output then take <= 112 KiB of trn2's
# 224 KiB SBUF partition (and the row totals [128, N] fp32 fit one PSUM bank).
NORM_DECODE_MAX_ELEMENTS = 8192
