"""Attention backward (FlashAttention-2 style) for AWS Trainium (NKI beta 2):
``attention_bwd_kernel(q, k, v, o, do, lse, mask, scale, causal) -> (dq, dk, dv)``.

The forward (attention.py with ``return_lse=True``) saves the per-row log-sum-exp
``lse[B, H, Sq]`` (fp32, attention_lse.py). The backward recomputes ``P = exp(scale·S +
mask - lse)`` block by block from Q, K and the lse, so no [Sq, Sk] tensor ever reaches HBM:

    D_i  = rowsum(dO ⊙ O)                      (fp32, once per query row)
    dV  += Pᵀ·dO            dP = dO·Vᵀ          dS = P ⊙ (dP - D_i)
    dK  += scale · dSᵀ·Q    dQ += scale · dS·K

Shapes (layout "bhsd", contiguous): q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv],
o / do [B, H, Sq, Dv], lse [B, H, Sq] fp32; mask as the forward takes it (None, an additive
fp32 key row [Bm, Sk] or [Bm, Hm, Sq, Sk]); dq / dk / dv like q / k / v, dtype of q.
GQA (H a multiple of Hkv): dK and dV of kv head hk sum over its G = H / Hkv query heads.
Every shape and dtype the forward takes (attention.py), D, Dv <= 256.

Cut (attention_bwd_plan.py): a unit is one (batch, kv head) pair with its G query heads.
Its query side (Qᵀ, dOᵀ, Q, dO, -lse, D_i and the fp32 dQ accumulators) stays in SBUF for
a chunk of query tiles while the keys stream through in blocks of ``kb`` keys (256, or
512 when D + Dv <= 256);
per key block the dK | dV accumulators stay in PSUM for the whole chunk, one slot of D + Dv
rounded up to a power of two per (key tile, kv head), so no matmul's output crosses a PSUM
bank (attention_bwd_plan.kv_slot_width). A unit of one
chunk (every workload of the main job) writes dK, dV once per key block; with several
chunks (long sequences) the partial dK | dV sums go through an fp32 HBM scratch the unit
alone owns, and dQ is written per chunk.

LNC=2 (AWS, "Using Logical NeuronCores (LNC) with NKI"): each program owns a contiguous
half of the (batch, kv head) pairs and writes dQ, dK, dV (and scratch) of its pairs only,
so no HBM element is written by both cores and nothing is reduced across them; the pairs
of a launch all cost the same, so the halves are balanced when the pair count is even
(one pair: the second core idles). Every pair is computed by the same instructions at
either degree, so LNC=1 and LNC=2 give identical results.

Engines, per (query tile, query head, key block):
    TensorE  S = Q·Kᵀ and dP = dO·Vᵀ, each in a PSUM tile of its own; dV += Pᵀ·dO and
             dK += dSᵀ·Q per 128-key tile (PSUM accumulation over the chunk); dSᵀ by
             128x128 transposes; dQ = dS·K (accumulated over the block's key tiles).
    ScalarE  P = exp(scale·S - lse) straight from PSUM (the -lse as per-row bias).
    VectorE  dS = (dP - D_i) ⊙ P in one instruction (dP read from PSUM), or, where the
             running estimate says VectorE is the busier, ScalarE's dP - D_i out of PSUM
             and GpSimd's product (BwdBalance.pick_ds); masked columns: scale·S + mask into
             SBUF first.
    VectorE or ScalarE (whichever the running estimate says is less loaded, BwdBalance):
             the dSᵀ copy out of PSUM, the dQ accumulation, the dK / dV evacuations.
    DMA      Qᵀ, dOᵀ, Kᵀ, Vᵀ arrive transposed (dma_transpose, 16-bit dtypes; fp32 on
             TensorE); Q, dO, K rows and the outputs move as [128 rows, heads, D] blocks.
Numerics: matmul operands in the input dtype (P and dS rounded to it, as the forward's P),
accumulation and D_i, lse, dQ partial sums in fp32. ``dropout_p`` does not exist here.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .attention_blocks import (_dma_transpose_p, bf16_triple, causal_base, causal_diagonal, copy_on, key_bias_rows,
                               load_transposed, store_rows, tile_bias)
from .attention_bwd_plan import LOAD_GROUP_TILES, FOLD_PAIR, FOLD_RING, FOLD_ROWS, BwdBalance, bwd_plan
from .attention_launch import P, launch_facts
from .attention_lse import load_lse
from .tiling import cdiv, program_share


@nki.jit
def attention_bwd_kernel(q, k, v, o, do, lse, mask=None, scale=1.0, causal=False, q_chunk=0):
    """dq, dk, dv of attention (module docstring). ``q_chunk``: query tiles per chunk
    (0: the plan's choice; tests force small chunks to cover the multi-chunk path)."""
    facts = launch_facts(q, k, v, mask, scale, causal, "bhsd", max(1, k.shape[2]))
    assert tuple(o.shape) == tuple(do.shape) == (facts.B, facts.H, facts.Sq, facts.Dv), \
        f"o {o.shape} / do {do.shape}: expected {(facts.B, facts.H, facts.Sq, facts.Dv)}"
    assert tuple(lse.shape) == (facts.B, facts.H, facts.Sq), \
        f"lse {lse.shape}: expected {(facts.B, facts.H, facts.Sq)}"
    plan = bwd_plan(facts, q_chunk)
    bal = BwdBalance(facts, plan)
    dq = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray(k.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray(v.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    # partial dK | dV sums between query chunks (fp32); each unit owns its rows
    scratch = (nl.ndarray((facts.B, facts.Hkv, facts.Sk, facts.D + facts.Dv), dtype=nl.float32,
                          buffer=nl.shared_hbm) if plan.n_chunks > 1 else None)
    base = causal_base() if facts.causal_only else None     # as the forward's
    ring = _ones_ring(facts, plan) if plan.folded else None
    tensors = (q, k, v, o, do, lse, mask, dq, dk, dv, scratch, base, ring)
    key_bias, bias_batch = None, -1
    for b, hk0, hk1 in _units(facts, plan):
        if b != bias_batch:
            key_bias, bias_batch = key_bias_rows(facts, mask, b), b
        for c in range(plan.n_chunks):
            t0 = c * plan.q_chunk
            t1 = min(facts.n_q_tiles, t0 + plan.q_chunk)
            _chunk(facts, plan, bal, tensors, b, hk0, hk1, t0, t1, key_bias, c)
    return dq, dk, dv


def _units(facts, plan):
    """This program's units (b, hk0, hk1): its contiguous share of the (batch, kv head)
    pairs, cut at batch boundaries into runs of at most plan.kv_group kv heads."""
    lo, hi = program_share(facts.B * facts.Hkv)
    # units of equal size (at most kv_group kv heads): the last one is not a small remainder
    size = cdiv(hi - lo, cdiv(hi - lo, plan.kv_group)) if hi > lo else 1
    units = []
    i = lo
    while i < hi:
        b, hk0 = i // facts.Hkv, i % facts.Hkv
        hk1 = min(facts.Hkv, hk0 + size, hk0 + hi - i)
        units.append((b, hk0, hk1))
        i += hk1 - hk0
    return units


def _chunk(facts, plan, bal, tensors, b, hk0, hk1, t0, t1, key_bias, c):
    """Query tiles t0:t1 of every query head of kv heads hk0:hk1 (batch b) against every key block."""
    f = facts
    q, k, v, o, do, lse, mask, dq, dk, dv, scratch, base, ring = tensors
    h0, h1 = hk0 * f.G, hk1 * f.G
    nh = h1 - h0
    nt = t1 - t0
    s0, s1 = t0 * P, min(f.Sq, t1 * P)
    # ---- query side of every head of the unit, resident for the chunk (one DMA per tensor,
    # or per group of LOAD_GROUP_TILES query tiles for long chunks of 16-bit data: the first
    # tiles' compute then starts after their group is in, not the whole chunk)
    groups = [(ta, min(t1, ta + LOAD_GROUP_TILES)) for ta in range(t0, t1, LOAD_GROUP_TILES)]
    grouped = not plan.folded and f.dma_transpose and f.D <= P and f.Dv <= P and len(groups) > 1
    if not grouped:
        groups = [(t0, t1)]
    if plan.folded:
        qx = nl.ndarray((f.D + FOLD_ROWS, nh, s1 - s0), dtype=f.dtype, buffer=nl.sbuf)
        dox = nl.ndarray((f.Dv + FOLD_ROWS, nh, s1 - s0), dtype=f.dtype, buffer=nl.sbuf)
        qT = load_transposed(f, q, b, h0, h1, s0, s1, out=qx[0:f.D])
        doT = load_transposed(f, do, b, h0, h1, s0, s1, out=dox[0:f.Dv])
    elif grouped:
        qT = [nl.ndarray((f.D, nh, s1 - s0), dtype=f.dtype, buffer=nl.sbuf)]
        doT = [nl.ndarray((f.Dv, nh, s1 - s0), dtype=f.dtype, buffer=nl.sbuf)]
    else:
        qT = load_transposed(f, q, b, h0, h1, s0, s1)        # [[dc, nh, rows]] per head-dim piece
        doT = load_transposed(f, do, b, h0, h1, s0, s1)      # [[dvc, nh, rows]]
    q_rows = nl.ndarray((P, nt, nh, f.D), dtype=f.dtype, buffer=nl.sbuf)
    do_rows = nl.ndarray((P, nt, nh, f.Dv), dtype=f.dtype, buffer=nl.sbuf)
    o_rows = nl.ndarray((P, nt, nh, f.Dv), dtype=f.dtype, buffer=nl.sbuf)
    prod = nl.ndarray((P, nt, nh, f.Dv), dtype=nl.float32, buffer=nl.sbuf)
    di = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)
    # -lse first: every exp needs it (a small transfer)
    neg_lse = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)
    load_lse(lse, neg_lse, b, h0, h1, s0, s1)
    nisa.tensor_scalar(dst=neg_lse, data=neg_lse, op0=nl.multiply, operand0=-1.0, engine=nisa.engine.gpsimd)
    neg_di = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)   # -D_i: a ScalarE bias
    kside0 = None
    for ta, tb in groups:
        ra, rb = ta * P, min(f.Sq, tb * P)
        ga, gb = ta - t0, tb - t0
        if ta > t0 and kside0 is None:
            # key block 0 right after the first group: the first tiles need nothing more
            kside0 = _load_kside(f, plan, bal, tensors, b, hk0, hk1, 0, min(f.Sk, plan.kb))
        if grouped:
            load_transposed(f, q, b, h0, h1, ra, rb, out=qT[0][:, :, ra - s0:rb - s0])
            load_transposed(f, do, b, h0, h1, ra, rb, out=doT[0][:, :, ra - s0:rb - s0])
        _load_rows(f, q, b, h0, h1, ra, rb, f.D, out=q_rows[:, ga:gb])
        _load_rows(f, do, b, h0, h1, ra, rb, f.Dv, out=do_rows[:, ga:gb])
        _load_rows(f, o, b, h0, h1, ra, rb, f.Dv, out=o_rows[:, ga:gb])
        # D_i = rowsum(dO ⊙ O) in fp32: one multiply (GpSimd) and one reduce per group
        nisa.tensor_tensor(dst=prod[:, ga:gb], data1=do_rows[:, ga:gb], data2=o_rows[:, ga:gb], op=nl.multiply,
                           engine=nisa.engine.gpsimd)
        nisa.tensor_reduce(dst=di[:, ga:gb], op=nl.add, data=prod[:, ga:gb], axis=3)
        bal.charge(vector_cycles=(gb - ga) * nh * f.Dv + bal.costs.vector_instr_cycles)
        bal.charge_gpsimd(2 * (gb - ga) * nh * f.Dv + bal.costs.gpsimd_instr_cycles)
        nisa.tensor_scalar(dst=neg_di[:, ga:gb], data=di[:, ga:gb], op0=nl.multiply, operand0=-1.0,
                           engine=nisa.engine.gpsimd)
    if plan.folded:
        # rows D..D+2 of Qᵀ: -lse / scale, rows Dv..Dv+2 of dOᵀ: -D_i, as exact bf16 triples
        inv = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)
        # -lse / scale as -lse * (1 / scale): NKI's ISA has no divide operator (the "Supported
        # Math Operators for NKI ISA" table, nki.api.shared; nki.language lists divide as not
        # supported)
        nisa.tensor_scalar(dst=inv, data=neg_lse, op0=nl.multiply, operand0=1.0 / f.scale,
                           engine=nisa.engine.gpsimd)
        _fold_rows(f, inv, qx, f.D, nt, nh, s0, s1)
        _fold_rows(f, neg_di, dox, f.Dv, nt, nh, s0, s1)
        qT, doT = [qx], [dox]
    # dQ partial sums (fp32); with a single key block the one eviction writes dQ itself
    dq_acc = nl.ndarray((P, nt, nh, f.D), dtype=dq.dtype if plan.n_kb == 1 else nl.float32, buffer=nl.sbuf)
    qside = (qT, doT, q_rows, do_rows, (di, neg_di), neg_lse, dq_acc)
    # ---- key blocks
    kb = plan.kb
    last = c == plan.n_chunks - 1
    for j in range(plan.n_kb):
        k0 = j * kb
        k1 = min(f.Sk, k0 + kb)
        if f.causal and k0 >= s1:
            # no row of the chunk sees these keys; keys no query row sees (k0 >= Sq) get
            # dK = dV = 0 when the last chunk passes them
            if last and k0 >= f.Sq:
                _zero_kv(f, tensors, b, hk0, hk1, k0, k1)
            continue
        # the scratch holds earlier chunks' sums of this block once one of them saw it
        seen_before = c > 0 and (not f.causal or k0 < s0)
        kside = kside0 if j == 0 and kside0 is not None else _load_kside(f, plan, bal, tensors, b, hk0, hk1, k0, k1)
        # one chunk: the block's dK, dV of every kv head of the unit staged, one store each
        staged = None
        if plan.n_chunks == 1:
            kt = cdiv(k1 - k0, P)
            staged = (nl.ndarray((P, kt, hk1 - hk0, f.D), dtype=dk.dtype, buffer=nl.sbuf),
                      nl.ndarray((P, kt, hk1 - hk0, f.Dv), dtype=dv.dtype, buffer=nl.sbuf))
        for a0 in range(hk0, hk1, plan.kv_batch):
            a1 = min(hk1, a0 + plan.kv_batch)
            _kv_batch(f, plan, bal, tensors, b, hk0, a0, a1, t0, t1, k0, k1, key_bias, c, j,
                      seen_before, qside, kside, staged)
        if staged is not None:
            store_rows(f, dk, staged[0], b, hk0, hk1, k0, k1)
            store_rows(f, dv, staged[1], b, hk0, hk1, k0, k1)
    # ---- dQ = scale · Σ dS·K, one rounding into the output dtype
    dq_sb = dq_acc
    if plan.n_kb > 1:
        dq_sb = nl.ndarray((P, nt, nh, f.D), dtype=dq.dtype, buffer=nl.sbuf)
        nisa.activation(dst=dq_sb, op=nl.copy, data=dq_acc, scale=f.scale)
        bal.charge(scalar_cycles=nt * nh * f.D + bal.costs.scalar_instr_cycles)
    store_rows(f, dq, dq_sb, b, h0, h1, s0, s1)


