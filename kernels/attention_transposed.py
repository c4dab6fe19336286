"""The transposed-scores attention path: P is made directly as Pᵀ, with no Pᵀ transposes
or PSUM copies of P (bf16, no mask, not causal, D <= 125, Dv <= 128, Sk <= 384, or Sk <= 768
with at least 4 query heads per core; see ``LaunchFacts.transposed_scores``).

Per query tile and batch of heads: S = Q·Kᵀ side by side in PSUM (a bank of heads at a time)
and VectorE reduces for the row maxes m (raw units); GpSimd splits m into bf16 hi + mid + lo
(exactly m) and one DMA transpose puts them on partitions D..D+2 of Qᵀ; TensorE computes Sᵀ
= [Kᵀ; -1; -1; -1]ᵀ·[Qᵀ; hi; mid; lo] = (S - m)ᵀ per 128-key tile (fp32 accumulation), and
ScalarE Pᵀ = exp(scale·Sᵀ) with no per-partition bias, so one exp covers the batch's heads
and every key tile of a PSUM group (all of them up to 256 keys: _ts_st_group). bf16
products are exact in fp32, so accumulated in the order of S = Q·Kᵀ the max element gives
exactly 0 and every other exp argument is <= 0: no overflow whatever the logits' size. Pᵀ
is the stationary operand of P·[V | 1], accumulated over the key tiles in PSUM.
"""

import nki.isa as nisa
import nki.language as nl

from .attention_blocks import (bf16_triple, evict, load_transposed, load_values, pv, row_extrema_side_by_side,
                               scores_side_by_side, store_rows)
from .attention_launch import P, PSUM_BANK_FP32, PSUM_BANKS, TS_EXTRA_ROWS, grouped_st_rows
from .attention_lse import LseStage
from .engine_costs import active as active_engine_costs
from .tiling import cdiv

# Heads per batch: at most 6, within _ts_heads' PSUM limits (a 128-row tile fits 4: Sᵀ of
# one key tile for all heads in one bank). 6 lets a short tail tile (r <= 85, e.g. ViT's
# 69 rows) share one exp among 6 heads instead of 4: fewer fixed costs on ScalarE
# (modeled trn2 LNC=2: ViT-B 43.4 us with 4, 42.8 with 6; ViT-L 54.6 / 54.1; 8 models as
# 6). It was 4 from 2026-11-29, when the cost model's fixed costs per instruction were
# not yet grounded in measurements and more heads on tail tiles modeled slower.
TS_MAX_HEADS = 6
# PSUM of one batch, up to TS_ONE_ST_KEY_TILES key tiles (attention_launch): the scores S
# of its heads, TS_ST_TILES tiles of Sᵀ (nkc banks each: the previous batch's may still be
# live) and TS_O_BANKS bank of outputs, within PSUM_BANKS.
TS_ST_TILES = 2
TS_O_BANKS = 1
# Longer rows: S of at most one bank of heads at a time (one head over cdiv(Sk, 512) banks
# past 512 keys), Sᵀ in groups of key tiles, one exp per group (_ts_st_group), and one bank
# of outputs, each allocation site rotating this many buffers (docs/cost-model.md
# "Buffers") within PSUM_BANKS. Until session 61 three key tiles (257-384 keys) took one
# Sᵀ tile of 3 banks, which kept one buffer, so each batch's Sᵀ matmuls waited for the
# previous batch's exp: modeled, us, LNC=2, B=8 H=16 S=257 D=64 trn2 124.9 -> 108.3, trn3
# 124.9 -> 105.9 with groups of 2 + 1; B=8 H=12 S=257 D=96 trn2 108.0 -> 100.6, trn3
# 107.1 -> 93.1 (outputs unchanged). Past 512 keys (S two banks) groups of 2 left a site
# one buffer: trn2 B=2 H=16 S=729 D=72 151.6 us against 127.0 with groups of 1; at B=4 H=12
# S=449 D=64 groups of 2 model 77.0 against 80.2 with 1.
TS_SITE_BUFFERS = 2
# Kᵀ tiles used in turn, so one group's Kᵀ load overlaps the previous group's work.
TS_KEY_TILES = 2


