"""Engine-balance planning of one attention launch: ``EngineBalance``.

Only VectorE and ScalarE read PSUM, and every softmax needs a pass over the scores on each
(the row max on VectorE, the exp on ScalarE). The remaining PSUM copies (Pᵀ blocks, output
banks) can go to either: the planner keeps a running estimate of both engines' busy time
(ns) over the launch, in issue order, and gives each copy to the one that keeps them most
even (engine_balance.VectorScalarBalance, shared with the backward). For 16-bit data it
also decides which Pᵀ transposes go to the DMA queues instead.
Estimates use the cost model's figures for the generation being built for
(engine_costs.active()); they steer speed, never results. The attention kernels charge each
VectorE instruction its whole fixed cost (``vector_instr_cycles``), not the cost left in a
stream of independent instructions (``vector_stream_cycles``, which the other kernels plan
with): most of attention's VectorE instructions wait on a TensorE or ScalarE result and
start after VectorE has idled, so its pipeline overlap does not come into play (in the
modeled trn2 LNC=2 traces of the main job's forward rows, 37-39 % of VectorE's instructions
start after an idle gap on the ViT rows, 61-63 % on the Llama rows, all in decode; 14 % on
SigLIP's). Planned with the stream figure (session 59), the main job's attention rows moved
-3.0 % (SigLIP) to +2.0 % (Llama S=2048 causal), ViT-L +1.6 %, and the ViT rows' error bars'
pessimistic ends rose (ViT-B 64.3 -> 68.0 us); with the whole fixed cost trn2 and trn3 plan
as before and trn1 (its overlap measured, 320 of 360 cycles then, of 400 since the refit of
2026-12-06) plans its attention 0.2 %
slower (geomean of the 13 main-job attention rows at LNC=1; ViT-L +2.3 %).
"""

import nki.language as nl

from .attention_launch import FP32_BYTES, P, grouped_st_rows, unbiased_heads_per_batch
from .engine_balance import VectorScalarBalance
from .engine_costs import active as active_engine_costs
from .tiling import cdiv

# _plan_dma_share searches the DMA share in steps of 1/20 of the launch's Pᵀ (5% steps: the
# first-order estimate behind it cannot tell finer ones apart)...
DMA_SHARE_STEPS = 20
# ...and keeps the smaller share unless a larger one is faster by more than float noise.
DMA_SHARE_TIE_NS = 1e-9


class EngineBalance(nl.NKIObject):
    """The forward's VectorE/ScalarE load estimates and the choices made from them.
    Mutable by design (it follows the launch's instructions in issue order), unlike
    ``LaunchFacts``. Created once per launch, before the first instruction.
    """

    def __init__(self, facts):
        self.costs = active_engine_costs()
        self.itemsize = facts.itemsize
        # the running VectorE / ScalarE estimates (engine_balance.py), spreading the share
        # (0..1) of the launch's Pᵀ made by DMA transposes (16-bit data only)
        self.loads = VectorScalarBalance(_plan_dma_share(facts, self.costs) if facts.dma_transpose else 0.0)
        # transposed-scores path: the launch's first query tile is still to come
        self.ts_first_tile = True
        # transposed-scores rows of grouped Sᵀ (several exps per batch): the row max split
        # per batch of heads on every query tile (hilo_per_batch)
        self.ts_grouped_rows = grouped_st_rows(facts.Sk)

    def charge(self, vector_cycles=0.0, scalar_cycles=0.0):
        """Account work that must run on VectorE / ScalarE (estimated cycles)."""
        self.loads.charge(vector_cycles, scalar_cycles)

    def pick(self, vector_cycles, scalar_cycles):
        """Engine for a PSUM -> SBUF copy either can do (VectorScalarBalance.pick)."""
        return self.loads.pick(vector_cycles, scalar_cycles)

    def pt_copy_cycles(self, elems):
        """(VectorE, ScalarE) cycles to copy ``elems`` per partition of Pᵀ out of PSUM: the
        passes and the fixed cost, without the model's MIN_II floor that ``copy_cycles``
        (the backward's) applies. With the floor, 12 of 128 probe launches (16
        shapes x bf16 / fp32 x causal or not x LNC 1 / 2; modeled trn2, session 68) placed
        their copies differently, 10 of them slower (up to +4.8 %: fp32 B=1 H=4/2kv Sq=5
        Sk=257 at LNC=1), geomean +0.1 %; the main job's rows did not move. Pᵀ copies under
        the floor are short rows (Sq tails), where the greedy pick does better thinking them
        cheaper."""
        c = self.costs
        sixteen = self.itemsize == 2
        rate = c.vector_psum_copy_rate(sixteen)
        return (elems / rate + c.vector_instr_cycles, elems / c.scalar_rate(sixteen) + c.scalar_instr_cycles)

    def use_dma(self):
        """Whether the next Pᵀ is made by DMA transposes: True for a share ``dma_share`` of
        the launch's successive Pᵀ, spread evenly (never for fp32: its share is 0)."""
        return self.loads.spread_share()

    def hilo_per_batch(self, last_tile):
        """Transposed scores: split the row max per batch of heads (True) or once for the
        tile. The launch's first and last tiles go per batch, so ScalarE starts early and
        the pipeline drains fast; the others once (one DMA transpose per tile), except rows
        of more than TS_ONE_ST_KEY_TILES key tiles, whose batches each take several Sᵀ
        groups and exps: there every batch's Sᵀ waits only for its own heads' maxes, and
        that work covers the batch's DMA transpose. Modeled trn2 LNC=2 (session 61, us):
        SigLIP so400m@384 127.0 -> 122.4, B=2 H=8 S=640 D=32 49.9 -> 48.1, B=8 H=16 S=257
        D=64 108.3 -> 106.8; 19 shapes geomean -0.8 %, two slower (B=4 H=12 S=257 +1.7 %,
        one head per core at 257 keys +1.1 %); trn3 -1.1 %; per batch on every tile for
        the ViT rows (two key tiles) +2.4 to +3.0 %."""
        return self.ts_first_tile or last_tile or self.ts_grouped_rows

    def ts_tile_done(self):
        """Transposed scores: a query tile's row maxes are done (the first tile is past)."""
        self.ts_first_tile = False