def _load_kside(f, plan, bal, tensors, b, hk0, hk1, k0, k1):
    """Kᵀ, Vᵀ (lists of pieces, or the extended ring tiles in folded mode) and K rows
    [128, kt, kv heads, D] of keys k0:k1 of kv heads hk0:hk1."""
    q, k, v, o, do, lse, mask, dq, dk, dv, scratch, base, ring = tensors
    if plan.folded:
        # the next ring slot: rows D..D+2 (Dv..Dv+2) hold ones since the launch began
        kx, vx = ring[bal.next_slot()]
        nkv = hk1 - hk0
        load_transposed(f, k, b, hk0, hk1, k0, k1, out=kx[0:f.D, 0:nkv, 0:k1 - k0])
        load_transposed(f, v, b, hk0, hk1, k0, k1, out=vx[0:f.Dv, 0:nkv, 0:k1 - k0])
        kT, vT = [kx], [vx]
    else:
        kT = load_transposed(f, k, b, hk0, hk1, k0, k1)        # [[dc, nkv, n]]
        vT = load_transposed(f, v, b, hk0, hk1, k0, k1)        # [[dvc, nkv, n]]
    return kT, vT, _load_rows(f, k, b, hk0, hk1, k0, k1, f.D)


def _kv_batch(f, plan, bal, tensors, b, hk0, a0, a1, t0, t1, k0, k1, key_bias, c, j, seen_before,
              qside, kside, staged):
    """Keys k0:k1 of kv heads a0:a1 (their dK | dV accumulators in one PSUM tile) against the
    chunk's query tiles t0:t1 of their query heads."""
    q, k, v, o, do, lse, mask, dq, dk, dv, scratch, base, ring = tensors
    qT, doT, q_rows, do_rows, di, neg_lse, dq_acc = qside
    kT, vT, k_rows = kside
    n = k1 - k0
    kt = cdiv(n, P)
    na = a1 - a0
    W = f.D + f.Dv
    # one slot of plan.kv_slot >= W columns per (key tile, kv head): no slot across a PSUM bank
    kv_acc = nl.ndarray((P, plan.kt, plan.kv_batch, plan.kv_slot), dtype=nl.float32, buffer=nl.psum)
    started = 0          # key tiles of kv_acc a matmul has initialised
    valid = 0            # keys any query row of the chunk sees (causal: grows with the tile)
    hq0 = (a0 - hk0) * f.G                  # first query head of the batch, unit-relative
    nq = na * f.G
    for t in range(t0, t1):
        q0 = t * P
        r = min(P, f.Sq - q0)
        m = min(n, q0 + r - k0) if f.causal else n       # causal: keys after the tile's last row
        if m <= 0:
            continue
        shared = None if f.mask_per_head else tile_bias(f, mask, b, 0, q0, r, k0, k0 + m, key_bias)
        diag = causal_diagonal(base, q0, k0, m) if f.causal_only else None
        for g0 in range(0, nq, plan.head_batch):
            g1 = min(nq, g0 + plan.head_batch)
            _head_batch(f, plan, bal, qside, kside, kv_acc, a0 - hk0, mask, b, hk0, hq0 + g0, hq0 + g1, t - t0,
                        q0, r, k0, m, key_bias, shared, diag, started, j == 0)
        started = max(started, cdiv(m, P))
        valid = max(valid, m)
    _finish_kv(f, plan, bal, tensors, b, a0, a1, k0, k1, kv_acc[:, 0:kt, 0:na, 0:W], valid, c, seen_before,
               None if staged is None else staged + (a0 - hk0,))


