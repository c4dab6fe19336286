"""What one attention-backward launch is and how it is cut (``BwdPlan``), and the running
engine-load estimate that places its PSUM copies (``BwdBalance``).

Nothing here issues instructions.

Cut of a launch (see attention_bwd.py for the loop it drives):

* kv blocks of ``kb`` keys: the unit of the dK/dV accumulators in PSUM ([128, kb / 128,
  D + Dv] fp32 must fit one PSUM bank) and of S / dP ([128, 2, kb] fp32, one bank).
* units of ``kv_group`` kv heads of one batch (their G query heads each): every load and
  store of the unit moves all its heads in one DMA, so transfers stay large (a transfer
  holds each DMA queue at least the 0.85 us gap however small it is).
* query chunks of ``q_chunk`` tiles: the query side (Qᵀ, dOᵀ, Q, dO, D, lse and the dQ
  accumulators) of a chunk stays in SBUF while the kv blocks stream through. When a unit
  has more than one chunk and more than one kv block, the dQ partial sums of a chunk go
  through an HBM fp32 scratch between kv blocks (``dq_scratch``).
"""

from dataclasses import dataclass

import nki.isa as nisa
import nki.language as nl

from .attention_launch import P, PSUM_BANK_BYTES
from .engine_costs import active as active_engine_costs
from .tiling import cdiv

FP32_BYTES = 4
# Keys per kv block: S and dP of one query tile side by side in one PSUM bank
# ([128, 2, 256] fp32 = 2 KiB); halved when the dK | dV accumulators of 256 keys
# ([128, 2, D + Dv] fp32) would not fit one bank (D + Dv > 256).
KV_BLOCK = 256
# Per-partition SBUF budgets (trn2: 224 KiB per partition): the query side of a chunk
# (resident while the kv blocks stream), the kv side of a unit's block (double-buffered by
# the allocation rotation: the next block loads while this one computes); the rest holds
# the per-block scratch (P, dS, dSᵀ, masks: < 8 KiB) and the D computation's Oᵀ.
Q_SIDE_BUDGET = 112 * 1024
KV_SIDE_BUDGET = 24 * 1024
# PSUM copies (dSᵀ blocks, dQ / dK / dV evacuations) go to VectorE or ScalarE, whichever the
# running estimate says is less loaded; for 16-bit data a share of dSᵀ is made by DMA
# transposes instead (searched in steps of 1/DMA_SHARE_STEPS, spread by a credit).
DMA_SHARE_STEPS = 20
DMA_CREDIT_ROUND = 0.5


@dataclass(frozen=True)
class BwdPlan(nl.NKIObject):
    """Static cut of one backward launch (module docstring), from the launch's facts."""

    kb: int                  # keys per kv block
    n_kb: int                # kv blocks
    kt: int                  # 128-key tiles per kv block (kb / 128)
    kv_group: int            # kv heads per unit
    q_chunk: int             # query tiles per chunk
    n_chunks: int            # chunks per unit
    dq_scratch: bool         # dQ partials through HBM between kv blocks
    dq_accumulate: bool      # dQ summed over kv blocks (fp32 SBUF accumulators)


