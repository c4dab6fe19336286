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
    the rows (tiling.program_row_blocks), blocks pipelined up to PREFETCH_AHEAD ahead
    (_prefetch_ahead: fewer where SBUF does not hold them).
Engines, per block:
    VectorE  p = dy * y over the whole block (16-bit: perf mode, rounded to the input dtype)
    VectorE  c = sum(p) per row (tensor_reduce over the block, fp32)
    then each row one of three ways (_row_split: a list schedule of the cost model's
    estimates for the active generation, so that no engine pays every row's fixed cost):
      ScalarE (copy with a per-partition scale) or GpSimd (tensor_scalar) m = y * (-c) in
              fp32, and GpSimd dx = p + m over all such rows at once (one rounding)
      VectorE dx = y * (-c) + p in one scalar_tensor_tensor (a VectorE-only instruction;
              the same fp32 product and sum, one rounding)
Expected error:
    p rounded to the input dtype (bf16 <= 2**-9 relative), c in fp32, dx rounded once
    more. fp32: ~1e-6 relative.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .limits import SOFTMAX_MAX_COLS as BACKWARD_MAX_COLS
from .tiling import (block_rows, fitting_ahead, itemsize, load_blocks, pipelined, program_row_blocks,
                     rows_per_partition)

# Rows packed per partition until a transfer holds 2048 elements (4 KiB bf16), as the forward.
TARGET_COLS = 2048
# Blocks loaded this many ahead of their compute (tiling.pipelined), as the norms; fewer
# where their tiles would not fit the active generation's SBUF (_prefetch_ahead).
PREFETCH_AHEAD = 2


def _prefetch_ahead(per, cols, itemsize):
    """Blocks loaded ahead: the most of PREFETCH_AHEAD, 1 and 0 whose tiles fit the active
    generation's SBUF. Live per partition: at most dy and y of ahead + 1 blocks, p and dx
    of one and m in fp32. The simulator's liveness sweep stays within that (bf16 rows of
    8192: 2 (ahead + 1) + 3 blocks against the bound's 2 (ahead + 1) + 4; fp32 one block
    less); fp32 rows of 8192 (32 KiB per partition) load one block ahead on trn2 and trn3
    and none on trn1, where two ahead needed 256 KiB (tests/kernels/
    test_widest_rows_fit_sbuf.py)."""
    block = per * cols * itemsize
    return fitting_ahead(PREFETCH_AHEAD, lambda ahead: (2 * (ahead + 1) + 2) * block + per * cols * 4)


def _row_split(per, cols, sixteen):
    """(rows whose m is made on ScalarE, on GpSimd, rows done on VectorE) of a [P, per, cols]
    block's last step: each row in turn goes the way that leaves the busiest engine least
    busy, starting from VectorE's p and c. Cost-model rules, with the active generation's
    figures (engine_costs.py): tensor_tensor 2 passes (16-bit on VectorE: its perf mode,
    engine_costs.vector_two_input_rate: 2x on trn2 and trn3, none on trn1),
    the row sums 1 (a tensor_reduce into fp32 has no N/2: [S] tensor_reduce),
    scalar_tensor_tensor 2 ("approximately the same latency as a regular tensor_tensor",
    nki.isa docs), tensor_scalar and activation 1."""
    c = active_engine_costs()
    load = {"vector": c.instruction_ns("vector", per * cols, c.vector_two_input_rate(sixteen))
            + c.instruction_ns("vector", per * cols),
            "scalar": 0.0, "gpsimd": 0.0}
    counts = {"scalar": 0, "gpsimd": 0, "vector": 0}
    for _ in range(per):
        options = []
        for way in ("scalar", "gpsimd", "vector"):
            trial = dict(load)
            if way == "vector":
                trial["vector"] += c.instruction_ns("vector", 2 * cols)
            else:
                trial[way] += c.instruction_ns(way, cols)
                # the row's share of GpSimd's p + m (one fixed cost per block)
                trial["gpsimd"] += cols / c.gpsimd_two_input_rate() / c.gpsimd_ghz
                if counts["scalar"] + counts["gpsimd"] == 0:
                    trial["gpsimd"] += c.gpsimd_instr_cycles / c.gpsimd_ghz
            options.append((max(trial.values()), sum(trial.values()), way, trial))
        _, _, way, load = min(options)
        counts[way] += 1
    return counts["scalar"], counts["gpsimd"], counts["vector"]


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
    per_max = rows_per_partition(cols, TARGET_COLS, BACKWARD_MAX_COLS)
    blocks = program_row_blocks(n_rows, per_max)

    def compute(block, tiles):
        start, parts, per = block
        dy_tile, y_tile = tiles
        shape = (parts, per, cols)
        p = nl.ndarray(shape, dtype=y.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=p, data1=dy_tile, data2=y_tile, op=nl.multiply)          # VectorE
        c = nl.ndarray((parts, per), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=c, op=nl.add, data=p, axis=2, negate=True)               # -c, VectorE
        dx_tile = nl.ndarray(shape, dtype=y.dtype, buffer=nl.sbuf)
        on_scalar, on_gpsimd, _ = _row_split(per, cols, itemsize(y.dtype) == 2)
        with_m = on_scalar + on_gpsimd      # rows [0, with_m) through m, the rest on VectorE
        if with_m:
            m = nl.ndarray((parts, with_m, cols), dtype=nl.float32, buffer=nl.sbuf)
            for j in range(with_m):
                if j < on_scalar:
                    nisa.activation(dst=m[:, j, :], op=nl.copy, data=y_tile[:, j, :],
                                    scale=c[:, j:j + 1])                                 # ScalarE
                else:
                    nisa.tensor_scalar(dst=m[:, j, :], data=y_tile[:, j, :], op0=nl.multiply,
                                       operand0=c[:, j:j + 1], engine=nisa.engine.gpsimd)
            nisa.tensor_tensor(dst=dx_tile[:, 0:with_m, :], data1=p[:, 0:with_m, :], data2=m,
                               op=nl.add, engine=nisa.engine.gpsimd)
        for j in range(with_m, per):
            nisa.scalar_tensor_tensor(dst=dx_tile[:, j, :], data=y_tile[:, j, :], op0=nl.multiply,
                                      operand0=c[:, j:j + 1], op1=nl.add, operand1=p[:, j, :])  # VectorE
        return dx_tile

    def store(block, dx_tile):
        start, parts, per = block
        nisa.dma_copy(dst=block_rows(dx, start, parts, per), src=dx_tile)

    pipelined(blocks, lambda block: load_blocks(block, dy, y), compute, store,
              _prefetch_ahead(per_max, cols, itemsize(y.dtype)))
    return dx
