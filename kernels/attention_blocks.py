"""Building blocks shared by the attention paths (single pass, transposed scores, flash):
loads and stores, masks, score matmuls, row max, exp, Pᵀ, P·V, eviction and normalisation.

Conventions: ``r`` query rows (<= 128, on partitions) and ``n`` keys of one query tile;
tiles are allocated with 128 partitions and only rows ``:r`` are used. ``facts`` is the
launch's ``LaunchFacts``, ``plan`` its ``EngineBalance``.
"""

import nki.isa as nisa
import nki.language as nl

from .attention_launch import FP32_BYTES, MATMUL_MAX_N, NEG_INF, P, PSUM_BANK_BYTES, PSUM_BANK_FP32
from .engine_costs import active as active_engine_costs
from .tiling import cdiv

FLT_MAX = 3.4028234663852886e38   # largest fp32: the clamp of a row max (see row_max)
TINY = 1e-30                      # guard for all-masked rows: 0 / max(0, TINY) = 0
# Keys per PSUM piece of a score row (scores, row_max), at most: 2 banks. A row of up to
# 2048 keys (4 of PSUM's 8 banks) in one tile keeps one buffer beside Pᵀ's and O's banks, so
# the next unit's S matmuls waited for VectorE's whole pass over this row, and VectorE then
# waited for them; in pieces, each rotating two 2-bank buffers, a piece's matmuls run while
# VectorE reads the one before. Each extra piece costs a VectorE reduce and a GpSimd min.
# Rows under a user mask stay whole: their masked pass is two VectorE passes, of which only
# the first reads PSUM, so the next row's matmuls can overlap the second; split too, 24
# key-padding launches of 1100-2500 keys modeled -14 % to +13 % (trn2, geomean +0.8 %; 10
# of the 12 bf16 ones slower; fp32 B=1 H=8/2kv S=2048 LNC=1 +12.6 %).
S_PIECE_KEYS = 2 * PSUM_BANK_FP32
# fp32 transposes of 128 rows per PSUM bank (4): one bank holds [d, 4, 128] fp32
FP32_PSUM_BLOCKS_PER_BANK = PSUM_BANK_BYTES // (P * FP32_BYTES)


# ------------------------------------------------------------------------------ loads/stores

def copy_on(dst, src, engine):
    """dst = src (cast to dst's dtype) on ``engine``: nisa.tensor_copy, or on ScalarE
    nisa.activation(op=nl.copy), which every generation's ScalarE runs (a tensor_copy on
    ScalarE needs NeuronCore-v3 or later: the simulator's NKI 0.7 rule); the same values and,
    in the cost model, the same ScalarE time."""
    if engine == nisa.engine.scalar:
        nisa.activation(dst=dst, op=nl.copy, data=src)
    else:
        nisa.tensor_copy(dst=dst, src=src, engine=engine)


def d_chunks(d):
    """[(d0, d1)]: a head dim of d cut into pieces of <= 128 (TensorE contracts over at most
    128 partitions); Q·Kᵀ accumulates one matmul per piece."""
    return [(d0, min(d, d0 + P)) for d0 in range(0, d, P)]


def head_views(tiles, h, lo, hi):
    """One head's columns lo:hi of every piece of a transposed load: [t[:, h, lo:hi]]."""
    return [t[:, h, lo:hi] for t in tiles]


