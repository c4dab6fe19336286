"""Gated activations ``act(x[..., :d]) * x[..., d:]`` (SwiGLU / GeGLU), x viewed as [N, 2d].

The kernels-community ``activation`` contract: ``silu_and_mul``, ``gelu_and_mul`` (erf) and
``gelu_tanh_and_mul``.

Dimensions:
    N: rows (any N >= 1).
    d: output width (any d >= 1; the input row is 2d).
Layout:
    Rows on partitions. When a whole input row fits one chunk (d <= COL_CHUNK), rows are
    packed J to a partition in blocks of 128 * J consecutive rows, so one contiguous DMA
    moves J*2d elements per partition (J grown until the output holds TARGET_COLS elements
    per partition).
    Wider rows are cut into column chunks of COL_CHUNK outputs; each chunk loads its gate and
    up slices with one DMA each (>= 4 KiB per partition in bf16). The last < 128 rows form a
    block with J = 1.
Engines:
    ScalarE  a = act(gate) in fp32 (one pass over the gate half)
    VectorE / GpSimd  out = a * up, fp32 inside, rounded once to the output dtype; the
             product is split between the two engines (EngineCosts.vector_gpsimd_share),
             by rows when a partition holds J > 1 rows, else by columns
    Fresh SBUF tiles per block/chunk, so the next load overlaps the current compute.
Expected error:
    one rounding to the output dtype on top of fp32 math (bf16: <= 2**-8 relative; fp32:
    ~1e-6 relative).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .tiling import block_rows, load_block, program_row_blocks, rows_per_partition, split_count

# Row packing target: 2048 output elements per partition per DMA (4 KiB bf16 / 8 KiB fp32
# stored; twice that loaded).
TARGET_COLS = 2048
# Outputs per column chunk: gate+up 2 x 4096 elements in, 4096 fp32 scratch and 4096 out =
# 48 KiB per partition in fp32, so two chunks in flight fit trn2's 224 KiB comfortably.
COL_CHUNK = 4096
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
# Share of the product a * up given to VectorE: EngineCosts.vector_gpsimd_share of the
# active generation. Per output element on trn2 (cost-model rules): two input passes cost
# VectorE 2.08 ns (0.96 GHz), GpSimd 1.67 ns (1.2 GHz); share f: VectorE 2.08f = GpSimd
# 1.67(1 - f) at f = 0.44 (0.93 ns), under the 2.09 ns of bf16 HBM traffic per output
# element (2 inputs read, 1 output written). (A constant 0.45 until 2026-12-02.)


def _rows_per_partition(in_cols):
    """Rows per partition of a block: rows are packed only if a whole row fits one chunk."""
    if in_cols > 2 * COL_CHUNK:
        return 1
    return rows_per_partition(in_cols, 2 * TARGET_COLS, 2 * COL_CHUNK)


def _gate_mul(out_tile, gate, up, func):
    """out_tile = func(gate) * up; gate/up/out are [P, J, w] views."""
    parts, per, width = out_tile.shape
    act = nl.ndarray((parts, per, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=act, op=func, data=gate)                      # ScalarE, fp32
    share = active_engine_costs().vector_gpsimd_share()
    if per > 1:
        cut = split_count(per, share)
        pieces = [(0, cut, 0, width), (cut, per, 0, width)]
    else:
        cut = split_count(width, share)
        pieces = [(0, 1, 0, cut), (0, 1, cut, width)]
    for (j0, j1, c0, c1), engine in zip(pieces, (nisa.engine.vector, nisa.engine.gpsimd)):
        if j1 > j0 and c1 > c0:
            nisa.tensor_tensor(dst=out_tile[:, j0:j1, c0:c1], data1=act[:, j0:j1, c0:c1],
                               data2=up[:, j0:j1, c0:c1], op=nl.multiply, engine=engine)


@nki.jit
def act_and_mul_kernel(x, act="silu"):
    """Return ``act(x[:, :d]) * x[:, d:]`` for x = [N, 2d].

    Args:
        x: HBM [N, 2d], float32/bfloat16/float16.
        act: "silu", "gelu" (erf) or "gelu_tanh".
    Returns:
        HBM [N, d] (shared_hbm), dtype of ``x``.
    """
    assert act in ACTIVATIONS, f"act={act!r}: expected one of {ACTIVATIONS}"
    func = {"silu": nl.silu, "gelu": nl.gelu, "gelu_tanh": nl.gelu_apprx_tanh}[act]
    n_rows, in_cols = x.shape
    assert in_cols % 2 == 0, f"x: last dim {in_cols} is odd; it must be an even size 2d"
    d = in_cols // 2
    out = nl.ndarray((n_rows, d), dtype=x.dtype, buffer=nl.shared_hbm)

    for start, parts, per in program_row_blocks(n_rows, _rows_per_partition(in_cols)):
        if d <= COL_CHUNK:
            # whole rows: one DMA of per * 2d elements per partition
            x_tile = load_block(x, start, parts, per)
            out_tile = nl.ndarray((parts, per, d), dtype=x.dtype, buffer=nl.sbuf)
            _gate_mul(out_tile, x_tile[:, :, 0:d], x_tile[:, :, d:in_cols], func)
            nisa.dma_copy(dst=block_rows(out, start, parts, per), src=out_tile)
            continue
        # wide rows (per == 1): column chunks, gate and up slices loaded separately
        for c0 in range(0, d, COL_CHUNK):
            width = min(COL_CHUNK, d - c0)
            gate = nl.ndarray((parts, 1, width), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=gate, src=x[start:start + parts, c0:c0 + width].expand_dim(1))
            up = nl.ndarray((parts, 1, width), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=up, src=x[start:start + parts, d + c0:d + c0 + width].expand_dim(1))
            out_tile = nl.ndarray((parts, 1, width), dtype=x.dtype, buffer=nl.sbuf)
            _gate_mul(out_tile, gate, up, func)
            nisa.dma_copy(dst=out[start:start + parts, c0:c0 + width].expand_dim(1), src=out_tile)
    return out
