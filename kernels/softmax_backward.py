"""Backward of softmax over the last dimension of a [N, C] tensor, from its output.

    forward:  y = softmax(x)                          (per row)
    backward: c = sum(dy * y)                         (per row)
              dx = y * (dy - c) = dy * y - c * y

Dimensions:
    N: rows (any N >= 1).
    C: row length, 1 <= C <= BACKWARD_MAX_COLS (8192, the forward's one-pass rows; the op
       layer runs the recompute backward for longer rows).
Layout:
    As the forward's one-pass form (kernels/softmax.py): rows on partitions, packed J to a
    partition in blocks of 128 * J rows (one DMA of J * C elements per partition per
    tensor), the last < 128 rows with J = 1; each program takes its WORK_PARTS part(s) of
    the rows (tiling.program_row_blocks), blocks pipelined PREFETCH_AHEAD ahead.
Engines, per block:
    VectorE  p = dy * y over the whole block (16-bit: perf mode, rounded to the input dtype)
    VectorE  c = sum(p) per row (tensor_reduce over the block, fp32)
    ScalarE  m = y * (-c) per row (copy with a per-partition scale, fp32)
    GpSimd   dx = p + m over the block (fp32 inside, one rounding)
Expected error:
    p rounded to the input dtype (bf16 <= 2**-9 relative), c in fp32, dx rounded once
    more. fp32: ~1e-6 relative.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .limits import SOFTMAX_MAX_COLS as BACKWARD_MAX_COLS
from .tiling import block_rows, load_block, pipelined, program_row_blocks, rows_per_partition

# Rows packed per partition until a transfer holds 2048 elements (4 KiB bf16), as the forward.
TARGET_COLS = 2048
# Blocks loaded this many ahead of their compute (tiling.pipelined), as the norms.
PREFETCH_AHEAD = 2


@nki.jit
def softmax_backward_kernel(dy, y):
    """Return ``y * (dy - sum(dy * y, -1))``, the gradient of softmax's input.

    Args:
        dy: HBM [N, C], the output gradient, dtype of ``y``.
        y: HBM [N, C], the forward's output, float32/bfloat16/float16, C <= BACKWARD_MAX_COLS.
    Returns:
        HBM [N, C] (shared_hbm), dtype of ``y``.
    """
    n_rows, cols = y.shape
    assert cols <= BACKWARD_MAX_COLS, f"C={cols} exceeds BACKWARD_MAX_COLS={BACKWARD_MAX_COLS}"
    dx = nl.ndarray((n_rows, cols), dtype=y.dtype, buffer=nl.shared_hbm)
    blocks = program_row_blocks(n_rows, rows_per_partition(cols, TARGET_COLS, BACKWARD_MAX_COLS))

    def load(block):
        start, parts, per = block
        return load_block(dy, start, parts, per), load_block(y, start, parts, per)

    def compute(block, tiles):
        start, parts, per = block
        dy_tile, y_tile = tiles
        shape = (parts, per, cols)
        p = nl.ndarray(shape, dtype=y.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=p, data1=dy_tile, data2=y_tile, op=nl.multiply)          # VectorE
        c = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=c, op=nl.add, data=p, axis=2, negate=True)               # -c, VectorE
        m = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        for j in range(per):
            nisa.activation(dst=m[:, j, :], op=nl.copy, data=y_tile[:, j, :], scale=c[:, j:j + 1])  # ScalarE
        dx_tile = nl.ndarray(shape, dtype=y.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dx_tile, data1=p, data2=m, op=nl.add, engine=nisa.engine.gpsimd)
        return dx_tile

    def store(block, dx_tile):
        start, parts, per = block
        nisa.dma_copy(dst=block_rows(dx, start, parts, per), src=dx_tile)

    pipelined(blocks, load, compute, store, PREFETCH_AHEAD)
    return dx