def _head_batch(f, plan, bal, qside, kside, kv_acc, ka0, mask, b, hk0, u0, u1, tl, q0, r, k0, m,
                key_bias, shared, diag, started, dq_first):
    """Query heads u0:u1 (unit-relative) of query tile tl against m keys: per head S, dP, P,
    dS and the dV, dK matmuls; the heads' dSᵀ in one PSUM tile (one copy out) and their dQ
    in one PSUM tile (one accumulation into dq_acc)."""
    qT, doT, q_rows, do_rows, di, neg_lse, dq_acc = qside
    kT, vT, k_rows = kside
    kt = cdiv(m, P)
    nu = u1 - u0
    h_first = hk0 * f.G                     # absolute index of unit-relative head 0
    # dSᵀ by DMA transposes (SBUF -> SBUF) for a planned share of the head batches (16-bit;
    # folded mode only with several key blocks: attention_bwd_plan._dst_dma_share), else
    # TensorE transposes into PSUM and one copy out
    by_dma = bal.use_dma(nu, r, m)
    ds_all = nl.ndarray((P, plan.head_batch, plan.kb), dtype=f.dtype, buffer=nl.sbuf) if by_dma else None
    tp = None if by_dma else nl.ndarray((P, plan.head_batch * plan.kt, P), dtype=f.dtype, buffer=nl.psum)
    for u in (range(u0, u1, FOLD_PAIR) if plan.folded else ()):
        _heads_folded(f, plan, bal, qT, doT, q_rows, do_rows, kT, vT, kv_acc, tl,
                      list(range(u, min(u1, u + FOLD_PAIR))), ka0, r, m, started, tp, u0,
                      None if ds_all is None else ds_all[:, u - u0:min(u1, u + FOLD_PAIR) - u0, :])
    for u in (() if plan.folded else range(u0, u1)):
        kv = u // f.G                       # unit-relative kv head
        bias = tile_bias(f, mask, b, h_first + u, q0, r, k0, k0 + m, key_bias) if f.mask_per_head else shared
        _head(f, plan, bal, qT, doT, q_rows, do_rows, di, neg_lse, kT, vT, kv_acc, tl, u, kv,
              kv - ka0, q0, k0, r, m, bias, diag, started,
              None if by_dma else tp[:, (u - u0) * plan.kt:(u - u0 + 1) * plan.kt, :],
              None if ds_all is None else ds_all[:, u - u0, :])
    dsT = nl.ndarray((P, plan.head_batch * plan.kt, P), dtype=f.dtype, buffer=nl.sbuf)
    if by_dma:
        _dma_transpose_p(ds_all[:, 0:nu, :], dsT.reshape((P, plan.head_batch, plan.kt, P))[:, 0:nu], r, m)
    else:
        # dSᵀ of every head of the batch out of PSUM in one copy; rows of a tail key tile
        # past m hold stale data the dQ matmuls never read
        copy_on(dsT[:, 0:nu * plan.kt, :r], tp[:, 0:nu * plan.kt, :r],
                bal.pick(*bal.copy_cycles(nu * plan.kt * r, f.itemsize == 2)))
    dqp = nl.ndarray((P, plan.head_batch, f.D), dtype=nl.float32, buffer=nl.psum)
    for u in range(u0, u1):
        kv = u // f.G
        for i in range(kt):
            kc = min(P, m - i * P)
            nisa.nc_matmul(dst=dqp[:r, u - u0, :], stationary=dsT[:kc, (u - u0) * plan.kt + i, :r],
                           moving=k_rows[:kc, i, kv, :], accumulate=i > 0)
    acc = dq_acc[:r, tl, u0:u1, :]
    if plan.n_kb == 1:
        # the only block: dQ = scale · dS·K, rounded into the output dtype
        if bal.pick(*bal.copy_cycles(nu * f.D, False)) == nisa.engine.vector:
            nisa.tensor_scalar(dst=acc, data=dqp[:r, 0:nu, :], op0=nl.multiply, operand0=f.scale)
        else:
            nisa.activation(dst=acc, op=nl.copy, data=dqp[:r, 0:nu, :], scale=f.scale)
    elif dq_first:
        copy_on(acc, dqp[:r, 0:nu, :], bal.pick(*bal.copy_cycles(nu * f.D, False)))
    else:
        nisa.tensor_tensor(dst=acc, data1=dqp[:r, 0:nu, :], data2=acc, op=nl.add)
        bal.charge(vector_cycles=nu * f.D + bal.costs.vector_instr_cycles)


