"""The single-pass attention path (``attention_kernel`` when the transposed-scores path does
not apply): for each 128-query tile the whole score row ``[128, Sk]`` stays in PSUM; one
row max, one exp, one P·V per head.

Without a mask (nor causal) heads are processed in batches whose scores sit side by side
in PSUM (``_unbiased_batch``); with one, head by head (``_biased_unit``).
"""

import nki.isa as nisa
import nki.language as nl

from .attention_blocks import (causal_diagonal, evict, head_views, load_transposed, load_values, normalize, pv,
                               row_exp, row_max, row_max_into, score_pieces, scores, scores_side_by_side,
                               softmax_cycles, store_rows, tile_bias, transpose_p, unit_pv)
from .attention_launch import P, PSUM_BANK_FP32, unbiased_heads_per_batch
from .attention_lse import LseStage
from .engine_costs import active as active_engine_costs
from .tiling import cdiv


def single_pass_group(facts, plan, tensors, b, hk0, hk1, tiles, key_bias, last):
    """Attention of batch b, kv heads hk0:hk1 and their query heads for query tiles
    tiles = (t0, t1), all Sk keys at once (``last``: the program's last unit, whose last
    batch of unmasked heads or last masked / causal unit normalises on VectorE: see
    _unbiased_batch).

    Kᵀ [D, kv heads, Sk] and V [128, key tiles, kv heads, Dv+1] are loaded once; queries
    go by chunks of facts.q_chunk tiles: Qᵀ [D, q heads, rows] in, outputs
    [128, tiles, q heads, Dv] out.  key_bias: [128, Sk] fp32 SBUF key-padding row or None."""
    f = facts
    h0, h1 = hk0 * f.G, hk1 * f.G
    kT = load_transposed(f, tensors.k, b, hk0, hk1, 0, f.Sk)      # [[dc, kv heads, Sk]]
    vals = load_values(f, tensors.v, b, hk0, hk1, 0, f.Sk)       # [128, key tiles, kv heads, Dv+1]
    for t0 in range(tiles[0], tiles[1], f.q_chunk):
        t1 = min(tiles[1], t0 + f.q_chunk)
        s0, s1 = t0 * P, min(f.Sq, t1 * P)
        qT = load_transposed(f, tensors.q, b, h0, h1, s0, s1)     # [[dc, q heads, rows]]
        o_sb = nl.ndarray((P, t1 - t0, h1 - h0, f.Dv), dtype=tensors.out.dtype, buffer=nl.sbuf)
        stage = None if tensors.lse is None else LseStage(t1 - t0, h1 - h0)   # return_lse
        for t in range(t0, t1):
            q0 = t * P
            r = min(P, f.Sq - q0)
            n = min(f.Sk, q0 + r) if f.causal else f.Sk    # causal: later keys never attend

            def unit(hq):
                # (Qᵀ [[dc, r]], Kᵀ [[dc, n]] per head-dim piece, kv index, output rows
                # [r, Dv]) of query head hq
                return (head_views(qT, hq - h0, q0 - s0, q0 - s0 + r), head_views(kT, hq // f.G - hk0, 0, n),
                        hq // f.G - hk0, o_sb[:r, t - t0, hq - h0, :])

            if not f.biased:
                nb = unbiased_heads_per_batch(f, n)
                for hb in range(h0, h1, nb):
                    he = min(h1, hb + nb)
                    _unbiased_batch(f, plan, [unit(hq)[:3] for hq in range(hb, he)], vals,
                                    o_sb[:r, t - t0, hb - h0:he - h0, :], r, n,
                                    lse=None if stage is None else (stage, t - t0, hb - h0),
                                    last=last and t == tiles[1] - 1 and he == h1)
                continue
            shared = None if f.mask_per_head else tile_bias(f, tensors.mask, b, 0, q0, r, 0, n, key_bias)
            diag = causal_diagonal(tensors.causal_base, q0, 0, n) if f.causal_only else None
            for hq in range(h0, h1):
                bias = tile_bias(f, tensors.mask, b, hq, q0, r, 0, n, key_bias) if f.mask_per_head else shared
                qv, kv_view, kv, ov = unit(hq)
                _biased_unit(f, plan, qv, kv_view, vals, kv, ov, bias, diag, r, n,
                             lse=None if stage is None else (stage, t - t0, hq - h0),
                             last=last and t == tiles[1] - 1 and hq == h1 - 1)
        store_rows(f, tensors.out, o_sb, b, h0, h1, s0, s1)
        if stage is not None:
            stage.store(tensors.lse, b, h0, s0, s1)


def _biased_unit(facts, plan, qT, kT, vals, kv, out_tile, bias, diag, r, n, lse=None, last=False):
    """One (head, query tile) with a mask or causal: S, masked row max, exp, P·V, O / rowsum
    into out_tile [r, Dv] SBUF.  qT / kT: [[dc, r]] / [[dc, n]] per head-dim piece;
    bias / diag: see row_max.  lse: (LseStage, tile, head) receiving the row statistics;
    last: the program's last unit, normalised on VectorE (see _unbiased_batch)."""
    s = scores(qT, kT, r, n, bias)
    p, neg_max, z = row_max(facts, s, r, n, bias, diag)
    if lse is not None:
        lse[0].put_neg_max(lse[1], lse[2], neg_max[:r], r)
    row_exp(p, z, r, n, neg_max)
    v_cyc, s_cyc = softmax_cycles(n, bias, diag)
    # ScalarE also copies O | rowsum (Dv + 1 columns) out of PSUM in normalize; charged so
    # for the program's last unit too, whose normalisation VectorE does: pricing VectorE
    # there instead steers that unit's Pᵀ copies worse (modeled trn2, 21 of the 128 probe
    # launches slower, up to +5.2 %, geomean +0.26 %; the review of 2026-12-06)
    plan.charge(v_cyc, s_cyc + facts.Dv + 1 + active_engine_costs().scalar_instr_cycles)
    o = unit_pv(facts, plan, p, vals, kv, r, n)
    rowsum = None if lse is None else lse[0].rowsum_view(lse[1], lse[2], 1, r)
    normalize(facts, out_tile, o, r, rowsum=rowsum, vector=last)


def _unbiased_batch(facts, plan, units, vals, out, r, n, lse=None, last=False):
    """Attention of several heads for one 128-query tile, no mask.

    Only VectorE and ScalarE can read PSUM, and each softmax needs a pass over the scores
    for the row max (VectorE: ScalarE's accumulators only add) and one for the exp
    (ScalarE), plus the Pᵀ and output copies out of PSUM; fixed costs per instruction are
    amortised by batching heads:

    * S = Q·Kᵀ for every head side by side in PSUM (a bank holds 512 // n heads); per
      head, one VectorE pass moves the row to SBUF as z = -scale·S and takes its min
      (-scale·max), and ScalarE computes P = exp(-z - scale·max) from SBUF. A row past
      S_PIECE_KEYS keys (one head per batch) comes in PSUM pieces, a VectorE pass each and
      GpSimd's min of their parts (row_max_into, as the masked units' rows).
    * Pᵀ: transpose_p (DMA, or TensorE + PSUM copies on VectorE/ScalarE).
    * O | rowsum = P·[V | 1] (ones column in V), then evict normalises (FlashAttention-2:
      once, after P·V), one PSUM bank of outputs at a time. The program's last batch
      (``last``) normalises on VectorE, as the transposed path's last unit, the decode
      path and the last masked unit (_biased_unit) do: its eviction ends the launch, and
      the other path (ScalarE copies the bank, GpSimd scales it) is a chain of two engines
      the VectorE / ScalarE balance does not price. Modeled trn2 (fwd_probe grid of 128
      launches: 16 shapes x bf16 / fp32 x causal or not x LNC 1 / 2; 2026-12-06): with the
      masked units' rule, 78 launches change, 76 faster (up to -6 %, fp32 B=1 H=2 S=33
      Sk=40 LNC=1 7.55 -> 7.10 us), two slower (fp32 B=1 H=16 S=65 LNC=2 +1.7 %, fp32 causal
      B=1 H=4 Sq=1 Sk=2048 LNC=2 +0.4 %), geomean over the grid -1.3 %.

    ``units``: (qᵀ, kᵀ, kv index) per head, qᵀ / kᵀ lists of [dc, r] / [dc, n] views per
    head-dim piece; ``out``: [r, heads, Dv] SBUF
    output rows of those (adjacent) heads; ``lse``: (LseStage, tile, first head) receiving
    the row statistics (return_lse)."""
    f = facts
    nb = len(units)
    # Per head, VectorE moves the row to SBUF fp32 as z = -scale·S and reduces its min
    # (= -max of scale·S, either sign of scale); ScalarE's exp reads z, not PSUM, so the
    # score banks are free once VectorE has read them and the next batch's matmuls overlap
    # these exps (row_max does the same per unit).  Modeled trn2 LNC=2, SigLIP so400m B=2
    # H=16 S=729: 184.4 -> 150.4 us; B=4 H=16 S=512 D=64: 232.7 -> 146.3 us.
    z = nl.ndarray((P, nb, n), dtype=nl.float32, buffer=nl.sbuf)
    neg_max = nl.ndarray((P, nb), dtype=nl.float32, buffer=nl.sbuf)
    pieces = len(score_pieces(n))
    if pieces > 1:
        # one head (a row past one PSUM bank); past S_PIECE_KEYS keys it comes in PSUM pieces,
        # as the masked units' rows do
        (qv, kv_view, _), = units
        rows = [scores(qv, kv_view, r, n)]
    else:
        _, _, views = scores_side_by_side([(qv, kv_view) for qv, kv_view, _ in units], r, n)
        rows = [[(0, n, view)] for view in views]          # each head's row: one piece
    for j, row in enumerate(rows):
        row_max_into(f, row, z[:, j, :], neg_max[:, j:j + 1], r, n)
    if lse is not None:
        lse[0].put_neg_max(lse[1], lse[2], neg_max[:r, 0:nb], r)
    nkc = cdiv(n, P)
    p = nl.ndarray((P, nb, nkc * P), dtype=f.dtype, buffer=nl.sbuf)
    for j in range(nb):
        nisa.activation(dst=p[:r, j, 0:n], op=nl.exp, data=z[:r, j, :], bias=neg_max[:r, j:j + 1], scale=-1.0)
    pT = nl.ndarray((P, nb * nkc, P), dtype=f.dtype, buffer=nl.sbuf)
    # VectorE: the reduces (n columns per head); ScalarE: the exps
    c = active_engine_costs()
    plan.charge(nb * (n + pieces * c.vector_instr_cycles), nb * (n + c.scalar_instr_cycles))
    in_flight = transpose_p(f, plan, p, pT, r, n)   # noqa: F841 (PSUM held until P·V)
    # O | rowsum = P·[V | 1]: head j at bank j // per_o, columns (j % per_o) * (Dv + 1)
    w = f.Dv + 1
    per_o = PSUM_BANK_FP32 // w
    o = nl.ndarray((P, cdiv(nb, per_o), PSUM_BANK_FP32), dtype=nl.float32, buffer=nl.psum)
    for j, (_, _, kv) in enumerate(units):
        pv(o[:r, j // per_o, (j % per_o) * w:(j % per_o + 1) * w], pT[:, j * nkc:(j + 1) * nkc, :],
           vals, kv, r, n)
    rowsum = None if lse is None else lse[0].rowsum_view(lse[1], lse[2], nb, r)
    evict(f, plan, o, out, nb, r, vector=last, rowsum=rowsum)
