"""The flash attention path (``flash_attention_kernel``, any Sk): keys stream through in
blocks of ``key_block``; the running max, the running sum and the unnormalised output are
rescaled per block (FlashAttention-2), so SBUF/PSUM use does not grow with Sk.
"""

import nki.isa as nisa
import nki.language as nl

from .attention_blocks import (causal_diagonal, copy_on, divide, head_views, load_transposed, load_values, row_exp, row_max,
                               scores, softmax_cycles, store_rows, tile_bias, unit_pv)
from .attention_launch import P
from .attention_lse import LseStage
from .engine_costs import active as active_engine_costs


def flash_group(facts, plan, tensors, b, hk0, hk1, tiles, key_bias, last):
    """Attention of batch b, kv heads hk0:hk1 and their query heads for query tiles
    tiles = (t0, t1), one key block at a time (``last``: the program's last unit; unused).

    Per chunk of facts.q_chunk query tiles: Qᵀ [D, q heads, rows] is loaded once, the
    accumulators O | rowsum [128, tiles, q heads, Dv+1] fp32 and the running -max
    [128, tiles, q heads] fp32 stay in SBUF while every key block (Kᵀ, V) streams through;
    then one division per (tile, head) and one store.  Causal: blocks above the diagonal
    are skipped.  key_bias: [128, Sk] fp32 SBUF key-padding row or None."""
    f = facts
    h0, h1 = hk0 * f.G, hk1 * f.G
    nh = h1 - h0
    for t0 in range(tiles[0], tiles[1], f.q_chunk):
        t1 = min(tiles[1], t0 + f.q_chunk)
        s0, s1 = t0 * P, min(f.Sq, t1 * P)
        nt = t1 - t0
        qT = load_transposed(f, tensors.q, b, h0, h1, s0, s1)
        acc = nl.ndarray((P, nt, nh, f.Dv + 1), dtype=nl.float32, buffer=nl.sbuf)   # O | rowsum
        neg_max = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)          # running -max
        last_key = min(f.Sk, s1) if f.causal else f.Sk
        for k0 in range(0, last_key, f.key_block):
            k1 = min(f.Sk, k0 + f.key_block)
            kT = load_transposed(f, tensors.k, b, hk0, hk1, k0, k1)
            vals = load_values(f, tensors.v, b, hk0, hk1, k0, k1)
            for t in range(t0, t1):
                q0 = t * P
                r = min(P, f.Sq - q0)
                if f.causal and k0 > q0 + r - 1:
                    continue                      # block entirely above the diagonal
                n = min(k1, q0 + r) - k0 if f.causal else k1 - k0
                shared = None if f.mask_per_head else tile_bias(f, tensors.mask, b, 0, q0, r, k0, k0 + n,
                                                                key_bias)
                diag = causal_diagonal(tensors.causal_base, q0, k0, n) if f.causal_only else None
                for hq in range(h0, h1):
                    bias = (tile_bias(f, tensors.mask, b, hq, q0, r, k0, k0 + n, key_bias)
                            if f.mask_per_head else shared)
                    _flash_unit(f, plan, head_views(qT, hq - h0, q0 - s0, q0 - s0 + r),
                                head_views(kT, hq // f.G - hk0, 0, n),
                                vals, hq // f.G - hk0, acc[:, t - t0, hq - h0, :],
                                neg_max[:, t - t0, hq - h0:hq - h0 + 1], bias, diag, r, n, first=(k0 == 0))
        o_sb = nl.ndarray((P, nt, nh, f.Dv), dtype=tensors.out.dtype, buffer=nl.sbuf)
        for t in range(t0, t1):
            r = min(P, f.Sq - t * P)
            divide(f, o_sb[:r, t - t0, :, :], acc[:r, t - t0, :, :], r)       # every head at once
        store_rows(f, tensors.out, o_sb, b, h0, h1, s0, s1)
        if tensors.lse is not None:      # return_lse: the accumulators hold the row statistics
            LseStage(nt, nh, views=(neg_max, acc[:, :, :, f.Dv])).store(tensors.lse, b, h0, s0, s1)


def _flash_unit(facts, plan, qT, kT, vals, kv, acc, run_neg_max, bias, diag, r, n, first):
    """One key block of one (head, query tile): online-softmax update of acc ([128, Dv+1]
    O | rowsum, SBUF fp32) and run_neg_max ([128, 1] -running max, scaled units, SBUF fp32).
    qT: [[dc, r]]; kT: [[dc, n]] SBUF per head-dim piece; bias / diag: see row_max; first:
    the first key block."""
    s = scores(qT, kT, r, n, bias)
    p, blk, z = row_max(facts, s, r, n, bias, diag)
    v_cyc, s_cyc = softmax_cycles(n, bias, diag)
    if first:
        row_exp(p, z, r, n, blk)
        nisa.tensor_copy(dst=run_neg_max[:r], src=blk[:r], engine=nisa.engine.gpsimd)
        # ScalarE also copies O | rowsum (Dv + 1 columns) into acc
        plan.charge(v_cyc, s_cyc + facts.Dv + 1 + active_engine_costs().scalar_instr_cycles)
        o = unit_pv(facts, plan, p, vals, kv, r, n)
        copy_on(acc[:r], o[:r], nisa.engine.scalar)
        return
    # new running -max = min(old, block); alpha = exp(old max - new max) rescales acc
    new = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=new[:r], data1=run_neg_max[:r], data2=blk[:r], op=nl.minimum,
                       engine=nisa.engine.gpsimd)
    alpha = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=alpha[:r], op=nl.exp, data=run_neg_max[:r], bias=new[:r], scale=-1.0)
    row_exp(p, z, r, n, new)
    nisa.tensor_copy(dst=run_neg_max[:r], src=new[:r], engine=nisa.engine.gpsimd)
    # VectorE also updates acc below (a scalar_tensor_tensor with O in PSUM: one pass of
    # Dv + 1 columns, as the cost model prices it; counted two until session 61, which
    # modeled within -0.8 .. +1.4 % of this on 8 flash shapes, trn2 LNC=2); ScalarE also
    # runs the one-column alpha exp (its fixed costs only)
    c = active_engine_costs()
    plan.charge(v_cyc + (facts.Dv + 1) + c.vector_instr_cycles, s_cyc + 2 * c.scalar_instr_cycles)
    o = unit_pv(facts, plan, p, vals, kv, r, n)
    # acc = acc·alpha + O (acc in SBUF, O in PSUM; VectorE)
    nisa.scalar_tensor_tensor(dst=acc[:r], data=acc[:r], op0=nl.multiply, operand0=alpha[:r],
                              op1=nl.add, operand1=o[:r])