def _head(f, plan, bal, qT, doT, q_rows, do_rows, di, neg_lse, kT, vT, kv_acc, tl, u, kv, ka, q0, k0, r, m,
          bias, diag, started, tp, ds_out=None):
    """One query head u (unit-relative; kv head kv of the unit, ka of the kv batch) of query
    tile tl against m keys: S, dP, P, dS, dV and dK (kv_acc: key tiles < ``started``
    accumulate, later ones are initialised by the first query head of the kv head's group
    and accumulated by the others) and dSᵀ into ``tp`` ([128, kt, 128] PSUM)."""
    kt = cdiv(m, P)
    later_in_group = u % f.G != 0
    # S and dP in PSUM, [128, kb] fp32 each (rows :r), two tiles: S's buffer is free for the
    # next head once the exp has read it, before dS reads dP
    s_ps = nl.ndarray((P, plan.kb), dtype=nl.float32, buffer=nl.psum)
    dp_ps = nl.ndarray((P, plan.kb), dtype=nl.float32, buffer=nl.psum)
    rows = slice(tl * P, tl * P + r)
    _contract(s_ps[:r, 0:m], [t[:, u, rows] for t in qT], [t[:, kv, 0:m] for t in kT])
    _contract(dp_ps[:r, 0:m], [t[:, u, rows] for t in doT], [t[:, kv, 0:m] for t in vT])
    sd = (s_ps, dp_ps)
    # P = exp(scale·S + mask - lse) (matmul dtype)
    p = nl.ndarray((P, plan.kb), dtype=f.dtype, buffer=nl.sbuf)
    nlse = neg_lse[:r, tl, u:u + 1]
    if bias is None and diag is not None and diag[0] < m:
        # causal, no user mask: one exp over every column, then GpSimd zeroes the columns
        # past each row's diagonal (a select, so a large exp there never reaches P)
        c = diag[0]
        nisa.activation(dst=p[:r, 0:m], op=nl.exp, data=sd[0][:r, 0:m], bias=nlse, scale=f.scale)
        nisa.affine_select(dst=p[:r, c:m], pattern=[[-1, m - c]], channel_multiplier=1, on_true_tile=p[:r, c:m],
                           on_false_value=0.0, cmp_op=nl.greater_equal, offset=q0 - k0 - c)
        bal.charge(scalar_cycles=m + bal.costs.scalar_instr_cycles)
        bal.charge_gpsimd(m - c + bal.costs.gpsimd_pattern_cycles)     # startup included
        cu, cb = m, None
    else:
        cu, cb = (0, bias) if bias is not None else (diag if diag is not None else (m, None))
    if bias is None and diag is not None and diag[0] < m:
        pass
    elif cu:
        nisa.activation(dst=p[:r, 0:cu], op=nl.exp, data=sd[0][:r, 0:cu], bias=nlse, scale=f.scale)
    if cu < m:
        z = nl.ndarray((P, plan.kb), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=z[:r, 0:m - cu], data=sd[0][:r, cu:m], op0=nl.multiply,
                                  operand0=f.scale, op1=nl.add, operand1=cb[:r, 0:m - cu])
        nisa.activation(dst=p[:r, cu:m], op=nl.exp, data=z[:r, 0:m - cu], bias=nlse)
        bal.charge(vector_cycles=(m - cu) + bal.costs.vector_instr_cycles)    # S in PSUM: one pass
    if not (bias is None and diag is not None and diag[0] < m):
        bal.charge(scalar_cycles=m + bal.costs.scalar_instr_cycles * (1 + (0 < cu < m)))
    # dS = (dP - D_i) ⊙ P
    ds = nl.ndarray((P, plan.kb), dtype=f.dtype, buffer=nl.sbuf) if ds_out is None else ds_out
    _ds(bal, ds[:r, 0:m], sd[1][:r, 0:m], di[0][:r, tl, u:u + 1], di[1][:r, tl, u:u + 1], p[:r, 0:m], m)
    # dV += Pᵀ·dO, dK += dSᵀ·Q (PSUM accumulation over the chunk), per 128-key tile
    for i in range(kt):
        c0, kc = i * P, min(P, m - i * P)
        nisa.nc_matmul(dst=kv_acc[:kc, i, ka, f.D:f.D + f.Dv], stationary=p[:r, c0:c0 + kc],
                       moving=do_rows[:r, tl, u, :], accumulate=i < started or later_in_group)
        nisa.nc_matmul(dst=kv_acc[:kc, i, ka, 0:f.D], stationary=ds[:r, c0:c0 + kc],
                       moving=q_rows[:r, tl, u, :], accumulate=i < started or later_in_group)
    # dSᵀ by 128x128 TensorE transposes
    for i in range(kt if tp is not None else 0):
        c0, kc = i * P, min(P, m - i * P)
        nisa.nc_transpose(dst=tp[:kc, i, :r], data=ds[:r, c0:c0 + kc])


