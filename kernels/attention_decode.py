"""The decode attention path: a few query rows per head against many keys, with the keys
on the 128 partitions (``LaunchFacts.decode``: 16-bit data, one query head per kv head, at
most DECODE_MAX_ROWS query rows (masked: DECODE_MASKED_MAX_ROWS within
DECODE_MASKED_WIDE_SCORES), no causal flag (any mask: key padding or per row), D <= 128;
beyond DECODE_RESIDENT_KEYS keys one pair at a time with Kᵀ streamed, within
DECODE_STREAM_BYTES).

Why: the other paths put a query tile's rows on the partitions. At decode a tile holds 1-64
live rows (Sq = 1, or the G query heads of a kv head folded into its rows by the op layer),
so every VectorE / ScalarE pass over a score row [r, Sk] runs Sk cycles on r of the 128
lanes. Here the scores are made transposed, Sᵀ [128 keys, rows], so each pass runs Sk·r/128
cycles on all lanes. AWS's decode kernel (nki-library core/attention/attention_tkg.py)
makes the same choice: keys on partitions, the max by a reduce, a TensorE transpose and a
second reduce, the exp after a VectorE subtraction.

Per batch of ``pb`` (batch, head) pairs, n = Sq rows each, T = ceil(Sk / 128) key tiles
(blocked when Sk is a multiple of 128: partition p holds keys p·T .. p·T + T - 1, so V and
the mask move as one contiguous run per partition; else tile t holds keys 128 t + p):
    DMA      Kᵀ [D, Sk] by DMA transposes, one batch ahead of V; Qᵀ and the key-padding
             rows of every pair of the core once, after the first batch's keys; V [128, T,
             Dv] per pair (two halves when each stays >= 4 KiB per partition); outputs.
    TensorE  Sᵀ_t = K_t·Qᵀ [128, n] per (pair, key tile) (stationary Kᵀ_t, moving Qᵀ), a
             PSUM bank of them at a time; unblocked mask rows transposed to [128, T]; the
             per-lane maxima transposed to rows; the row max broadcast back to 128 lanes;
             O = P·V and the row sums P·1 (stationary Pᵀ_t [128, n]) per pair.
    VectorE  x = scale·Sᵀ out of PSUM into SBUF fp32 [128, pb, T, n]; the per-lane max over
             the key tiles; the max of the 128 lanes; x - m (m broadcast over lanes and
             tiles); the eviction of O / rowsum (attention_blocks.evict).
    GpSimd   the mask (or the -inf of padded keys) added to x; memsets.
    ScalarE  Pᵀ = exp(x - m) into SBUF (matmul dtype), one instruction per batch of pairs.
With more than DECODE_RESIDENT_KEYS keys and an odd number of pairs at LNC=2, the last
pair splits its keys over the two cores and the halves' partial results are combined
(_split_pair_scores, _finish_split_pair); each core takes half of the other pairs.
x - m is exactly 0 at each row's max (m is one of x's fp32 values), so no exp overflows
whatever the logits' size. A row whose keys are all masked has m = -inf, clamped to
-FLT_MAX: its exps are 0, its row sum 0, and the eviction's TINY floor makes the row 0 (as
torch's SDPA).
"""

import nki.isa as nisa
import nki.language as nl

from .attention_blocks import FLT_MAX, divide, evict, load_transposed
from .attention_launch import DECODE_RESIDENT_KEYS, KEY_BLOCK, NEG_INF, P, PSUM_BANK_FP32, decode_stream_key_tiles
from .tiling import DMA_SATURATING_BYTES, cdiv

# SBUF of one batch of pairs, per partition: Kᵀ and V (16-bit), x (fp32) and Pᵀ; two
# batches are in flight (the next one's loads overlap this one's compute), 128 KiB of
# trn2's 224 KiB per partition in all.
DECODE_BATCH_BYTES = 64 * 1024
# At most this many V DMAs per pair (long streamed pairs: P·V follows V in 8 steps).
V_MAX_PARTS = 8
# PSUM banks of outputs O | rowsum per batch of pairs (each bank holds 512 // (Dv + 1)
# pairs' [n, Dv + 1]).
DECODE_O_BANKS = 2


