"""Rotary position embedding, transformers' Llama convention (rotate-half), for q and k.

    out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])

Dimensions:
    B: batch; Hq, Hk: query / key heads (may differ: grouped-query attention);
    S: positions (any S >= 1); D: head size (even).
    cos, sin: [Bc, S, D] with Bc = B, or Bc = 1 (shared by the batch).
Layout:
    Positions on partitions, heads and head dims on the free axis: for each (b, 128-position
    tile) the cos/sin rows [P, D] are loaded once and used for every q and k head. A head
    group is the HBM view x[b, h0:h0+G, s0:s0+P, :] permuted to [P, G, D] (one DMA of G*D
    elements per partition; G*D <= HEAD_COLS). cos/sin are broadcast over the G heads by a
    stride-0 view, never copied.
Engines, per head group:
    VectorE  a = x * cos                                  (full width)
    GpSimd   b = swap_halves(x) * (-sin_lo | sin_hi)      (two half-width ops)
    VectorE / GpSimd  out = a + b, split by heads (VECTOR_SHARE_ADD_*)
    The signed sin (-sin[:D/2], sin[D/2:]) is built once per position tile.
    Intermediates a and b are kept in the input dtype for 16-bit inputs (VectorE runs
    16-bit tensor_tensor at twice the fp32 rate; eager PyTorch rounds the same products) and
    in fp32 for fp32 inputs.
Expected error:
    fp32: ~1e-7 relative. bf16/fp16: three roundings to the input dtype (x*cos, the sin
    product, the sum), as eager PyTorch does: <= ~1.5 ulp per element, ~2e-3 relative RMS
    in bf16.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .tiling import PARTITIONS, cdiv, program_share

# Elements per partition of one head group: 4096 = 32 heads x 128 (8 KiB bf16, 16 KiB fp32
# per transfer, above the 4 KiB that saturates DMA). Input, two fp32 scratch tiles and the
# output of a group are 48 KiB in fp32: two groups in flight fit trn2's 224 KiB.
HEAD_COLS = 4096
# Share of the final add done on VectorE (the rest of the heads on GpSimd). Per element on
# trn2 (cost-model rules): a two-input pass costs VectorE 2.08 ns in fp32 and 1.04 ns when
# every operand is 16-bit (0.96 GHz), GpSimd 1.67 ns (1.2 GHz). VectorE does x * cos and a
# share s of the add, GpSimd the sin products and the rest:
#   16-bit: VectorE 1.04(1 + s), GpSimd 1.67(2 - s) -> s = 0.85, both 1.92 ns
#   fp32:   VectorE 2.08(1 + s), GpSimd 1.67(2 - s) -> s = 0.33, both 2.78 ns
# fp32 then matches its 2.78 ns of HBM traffic per element; bf16 (1.39 ns) stays
# engine-bound: three two-input passes per element exceed what the DMA needs.
VECTOR_SHARE_ADD_16BIT = 0.85
VECTOR_SHARE_ADD_FP32 = 0.33


def _rotate(dst_hbm, src_hbm, b, h0, group, s0, parts, dim, cos_tile, signed_sin, inter_dtype, add_share):
    """dst[b, h0:h0+group, s0:s0+parts, :] = rope(src[...]) for one head group."""
    half = dim // 2
    src_view = src_hbm[b, h0:h0 + group, s0:s0 + parts, :].permute((1, 0, 2))   # [P, G, D]
    dst_view = dst_hbm[b, h0:h0 + group, s0:s0 + parts, :].permute((1, 0, 2))
    x_tile = nl.ndarray((parts, group, dim), dtype=src_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile, src=src_view)
    cos_b = cos_tile.expand_dim(1).broadcast(1, group)     # [P, G, D], stride 0 over heads
    sin_b = signed_sin.expand_dim(1).broadcast(1, group)
    # a = x * cos on VectorE
    prod_cos = nl.ndarray((parts, group, dim), dtype=inter_dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod_cos, data1=x_tile, data2=cos_b, op=nl.multiply)
    # b = swap(x) * signed sin on GpSimd: first half x_hi * (-sin_lo), second x_lo * sin_hi
    prod_sin = nl.ndarray((parts, group, dim), dtype=inter_dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod_sin[:, :, 0:half], data1=x_tile[:, :, half:dim],
                       data2=sin_b[:, :, 0:half], op=nl.multiply, engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=prod_sin[:, :, half:dim], data1=x_tile[:, :, 0:half],
                       data2=sin_b[:, :, half:dim], op=nl.multiply, engine=nisa.engine.gpsimd)
    # out = a + b, heads [0, cut) on VectorE, the rest on GpSimd
    out_tile = nl.ndarray((parts, group, dim), dtype=dst_hbm.dtype, buffer=nl.sbuf)
    cut = min(group, max(0, int(round(group * add_share))))
    for g0, g1, engine in ((0, cut, nisa.engine.vector), (cut, group, nisa.engine.gpsimd)):
        if g1 > g0:
            nisa.tensor_tensor(dst=out_tile[:, g0:g1, :], data1=prod_cos[:, g0:g1, :],
                               data2=prod_sin[:, g0:g1, :], op=nl.add, engine=engine)
    nisa.dma_copy(dst=dst_view, src=out_tile)


@nki.jit
def rotary_kernel(q, k, cos, sin):
    """Return ``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)``.

    Args:
        q: HBM [B, Hq, S, D]; k: HBM [B, Hk, S, D] (same B, S, D and dtype as q).
        cos, sin: HBM [Bc, S, D] with Bc in (1, B), any float dtype.
    Returns:
        (q_out, k_out): HBM tensors (shared_hbm), shapes and dtype of q and k.
    """
    batch, q_heads, seq, dim = q.shape
    k_heads = k.shape[1]
    assert dim % 2 == 0, f"head dim {dim} is odd"
    cos_batch = cos.shape[0]
    q_out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    k_out = nl.ndarray(k.shape, dtype=k.dtype, buffer=nl.shared_hbm)
    half = dim // 2
    group_max = max(1, HEAD_COLS // dim)
    sixteen_bit = q.dtype == nl.bfloat16 or q.dtype == nl.float16
    inter_dtype = q.dtype if sixteen_bit else nl.float32
    add_share = VECTOR_SHARE_ADD_16BIT if sixteen_bit else VECTOR_SHARE_ADD_FP32

    # work units: (batch, 128-position tile); at LNC=2 each program takes half of them
    n_pos_tiles = cdiv(seq, PARTITIONS)
    unit_lo, unit_hi = program_share(batch * n_pos_tiles)
    for unit in range(unit_lo, unit_hi):
        b, s0 = unit // n_pos_tiles, (unit % n_pos_tiles) * PARTITIONS
        bc = b if cos_batch > 1 else 0
        parts = min(PARTITIONS, seq - s0)
        cos_tile = nl.ndarray((parts, dim), dtype=cos.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=cos_tile, src=cos[bc, s0:s0 + parts, :])
        sin_tile = nl.ndarray((parts, dim), dtype=sin.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sin_tile, src=sin[bc, s0:s0 + parts, :])
        # signed sin = (-sin[:D/2], sin[D/2:]), once per position tile (negation is exact)
        signed_sin = nl.ndarray((parts, dim), dtype=inter_dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=signed_sin[:, 0:half], data=sin_tile[:, 0:half],
                           op0=nl.multiply, operand0=-1.0)
        nisa.tensor_copy(dst=signed_sin[:, half:dim], src=sin_tile[:, half:dim])
        for src, dst, heads in ((q, q_out, q_heads), (k, k_out, k_heads)):
            for h0 in range(0, heads, group_max):
                group = min(group_max, heads - h0)
                _rotate(dst, src, b, h0, group, s0, parts, dim, cos_tile, signed_sin,
                        inter_dtype, add_share)
    return q_out, k_out