class TransposedKeys(nl.NKIObject):
    """The persistent Kᵀ tiles of a transposed-scores launch: TS_KEY_TILES SBUF tiles
    [D+3, kv_group, Sk] (matmul dtype) used in turn, rows D..D+2 = -1.

    Rows D..D+2 come from one small GpSimd memset of a [3, 1, Sk] tile on partitions 0..2,
    moved to partitions D..D+2 and spread over the kv heads by an SBUF->SBUF DMA on each
    tile's first use (a memset of every head would cost GpSimd kv_group x Sk cycles on 2
    lanes at the start of the launch; an engine could write partitions D..D+2 only for D a
    multiple of 32)."""

    def __init__(self, facts):
        D = facts.D
        self.D = D
        self.kv_group = facts.kv_group
        self.uses = 0
        minus_ones = nl.ndarray((TS_EXTRA_ROWS, 1, facts.Sk), dtype=facts.dtype, buffer=nl.sbuf)
        nisa.memset(dst=minus_ones, value=-1.0, engine=nisa.engine.gpsimd)
        self.minus_ones = minus_ones
        self.tiles = []
        for _ in range(TS_KEY_TILES):
            self.tiles.append(nl.ndarray((D + TS_EXTRA_ROWS, facts.kv_group, facts.Sk),
                                         dtype=facts.dtype, buffer=nl.sbuf))

    def next_tile(self):
        """(kx, first_use): the next Kᵀ tile in turn, and whether its -1 rows are unwritten."""
        kx = self.tiles[self.uses % len(self.tiles)]
        self.uses += 1
        return kx, self.uses <= len(self.tiles)

    def write_minus_ones(self, kx):
        """Rows D..D+2 of kx = -1 (one SBUF->SBUF DMA)."""
        D = self.D
        nisa.dma_copy(dst=kx[D:D + TS_EXTRA_ROWS], src=self.minus_ones.broadcast(1, self.kv_group))


def transposed_scores_group(facts, plan, tensors, b, hk0, hk1, tiles, key_bias, last):
    """Attention of batch b, kv heads hk0:hk1 and their query heads for query tiles
    tiles = (t0, t1) (no mask: key_bias None; ``last``: the program's last unit).

    Kᵀ goes into the next TransposedKeys tile; the -1 rows of a tile's first use are
    written after the loads the first scores wait for (Kᵀ, then Qᵀ of the first chunk,
    loaded before V).  The launch's last query tile stores each batch of heads as soon as
    it is done (a short tail); the program's last unit normalises its outputs on VectorE,
    which runs out of work first (ScalarE still has the exps), so the tail is short."""
    f = facts
    h0, h1 = hk0 * f.G, hk1 * f.G
    kx, first_use = tensors.ts_keys.next_tile()
    kT = kx[:, 0:hk1 - hk0, :]                                   # [D+3, kv heads, Sk]
    load_transposed(f, tensors.k, b, hk0, hk1, 0, f.Sk, out=kT[0:f.D])
    qT_first = _load_q_extended(f, tensors.q, b, h0, h1, tiles[0] * P,
                                min(f.Sq, min(tiles[1], tiles[0] + f.q_chunk) * P))
    if first_use:
        tensors.ts_keys.write_minus_ones(kx)
    vals = load_values(f, tensors.v, b, hk0, hk1, 0, f.Sk)      # [128, key tiles, kv heads, Dv+1]
    for t0 in range(tiles[0], tiles[1], f.q_chunk):
        t1 = min(tiles[1], t0 + f.q_chunk)
        s0, s1 = t0 * P, min(f.Sq, t1 * P)
        qT = qT_first if t0 == tiles[0] else _load_q_extended(f, tensors.q, b, h0, h1, s0, s1)
        o_sb = nl.ndarray((P, t1 - t0, h1 - h0, f.Dv), dtype=tensors.out.dtype, buffer=nl.sbuf)
        stage = None if tensors.lse is None else LseStage(t1 - t0, h1 - h0)   # return_lse
        s_first = s0
        for t in range(t0, t1):
            q0 = t * P
            r = min(P, f.Sq - q0)
            last_tile = last and t == tiles[1] - 1

            def store(j0, j1, t=t, q0=q0, r=r):
                # the launch's last tile: each batch of heads stored as soon as it is done
                nisa.dma_copy(dst=f.rows(tensors.out, b, h0 + j0, h0 + j1, q0, q0 + r),
                              src=o_sb[:r, t - t0, j0:j1, :])

            _ts_tile(f, plan, qT[:, :, q0 - s0:q0 - s0 + r], kT, vals, h0, h1, hk0,
                     o_sb[:r, t - t0, :, :], r, f.Sk, last=last_tile,
                     on_vector=last, store=store if last_tile else None,
                     lse=None if stage is None else (stage, t - t0))
            if last_tile:
                s1 = q0                        # rows q0.. already stored
        if s1 > s0:
            store_rows(f, tensors.out, o_sb, b, h0, h1, s0, s1)
        if stage is not None:
            stage.store(tensors.lse, b, h0, s_first, min(f.Sq, t1 * P))


