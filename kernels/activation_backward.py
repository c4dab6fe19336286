"""Backward of the activations: gelu (erf form) and silu elementwise (kernels/elementwise.py),
and the gated silu_and_mul / gelu_and_mul (kernels/activation_and_mul.py).

    elementwise: y = f(x)          ->  dx = dy * f'(x)
    gated:       y = f(g) * u      ->  dg = dy * u * f'(g),  du = dy * f(g)
                 (x = [g | u] = [N, 2d], dy = [N, d], dx = [dg | du] = [N, 2d])

f' runs on ScalarE (nl.gelu_dx, nl.silu_dx, NKI activation functions). gelu's tanh
approximation has no ScalarE derivative function: the op layer runs the recompute
backward for it.

Dimensions / layout:
    elementwise: as the forward: the tensor as flat memory, the first 128 * (n // 128)
        elements viewed as [128, n // 128] (each program its share of the columns, in
        chunks of COLS), the n % 128 leftover as one [tail, 1] tile on the last program.
    gated: as the forward: rows on partitions, blocks of 128 * J rows (J > 1 only when a
        whole row fits one chunk), wider rows in column chunks of COL_CHUNK outputs; each
        program takes its WORK_PARTS part(s) of the rows.
Engines:
    ScalarE  f'(x) (and for the gated ops f(g)) in fp32
    VectorE / GpSimd  the products with dy (and u), fp32 inside, one rounding per output;
             split by columns (EngineCosts.vector_gpsimd_share)
No reductions: every output element is computed by one program, the same at LNC=1 and
LNC=2.
Expected error:
    elementwise: f' in fp32, one rounding. gated: dg = (dy * u) * f'(g) with dy * u kept in
    fp32, one rounding; du one rounding (bf16: <= 2**-8 relative; fp32 ~1e-6).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .tiling import (PARTITIONS, block_rows, fitting_ahead, itemsize, load_block, pipelined, program_row_blocks,
                     program_share, rows_per_partition, split_count)

# Elementwise: 2048 elements per partition per transfer (4 KiB bf16), as the forward.
COLS = 2048
# Gated: row packing and column chunks as the forward (kernels/activation_and_mul.py).
TARGET_COLS = 2048
COL_CHUNK = 4096
# Gated: chunks loaded this many ahead of their compute (tiling.pipelined), as the norms;
# fewer where their tiles would not fit the active generation's SBUF (_prefetch_ahead).
PREFETCH_AHEAD = 2
# (f, f') per op name on ScalarE
FUNCTIONS = {"gelu": (nl.gelu, nl.gelu_dx), "silu": (nl.silu, nl.silu_dx)}
# Share of the products given to VectorE: EngineCosts.vector_gpsimd_share of the active
# generation. A two-input pass with an fp32 operand costs VectorE 2.08 ns per element
# (0.96 GHz) and GpSimd 1.67 ns (1.2 GHz) on trn2: 0.44 balances them (0.93 ns per
# product), under the HBM time per element (elementwise 2.09 ns: dy, x read, dx written in
# bf16; gated 3.48 ns per output element: dy, x = [g | u] read, dx = [dg | du] written).
# (A constant 0.45 until 2026-12-02.)


def _split_product(dst, a, b):
    """dst = a * b over [P, ..., w] views, columns split between VectorE and GpSimd."""
    width = dst.shape[-1]
    cut = split_count(width, active_engine_costs().vector_gpsimd_share())
    for lo, hi, engine in ((0, cut, nisa.engine.vector), (cut, width, nisa.engine.gpsimd)):
        if hi > lo:
            nisa.tensor_tensor(dst=dst[..., lo:hi], data1=a[..., lo:hi], data2=b[..., lo:hi], op=nl.multiply,
                               engine=engine)


def _elementwise_tile(dx_hbm, dy_hbm, x_hbm, rows, cols, f_dx):
    """dx = dy * f'(x) for one [rows, cols] HBM region (rows <= 128)."""
    x_tile = nl.ndarray((rows, cols), dtype=x_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=x_hbm)
    dy_tile = nl.ndarray((rows, cols), dtype=dy_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=dy_tile, src=dy_hbm)
    slope = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=slope, op=f_dx, data=x_tile)                  # ScalarE, fp32
    dx_tile = nl.ndarray((rows, cols), dtype=dx_hbm.dtype, buffer=nl.sbuf)
    _split_product(dx_tile, slope, dy_tile)
    nisa.dma_copy(dst=dx_hbm, src=dx_tile)


@nki.jit
def elementwise_backward_kernel(dy, x, op="gelu"):
    """Return ``dy * op'(x)``.

    Args:
        dy: HBM tensor, the shape and dtype of ``x``.
        x: HBM tensor, any shape, float32/bfloat16/float16.
        op: "gelu" (erf form) or "silu".
    Returns:
        HBM tensor (shared_hbm), shape and dtype of ``x``.
    """
    assert op in FUNCTIONS, f"op={op!r}: expected one of {tuple(FUNCTIONS)}"
    f_dx = FUNCTIONS[op][1]
    dx = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = 1
    for size in x.shape:
        n *= size
    flat = [t.reshape((n,)) for t in (dx, dy, x)]
    body_cols = n // PARTITIONS
    if body_cols > 0:
        body = [t[0:PARTITIONS * body_cols].reshape((PARTITIONS, body_cols)) for t in flat]
        col_lo, col_hi = program_share(body_cols)
        for start in range(col_lo, col_hi, COLS):
            cols = min(COLS, col_hi - start)
            _elementwise_tile(*[t[:, start:start + cols] for t in body], PARTITIONS, cols, f_dx)
    tail = n - PARTITIONS * body_cols
    if tail > 0 and nl.program_id(0) == nl.num_programs() - 1:   # the last program takes the tail
        start = PARTITIONS * body_cols
        _elementwise_tile(*[t[start:n].reshape((tail, 1)) for t in flat], tail, 1, f_dx)
    return dx