def bwd_plan(facts):
    """The ``BwdPlan`` of a launch (``facts``: attention_launch.LaunchFacts)."""
    f = facts
    kb = KV_BLOCK if f.D + f.Dv <= PSUM_BANK_BYTES // (2 * FP32_BYTES) else P
    kb = min(kb, max(1, f.Sk))
    n_kb = cdiv(f.Sk, kb)
    kt = cdiv(kb, P)
    d_pieces, dv_pieces = cdiv(f.D, P), cdiv(f.Dv, P)
    isz = f.itemsize
    # per kv head and partition: Kᵀ, Vᵀ (per piece), K in rows, the dK | dV output rows
    per_kv = (d_pieces + dv_pieces) * kb * isz + kt * f.D * isz + kt * (f.D + f.Dv) * isz
    # per (query head, query tile) and partition: Qᵀ, dOᵀ (per piece), Q, dO in rows, D and
    # -lse (fp32), the dQ accumulator (fp32) or output rows
    dq_bytes = f.D * FP32_BYTES if n_kb > 1 else f.D * isz
    per_ht = ((d_pieces + dv_pieces) * P * isz + (f.D + f.Dv) * isz + 2 * FP32_BYTES + dq_bytes)
    n_q_tiles = f.n_q_tiles
    kv_group = max(1, min(f.Hkv, KV_SIDE_BUDGET // per_kv, Q_SIDE_BUDGET // max(1, per_ht * f.G * n_q_tiles)))
    q_chunk = max(1, min(n_q_tiles, Q_SIDE_BUDGET // (per_ht * f.G * kv_group)))
    n_chunks = cdiv(n_q_tiles, q_chunk)
    return BwdPlan(kb=kb, n_kb=n_kb, kt=kt, kv_group=kv_group, q_chunk=q_chunk, n_chunks=n_chunks,
                   dq_scratch=n_chunks > 1 and n_kb > 1, dq_accumulate=n_kb > 1)


class BwdBalance(nl.NKIObject):
    """Running VectorE / ScalarE busy-time estimates of one backward launch (ns), in issue
    order, and the choices made from them: which engine copies a PSUM tile, and whether a
    dSᵀ is made by DMA transposes (16-bit data, a planned share of them)."""

    def __init__(self, facts, plan):
        self.costs = active_engine_costs()
        self.itemsize = facts.itemsize
        self.vector_ns = 0.0
        self.scalar_ns = 0.0
        self.dma_share = _plan_dma_share(facts, plan, self.costs) if facts.dma_transpose else 0.0
        self.dma_credit = 0.0

    def charge(self, vector_cycles=0.0, scalar_cycles=0.0):
        """Account work that must run on VectorE / ScalarE (estimated cycles)."""
        self.vector_ns += vector_cycles / self.costs.vector_ghz
        self.scalar_ns += scalar_cycles / self.costs.scalar_ghz

    def pick(self, vector_cycles, scalar_cycles):
        """The engine (nisa.engine) for work either can do: the one that keeps the two
        estimates most even (greedy list schedule)."""
        tv = self.vector_ns + vector_cycles / self.costs.vector_ghz
        ts = self.scalar_ns + scalar_cycles / self.costs.scalar_ghz
        if max(tv, self.scalar_ns) <= max(self.vector_ns, ts):
            self.vector_ns = tv
            return nisa.engine.vector
        self.scalar_ns = ts
        return nisa.engine.scalar

    def copy_cycles(self, elems, sixteen):
        """(VectorE, ScalarE) cycles of a PSUM -> SBUF copy of ``elems`` per partition
        (VectorE: 16-bit performance mode with one side in PSUM)."""
        c = self.costs
        rate = c.vector_psum_copy_16bit_rate if sixteen else 1.0
        return (max(c.min_instruction_cycles, elems / rate) + c.instr_cycles,
                max(c.min_instruction_cycles, elems) + c.instr_cycles)

    def use_dma(self):
        """Whether the next dSᵀ is made by DMA transposes (a share ``dma_share``, spread)."""
        self.dma_credit += self.dma_share
        if self.dma_credit >= DMA_CREDIT_ROUND:
            self.dma_credit -= 1.0
            return True
        return False


def _plan_dma_share(facts, plan, costs):
    """Share of the dSᵀ transposes made by SBUF->SBUF DMA transposes instead of TensorE +
    a PSUM copy: the one that levels the DMA queues with TensorE and VectorE/ScalarE in a
    first-order estimate of the launch (``_launch_work``)."""
    t_dma, t_pe, t_vs, pt_pe, pt_vs, pt_dma = _launch_work(facts, plan, costs)
    best, best_t = 0.0, None
    for i in range(DMA_SHARE_STEPS + 1):
        d = i / DMA_SHARE_STEPS
        t = max(t_dma + d * pt_dma, t_pe + (1 - d) * pt_pe, t_vs + (1 - d) * pt_vs)
        if best_t is None or t < best_t - 1e-9:
            best, best_t = d, t
    return best


def _launch_work(facts, plan, costs):
    """Estimated ns of the launch on one core: (DMA with the loads and stores, TensorE
    matmuls, VectorE + ScalarE halved (they share the PSUM copies), all dSᵀ on TensorE,
    their PSUM copies (halved), all dSᵀ by DMA)."""
    f = facts
    isz = f.itemsize
    # Qᵀ, Q, dQ, dOᵀ, dO, Oᵀ per query row; Kᵀ, K, dK, Vᵀ, dV per key row
    io = (f.B * f.Sq * f.H * (3 * f.D + 3 * f.Dv) + f.B * f.Sk * f.Hkv * (3 * f.D + 2 * f.Dv)) * isz
    t_dma = io / costs.dma_bytes_per_s * 1e9
    pe = vs = pt_pe = pt_vs = pt_dma = 0.0
    tensor_ghz = costs.tensor_ghz
    for t in range(f.n_q_tiles):
        r = min(P, f.Sq - t * P)
        n = min(f.Sk, t * P + r) if f.causal else f.Sk
        units = f.B * f.H
        nkc = cdiv(n, P)
        # S, dP (n columns each), dV, dK, dQ (D / Dv columns per 128-key tile, at least 64)
        pe += units * (2 * n + nkc * (2 * max(64, f.Dv) + max(64, f.D))) / tensor_ghz
        # exp on ScalarE, dS on VectorE (two inputs), each with its fixed cost per kv block
        blocks = cdiv(n, plan.kb)
        vs += units * ((n + blocks * costs.instr_cycles) / costs.scalar_ghz
                       + (2 * n + blocks * costs.instr_cycles) / costs.vector_ghz) / 2
        pt_pe += units * nkc * max(r, 64) / tensor_ghz
        pt_vs += units * blocks * (nkc * r / 2 + costs.instr_cycles) / costs.vector_ghz / 2
        data = r * P * isz / (costs.dma_bytes_per_s * costs.dma_transpose_efficiency) * 1e9
        pt_dma += units * blocks * costs.dma_occupancy_ns(data * nkc / blocks)
    return t_dma, pe, vs, pt_pe, pt_vs, pt_dma