def _heads_folded(f, plan, bal, qx, dox, q_rows, do_rows, kx, vx, kv_acc, tl, us, ka0, r, m, started, tp, u0,
                  ds_out=None):
    """Folded mode (plan.folded: bf16, no mask, not causal): query heads ``us`` (one to
    FOLD_PAIR) of query tile tl against m keys, their scores side by side in one PSUM tile
    ([128, FOLD_PAIR, kb] fp32, two banks; dP'' in another).
    S'' = [Qᵀ; -lse/scale]ᵀ·[Kᵀ; 1] = S - lse/scale and dP'' = [dOᵀ; -D_i]ᵀ·[Vᵀ; 1] = dP - D_i
    come out of TensorE (the extra contraction rows: exact bf16 triples, _fold_rows), so
    P = exp(scale·S'') is one ScalarE instruction for the heads with no bias, and
    dS = P ⊙ dP'' one VectorE instruction with one input in PSUM (one pass). ``ds_out``: the
    head batch's SBUF dS rows [128, len(us), kb] when its dSᵀ goes by DMA (``tp`` is None)."""
    n = len(us)
    kt = cdiv(m, P)
    rows = slice(tl * P, tl * P + r)
    s2 = nl.ndarray((P, FOLD_PAIR, plan.kb), dtype=nl.float32, buffer=nl.psum)
    dp2 = nl.ndarray((P, FOLD_PAIR, plan.kb), dtype=nl.float32, buffer=nl.psum)
    for j, u in enumerate(us):
        kv = u // f.G
        nisa.nc_matmul(dst=s2[:r, j, 0:m], stationary=qx[0][:, u, rows], moving=kx[0][:, kv, 0:m])
        nisa.nc_matmul(dst=dp2[:r, j, 0:m], stationary=dox[0][:, u, rows], moving=vx[0][:, kv, 0:m])
    p = nl.ndarray((P, FOLD_PAIR, plan.kb), dtype=f.dtype, buffer=nl.sbuf)
    nisa.activation(dst=p[:r, 0:n, 0:m], op=nl.exp, data=s2[:r, 0:n, 0:m], scale=f.scale)
    ds = nl.ndarray((P, FOLD_PAIR, plan.kb), dtype=f.dtype, buffer=nl.sbuf) if ds_out is None else ds_out
    nisa.tensor_tensor(dst=ds[:r, 0:n, 0:m], data1=dp2[:r, 0:n, 0:m], data2=p[:r, 0:n, 0:m], op=nl.multiply)
    bal.charge(vector_cycles=n * m + bal.costs.vector_instr_cycles, scalar_cycles=n * m + bal.costs.scalar_instr_cycles)
    for j, u in enumerate(us):
        ka = u // f.G - ka0
        acc = lambda i: i < started or u % f.G != 0   # noqa: E731  (see _head)
        for i in range(kt):
            c0, kc = i * P, min(P, m - i * P)
            nisa.nc_matmul(dst=kv_acc[:kc, i, ka, f.D:f.D + f.Dv], stationary=p[:r, j, c0:c0 + kc],
                           moving=do_rows[:r, tl, u, :], accumulate=acc(i))
            nisa.nc_matmul(dst=kv_acc[:kc, i, ka, 0:f.D], stationary=ds[:r, j, c0:c0 + kc],
                           moving=q_rows[:r, tl, u, :], accumulate=acc(i))
        for i in range(kt if tp is not None else 0):
            c0, kc = i * P, min(P, m - i * P)
            nisa.nc_transpose(dst=tp[:kc, (u - u0) * plan.kt + i, :r], data=ds[:r, j, c0:c0 + kc])