def decode_pair_bytes(facts):
    """SBUF bytes per partition one (batch, head) pair takes in a batch of pairs."""
    T = cdiv(facts.Sk, P)
    n = facts.Sq
    isz = facts.itemsize
    row_mask = facts.mask_rows * 4 if facts.mask_kind == "full" else 0   # fp32 rows of a per-row mask
    return T * (P * isz + facts.Dv * isz + n * (4 + isz) + row_mask)


def decode_batch_sizes(facts, pairs):
    """Pairs per batch, in order, for ``pairs`` pairs on this core: batches of as many as
    DECODE_BATCH_BYTES, the 128 rows of the transposed maxima and DECODE_O_BANKS of
    outputs allow."""
    if facts.Sk > DECODE_RESIDENT_KEYS:
        return [1] * pairs                      # streamed keys: one pair at a time
    per_o = PSUM_BANK_FP32 // (facts.Dv + 1)
    most = max(1, min(DECODE_BATCH_BYTES // decode_pair_bytes(facts), P // facts.Sq,
                      per_o * DECODE_O_BANKS))
    batches = cdiv(pairs, most)
    pb = cdiv(pairs, batches)
    return [min(pb, pairs - i) for i in range(0, pairs, pb)]


def decode_attention(facts, plan, tensors, units):
    """Decode attention for this program's work ``units`` (attention_work.program_units:
    whole (batch, head) pairs, every query row), in batches of pairs."""
    split = None
    if nl.num_programs() == 2 and facts.B * facts.Hkv % 2 == 1 and facts.Sk > DECODE_RESIDENT_KEYS:
        # an odd number of pairs with streamed keys: each core takes half of the others and
        # half of the last pair's keys (the cores' loads stay even)
        every = [(b, h) for b in range(facts.B) for h in range(facts.Hkv)]
        split, whole = every[-1], len(every) - 1
        core = nl.program_id(0)
        pairs = every[core * whole // 2:(core + 1) * whole // 2]
    else:
        pairs = [(b, h) for (b, h0, h1, _t0, _t1) in units for h in range(h0, h1)]
    # DMA order with a split pair: its keys, the first whole pair's keys, its values (its
    # softmax, exchange and combination overlap the whole pairs' streams), then theirs
    ones = nl.ndarray((P, 1), dtype=facts.dtype, buffer=nl.sbuf)   # moving operand of the row sums
    nisa.memset(dst=ones, value=1.0, engine=nisa.engine.gpsimd)
    split_state = _split_pair_scores(facts, tensors, split) if split is not None else None
    state = _start_pairs(facts, tensors, pairs) if pairs else None
    if split is not None:
        _finish_split_pair(facts, plan, tensors, split, split_state, ones)
    if pairs:
        _decode_pairs(facts, plan, tensors, pairs, state, ones)


def _start_pairs(facts, tensors, pairs):
    """The first loads of whole ``pairs`` on this core (see _decode_pairs): (sizes, starts,
    qT, bias, tail_bias, the first batch's Kᵀ or the first pair's scores)."""
    sizes = decode_batch_sizes(facts, len(pairs))
    tail_bias = _tail_bias(facts) if facts.mask_kind is None else None
    qT = nl.ndarray((facts.D, len(pairs), facts.Sq), dtype=facts.dtype, buffer=nl.sbuf)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    # Kᵀ one batch ahead of V (resident) or one pair's scores ahead (streamed): DMA order K0,
    # (queries, masks), K1, V0, K2, V1, ... so a batch's softmax is done when its V arrives
    # and only the last P·V follows the stream
    streamed = facts.Sk > DECODE_RESIDENT_KEYS
    next_keys = None if streamed else _load_keys(facts, tensors, pairs[0:sizes[0]])
    # Qᵀ and the mask rows of every pair of this core, once, after the first batch's keys:
    # small transfers (each costs a DMA transfer gap), not needed before the first score
    # matmul, and between later batches' K / V streams they would stall it
    for j0, j1 in _runs(pairs):
        nisa.dma_transpose(dst=qT[:, j0:j1, :], src=_run_rows(facts, tensors.q, pairs, j0, j1, 0, facts.Sq),
                           axes=(2, 1, 0))
    bias = _key_bias(facts, tensors.mask, pairs) if facts.mask_kind == "key" else None
    # streamed keys: the next pair's scores (its Kᵀ stream) one pair ahead of this pair's V
    next_scores = _pair_scores(facts, tensors, pairs, 0, qT) if streamed else None
    return sizes, starts, qT, bias, tail_bias, next_keys, next_scores


def _decode_pairs(facts, plan, tensors, pairs, state, ones):
    """Decode attention of whole ``pairs`` on this core, in batches, from _start_pairs'
    ``state``."""
    sizes, starts, qT, bias, tail_bias, next_keys, next_scores = state
    streamed = facts.Sk > DECODE_RESIDENT_KEYS
    for i, (p0, size) in enumerate(zip(starts, sizes)):
        kT, x = next_keys, next_scores
        if i + 1 < len(sizes):
            if streamed:
                next_scores = _pair_scores(facts, tensors, pairs, starts[i + 1], qT)
            else:
                next_keys = _load_keys(facts, tensors, pairs[starts[i + 1]:starts[i + 1] + sizes[i + 1]])
        _decode_batch(facts, plan, tensors, pairs, p0, p0 + size, qT, kT, x, bias, tail_bias, ones)


def _split_pair_scores(facts, tensors, pair):
    """This core's half of a split ``pair``: (keys, qT, x) with x its scores (its Kᵀ stream);
    _finish_split_pair does the rest."""
    core = nl.program_id(0)
    half = cdiv(cdiv(facts.Sk, P), 2) * P
    keys = (0, half) if core == 0 else (half, facts.Sk)
    pairs = [pair]
    qT = nl.ndarray((facts.D, 1, facts.Sq), dtype=facts.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=qT, src=_run_rows(facts, tensors.q, pairs, 0, 1, 0, facts.Sq), axes=(2, 1, 0))
    return keys, qT, _pair_scores(facts, tensors, pairs, 0, qT, keys)


def _finish_split_pair(facts, plan, tensors, pair, state, ones):
    """One (batch, head) ``pair`` on both cores of an LNC=2 launch (batch-1 decode with one kv
    head per launch, or the last of an odd number of pairs): each core takes half of the keys (a multiple of 128 on core 0) and
    makes its partial O | rowsum and row max m (FlashAttention's split-KV decoding); the
    cores swap their partials with one sendrecv (nki.isa.sendrecv, NKI 0.7: "sends its src
    tile to the dst location of the target NeuronCore ... while simultaneously receiving")
    and core 0 combines them: m = max(m0, m1), O = O0·exp(m0 - m) + O1·exp(m1 - m) and the
    row sums alike, then O / rowsum. AWS's attention_tkg shards its keys over the two cores
    the same way when the batch cannot be split."""
    core = nl.program_id(0)
    Dv, n = facts.Dv, facts.Sq
    keys, qT, x = state
    pairs = [pair]
    bias = _key_bias(facts, tensors.mask, pairs, keys) if facts.mask_kind == "key" else None
    tail_bias = _tail_bias(facts, keys[1] - keys[0]) if facts.mask_kind is None else None
    o, m = _decode_batch(facts, plan, tensors, pairs, 0, 1, qT, None, x, bias, tail_bias, ones, keys)
    # partial [n, Dv + 2] fp32: O | rowsum | m
    part = nl.ndarray((n, Dv + 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=part[:, 0:Dv + 1], src=o[:n, 0, 0:Dv + 1], engine=nisa.engine.vector)
    nisa.tensor_copy(dst=part[:, Dv + 1:Dv + 2], src=m, engine=nisa.engine.gpsimd)
    other = nl.ndarray((n, Dv + 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.sendrecv(src=part, dst=other, send_to_rank=1 - core, recv_from_rank=1 - core, pipe_id=0)
    if core != 0:
        return
    # weights exp(m_c - max(m0, m1)) of the two partials ([n, 2]; m >= -FLT_MAX, so no NaN)
    both = nl.ndarray((n, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=both[:, 0:1], src=part[:, Dv + 1:Dv + 2], engine=nisa.engine.gpsimd)
    nisa.tensor_copy(dst=both[:, 1:2], src=other[:, Dv + 1:Dv + 2], engine=nisa.engine.gpsimd)
    mx = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=both, axis=1)
    nisa.tensor_tensor(dst=both, data1=both, data2=mx.broadcast(1, 2), op=nl.subtract)
    nisa.activation(dst=both, op=nl.exp, data=both)
    raw = nl.ndarray((n, Dv + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=raw, data=part[:, 0:Dv + 1], op0=nl.multiply, operand0=both[:, 0:1])
    nisa.scalar_tensor_tensor(dst=raw, data=other[:, 0:Dv + 1], op0=nl.multiply, operand0=both[:, 1:2],
                              op1=nl.add, operand1=raw)
    res = nl.ndarray((n, Dv), dtype=facts.dtype, buffer=nl.sbuf)
    divide(facts, res, raw, n)
    nisa.dma_copy(dst=_run_rows(facts, tensors.out, pairs, 0, 1, 0, n), src=res.expand_dim(1))


def _pair_scores(facts, tensors, pairs, p, qT, keys=None):
    """x [128, 1, T, n] fp32 = scale·Sᵀ of pair p (its keys k0:k1, default all), its Kᵀ
    streamed (_streamed_scores)."""
    k0, k1 = keys if keys is not None else (0, facts.Sk)
    T = cdiv(k1 - k0, P)
    x = nl.ndarray((P, 1, T, facts.Sq), dtype=nl.float32, buffer=nl.sbuf)
    _streamed_scores(facts, tensors, x, pairs[p], qT[:, p, :], k1 - k0 == T * P, k0)
    return x


def _resident_scores(facts, x, kT, qT, blocked):
    """x [128, pb, T, n] = scale·Sᵀ from the batch's resident Kᵀ, a PSUM bank of (pair, key
    tile) items at a time (items of several pairs share a bank: fewer evictions)."""
    _, pb, T, n = x.shape
    x_items = x.reshape((P, pb * T * n))
    per_bank = PSUM_BANK_FP32 // n
    items = pb * T
    for i0 in range(0, items, per_bank):
        i1 = min(items, i0 + per_bank)
        st = nl.ndarray((P, per_bank * n), dtype=nl.float32, buffer=nl.psum)
        for i in range(i0, i1):
            j, t = i // T, i % T
            c = (i - i0) * n
            keys = kT[:, j, t::T] if blocked else kT[:, j, t * P:(t + 1) * P]
            nisa.nc_matmul(dst=st[:, c:c + n], stationary=keys, moving=qT[:, j, :])
        nisa.tensor_scalar(dst=x_items[:, i0 * n:i1 * n], data=st[:, 0:(i1 - i0) * n], op0=nl.multiply,
                           operand0=facts.scale)


def _streamed_scores(facts, tensors, x, pair, qT, blocked, k0=0):
    """x [128, 1, T, n] = scale·Sᵀ of one pair with its Kᵀ streamed in blocks of
    decode_stream_key_tiles key tiles (a rotating [D, tiles, 128] SBUF buffer, one DMA
    transpose each, DECODE_STREAM_BLOCK_BYTES where its caps allow), a PSUM bank of key
    tiles per block. Blocked keys: the block of tiles t0:t1 holds keys p·T + t
    (partition p of the key tile), so its DMA reads rows t0:t1 of K viewed [128, T, D]."""
    b, h = pair
    D = facts.D
    T, n = x.shape[2], x.shape[3]
    Sk = min(facts.Sk - k0, T * P)                            # this range's keys: k0 .. k0 + Sk
    per_block = decode_stream_key_tiles(D, facts.itemsize, n)
    rows = facts.rows(tensors.k, b, h, h + 1, k0, k0 + Sk)    # [Sk, 1, D]
    for t0 in range(0, T, per_block):
        t1 = min(T, t0 + per_block)
        kb = nl.ndarray((D, per_block, P), dtype=facts.dtype, buffer=nl.sbuf)
        if blocked:
            nisa.dma_transpose(dst=kb[:, 0:t1 - t0, :], src=rows.reshape((P, T, D))[:, t0:t1, :], axes=(2, 1, 0))
        else:
            r0, r1 = t0 * P, min(Sk, t1 * P)
            flat = kb.reshape((D, 1, per_block * P))
            if r1 < t1 * P:                                    # the last tile's padding keys: 0
                nisa.memset(dst=flat[:, :, r1 - r0:(t1 - t0) * P], value=0.0, engine=nisa.engine.gpsimd)
            nisa.dma_transpose(dst=flat[:, :, 0:r1 - r0], src=rows[r0:r1], axes=(2, 1, 0))
        st = nl.ndarray((P, per_block * n), dtype=nl.float32, buffer=nl.psum)
        for t in range(t0, t1):
            c = (t - t0) * n
            nisa.nc_matmul(dst=st[:, c:c + n], stationary=kb[:, t - t0, :], moving=qT)
        nisa.tensor_scalar(dst=x[:, 0, t0:t1, :], data=st[:, 0:(t1 - t0) * n].reshape((P, t1 - t0, n)),
                           op0=nl.multiply, operand0=facts.scale)


def _load_keys(facts, tensors, pairs):
    """Kᵀ [D, pairs, T*128] SBUF (matmul dtype) of ``pairs``: DMA transposes of up to
    KEY_BLOCK keys, the padding keys of a partial last tile 0."""
    Sk = facts.Sk
    T = cdiv(Sk, P)
    kT = nl.ndarray((facts.D, len(pairs), T * P), dtype=facts.dtype, buffer=nl.sbuf)
    if Sk < T * P:
        nisa.memset(dst=kT[:, :, Sk:T * P], value=0.0, engine=nisa.engine.gpsimd)
    for j, (b, h) in enumerate(pairs):
        for k0 in range(0, Sk, KEY_BLOCK):
            k1 = min(Sk, k0 + KEY_BLOCK)
            load_transposed(facts, tensors.k, b, h, h + 1, k0, k1, out=kT[:, j:j + 1, k0:k1])
    return kT


def _tail_bias(facts, sk=None):
    """[128, 1] fp32 SBUF: 0 on the partitions of the last key tile that hold keys, -inf on
    the padding ones (None when the ``sk`` keys, default Sk, are a multiple of 128)."""
    tail = (facts.Sk if sk is None else sk) % P
    if tail == 0:
        return None
    tb = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=tb, value=NEG_INF, engine=nisa.engine.gpsimd)
    nisa.memset(dst=tb[:tail], value=0.0, engine=nisa.engine.gpsimd)
    return tb


def _decode_batch(facts, plan, tensors, all_pairs, p0, p1, qT_all, kT, x, bias, tail_bias, ones, keys=None):
    """Pairs p0:p1 of this core's ``all_pairs``; ``qT_all`` [D, pairs, n] their Qᵀ; either
    kT, their resident Kᵀ (_load_keys), or x, the scores of a streamed pair (_pair_scores);
    ``bias`` (rows, first row) of _key_bias or None. ``keys`` (k0, k1): only those keys
    (a core's half of a split pair): returns (O | rowsum [128, 1, 512] fp32 PSUM, the row
    max m [n, 1] fp32 SBUF) instead of storing the output."""
    pairs = all_pairs[p0:p1]
    k0, k1 = keys if keys is not None else (0, facts.Sk)
    Dv, Sk, n = facts.Dv, k1 - k0, facts.Sq
    T = cdiv(Sk, P)
    full = Sk // P
    pb = len(pairs)
    N = pb * n                                  # rows of the batch (<= 128)
    # Which key sits where. Blocked (Sk a multiple of 128): partition p holds keys
    # p·T .. p·T + T - 1, so each partition's V (and mask) is one contiguous HBM run; key
    # tile t is the strided Kᵀ columns t, t + T, ... Else tile t holds keys 128 t + p.
    blocked = full == T

    # a per-row mask: this batch's rows, before its V on the DMA queues
    row_bias = _row_bias(facts, tensors.mask, pairs, (k0, k1)) if facts.mask_kind == "full" else None

    # ---- x = scale·Sᵀ [128, pb, T, n] fp32 (a streamed pair's is made one pair ahead)
    if x is None:
        x = nl.ndarray((P, pb, T, n), dtype=nl.float32, buffer=nl.sbuf)
        _resident_scores(facts, x, kT, qT_all[:, p0:p1, :], blocked)
    # ---- V [128, pb, T, Dv] (after the scores in program order: streamed keys go first on
    # the DMA queues): each pair's in parts of >= 4 KiB per partition (_v_parts), so P·V of
    # the first part runs while the next arrives (the last pair's P·V is what the DMA
    # stream cannot hide)
    vals = nl.ndarray((P, pb, T, Dv), dtype=facts.dtype, buffer=nl.sbuf)
    runs = _runs(pairs)
    for j, (b, h) in enumerate(pairs):
        if blocked:
            # key p·T + t at partition p, slot t: T·Dv contiguous elements per partition
            src = facts.rows(tensors.v, b, h, h + 1, k0, k1).reshape((P, T, Dv))
            for t0, t1 in _v_parts(facts, T):
                nisa.dma_copy(dst=vals[:, j, t0:t1], src=src[:, t0:t1])
            continue
        for t0, t1 in _v_parts(facts, full):
            nisa.dma_copy(dst=vals[:, j, t0:t1, :].expand_dim(2),
                          src=facts.tiles(tensors.v, b, h, h + 1, k0 + t0 * P, k0 + t1 * P))
        if Sk > full * P:
            nisa.dma_copy(dst=vals[:Sk - full * P, j, full:T, :],
                          src=facts.rows(tensors.v, b, h, h + 1, k0 + full * P, k1))

    if bias is not None:
        bias, lo = bias
        if bias.shape[1] == len(all_pairs):            # one mask row per pair, in order
            rows = bias[:, p0:p1, :]
            nisa.tensor_tensor(dst=x, data1=x, data2=rows.expand_dim(3).broadcast(3, n), op=nl.add,
                               engine=nisa.engine.gpsimd)
        else:
            for j, (b, _h) in enumerate(pairs):
                row = (b if facts.mask_batches > 1 else 0) - lo
                nisa.tensor_tensor(dst=x[:, j], data1=x[:, j], data2=bias[:, row].expand_dim(2).broadcast(2, n),
                                   op=nl.add, engine=nisa.engine.gpsimd)
    elif row_bias is not None:
        # mask row s % Sm for query row s: the Sm rows repeat n // Sm times (the op's fold of
        # a kv head's query heads, whose positions share one mask)
        sm = facts.mask_rows
        rows = row_bias.reshape((P, pb, sm, T)).permute((0, 1, 3, 2))          # [128, pb, T, Sm]
        xr = x.reshape((P, pb, T, n // sm, sm))
        nisa.tensor_tensor(dst=xr, data1=xr, data2=rows.expand_dim(3).broadcast(3, n // sm), op=nl.add,
                           engine=nisa.engine.gpsimd)
    elif tail_bias is not None:
        last = x[:, :, T - 1, :]
        nisa.tensor_tensor(dst=last, data1=last, data2=tail_bias.expand_dim(2).broadcast(1, pb).broadcast(2, n),
                           op=nl.add, engine=nisa.engine.gpsimd)

    # ---- row max m: per lane over the key tiles, then over the 128 lanes (transposed)
    lane_max = nl.ndarray((P, pb, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=lane_max, op=nl.maximum, data=x.permute((0, 1, 3, 2)), axis=3)
    lane_max_t = nl.ndarray((N, P), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=lane_max_t, data=lane_max.reshape((P, N)))
    m = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m, op=nl.maximum, data=lane_max_t, axis=1)
    if facts.guard_empty_rows:
        # an all-masked row: -inf - (-FLT_MAX) = -inf below, not -inf - (-inf) = NaN
        nisa.tensor_scalar(dst=m, data=m, op0=nl.maximum, operand0=-FLT_MAX)
    # m on every lane: the transpose of the [N, 128] broadcast of the column
    m_lanes = nl.ndarray((P, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=m_lanes, data=m.broadcast(1, P))

    # ---- Pᵀ = exp(x - m) (matmul dtype)
    nisa.tensor_tensor(dst=x, data1=x, data2=m_lanes.reshape((P, pb, n)).expand_dim(2).broadcast(2, T),
                       op=nl.subtract)
    pT = nl.ndarray((P, pb, T, n), dtype=facts.dtype, buffer=nl.sbuf)
    nisa.activation(dst=pT, op=nl.exp, data=x)

    # ---- O | rowsum = P·[V | 1] per pair, side by side in PSUM; O / rowsum; store
    w = Dv + 1
    per_o = PSUM_BANK_FP32 // w
    o = nl.ndarray((P, cdiv(pb, per_o), PSUM_BANK_FP32), dtype=nl.float32, buffer=nl.psum)
    # A streamed pair's many key tiles (pb = 1): Oᵀ = V_tᵀ·P_t [Dv, n] (stationary V_t, 64
    # TensorE cycles a tile against 128 + for O = P_t·V_t with the n-row Pᵀ stationary), then
    # one transpose back; the row sums stay P_tᵀ·1 into column Dv.
    values_stationary = kT is None and Dv <= P
    for j in range(pb):
        c = (j % per_o) * w
        o_t = nl.ndarray((Dv, n), dtype=nl.float32, buffer=nl.psum) if values_stationary else None
        for t in range(T):
            kc = min(P, Sk - t * P) if not blocked else P
            if values_stationary:
                nisa.nc_matmul(dst=o_t, stationary=vals[:kc, j, t, :], moving=pT[:kc, j, t, :], accumulate=t > 0)
            else:
                # O in columns :Dv, the row sum of the same rounded P in column Dv
                nisa.nc_matmul(dst=o[:n, j // per_o, c:c + Dv], stationary=pT[:kc, j, t, :],
                               moving=vals[:kc, j, t, :], accumulate=t > 0)
            nisa.nc_matmul(dst=o[:n, j // per_o, c + Dv:c + w], stationary=pT[:kc, j, t, :], moving=ones[:kc],
                           accumulate=t > 0)
        if values_stationary:
            o_t_sb = nl.ndarray((Dv, n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o_t_sb, src=o_t, engine=nisa.engine.vector)
            nisa.nc_transpose(dst=o[:n, j // per_o, c:c + Dv], data=o_t_sb)
    if keys is not None:
        return o, m
    res = nl.ndarray((P, pb, Dv), dtype=facts.dtype, buffer=nl.sbuf)
    # VectorE normalises (the row sums' reciprocals and one multiply from PSUM), not the
    # engine the launch's VectorE / ScalarE balance points to: the balance sees neither
    # GpSimd's share of the other path (ScalarE copies the bank, GpSimd scales it) nor that
    # this eviction ends the batch's chain. With the balance, trn2's VectorE at 150 cycles
    # (the refit of 2026-12-06) sent these evictions to ScalarE + GpSimd; modeled trn2 LNC=2,
    # VectorE is as fast or faster on every decode shape of the side-by-side table (0 to -5 %
    # central; B=8 H=4/1kv S=4096 32.3 -> 31.3 us) and on the main job's Llama decode row
    # (108.5 -> 107.3 us).
    evict(facts, plan, o, res[:n], pb, n, vector=True)
    for j0, j1 in runs:                                # one store per run
        nisa.dma_copy(dst=_run_rows(facts, tensors.out, pairs, j0, j1, 0, n), src=res[:n, j0:j1, :])


def _v_parts(facts, n):
    """Key-tile ranges of one pair's V DMAs for n tiles: as many parts (up to V_MAX_PARTS)
    as still move DMA_SATURATING_BYTES per partition each (the DMA overview's curve:
    bandwidth saturates from ~4 KiB per partition; a smaller transfer is held by the
    per-transfer gap); [] for n = 0."""
    parts = max(1, min(V_MAX_PARTS, n * facts.Dv * facts.itemsize // DMA_SATURATING_BYTES))
    cuts = [n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _runs(pairs):
    """[(j0, j1)]: the batch's pairs cut into runs of consecutive heads of one batch or of
    one head of consecutive batches (one DMA moves a run's queries or outputs)."""
    runs = []
    j0 = 0
    while j0 < len(pairs):
        b0, h0 = pairs[j0]
        j1 = j0 + 1
        while j1 < len(pairs) and pairs[j1] == (b0, h0 + j1 - j0):
            j1 += 1
        if j1 == j0 + 1:
            while j1 < len(pairs) and pairs[j1] == (b0 + j1 - j0, h0):
                j1 += 1
        runs.append((j0, j1))
        j0 = j1
    return runs


def _run_rows(facts, t, pairs, j0, j1, s0, s1):
    """HBM view [s1-s0, j1-j0, d] of rows s0:s1 of the run j0:j1's pairs in t (q or out,
    either layout)."""
    (b0, h0), (b1, h1) = pairs[j0], pairs[j1 - 1]
    if b0 == b1:
        return facts.rows(t, b0, h0, h1 + 1, s0, s1)
    if facts.layout == "bhsd":
        return t[b0:b1 + 1, h0, s0:s1, :].permute((1, 0, 2))
    return t[b0:b1 + 1, s0:s1, h0, :].permute((1, 0, 2))


def _key_bias(facts, mask, pairs, keys=None):
    """(bias, lo): bias [128, nb, T] fp32 SBUF holds the key-padding rows lo .. lo + nb - 1
    of the mask (the batch's pairs read consecutive rows) over keys k0:k1 (default all) with
    keys where x has them (_keys_on_partitions). One DMA for the rows."""
    k0, k1 = keys if keys is not None else (0, facts.Sk)
    rows_of = [b if facts.mask_batches > 1 else 0 for b, _h in pairs]
    lo, hi = rows_of[0], rows_of[-1] + 1
    bias = nl.ndarray((P, hi - lo, cdiv(k1 - k0, P)), dtype=nl.float32, buffer=nl.sbuf)
    _keys_on_partitions(bias, mask[lo:hi, k0:k1])
    return bias, lo


def _row_bias(facts, mask, pairs, keys):
    """[128, pb * Sm, T] fp32 SBUF: the per-row mask of each pair's Sm = facts.mask_rows
    mask rows (row j * Sm + s: pair j, mask row s; query row s' takes mask row s' % Sm) over
    keys k0:k1, keys where x has them. One DMA per pair (_keys_on_partitions). A folded
    launch's rows repeat per query head (LaunchFacts.mask_rows): loading the distinct ones
    moves 1 / G of the bytes in 1 / G of the runs. The DMA moves 128 · Sm runs of T fp32
    (96 B at 3072 keys), each charged a descriptor (up to 166 B at the error bar's
    pessimistic end, docs/cost-model.md "DMA"): B=4 H=8/1kv s=7 S=3072 D=64 loaded 56 rows
    per pair, 7168 runs, 2.3 us modeled central and 5.7 us pessimistic, more than the pair's
    K and V; its 7 distinct rows take 0.7 us pessimistic."""
    k0, k1 = keys
    n = facts.mask_rows
    bias = nl.ndarray((P, len(pairs) * n, cdiv(k1 - k0, P)), dtype=nl.float32, buffer=nl.sbuf)
    for j, (b, h) in enumerate(pairs):
        mb = b if facts.mask_batches > 1 else 0
        mh = h if facts.mask_heads > 1 else 0
        _keys_on_partitions(bias[:, j * n:(j + 1) * n, :], mask[mb, mh, 0:n, k0:k1])
    return bias


def _keys_on_partitions(dst, src):
    """dst [128, R, T] fp32 SBUF <- src [R, Sk] fp32 HBM mask rows, key t·128 + p (or p·T + t
    when blocked, Sk = 128 T: as x, V and Kᵀ lay them out) at [p, r, t]; -inf on the
    padding of a last partial tile. Blocked: one DMA, T contiguous values per partition and
    row. Else the rows arrive as [tiles, R, 128] (a partition per key tile, at most 128
    tiles a chunk) and are transposed on TensorE."""
    R, Sk = src.shape
    T = cdiv(Sk, P)
    full = Sk // P
    if full == T:
        nisa.dma_copy(dst=dst, src=src.reshape((R, P, T)).permute((1, 0, 2)))
        return
    for c0 in range(0, T, P):
        c1 = min(T, c0 + P)
        f1 = min(full, c1)                              # full tiles of this chunk end here
        rows = nl.ndarray((c1 - c0, R, P), dtype=nl.float32, buffer=nl.sbuf)
        if f1 < c1:
            nisa.memset(dst=rows, value=NEG_INF, engine=nisa.engine.gpsimd)
        if f1 > c0:
            nisa.dma_copy(dst=rows[0:f1 - c0], src=src[:, c0 * P:f1 * P].reshape((R, f1 - c0, P)).permute((1, 0, 2)))
        if f1 < c1:
            nisa.dma_copy(dst=rows[f1 - c0:c1 - c0, :, 0:Sk - full * P], src=src[:, full * P:Sk].expand_dim(0))
        per_bank = PSUM_BANK_FP32 // (c1 - c0)
        for i0 in range(0, R, per_bank):
            g = min(per_bank, R - i0)
            cols = nl.ndarray((P, per_bank, c1 - c0), dtype=nl.float32, buffer=nl.psum)
            for i in range(g):
                nisa.nc_transpose(dst=cols[:, i, :], data=rows[:, i0 + i, :])
            nisa.tensor_copy(dst=dst[:, i0:i0 + g, c0:c1], src=cols[:, 0:g, :], engine=nisa.engine.vector)