def _gated_tile(dg_tile, du_tile, dy_tile, gate, up, f, f_dx):
    """dg = dy * up * f'(gate), du = dy * f(gate) over [P, J, w] views."""
    shape = dy_tile.shape
    value = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=value, op=f, data=gate)                       # ScalarE, fp32
    slope = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=slope, op=f_dx, data=gate)                    # ScalarE, fp32
    _split_product(du_tile, value, dy_tile)
    dy_up = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    _split_product(dy_up, dy_tile, up)
    _split_product(dg_tile, dy_up, slope)


def _prefetch_ahead(per, width, itemsize):
    """Chunks loaded ahead in the gated backward: the most of PREFETCH_AHEAD, 1 and 0 whose
    tiles fit the active generation's SBUF. Live per partition: at most dy, g and u of
    ahead + 2 chunks (``per`` rows of ``width`` columns each) and the three fp32
    temporaries of one. The simulator's liveness sweep meets this bound at fp32 rows of
    d = 4096 (15 chunks' worth at two ahead: 240 KiB, over trn2's 224, where two chunks
    ahead made silu_and_mul's backward fail until 2026-12-05; tests/kernels/
    test_widest_rows_fit_sbuf.py)."""
    chunk = per * width * itemsize
    return fitting_ahead(PREFETCH_AHEAD, lambda ahead: 3 * (ahead + 2) * chunk + 3 * per * width * 4)


@nki.jit
def act_and_mul_backward_kernel(dy, x, act="silu"):
    """Return ``dx = [dy * u * act'(g) | dy * act(g)]`` for ``x = [g | u]``.

    Args:
        dy: HBM [N, d], dtype of ``x``.
        x: HBM [N, 2d], float32/bfloat16/float16.
        act: "silu" or "gelu" (erf form).
    Returns:
        HBM [N, 2d] (shared_hbm), dtype of ``x``.
    """
    assert act in FUNCTIONS, f"act={act!r}: expected one of {tuple(FUNCTIONS)}"
    f, f_dx = FUNCTIONS[act]
    n_rows, in_cols = x.shape
    assert in_cols % 2 == 0, f"x: last dim {in_cols} is odd; it must be an even size 2d"
    d = in_cols // 2
    assert tuple(dy.shape) == (n_rows, d), \
        f"dy shape {tuple(dy.shape)} must be ({n_rows}, {d}), half of x's {tuple(x.shape)}"
    dx = nl.ndarray((n_rows, in_cols), dtype=x.dtype, buffer=nl.shared_hbm)
    per_max = 1 if d > COL_CHUNK else rows_per_partition(d, TARGET_COLS, COL_CHUNK)
    # (first row, partitions, rows per partition, first output column, width): whole rows
    # when they fit one chunk, else column chunks of one row per partition
    items = []
    for start, parts, per in program_row_blocks(n_rows, per_max):
        for c0 in range(0, d, COL_CHUNK):
            items.append((start, parts, per, c0, min(COL_CHUNK, d - c0)))

    def load(item):
        start, parts, per, c0, w = item
        if w == d:         # whole rows: one DMA each for dy and x
            x_tile = load_block(x, start, parts, per)
            return load_block(dy, start, parts, per), x_tile[:, :, 0:d], x_tile[:, :, d:in_cols]
        tiles = []
        for src in (dy[start:start + parts, c0:c0 + w], x[start:start + parts, c0:c0 + w],
                    x[start:start + parts, d + c0:d + c0 + w]):
            tile = nl.ndarray((parts, 1, w), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=src.expand_dim(1))
            tiles.append(tile)
        return tuple(tiles)

    def compute(item, tiles):
        start, parts, per, c0, w = item
        dx_tile = nl.ndarray((parts, per, 2 * w), dtype=x.dtype, buffer=nl.sbuf)
        _gated_tile(dx_tile[:, :, 0:w], dx_tile[:, :, w:2 * w], *tiles, f, f_dx)
        return dx_tile

    def store(item, dx_tile):
        start, parts, per, c0, w = item
        if w == d:
            nisa.dma_copy(dst=block_rows(dx, start, parts, per), src=dx_tile)
            return
        nisa.dma_copy(dst=dx[start:start + parts, c0:c0 + w].expand_dim(1), src=dx_tile[:, :, 0:w])
        nisa.dma_copy(dst=dx[start:start + parts, d + c0:d + c0 + w].expand_dim(1), src=dx_tile[:, :, w:2 * w])

    pipelined(items, load, compute, store, _prefetch_ahead(per_max, min(d, COL_CHUNK), itemsize(x.dtype)))
    return dx