def _fold_rows(f, x, tile, d, nt, nh, s0, s1):
    """Rows d..d+2 of ``tile`` [d+3, nh, rows] = hi, mid, lo: three bf16 values summing
    exactly to x (fp32 [128, nt, nh], rows on partitions; attention_blocks.bf16_triple, on
    GpSimd), put on those partitions by one DMA transpose per query tile."""
    hml = nl.ndarray((P, nt, nh, FOLD_ROWS), dtype=f.dtype, buffer=nl.sbuf)
    rest = nl.ndarray((P, nt, nh), dtype=nl.float32, buffer=nl.sbuf)
    hi, mid, lo = (hml[:, :, :, i:i + 1].reshape((P, nt, nh)) for i in range(FOLD_ROWS))
    bf16_triple(x, hi, mid, lo, rest)
    for t in range(nt):
        r = min(P, s1 - s0 - t * P)
        nisa.dma_transpose(dst=tile[d:d + FOLD_ROWS, :, t * P:t * P + r], src=hml[:r, t], axes=(2, 1, 0))


def _ones_ring(f, plan):
    """FOLD_RING pairs of extended Kᵀ / Vᵀ tiles ([D+3, kv_group, kb], [Dv+3, ...]) whose
    last three rows are ones, used by the key blocks in turn (one block loads while the
    previous one computes). The ones come from one small GpSimd memset of a [3, 1, kb]
    tile spread over the kv heads by one SBUF->SBUF DMA per tile (a memset of every head
    would hold GpSimd kv_group x kb cycles at the start of the launch)."""
    ones = nl.ndarray((FOLD_ROWS, 1, plan.kb), dtype=f.dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0, engine=nisa.engine.gpsimd)
    spread = ones.broadcast(1, plan.kv_group)
    ring = []
    for _ in range(FOLD_RING):
        kx = nl.ndarray((f.D + FOLD_ROWS, plan.kv_group, plan.kb), dtype=f.dtype, buffer=nl.sbuf)
        vx = nl.ndarray((f.Dv + FOLD_ROWS, plan.kv_group, plan.kb), dtype=f.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kx[f.D:f.D + FOLD_ROWS], src=spread)
        nisa.dma_copy(dst=vx[f.Dv:f.Dv + FOLD_ROWS], src=spread)
        ring.append((kx, vx))
    return ring