def load_transposed(facts, src, b, h0, h1, s0, s1, out=None):
    """src[b, rows s0:s1, heads h0:h1]ᵀ as a list of SBUF tiles [dc, h1-h0, s1-s0] (matmul
    dtype), one per piece of the head dim (``d_chunks``: one tile for d <= 128).
    ``out``: an SBUF view [d, h1-h0, s1-s0] to load into instead (16-bit data, d <= 128)."""
    d = src.shape[-1]
    nh, n = h1 - h0, s1 - s0
    if out is not None:
        nisa.dma_transpose(dst=out, src=facts.rows(src, b, h0, h1, s0, s1), axes=(2, 1, 0))
        return [out]
    pieces = d_chunks(d)
    outs = [nl.ndarray((d1 - d0, nh, n), dtype=facts.dtype, buffer=nl.sbuf) for d0, d1 in pieces]
    if facts.dma_transpose:
        # DMA engines transpose 2-byte elements on the way in: [n, nh, d] -> [d, nh, n].
        rows = facts.rows(src, b, h0, h1, s0, s1)
        for t, (d0, d1) in zip(outs, pieces):
            nisa.dma_transpose(dst=t, src=rows if len(pieces) == 1 else rows[:, :, d0:d1], axes=(2, 1, 0))
        return outs
    # fp32: load [rows, heads, d] blocks and transpose each head (and piece) on TensorE
    # (PSUM), a PSUM bank of fp32 holding 4 heads x 128 rows, evacuated by one ScalarE copy.
    per_bank = FP32_PSUM_BLOCKS_PER_BANK
    for r0 in range(s0, s1, P):
        r = min(P, s1 - r0)
        nat = nl.ndarray((P, nh, d), dtype=facts.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=nat[:r], src=facts.rows(src, b, h0, h1, r0, r0 + r))
        for t, (d0, d1) in zip(outs, pieces):
            for g0 in range(0, nh, per_bank):
                g = min(per_bank, nh - g0)
                tp = nl.ndarray((d1 - d0, per_bank, P), dtype=facts.dtype, buffer=nl.psum)
                for j in range(g):
                    nisa.nc_transpose(dst=tp[:, j, :r], data=nat[:r, g0 + j, d0:d1])
                copy_on(t[:, g0:g0 + g, r0 - s0:r0 - s0 + r], tp[:, :g, :r], nisa.engine.scalar)
    return outs


def load_values(facts, v, b, h0, h1, k0, k1):
    """[128, n_tiles, h1-h0, Dv+1] SBUF tile: V rows k0:k1 (128 keys per tile) with a ones
    column appended (GpSimd memset), so P·[V | 1] also yields the row sum of P."""
    nh, n = h1 - h0, k1 - k0
    nt = cdiv(n, P)
    Dv = facts.Dv
    out = nl.ndarray((P, nt, nh, Dv + 1), dtype=facts.dtype, buffer=nl.sbuf)
    nisa.memset(dst=out[:, :, :, Dv:Dv + 1], value=1.0, engine=nisa.engine.gpsimd)
    full = n // P
    if full:
        nisa.dma_copy(dst=out[:, 0:full, :, 0:Dv], src=facts.tiles(v, b, h0, h1, k0, k0 + full * P))
    tail = n - full * P
    if tail:
        nisa.dma_copy(dst=out[:tail, full, :, 0:Dv], src=facts.rows(v, b, h0, h1, k0 + full * P, k1))
    return out


def store_rows(facts, out, tile, b, h0, h1, s0, s1):
    """out[b, rows s0:s1, heads h0:h1] (HBM) <- tile [128, n_tiles, h1-h0, Dv] (SBUF)."""
    n = s1 - s0
    full = n // P
    if full:
        nisa.dma_copy(dst=facts.tiles(out, b, h0, h1, s0, s0 + full * P), src=tile[:, 0:full])
    tail = n - full * P
    if tail:
        nisa.dma_copy(dst=facts.rows(out, b, h0, h1, s0 + full * P, s1), src=tile[:tail, full])


# ------------------------------------------------------------------------------ masks

def key_bias_rows(facts, mask, b):
    """[128, Sk] fp32 SBUF: the key-padding row of batch b on every partition (or None)."""
    if facts.mask_kind != "key":
        return None
    mb = b if facts.mask_batches > 1 else 0
    kb = nl.ndarray((P, facts.Sk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=kb, src=mask[mb:mb + 1, :].broadcast(0, P))   # one HBM row onto 128 partitions
    return kb


def tile_bias(facts, mask, b, h, q0, r, k0, k1, key_bias):
    """[128, k1-k0] fp32 SBUF additive bias of query rows q0:q0+r, keys k0:k1 (rows :r
    valid): user mask (key row or full tile) plus, if causal, -inf above the diagonal
    (GpSimd affine_select). None without a user mask (causal alone: causal_diagonal)."""
    if facts.mask_kind is None:
        return None
    n = k1 - k0
    bias = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    if facts.mask_kind == "full":
        mb = b if facts.mask_batches > 1 else 0
        mh = h if facts.mask_heads > 1 else 0
        nisa.dma_copy(dst=bias[:r], src=mask[mb, mh, q0:q0 + r, k0:k1])
        base = bias
    else:
        base = key_bias[:, k0:k1]
    if facts.causal:
        # keep where (q0 + p) - (k0 + j) >= 0, i.e. key <= query (top-left aligned)
        nisa.affine_select(dst=bias[:r], pattern=[[-1, n]], channel_multiplier=1,
                           on_true_tile=base[:r], on_false_value=NEG_INF,
                           cmp_op=nl.greater_equal, offset=q0 - k0)
    elif facts.mask_kind == "key":
        return base
    return bias


def causal_base():
    """[128, 128] fp32 SBUF (GpSimd): base[p, x] = 0 where x <= p - 1, else -inf. Every
    causal diagonal tile without a user mask is a column window of it (causal_diagonal)."""
    zeros = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0, engine=nisa.engine.gpsimd)
    base = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=base, pattern=[[-1, P]], channel_multiplier=1, on_true_tile=zeros,
                       on_false_value=NEG_INF, cmp_op=nl.greater_equal, offset=-1)
    return base


