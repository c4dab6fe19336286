"""Rotary position embedding, transformers' Llama convention (rotate-half), for q and k.

    out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])

Backward (``transpose=True``): rotate_half is the map R(x) = [-x2, x1], whose transpose
is R^T(g) = [g2, -g1], so dx = dout * cos + R^T(dout * sin) = dout * cos +
[dout2 * sin2, -dout1 * sin1]: the same kernel with the signed sin (sin[D/2:], -sin[:D/2])
in place of (-sin[:D/2], sin[D/2:]). The halves are swapped, not only negated: sin's two
halves need not be equal (transformers' cos/sin repeat the frequencies, but the op takes
any). cos and sin take no gradient here; the op layer recomputes when they need one.

Dimensions:
    B: batch; Hq, Hk: query / key heads (may differ: grouped-query attention);
    S: positions (any S >= 1); D: head size (even).
    cos, sin: [Bc, S, D] with Bc = B, or Bc = 1 (shared by the batch).
Layout:
    Positions on partitions, heads and head dims on the free axis: for each (b, 128-position
    tile) the cos/sin rows [P, D] are loaded once and used for every q and k head. A head
    group is the HBM view x[b, h0:h0+G, s0:s0+P, :] permuted to [P, G, D] (one DMA of G*D
    elements per partition; G*D <= HEAD_COLS, HEAD_COLS_WIDE for D > 512). cos/sin are
    broadcast over the G heads by a stride-0 view, never copied. When q and k have one head
    each, a unit is a block of position tiles instead (as many as one PSUM bank holds as
    fp32 cos / sin: 4 at D = 128), whose tiles take the heads' place on the G axis, with
    cos / sin per tile: one transfer per block, where one head's 128 positions (32 KiB in
    bf16 at D = 128) would pay the DMA's per-transfer cost each (modeled trn2 LNC=2, q and
    k [4, 1, 512, 128] bf16: 42.1 -> 12.1 us; nki-library's rope_hf 22.6).
Engines, per head group (started one group ahead: the load and GpSimd's first products,
then the previous group's paths and store). Heads of at most a PSUM bank (D <= 512):
    ScalarE  cos and the signed sin copied to fp32 PSUM tables once per work unit
    heads [0, cut) (_vector_heads: the cut that evens out the two engines' estimated time):
      VectorE  b = swap_halves(x) * (-sin_lo | sin_hi) into SBUF for all its heads (two
               half-width ops), then per PSUM bank of heads a = x * cos into PSUM and
               out = a + b: each with one input in PSUM, one pass where two SBUF inputs
               take two
    the other heads:
      GpSimd   b (two half-width ops), a = x * cos, out = a + b (fp32 SBUF; GpSimd cannot
               read PSUM)
Wider heads (D > 512): GpSimd makes b for every head (the VectorE heads' first); VectorE's
heads a = x * cos in SBUF and out = a + b, two SBUF inputs each (_vector_share).
    The signed sin (-sin[:D/2], sin[D/2:]) is built once per work unit.
    Intermediates a and b are fp32 for every input dtype, and the sum is rounded once to
    the output dtype: the reference's rounding (fp32 math, one rounding). 16-bit
    intermediates would round three times (x*cos, the sin product, the sum), off by one
    bf16 ulp on some elements, and fp16 products overflow where the result does not.
Expected error:
    one rounding of the fp32 result to the output dtype (bf16: <= 2**-8 relative; fp16:
    <= 2**-11; fp32: ~1e-7 relative).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs
from .tiling import PARTITIONS, program_share

# Elements per partition of one head group: 2048 = 16 heads x 128 (4 KiB bf16, 8 KiB fp32
# per transfer: at the 4 KiB per partition where the DMA overview's curve saturates, 96.6 %).
# Groups are started one ahead (``_rope``: the next group's load and GpSimd's first products
# are issued before this group's paths), so three groups' tiles can be live; input, two fp32
# scratch tiles and the output of a group are 24 KiB per partition in bf16, 32 KiB in fp32. Smaller groups pipeline
# finer: 32-head groups (4096 columns) modeled 134 us on the Llama-7B workload at their best
# share (0.65), 16-head groups 121 us (trn2, LNC=2; before the PSUM tables).
HEAD_COLS = 2048
# Heads wider than a PSUM bank take the SBUF path (below) in groups of up to 4096 columns:
# at 2048 a group holds 2 heads of 768 and the VectorE share rounds to one of them.
HEAD_COLS_WIDE = 4096
# fp32 per PSUM bank (512): heads of at most this many columns take the PSUM tables, and
# the products a = x * cos of the VectorE heads go to PSUM one bank at a time.
PSUM_BANK_FP32 = nl.tile_size.psum_bank_fmax
# The VectorE path with PSUM tables (since session 58): "If one input tile is in PSUM and
# the other is in SBUF, N Vector Engine cycles" (nki.isa.tensor_tensor, NKI 0.7 docs; the
# cost model's rule), against 2N for two SBUF inputs. With cos and the signed sin as fp32
# PSUM tables, VectorE makes b, a and a + b at one pass each: per element on trn2 3 x 1.04
# = 3.13 ns for all three, where before VectorE's a (2.08) and a + b (1.04) left b to
# GpSimd (1.67). GpSimd's path is three two-input passes (5.0 ns). The cut (whole heads per
# group) evens out the two engines' estimated times, fixed costs per instruction included
# (_group_path_ns): 10 of 16 heads and 5 of 8 on trn2. Modeled (trn2 LNC=2, us), Llama-7B
# [1, 32/8, 2048, 128] bf16 121.2 (106.7-179.5) -> 102.7 (89.8-167.5), forward and
# backward; 120 runs (12 shapes of head size 32-768, bf16 / fp16 / fp32, forward and
# backward; trn2 and trn3 at LNC=2 and 1, trn1): 110 faster (geomean trn2 LNC=2 -10.5 %,
# trn3 -16.3 %, trn1 -16.5 %), the 10 with D = 768 (no tables) unchanged; outputs
# identical bit for bit (the same fp32 products; the tables are exact copies). With b made
# per bank as well (four VectorE instructions per bank): 103.9 us, and the error bar's
# pessimistic end, at 300 cycles per instruction, 196.8. The cut was 9 of 16 until session
# 59, when the kernels began to plan with the model's VectorE overlap on trn2 and trn3 (60
# of 100 fixed cycles hidden behind an independent next instruction,
# EngineCosts.vector_stream_cycles): 102.7 -> 96.8 us (80.6-174.9; the bar's pessimistic
# end has no overlap).
# Wider heads (D > 512): ``_vector_share``, from the active generation's engine figures
# (kernels/engine_costs.py). On trn2, per element (every pass has an fp32 operand, so no
# 16-bit performance mode): GpSimd makes b = rotate_half(x) * sin for every head, 2 inputs
# at 1.2 GHz = 1.67 ns; VectorE a = x * cos (2 SBUF inputs at 0.96 GHz, 2.08 ns) and a + b
# (2.08 ns): VectorE 4.17 f = GpSimd 1.67 + 3.33 (1 - f) -> f = 0.67. Before the tables
# every head size took this form with a in PSUM (a + b 1.04 ns; f = 0.80: 12 of 16 heads
# rounded down, 121.2 us on the Llama-7B workload; a constant 0.56 until 2026-12-02, 144.7).
# Above fp32's 2.78 ns of HBM traffic per element nothing is lost; 16-bit data (1.39 ns) is
# engine-bound.


def _vector_share(dim, group):
    """Fraction of a group's heads for the VectorE path of wide heads (no PSUM tables) that
    evens out VectorE and GpSimd (per head of ``dim`` columns, one instruction per pass for
    the group's ``group`` heads; see above)."""
    costs = active_engine_costs()
    cols = group * dim
    # GpSimd: b (two half-width products) for every head; its path's a and a + b
    swap = 2 * costs.instruction_ns("gpsimd", cols // 2, rate=costs.gpsimd_two_input_rate()) / group
    own = 2 * costs.instruction_ns("gpsimd", cols, rate=costs.gpsimd_two_input_rate()) / group
    # VectorE: a = x * cos (two SBUF inputs), a + b (two in SBUF), which reads a: VectorE's
    # pipeline drains between the two
    # (an fp32 operand in every pass: no 16-bit performance mode)
    fp32_two = costs.vector_two_input_rate(False)
    vector = (costs.instruction_ns("vector", cols, rate=fp32_two)
              + costs.instruction_ns("vector", cols, rate=fp32_two, reads_previous=True)) / group
    return (swap + own) / (vector + own)


def _vector_heads(group, dim):
    """(cut, step, a_buffer): heads [0, cut) of a group take the VectorE path, ``step``
    heads per instruction, with a = x * cos in ``a_buffer`` (PSUM one bank of heads at a
    time when a head fits a bank, else SBUF)."""
    per_bank = PSUM_BANK_FP32 // dim
    if per_bank:
        # PSUM tables (_psum_tables): the whole-head cut whose estimated VectorE and GpSimd
        # times for the group are closest to even (the least of the two's maximum; ties:
        # more heads on VectorE). VectorE's instructions go one bank of heads at a time, a
        # last partial bank paying the same fixed costs; GpSimd's path is one instruction
        # per pass for all its heads.
        return min(range(group + 1), key=lambda cut: (_group_path_ns(cut, group, dim, per_bank), -cut)), \
            per_bank, nl.psum
    share = _vector_share(dim, group)
    # SBUF path: one pair of instructions per group, rounded to nearest (3 of 4 heads of
    # 768: 28.4 against 30.3 us)
    return min(group, int(round(group * share))), group, nl.sbuf


def _group_path_ns(cut, group, dim, per_bank):
    """Estimated ns of the busier of VectorE and GpSimd on one head group with PSUM tables
    and heads [0, cut) on VectorE (engine_costs.py: the cost model's rules)."""
    costs = active_engine_costs()
    # b for all of VectorE's heads (two half-width instructions), then a and a + b per bank
    vector = 2 * costs.instruction_ns("vector", cut * dim // 2) if cut else 0.0
    for g0 in range(0, cut, per_bank):
        cols = (min(cut, g0 + per_bank) - g0) * dim
        vector += costs.instruction_ns("vector", cols) + costs.instruction_ns("vector", cols, reads_previous=True)
    cols = (group - cut) * dim
    gpsimd = 0.0
    if cols:
        gpsimd = (2 * costs.instruction_ns("gpsimd", cols // 2, rate=costs.gpsimd_two_input_rate())
                  + 2 * costs.instruction_ns("gpsimd", cols, rate=costs.gpsimd_two_input_rate()))
    return max(vector, gpsimd)


def _swap_times_sin(prod_sin, x_tile, sin_b, g0, g1, half, dim, engine=nisa.engine.gpsimd):
    """prod_sin[:, g0:g1] = swap(x) * signed sin on ``engine``, fp32: first half
    x_hi * (-sin_lo), second x_lo * sin_hi (``sin_b``: the signed sin broadcast over heads,
    from SBUF or, for VectorE, its PSUM table)."""
    if g0 >= g1:
        return
    nisa.tensor_tensor(dst=prod_sin[:, g0:g1, 0:half], data1=x_tile[:, g0:g1, half:dim],
                       data2=sin_b[:, g0:g1, 0:half], op=nl.multiply, engine=engine)
    nisa.tensor_tensor(dst=prod_sin[:, g0:g1, half:dim], data1=x_tile[:, g0:g1, 0:half],
                       data2=sin_b[:, g0:g1, half:dim], op=nl.multiply, engine=engine)


def _psum_tables(cos_tile, signed_sin):
    """(cos, signed sin) as fp32 PSUM tiles of their shape ([parts, tiles, dim]; ScalarE
    copies, exact), for the VectorE path: a VectorE tensor_tensor with one input in PSUM and
    the other in SBUF makes one pass, with both in SBUF two."""
    tables = []
    for src in (cos_tile, signed_sin):
        table = nl.ndarray(src.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.activation(dst=table, op=nl.copy, data=src)
        tables.append(table)
    return tuple(tables)


def _block_view(t, b, h0, group, s0, parts, tiles):
    """[P, G, D] view of HBM ``t`` [B, H, S, D]: heads h0..h0+G at positions s0..s0+P, or
    (``tiles`` > 1, one head) the ``tiles`` position tiles s0 + j*P .. s0 + (j+1)*P as the G
    axis."""
    if tiles > 1:
        return t[b, h0, s0:s0 + tiles * parts, :].reshape((tiles, parts, t.shape[3])).permute((1, 0, 2))
    return t[b, h0:h0 + group, s0:s0 + parts, :].permute((1, 0, 2))


def _per_column(table, group, tiles):
    """A [P, tiles, D] cos / sin tile (or table) as the [P, G, D] operand of a group: itself
    when its position tiles are the group's columns (``tiles`` > 1), else its one tile
    broadcast over the G heads (stride 0)."""
    return table if tiles > 1 else table.broadcast(1, group)


def _start_group(dst_hbm, src_hbm, b, h0, group, s0, parts, tiles, dim, cos_tile, signed_sin, tables):
    """First half of one head group, dst[b, h0:h0+group, s0:s0+parts, :] = rope(src[...])
    (``tiles`` > 1: one head, G = ``tiles`` position tiles, _block_view): load x and, on
    GpSimd, make b = swap(x) * sin for the heads whose path needs GpSimd's b first: the
    VectorE path's without PSUM tables, else the GpSimd path's own (the caller issues it
    one group ahead of ``_finish_group``)."""
    x_tile = nl.ndarray((parts, group, dim), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=_block_view(src_hbm, b, h0, group, s0, parts, tiles))
    cos_b = _per_column(cos_tile, group, tiles)
    sin_b = _per_column(signed_sin, group, tiles)
    prod_sin = nl.ndarray((parts, group, dim), dtype=nl.float32, buffer=nl.sbuf)
    split = _vector_heads(group, dim)
    if tables is None:
        _swap_times_sin(prod_sin, x_tile, sin_b, 0, split[0], dim // 2, dim)
    else:
        _swap_times_sin(prod_sin, x_tile, sin_b, split[0], group, dim // 2, dim)
    return (dst_hbm, b, h0, group, s0, parts, tiles, dim, x_tile, cos_b, sin_b, prod_sin, split, tables)


def _finish_group(state):
    """Second half of a head group: the rest of b, both paths' a = x * cos and out = a + b
    (fp32, rounded once to the output dtype, as the reference), the store."""
    dst_hbm, b, h0, group, s0, parts, tiles, dim, x_tile, cos_b, sin_b, prod_sin, (cut, step, a_buffer), tables = state
    if tables is None:
        _swap_times_sin(prod_sin, x_tile, sin_b, cut, group, dim // 2, dim)
    out_tile = nl.ndarray((parts, group, dim), dtype=dst_hbm.dtype, buffer=nl.sbuf)
    # VectorE path, heads [0, cut): a = x * cos (fp32; PSUM one bank of heads at a time),
    # then out = a + b rounded to the output dtype
    if tables is not None and cut:
        # b = swap(x) * sin for all of VectorE's heads at once (SBUF; the sin table in PSUM)
        sin_p = _per_column(tables[1], group, tiles)
        _swap_times_sin(prod_sin, x_tile, sin_p, 0, cut, dim // 2, dim, engine=nisa.engine.vector)
    for g0 in range(0, cut, step):
        g1 = min(cut, g0 + step)
        a = nl.ndarray((parts, step, dim), dtype=nl.float32, buffer=a_buffer)
        # cos from its PSUM table (one pass) or from SBUF (two)
        cos_v = (cos_b if tables is None else _per_column(tables[0], group, tiles))[:, g0:g1, :]
        nisa.tensor_tensor(dst=a[:, 0:g1 - g0, :], data1=x_tile[:, g0:g1, :], data2=cos_v, op=nl.multiply)
        nisa.tensor_tensor(dst=out_tile[:, g0:g1, :], data1=a[:, 0:g1 - g0, :], data2=prod_sin[:, g0:g1, :],
                           op=nl.add)
    # GpSimd path, heads [cut, group): a = x * cos (fp32 SBUF), out = a + b
    if cut < group:
        a = nl.ndarray((parts, group - cut, dim), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=a, data1=x_tile[:, cut:group, :], data2=cos_b[:, cut:group, :],
                           op=nl.multiply, engine=nisa.engine.gpsimd)
        nisa.tensor_tensor(dst=out_tile[:, cut:group, :], data1=a, data2=prod_sin[:, cut:group, :],
                           op=nl.add, engine=nisa.engine.gpsimd)
    nisa.dma_copy(dst=_block_view(dst_hbm, b, h0, group, s0, parts, tiles), src=out_tile)


def _rope(pairs, cos, sin, transpose=False):
    """dst = src * cos + rotate_half(src) * sin for every (src, dst) HBM pair of ``pairs``
    (tensors [B, H, S, D] that differ only in H; cos, sin [Bc, S, D]); with ``transpose``
    the transposed map, src * cos + [src2 * sin2, -src1 * sin1] (module docstring)."""
    batch, _, seq, dim = pairs[0][0].shape
    cos_batch = cos.shape[0]
    half = dim // 2
    group_max = max(1, (HEAD_COLS if dim <= PSUM_BANK_FP32 else HEAD_COLS_WIDE) // dim)
    # work units: (batch, block of position tiles); at LNC=2 each program takes half of them
    units = []
    tiles_per_block = _tiles_per_block(pairs, dim, group_max, batch * (seq // PARTITIONS))
    for b in range(batch):
        for s0, tiles, parts in _position_blocks(seq, tiles_per_block):
            units.append((b, s0, tiles, parts))
    unit_lo, unit_hi = program_share(len(units))
    pending = None      # the head group started last, finished after the next one starts
    for unit in range(unit_lo, unit_hi):
        b, s0, tiles, parts = units[unit]
        bc = b if cos_batch > 1 else 0
        # cos / sin [Bc, S, D] as one-head tensors: the unit's [P, tiles, D]
        cos_tile = nl.ndarray((parts, tiles, dim), dtype=cos.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=cos_tile, src=_block_view(cos.expand_dim(1), bc, 0, 1, s0, parts, tiles))
        sin_tile = nl.ndarray((parts, tiles, dim), dtype=sin.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sin_tile, src=_block_view(sin.expand_dim(1), bc, 0, 1, s0, parts, tiles))
        # signed sin, multiplied into swap_halves(src), in sin's dtype, once per block of
        # position tiles (negation is exact): (-sin[:D/2], sin[D/2:]); transposed
        # (sin[D/2:], -sin[:D/2])
        signed_sin = nl.ndarray((parts, tiles, dim), dtype=sin.dtype, buffer=nl.sbuf)
        lo, hi = (0, half), (half, dim)
        # (destination half, source half) of the negated and of the copied piece
        (neg_dst, neg_src), (copy_dst, copy_src) = ((hi, lo), (lo, hi)) if transpose else ((lo, lo), (hi, hi))
        nisa.tensor_scalar(dst=signed_sin[:, :, neg_dst[0]:neg_dst[1]], data=sin_tile[:, :, neg_src[0]:neg_src[1]],
                           op0=nl.multiply, operand0=-1.0)
        nisa.tensor_copy(dst=signed_sin[:, :, copy_dst[0]:copy_dst[1]], src=sin_tile[:, :, copy_src[0]:copy_src[1]])
        tables = _psum_tables(cos_tile, signed_sin) if dim <= PSUM_BANK_FP32 else None
        for src, dst in pairs:
            heads = src.shape[1]
            for h0 in range(0, heads, group_max):
                group = tiles if tiles > 1 else min(group_max, heads - h0)
                started = _start_group(dst, src, b, h0, group, s0, parts, tiles, dim, cos_tile, signed_sin, tables)
                if pending is not None:
                    _finish_group(pending)
                pending = started
    if pending is not None:
        _finish_group(pending)


def _tiles_per_block(pairs, dim, group_max, full_tiles):
    """Position tiles per work unit: 1, or, when every tensor has one head (its groups would
    hold one head, G*D columns: a transfer each of a few KiB, and the DMA's per-transfer
    cost would dominate), as many as a group's columns take (HEAD_COLS) and one PSUM bank
    holds as fp32 cos / sin tables: the tiles then play the heads' part (_block_view). At
    most ``full_tiles`` (the full 128-position tiles of all sequences) over the programs, so
    that every program gets a block (q, k [1, 1, 256, 256] in one block: one core did it all,
    8.77 against 7.36 us one tile per unit, modeled trn2 LNC=2). The blocks change no
    arithmetic, so LNC=1 and LNC=2 still give the same bits."""
    if dim > PSUM_BANK_FP32 or any(src.shape[1] != 1 for src, _ in pairs):
        return 1
    return max(1, min(group_max, PSUM_BANK_FP32 // dim, full_tiles // nl.num_programs()))


def _position_blocks(seq, tiles):
    """(s0, tiles, parts) of the blocks of one sequence: runs of ``tiles`` full 128-position
    tiles, then the rest one tile at a time (the last may hold fewer than 128 positions)."""
    blocks = []
    full = seq // PARTITIONS
    s0 = 0
    if tiles > 1:
        for _ in range(full // tiles):
            blocks.append((s0, tiles, PARTITIONS))
            s0 += tiles * PARTITIONS
    while s0 < seq:
        parts = min(PARTITIONS, seq - s0)
        blocks.append((s0, 1, parts))
        s0 += parts
    return blocks


@nki.jit
def rotary_kernel(q, k, cos, sin, transpose=False):
    """Return ``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)``; with
    ``transpose``, the backward: the rotation's transpose, dout * cos + [dout2 * sin2,
    -dout1 * sin1].

    Args:
        q: HBM [B, Hq, S, D]; k: HBM [B, Hk, S, D] (same B, S, D and dtype as q).
        cos, sin: HBM [Bc, S, D] with Bc in (1, B), any float dtype.
        transpose: apply the transposed rotation (the gradient of q and k).
    Returns:
        (q_out, k_out): HBM tensors (shared_hbm), shapes and dtype of q and k.
    """
    assert q.shape[3] % 2 == 0, f"head dim {q.shape[3]} is odd"
    q_out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    k_out = nl.ndarray(k.shape, dtype=k.dtype, buffer=nl.shared_hbm)
    _rope([(q, q_out), (k, k_out)], cos, sin, transpose)
    return q_out, k_out


@nki.jit
def rotary_single_kernel(x, cos, sin, transpose=False):
    """Return ``x * cos + rotate_half(x) * sin`` for one tensor (the op uses it when q or k
    has no element: an empty tensor is never passed to a kernel).

    Args:
        x: HBM [B, H, S, D]; cos, sin: HBM [Bc, S, D] with Bc in (1, B), any float dtype.
        transpose: as ``rotary_kernel``.
    Returns:
        HBM tensor (shared_hbm), shape and dtype of ``x``.
    """
    assert x.shape[3] % 2 == 0, f"head dim {x.shape[3]} is odd"
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    _rope([(x, out)], cos, sin, transpose)
    return out