def _ds(bal, ds, dp, di, neg_di, p, m):
    """ds = (dP - D_i) ⊙ P, rounded once into the matmul dtype, on the engines the running
    estimate says are least loaded (BwdBalance.pick_ds): VectorE alone (one instruction,
    two full inputs, dP from PSUM), or ScalarE takes dP - D_i out of PSUM (-D_i as its
    bias, fp32) and GpSimd multiplies by P in SBUF. Both compute the same fp32 values, so
    the result does not depend on the choice (LNC=1 and LNC=2 runs agree bit for bit)."""
    if bal.pick_ds(m) == 0:
        nisa.scalar_tensor_tensor(dst=ds, data=dp, op0=nl.subtract, operand0=di, op1=nl.multiply, operand1=p)
        return
    r = ds.shape[0]
    dpm = nl.ndarray((P, m), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dpm[:r], op=nl.copy, data=dp, bias=neg_di)
    nisa.tensor_tensor(dst=ds, data1=dpm[:r], data2=p, op=nl.multiply, engine=nisa.engine.gpsimd)


def _finish_kv(f, plan, bal, tensors, b, a0, a1, k0, k1, kv_acc, valid, c, seen_before, staged=None):
    """dK | dV of kv heads a0:a1, keys k0:k1 out of PSUM (kv_acc [128, kt, heads, D + Dv];
    keys valid.. no row of the chunk saw: 0): to the outputs (one chunk), else summed
    through the fp32 scratch (the first chunk that sees the block writes it, later ones
    read-add it, the last chunk writes the outputs)."""
    q, k, v, o, do, lse, mask, dq, dk, dv, scratch, base, ring = tensors
    n = k1 - k0
    kt = cdiv(n, P)
    na = a1 - a0
    W = f.D + f.Dv
    last = c == plan.n_chunks - 1
    if plan.n_chunks == 1 and valid == n:
        src = kv_acc
    else:
        part = nl.ndarray((P, kt, na, W), dtype=nl.float32, buffer=nl.sbuf)
        vf, vt = valid // P, valid % P
        if seen_before:
            _load_rows(f, scratch, b, a0, a1, k0, k1, W, out=part)
            if vf:
                nisa.tensor_tensor(dst=part[:, 0:vf], data1=kv_acc[:, 0:vf], data2=part[:, 0:vf], op=nl.add)
            if vt:
                nisa.tensor_tensor(dst=part[:vt, vf], data1=kv_acc[:vt, vf], data2=part[:vt, vf], op=nl.add)
        else:
            if valid < n:
                nisa.memset(dst=part, value=0.0, engine=nisa.engine.gpsimd)
            if vf:
                nisa.tensor_copy(dst=part[:, 0:vf], src=kv_acc[:, 0:vf], engine=nisa.engine.vector)
            if vt:
                nisa.tensor_copy(dst=part[:vt, vf], src=kv_acc[:vt, vf], engine=nisa.engine.vector)
        # one pass each (kv_acc in PSUM), one instruction per full-tile run and tail
        bal.charge(vector_cycles=(vf + (vt > 0)) * na * W + ((vf > 0) + (vt > 0)) * bal.costs.vector_instr_cycles)
        if not last:
            store_rows(f, scratch, part, b, a0, a1, k0, k1)
            return
        src = part
    if staged is None:
        dk_sb = nl.ndarray((P, kt, na, f.D), dtype=dk.dtype, buffer=nl.sbuf)
        dv_sb = nl.ndarray((P, kt, na, f.Dv), dtype=dv.dtype, buffer=nl.sbuf)
        j0 = 0
    else:
        dk_sb, dv_sb, j0 = staged        # the unit's [128, kt, kv heads, d] tiles, kv head a0 at j0
    nisa.activation(dst=dk_sb[:, 0:kt, j0:j0 + na, :], op=nl.copy, data=src[:, :, :, 0:f.D], scale=f.scale)
    copy_on(dv_sb[:, 0:kt, j0:j0 + na, :], src[:, :, :, f.D:W], bal.pick(*bal.copy_cycles(kt * na * f.Dv, False)))
    bal.charge(scalar_cycles=kt * na * f.D + bal.costs.scalar_instr_cycles)
    if staged is None:
        store_rows(f, dk, dk_sb, b, a0, a1, k0, k1)
        store_rows(f, dv, dv_sb, b, a0, a1, k0, k1)