def _load_q_extended(facts, q, b, h0, h1, s0, s1):
    """[D+3, h1-h0, s1-s0] SBUF tile with Qᵀ of rows s0:s1 in rows 0:D (rows D..D+2: hi,
    mid, lo of the row max, written per tile by _ts_hilo)."""
    qT = nl.ndarray((facts.D + TS_EXTRA_ROWS, h1 - h0, s1 - s0), dtype=facts.dtype, buffer=nl.sbuf)
    load_transposed(facts, q, b, h0, h1, s0, s1, out=qT[0:facts.D])
    return qT


def _ts_heads(n, r, w):
    """Heads per batch: Sᵀ of one key tile for all of them fits a PSUM bank (m·r <= 512, at
    most TS_MAX_HEADS); up to TS_ONE_ST_KEY_TILES key tiles at most as many as S of all of
    them would fit beside TS_ST_TILES Sᵀ tiles and TS_O_BANKS output bank (S itself is made
    one bank at a time, _ts_tile, and the cap still models best); for longer rows at most as
    many as one bank of outputs O | rowsum holds (``w`` = Dv + 1 columns each: TS_O_BANKS in
    _ts_st_group's budget)."""
    if grouped_st_rows(n):
        return max(1, min(TS_MAX_HEADS, PSUM_BANK_FP32 // r, PSUM_BANK_FP32 // w))
    per_bank = max(1, PSUM_BANK_FP32 // n)
    s_banks = PSUM_BANKS - TS_O_BANKS - TS_ST_TILES * cdiv(n, P)
    return max(1, min(TS_MAX_HEADS, PSUM_BANK_FP32 // r, per_bank * s_banks))


def _ts_st_group(n):
    """Key tiles per Sᵀ PSUM tile, each group one exp: all of a row's up to
    TS_ONE_ST_KEY_TILES; for longer rows the banks left beside S (one bank of heads, or one
    head's row over cdiv(n, 512) banks) and TS_O_BANKS output bank, every site at
    TS_SITE_BUFFERS buffers: 2 key tiles up to 512 keys, 1 beyond (to 1024 keys; the launch
    takes up to attention_launch.TS_MAX_KEY_TILES)."""
    if not grouped_st_rows(n):
        return cdiv(n, P)
    return PSUM_BANKS // TS_SITE_BUFFERS - cdiv(n, PSUM_BANK_FP32) - TS_O_BANKS


def _ts_hilo(facts, ext, qx, j0, j1, r):
    """Rows D, D+1, D+2 of qx[:, j0:j1, :r] = hi, mid, lo: three bf16 values whose sum is
    exactly ext (attention_blocks.bf16_triple, on GpSimd), transposed onto those
    partitions by one DMA transpose. Exact, so the max score of
    a row gives Sᵀ - m = 0 and exp never overflows (two terms, exact to ~2^-17 relative,
    overflowed for scaled logits of ~1e7). ext: [128, heads] fp32 SBUF row maxes."""
    nj, D = j1 - j0, facts.D
    hml = nl.ndarray((P, nj, TS_EXTRA_ROWS), dtype=facts.dtype, buffer=nl.sbuf)
    hi, mid, lo = (hml[:r, :, i:i + 1].reshape((r, nj)) for i in range(TS_EXTRA_ROWS))
    rest = nl.ndarray((P, nj), dtype=nl.float32, buffer=nl.sbuf)
    bf16_triple(ext[:r, j0:j1], hi, mid, lo, rest[:r])
    nisa.dma_transpose(dst=qx[D:D + TS_EXTRA_ROWS, j0:j1, :], src=hml[:r], axes=(2, 1, 0))


def _ts_tile(facts, plan, qx, kx, vals, h0, h1, hk0, out, r, n, last, on_vector, store, lse=None):
    """Attention of every head of a group for one query tile, P made directly as Pᵀ.

    1. per batch of heads, S = Q·Kᵀ side by side in PSUM and one VectorE reduce for the row
       maxes m, one PSUM bank of heads at a time (a row longer than a bank: one head at a
       time, over cdiv(n, 512) banks); hi + mid + lo = m onto partitions D..D+2 of Qᵀ
       (_ts_hilo: per batch on the launch's first and last tiles, else once for all heads);
    2. per batch of heads, Sᵀ = [Kᵀ; -1; -1; -1]ᵀ·[Qᵀ; hi; mid; lo] = (S - m)ᵀ per key tile
       [128 keys, key tiles, heads · r] fp32 PSUM, Pᵀ = exp(scale·Sᵀ) by one ScalarE
       instruction per group of key tiles (_ts_st_group: all of them up to 256 keys),
       O | rowsum = P·[V | 1], then evict (on VectorE if ``last`` or ``on_vector``) and
       ``store`` (if given) of the batch's heads.
    One function: the last batch's S stays allocated through step 2, as the PSUM budget
    of _ts_heads counts it.  ``qx``: [D+3, heads, r] view of Qᵀ; ``kx``: [D+3, kv heads,
    Sk] with rows D..D+2 = -1; ``out``: [r, heads, Dv] SBUF output rows; ``lse``: (LseStage,
    tile) receiving the row statistics (return_lse)."""
    nh, D = h1 - h0, facts.D
    nb = _ts_heads(n, r, facts.Dv + 1)
    nkc = cdiv(n, P)
    group = _ts_st_group(n)
    kvs = [hq // facts.G - hk0 for hq in range(h0, h1)]
    per_batch_hilo = plan.hilo_per_batch(last)
    ext = nl.ndarray((P, nh), dtype=nl.float32, buffer=nl.sbuf)       # row max per head
    # S for the row maxes one PSUM bank at a time (the heads one bank holds), so S rotates
    # through two banks beside Sᵀ's two tiles and O's: the batch's whole S in one tile (3
    # banks with 6 heads) kept one buffer within PSUM's 8 banks, and every row max waited
    # for the previous one's (modeled trn2 LNC=2, ViT-B 47.4 -> 42.8 us)
    per_s = max(1, PSUM_BANK_FP32 // n)
    for b0 in range(0, nh, nb):
        m = min(nb, nh - b0)
        for s0 in range(b0, b0 + m, per_s):
            ms = min(per_s, b0 + m - s0)
            s, per_bank, _ = scores_side_by_side(
                [([qx[0:D, s0 + j, :]], [kx[0:D, kvs[s0 + j], 0:n]]) for j in range(ms)], r, n)
            row_extrema_side_by_side(facts, s, ext[:, s0:s0 + ms], ms, per_bank, r, n)
            plan.charge(ms * n + active_engine_costs().vector_instr_cycles * cdiv(ms, per_bank), 0)
        if per_batch_hilo:
            _ts_hilo(facts, ext, qx, b0, b0 + m, r)
    if not per_batch_hilo:
        _ts_hilo(facts, ext, qx, 0, nh, r)
    if lse is not None:
        lse[0].put_scaled_max(lse[1], 0, ext[:r, 0:nh], r, facts.scale)
    plan.ts_tile_done()
    w = facts.Dv + 1
    per_o = PSUM_BANK_FP32 // w
    for b0 in range(0, nh, nb):
        m = min(nb, nh - b0)
        pT = nl.ndarray((P, nkc, m, P), dtype=facts.dtype, buffer=nl.sbuf)
        for c0 in range(0, nkc, group):
            c1 = min(nkc, c0 + group)
            st = nl.ndarray((P, c1 - c0, PSUM_BANK_FP32), dtype=nl.float32, buffer=nl.psum)   # Sᵀ
            for c in range(c0, c1):
                kc = min(P, n - c * P)
                for j in range(m):
                    nisa.nc_matmul(dst=st[:kc, c - c0, j * r:(j + 1) * r],
                                   stationary=kx[:, kvs[b0 + j], c * P:c * P + kc], moving=qx[:, b0 + j, :])
            # one exp over the group's key tiles (lanes kc..127 of a tail key tile hold stale
            # PSUM values: exp runs on them, and P·V never reads those lanes of Pᵀ)
            nisa.activation(dst=pT[:, c0:c1, :, :r], op=nl.exp,
                            data=st[:, 0:c1 - c0, 0:m * r].reshape((P, c1 - c0, m, r)), scale=facts.scale)
            plan.charge(0, (c1 - c0) * m * r + active_engine_costs().scalar_instr_cycles)
        o = nl.ndarray((P, cdiv(m, per_o), PSUM_BANK_FP32), dtype=nl.float32, buffer=nl.psum)
        for j in range(m):
            pv(o[:r, j // per_o, (j % per_o) * w:(j % per_o + 1) * w], pT[:, :, j, :], vals,
               kvs[b0 + j], r, n)
        evict(facts, plan, o, out[:, b0:b0 + m, :], m, r, vector=last or on_vector,
              rowsum=None if lse is None else lse[0].rowsum_view(lse[1], b0, m, r))
        if store is not None:
            store(b0, b0 + m)