def causal_diagonal(base, q0, k0, n):
    """(c, cb) of a causal tile without user mask: query rows q0:q0+r, keys k0:k0+n (n already
    clipped to key < q0 + r).  Keys <= q0 are visible to every row; key q0 + 1 + x is
    visible to row p iff x <= p - 1, i.e. base[p, x] (0 or -inf, LaunchTensors.causal_base)."""
    a = max(k0, q0 + 1)
    c = min(n, a - k0)
    if c == n:
        return n, None
    return c, base[:, a - q0 - 1:k0 + n - q0 - 1]


# ------------------------------------------------------------------------------ softmax of one unit

def _contract(dst, q_pieces, k_pieces, c0, c1):
    """dst = Σ over head-dim pieces of q_pieceᵀ·k_piece[:, c0:c1] (TensorE, accumulating in
    PSUM; one matmul when the head dim fits 128 partitions)."""
    if len(q_pieces) == 1:
        nisa.nc_matmul(dst=dst, stationary=q_pieces[0], moving=k_pieces[0][:, c0:c1])
        return
    for i, (qc, kc) in enumerate(zip(q_pieces, k_pieces)):
        nisa.nc_matmul(dst=dst, stationary=qc, moving=kc[:, c0:c1], accumulate=i > 0)


def score_pieces(n, bias=None):
    """(k0, k1) key ranges of the PSUM pieces ``scores`` makes a row of n keys in: the fewest
    pieces of at most S_PIECE_KEYS keys, each bound at its even share of n rounded up to a
    128-key tile, or one piece under a user mask (``bias``: see S_PIECE_KEYS). Modeled 0.7 %
    faster than bounds at multiples of S_PIECE_KEYS (geomean of 32 causal / unmasked
    launches with 1100-2500 keys, trn2; n = 1100 takes 640 + 460 keys rather than 1024 + 76)."""
    if bias is not None:
        return [(0, n)]
    k = cdiv(n, S_PIECE_KEYS)
    bounds = [min(n, cdiv(n * i // k, P) * P) for i in range(k)] + [n]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


def scores(qT, kT, r, n, bias=None):
    """S = Q·Kᵀ (TensorE) for r query rows and n keys, 512 keys per matmul, as PSUM pieces of
    at most S_PIECE_KEYS keys: a list of (k0, k1, [128, k1 - k0] fp32 PSUM tile), rows :r
    (one piece up to S_PIECE_KEYS keys, or under a user mask: ``bias``, see row_max).  qT:
    [[dc, r]] and kT: [[dc, >= n]] SBUF, one per head-dim piece."""
    pieces = []
    for k0, k1 in score_pieces(n, bias):
        s = nl.ndarray((P, k1 - k0), dtype=nl.float32, buffer=nl.psum)
        for c0 in range(k0, k1, MATMUL_MAX_N):
            c1 = min(k1, c0 + MATMUL_MAX_N)
            _contract(s[:r, c0 - k0:c1 - k0], qT, kT, c0, c1)
        pieces.append((k0, k1, s))
    return pieces


def row_max(facts, s, r, n, bias=None, diag=None):
    """-rowmax of scale·S + mask, in fp32 (scaled units), for the exp that follows, and the
    row itself moved out of PSUM.

    s: the PSUM pieces of ``scores`` (rows :r).  Masking, one of:
      bias: [128, n] fp32 SBUF additive tile (user mask, causal folded in);
      diag: (c, cb) for causal without a user mask: columns [0, c) are visible to every
            row, columns [c, n) get the additive causal tile cb ([128, n - c] SBUF view);
      neither: no mask.
    VectorE reads PSUM once, writing z = -(scale·S) to SBUF fp32 and reducing its min
    (min(-scale·S) = -max(scale·S), so either sign of scale works); masked columns take two
    VectorE passes instead (scale·S + mask from PSUM into z, then z negated with its min
    reduced); one reduce per piece and kind of column, and GpSimd takes the min of the
    pieces' parts.  The exp then reads z from SBUF, not S from PSUM: each piece's PSUM
    buffer is free once VectorE has read it, so the next unit's matmuls overlap this unit's
    exp (modeled trn2 LNC=2, Llama causal GQA: S=2048 261.4 -> 165.4 us, S=4096 1934.4 ->
    1166.0 us), and with the row in pieces, a piece's matmuls overlap VectorE's pass over
    the one before (see S_PIECE_KEYS).
    Returns (p, neg_max, z): p a [128, n] SBUF tile for P, neg_max [128, 1] fp32 <= FLT_MAX
    (clamped where a row can be masked everywhere, which then gives exp(-inf) = 0; elsewhere
    every row has a column visible, so it is finite), z [128, n] SBUF fp32."""
    p = nl.ndarray((P, n), dtype=facts.dtype, buffer=nl.sbuf)
    neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    z = nl.ndarray((P, n), dtype=nl.float32, buffer=nl.sbuf)
    row_max_into(facts, s, z, neg_max, r, n, bias, diag)
    return p, neg_max, z


def row_max_into(facts, s, z, neg_max, r, n, bias=None, diag=None):
    """row_max's instructions, into given tiles: z [128, n] fp32 SBUF view, neg_max [128, 1]
    fp32 SBUF view (s, r, n, bias, diag: as row_max)."""
    c, cb = row_masking(n, bias, diag)
    reduces = row_max_passes([(k0, k1) for k0, k1, _ in s], c)
    # A row can be masked everywhere only under a user mask or when no column is visible to
    # every row (c == 0: a flash key block past the tile's first query); its -max is then
    # +inf, clamped to FLT_MAX. Otherwise one part reduces straight into neg_max.
    clamp = bias is not None or c == 0
    direct = len(reduces) == 1 and not clamp
    parts = neg_max if direct else nl.ndarray((P, len(reduces)), dtype=nl.float32, buffer=nl.sbuf)
    for i, (j, a, e, is_masked) in enumerate(reduces):
        k0, _, tile = s[j]
        if not is_masked:
            nisa.tensor_scalar_reduce(dst=z[:r, a:e], data=tile[:r, a - k0:e - k0], op0=nl.multiply,
                                      operand0=-facts.scale, reduce_op=nl.minimum, reduce_res=parts[:r, i:i + 1])
            continue
        nisa.scalar_tensor_tensor(dst=z[:r, a:e], data=tile[:r, a - k0:e - k0], op0=nl.multiply,
                                  operand0=facts.scale, op1=nl.add, operand1=cb[:r, a - c:e - c])
        nisa.tensor_scalar_reduce(dst=z[:r, a:e], data=z[:r, a:e], op0=nl.multiply, operand0=-1.0,
                                  reduce_op=nl.minimum, reduce_res=parts[:r, i:i + 1])
    if direct:
        return
    src = parts[:, 0:1]
    # GpSimd: the min of the parts, one pair at a time (NKI's tensor_reduce is VectorE's)
    for i in range(1, len(reduces)):
        nisa.tensor_tensor(dst=neg_max[:r], data1=src[:r], data2=parts[:r, i:i + 1], op=nl.minimum,
                           engine=nisa.engine.gpsimd)
        src = neg_max
    if clamp:
        nisa.tensor_scalar(dst=neg_max[:r], data=src[:r], op0=nl.minimum, operand0=FLT_MAX,
                           engine=nisa.engine.gpsimd)


def row_masking(n, bias, diag):
    """(c, cb) of a row of n keys: columns [0, c) are visible to every row, columns [c, n)
    take the additive tile cb (bias / diag: see row_max; no mask: c = n, cb None)."""
    if bias is not None:
        return 0, bias
    return diag if diag is not None else (n, None)


def row_max_passes(pieces, c):
    """row_max's reduces, in order: (piece index, first column, end column, masked) for the
    visible columns [0, c) and the masked ones [c, ...) of each (k0, k1) piece (the masked
    ones also take a VectorE pass that adds the mask before their reduce)."""
    passes = []
    for i, (k0, k1) in enumerate(pieces):
        if k0 < min(k1, c):
            passes.append((i, k0, min(k1, c), False))
        if max(k0, c) < k1:
            passes.append((i, max(k0, c), k1, True))
    return passes


def row_exp(p, z, r, n, neg_max):
    """p[:r, 0:n] = exp(-z + neg_max) = exp(scale·S + mask + neg_max) on ScalarE, one
    instruction.  z: [128, n] fp32 SBUF from row_max; neg_max: [128, 1] fp32 SBUF."""
    nisa.activation(dst=p[:r, 0:n], op=nl.exp, data=z[:r, 0:n], bias=neg_max[:r], scale=-1.0)


def softmax_cycles(n, bias, diag):
    """(VectorE, ScalarE) cycles of row_max + row_exp for one unit (for EngineBalance.charge),
    as the cost model prices row_max's instructions: VectorE one pass over the unmasked
    columns (a tensor_scalar_reduce per PSUM piece) and two over the masked ones (scale·S +
    mask with S in PSUM, one pass; then a tensor_scalar_reduce), each reduce's accumulator
    read-out and each instruction's fixed cost (row_max_passes); ScalarE each column once in
    one exp. GpSimd's min of the pieces' parts is not charged (the balance is VectorE's and
    ScalarE's). Like the planner's other
    charges it leaves out the 64-cycle instruction minimum (MIN_II), which a causal tile's
    first, one-column part would take: charged, it modeled trn2 LNC=2 B=1 H=4 S=1500 D=128
    causal 64.9 -> 67.2 us. (Until session 61 the masked columns were charged three passes
    and no read-out: row_max's older form.)"""
    c0 = row_masking(n, bias, diag)[0]     # first masked column
    passes = row_max_passes(score_pieces(n, bias), c0)
    reduces, masks = len(passes), sum(1 for p in passes if p[3])
    c = active_engine_costs()
    vector = (n + (n - c0) + reduces * c.vector_reduce_readout_cycles
              + c.vector_instr_cycles * (reduces + masks))
    scalar = n + c.scalar_instr_cycles
    return vector, scalar


# ------------------------------------------------------------------------------ batches of heads

def scores_side_by_side(pairs, r, n):
    """S = Q·Kᵀ of several heads side by side in PSUM: head j at bank j // per_bank, columns
    (j % per_bank) * n (a bank holds 512 // n heads; a single head may be longer).
    pairs: [(qT, kT)] per head, each a list of SBUF views per head-dim piece ([dc, r] and
    [dc, >= n]).  Returns (s, per_bank, views): s [128, banks, 512 or n] fp32 PSUM and
    views [128, n] of each head's scores."""
    nb = len(pairs)
    per_bank = max(1, PSUM_BANK_FP32 // n)
    s = nl.ndarray((P, cdiv(nb, per_bank), max(PSUM_BANK_FP32, n) if nb == 1 else PSUM_BANK_FP32),
                   dtype=nl.float32, buffer=nl.psum)
    views = []
    for j, (qv, kv_view) in enumerate(pairs):
        c = (j % per_bank) * n
        view = s[:, j // per_bank, c:c + n]
        for c0 in range(0, n, MATMUL_MAX_N):
            c1 = min(n, c0 + MATMUL_MAX_N)
            _contract(view[:r, c0:c1], qv, kv_view, c0, c1)
        views.append(view)
    return s, per_bank, views


def row_extrema_side_by_side(facts, s, ext, nb, per_bank, r, n):
    """ext[:r, j] = max_k S_j (min when scale < 0: max(scale·S) = scale·min(S)) for the nb
    heads of scores_side_by_side, raw units, fp32: one VectorE reduce over the full banks
    and one over the last, partial one.  ext: [128, >= nb] fp32 SBUF."""
    red = nl.maximum if facts.scale >= 0 else nl.minimum
    full_banks = nb // per_bank
    if full_banks:
        nisa.tensor_reduce(dst=ext[:r, 0:full_banks * per_bank].reshape((r, full_banks, per_bank)),
                           op=red, axis=3,
                           data=s[:r, 0:full_banks, 0:per_bank * n].reshape((r, full_banks, per_bank, n)))
    rest = nb - full_banks * per_bank
    if rest:
        nisa.tensor_reduce(dst=ext[:r, full_banks * per_bank:nb], op=red, axis=2,
                           data=s[:r, full_banks, 0:rest * n].reshape((r, rest, n)))


# ------------------------------------------------------------------------------ Pᵀ and P·V

def transpose_p(facts, plan, p, pT, r, n):
    """pT[:kc, j * nkc + c, :r] = (p[:r, j, 128c : 128c + kc])ᵀ for every head j and 128-key
    chunk c (nkc = ceil(n / 128)): by DMA transposes for the planner's share of the launch,
    else 128x128 TensorE transposes into PSUM, each PSUM bank of blocks copied to SBUF by
    VectorE or ScalarE (plan.pick).  p: [128, heads, >= n] SBUF; pT: [128, heads * nkc,
    128] SBUF (rows kc..127 of a tail block are never written: P·V does not read them).
    Returns the last PSUM tile of blocks (None after DMA transposes): the caller holds it
    until its P·V is issued, as the PSUM budgets count a bank of Pᵀ blocks in flight."""
    nu = p.shape[1]
    nkc = cdiv(n, P)
    if plan.use_dma():
        _dma_transpose_p(p, pT.reshape((P, nu, nkc, P)), r, n)
        return None
    blocks = [(j, c) for j in range(nu) for c in range(nkc)]
    per_tp = PSUM_BANK_BYTES // (P * facts.itemsize)      # 128x128 blocks per PSUM bank
    tp = None
    for i0 in range(0, len(blocks), per_tp):
        chunk = blocks[i0:i0 + per_tp]
        tp = nl.ndarray((P, per_tp, P), dtype=facts.dtype, buffer=nl.psum)
        for i, (j, c) in enumerate(chunk):
            kc = min(P, n - c * P)
            nisa.nc_transpose(dst=tp[:kc, i, :r], data=p[:r, j, c * P:c * P + kc])
        copy_on(pT[:, i0:i0 + len(chunk), :r], tp[:, 0:len(chunk), :r], plan.pick(*plan.pt_copy_cycles(len(chunk) * r)))
    return tp


def _dma_transpose_p(p, pT, r, n):
    """pT[:kc, j, c, :r] = (p[:r, j, 128c : 128c + kc])ᵀ on the DMA engines: one 4-D
    transpose for the full chunks of every head, one 3-D for the tail chunk.
    p: [r, heads, >= n] SBUF; pT: [128, heads, chunks, 128] SBUF."""
    nu = p.shape[1]
    full = n // P
    if full:
        nisa.dma_transpose(dst=pT[:, :, 0:full, :r], src=p[:r, :, 0:full * P].reshape((r, nu, full, P)),
                           axes=(3, 1, 2, 0))
    if n > full * P:
        kc = n - full * P
        nisa.dma_transpose(dst=pT[:kc, :, full, :r], src=p[:r, :, full * P:n], axes=(2, 1, 0))


def pv(dst, pT, vals, kv, r, n):
    """dst = P·[V | 1] on TensorE, accumulated over the 128-key chunks: [r, Dv + 1] fp32 PSUM
    (column Dv: the row sum of P).  pT: [128, nkc, >= r] SBUF Pᵀ blocks of one head;
    vals: [128, nkc, kv heads, Dv + 1] SBUF (load_values); kv: the head's kv index."""
    for c in range(cdiv(n, P)):
        kc = min(P, n - c * P)
        nisa.nc_matmul(dst=dst, stationary=pT[:kc, c, :r], moving=vals[:kc, c, kv, :],
                       accumulate=(c > 0))


def unit_pv(facts, plan, p, vals, kv, r, n):
    """O = P·[V | 1] for one (head, query tile): [128, Dv+1] fp32 PSUM (rows :r), column Dv
    = row sum of P.  p: [128, n] SBUF P (rows :r)."""
    nkc = cdiv(n, P)
    pT = nl.ndarray((P, nkc, P), dtype=facts.dtype, buffer=nl.sbuf)
    in_flight = transpose_p(facts, plan, p[:, 0:n].reshape((P, 1, n)), pT, r, n)   # noqa: F841
    o = nl.ndarray((P, facts.Dv + 1), dtype=nl.float32, buffer=nl.psum)
    pv(o[:r], pT, vals, kv, r, n)
    return o


def bf16_triple(x, hi, mid, lo, rest):
    """hi, mid, lo: three bf16 values summing exactly to the fp32 ``x`` (hi = bf16(x), mid =
    bf16(x - hi), lo = x - hi - mid: each step takes 8 more of fp32's 24 significant bits,
    and x - hi is exact in fp32), four GpSimd instructions; ``rest`` an fp32 tile of x's
    shape for x - hi. The forward's transposed-scores path puts the row maxes so on extra
    rows of Qᵀ (attention_transposed._ts_hilo), the backward's folded mode -lse / scale and
    -D_i (attention_bwd._fold_rows)."""
    nisa.tensor_copy(dst=hi, src=x, engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=rest, data1=x, data2=hi, op=nl.subtract, engine=nisa.engine.gpsimd)
    nisa.tensor_copy(dst=mid, src=rest, engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=lo, data1=rest, data2=mid, op=nl.subtract, engine=nisa.engine.gpsimd)


# ------------------------------------------------------------------------------ normalisation

def evict(facts, plan, o, out, nb, r, vector=False, rowsum=None):
    """out[:, j, :] = O_j / rowsum_j for nb heads in PSUM o (per_o = 512 // (Dv + 1) heads
    per bank), one bank at a time, on VectorE (normalise_on_vector) when ``vector`` or when
    the planner says it is less loaded, else ScalarE copies the bank to SBUF and GpSimd
    scales all its heads at once (see divide).  out: [r, nb, Dv] SBUF (output dtype).
    ``rowsum``: an [r, nb] fp32 SBUF view that also receives the row sums (GpSimd copy of
    the sums the reciprocals are taken of), for the lse."""
    Dv = facts.Dv
    w = Dv + 1
    per_o = PSUM_BANK_FP32 // w
    o_raw = nl.ndarray((P, nb, w), dtype=nl.float32, buffer=nl.sbuf)
    keep_sums = keeps_row_sums(facts, rowsum)
    sums = nl.ndarray((P, nb, 1), dtype=nl.float32, buffer=nl.sbuf) if keep_sums else None
    inv = nl.ndarray((P, nb, 1), dtype=nl.float32, buffer=nl.sbuf)
    for g0 in range(0, nb, per_o):
        g = min(per_o, nb - g0)
        bank = o[:r, g0 // per_o, 0:g * w].reshape((r, g, w))
        if vector:
            eng = nisa.engine.vector
        else:
            # VectorE: the reciprocals of g row sums (an iterative instruction, mostly the
            # 64-cycle instruction minimum) and the multiply (g·Dv, one input in PSUM), two
            # fixed costs, plus the sums' copy (the minimum) where they are kept; ScalarE:
            # the copy of the bank (g·(Dv + 1)), one fixed cost (GpSimd then scales)
            c = active_engine_costs()
            vector_cycles = (2 * c.vector_instr_cycles + max(c.min_instruction_cycles, c.vector_reciprocal_factor * g)
                             + g * Dv)
            if keep_sums:
                vector_cycles += c.vector_instr_cycles + c.min_instruction_cycles
            eng = plan.pick(vector_cycles, g * w + c.scalar_instr_cycles)
        if eng == nisa.engine.vector:
            normalise_on_vector(facts, out[:, g0:g0 + g, :], bank, inv[:r, g0:g0 + g, :],
                                None if sums is None else sums[:r, g0:g0 + g, :],
                                None if rowsum is None else rowsum[:, g0:g0 + g])
            continue
        nisa.activation(dst=o_raw[:r, g0:g0 + g, :], op=nl.copy, data=bank)
        if rowsum is not None:
            nisa.tensor_copy(dst=rowsum[:, g0:g0 + g], src=o_raw[:r, g0:g0 + g, Dv], engine=nisa.engine.gpsimd)
        divide(facts, out[:, g0:g0 + g, :], o_raw[:r, g0:g0 + g, :], r)


def keeps_row_sums(facts, rowsum):
    """Whether VectorE's normalisation copies the row sums to SBUF before their reciprocals:
    where they are floored (a user mask: all-masked rows give 0) or kept for the lse
    (``rowsum``); the callers allocate ``sums`` for normalise_on_vector by it."""
    return facts.guard_empty_rows or rowsum is not None


def normalise_on_vector(facts, dst, bank, inv, sums=None, rowsum=None):
    """dst = O / rowsum for the heads of one PSUM bank, on VectorE: the reciprocals of the
    row sums, then one multiply with O straight from PSUM (O times 1 / rowsum, as the GpSimd
    path (divide) makes it with its power of -1; both exactly 1 / x here; on hardware the two
    engines' reciprocals may differ in the last bit, not measured). bank: [r, g, Dv + 1] fp32
    PSUM (O | rowsum); dst: [r, g, Dv] SBUF; inv: [r, g, 1] fp32 SBUF for the reciprocals.
    The row sums go to ``sums`` ([r, g, 1] fp32 SBUF) before their reciprocals where they
    are floored (a user mask: all-masked rows give 0) or kept for the lse (``rowsum``: an
    [r, g] fp32 SBUF view, GpSimd copy); else VectorE takes the reciprocals straight from PSUM
    (v2.33 nki.isa.reciprocal: "Both the input data and output dst tiles can be in SBUF or
    PSUM")."""
    Dv = facts.Dv
    recip_of = bank[:, :, Dv:Dv + 1]
    if keeps_row_sums(facts, rowsum):
        assert sums is not None, "normalise_on_vector: the row sums are kept here; pass sums"
        nisa.tensor_scalar(dst=sums, data=recip_of, op0=nl.maximum,
                           operand0=TINY if facts.guard_empty_rows else -FLT_MAX)
        recip_of = sums
    nisa.reciprocal(dst=inv, data=recip_of)
    nisa.tensor_tensor(dst=dst, data1=bank[:, :, 0:Dv], data2=inv.broadcast(2, Dv), op=nl.multiply)
    if rowsum is not None:
        nisa.tensor_copy(dst=rowsum, src=sums[:, :, 0], engine=nisa.engine.gpsimd)


def normalize(facts, dst, o, r, rowsum=None, vector=False):
    """dst[:r] = O / rowsum (FlashAttention-2: normalise once, after P·V).  ScalarE moves
    O | rowsum ([128, Dv + 1] fp32 PSUM) to SBUF, GpSimd scales (see divide); with
    ``vector`` (the launch's last unit) VectorE normalises straight from PSUM instead
    (normalise_on_vector: a shorter chain to end the launch on). ``rowsum``: an [r, 1] fp32
    SBUF view that also receives the row sum (GpSimd), for the lse."""
    if vector:
        inv = nl.ndarray((P, 1, 1), dtype=nl.float32, buffer=nl.sbuf)
        keep_sums = keeps_row_sums(facts, rowsum)
        sums = nl.ndarray((P, 1, 1), dtype=nl.float32, buffer=nl.sbuf) if keep_sums else None
        normalise_on_vector(facts, dst.expand_dim(1), o[:r].expand_dim(1), inv[:r],   # one head: [r, 1, ...]
                            None if sums is None else sums[:r], rowsum)
        return
    raw = nl.ndarray((P, facts.Dv + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=raw[:r], op=nl.copy, data=o[:r])
    if rowsum is not None:
        nisa.tensor_copy(dst=rowsum, src=raw[:r, facts.Dv:facts.Dv + 1], engine=nisa.engine.gpsimd)
    divide(facts, dst, raw[:r], r)


def divide(facts, dst, raw, r):
    """dst = raw[..., :Dv] / raw[..., Dv] as raw[..., :Dv] * raw[..., Dv] ** -1, all on GpSimd:
    the row sums' reciprocals by one tensor_scalar power ([r, heads, 1]; a GpSimd arithmetic
    tensor_scalar, README "A known risk for the first run"; tensor_tensor's power with a
    memset exponent tile, the documented GpSimd form, modeled trn2 LNC=2 ViT-B/16 42.64 us
    against 42.10, the memset per call), then one multiply for every head of the tile (raw:
    [r, (heads,) Dv + 1] fp32 SBUF; dst: [r, (heads,) Dv]). Not one division: NKI's ISA has no
    divide operator (the "Supported Math Operators for NKI ISA" table, nki.api.shared;
    nki.language lists divide as not supported); not VectorE's reciprocal: this path is
    taken to keep VectorE free. An all-masked row has rowsum 0 and O 0: with a user mask
    the divisor is max(rowsum, TINY), so the row is 0 (as torch's SDPA)."""
    Dv = facts.Dv
    if len(raw.shape) == 2:
        dst, raw = dst.expand_dim(1), raw.expand_dim(1)         # one head: [r, 1, ...]
    heads = raw.shape[1]
    denom = raw[:, :, Dv:Dv + 1]
    if facts.guard_empty_rows:
        d = nl.ndarray((P, heads, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d[:r], data=denom, op0=nl.maximum, operand0=TINY, engine=nisa.engine.gpsimd)
        denom = d[:r]
    inv = nl.ndarray((P, heads, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=inv[:r], data=denom, op0=nl.power, operand0=-1.0, engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=dst, data1=raw[:, :, 0:Dv], data2=inv[:r].broadcast(2, Dv), op=nl.multiply,
                       engine=nisa.engine.gpsimd)