def _plan_dma_share(facts, costs):
    """Share of Pᵀ to transpose with the DMA engines rather than TensorE + a PSUM copy.

    A first-order estimate of where the time goes, from the shapes alone (``_launch_work``);
    the share moved to the DMA is the one that levels DMA with VectorE/ScalarE, searched
    in steps of 1/DMA_SHARE_STEPS."""
    t_io, vec, sca, pt_v, pt_s, pt_d = _launch_work(facts, costs)
    best, best_t = 0.0, None
    for i in range(DMA_SHARE_STEPS + 1):
        d = i / DMA_SHARE_STEPS
        rest = 1.0 - d
        # balanced VectorE/ScalarE time with the remaining copies split between them
        x = (sca + rest * pt_s - vec) / (pt_v + pt_s)          # share of the copies on VectorE
        x = min(rest, max(0.0, x))
        t_vs = max(vec + x * pt_v, sca + (rest - x) * pt_s)
        t = max(t_io + d * pt_d, t_vs)
        if best_t is None or t < best_t - DMA_SHARE_TIE_NS:
            best, best_t = d, t
    return best


def _launch_work(facts, costs):
    """Estimated ns of the launch: (DMA busy with q/k/v/out (+ mask), VectorE softmax work,
    ScalarE softmax work, all Pᵀ copies on VectorE, all on ScalarE, all Pᵀ by DMA)."""
    f = facts
    io = (f.B * f.Sq * f.H * (f.D + f.Dv) + f.B * f.Sk * f.Hkv * (f.D + f.Dv)) * f.itemsize
    if f.mask_kind is not None:         # the fp32 mask
        io += FP32_BYTES * (f.mask_batches * f.Sk if f.mask_kind == "key" else
                   f.mask_batches * f.mask_heads * f.Sq * f.Sk)
    c = costs
    t_io = io / c.dma_bytes_per_s * 1e9
    vec = sca = pt_v = pt_s = pt_d = 0.0
    for t in range(f.n_q_tiles):
        r = min(P, f.Sq - t * P)
        n = min(f.Sk, t * P + r) if f.causal else f.Sk
        masked = n if f.mask_kind is not None else (min(n, r) if f.causal else 0)
        units = f.B * f.H
        # VectorE: the row max reads n columns; a masked column takes 2 more passes (add the
        # mask, reduce: row_max's older form; the cost model charges its instructions one
        # more pass, attention_blocks.softmax_cycles, but this first-order estimate, which
        # leaves out VectorE's other work, then picked a Pᵀ DMA share that modeled trn2
        # LNC=2 Llama B=1 H=8/2kv S=2048 causal 175.5 -> 182.7 us, so it keeps the 2);
        # ScalarE: the exp and the copy of O | rowsum (Dv + 1 columns)
        vec += units * (n + 2 * masked + c.vector_instr_cycles) / c.vector_ghz
        sca += units * (n + 2 * c.scalar_instr_cycles + f.Dv + 1) / c.scalar_ghz
        e = cdiv(n, P) * r          # Pᵀ elements per partition: r columns per 128-key block
        rate = c.vector_psum_copy_rate(f.itemsize == 2)
        pt_v += units * e / rate / c.vector_ghz
        pt_s += units * e / c.scalar_rate(f.itemsize == 2) / c.scalar_ghz
        # DMA: one transfer for the full 128-key chunks and one for the tail chunk of a batch
        # of heads; a transpose spreads over all 16 queues, each held for its share's data
        # (plus hand-over) and at least the gap between transfers
        nb = unbiased_heads_per_batch(f, n) if not f.biased else 1
        batches = cdiv(units, nb)
        for keys in (n // P * P, n % P):
            if keys:
                data = c.dma_transpose_ns(nb * r * keys * f.itemsize)
                pt_d += batches * c.dma_occupancy_ns(data)
    return t_io, vec, sca, pt_v, pt_s, pt_d