def _zero_kv(f, tensors, b, a0, a1, k0, k1):
    """dK = dV = 0 for kv heads a0:a1, keys k0:k1 (causal: keys after the last query row)."""
    q, k, v, o, do, lse, mask, dq, dk, dv, scratch, base, ring = tensors
    kt = cdiv(k1 - k0, P)
    z = nl.ndarray((P, kt, a1 - a0, max(f.D, f.Dv)), dtype=dk.dtype, buffer=nl.sbuf)
    nisa.memset(dst=z, value=0.0, engine=nisa.engine.gpsimd)
    store_rows(f, dk, z[:, :, :, 0:f.D], b, a0, a1, k0, k1)
    store_rows(f, dv, z[:, :, :, 0:f.Dv], b, a0, a1, k0, k1)


# ------------------------------------------------------------------------------ helpers

def _contract(dst, a_pieces, b_pieces):
    """dst = Σ over head-dim pieces of a_pieceᵀ·b_piece (TensorE, PSUM accumulation)."""
    for i, (a, bb) in enumerate(zip(a_pieces, b_pieces)):
        nisa.nc_matmul(dst=dst, stationary=a, moving=bb, accumulate=i > 0)


def _load_rows(facts, src, b, h0, h1, s0, s1, d, out=None):
    """[128, tiles, h1-h0, d] SBUF tile of src[b, h0:h1, s0:s1] (row s0 + 128 t + p at
    partition p of tile t): one DMA for the full tiles, one for a tail."""
    n = s1 - s0
    nt = cdiv(n, P)
    if out is None:
        out = nl.ndarray((P, nt, h1 - h0, d), dtype=src.dtype, buffer=nl.sbuf)
    full = n // P
    if full:
        nisa.dma_copy(dst=out[:, 0:full], src=facts.tiles(src, b, h0, h1, s0, s0 + full * P))
    if n > full * P:
        nisa.dma_copy(dst=out[:n - full * P, full], src=facts.rows(src, b, h0, h1, s0 + full * P, s1))
    return out

