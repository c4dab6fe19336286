"""What one attention-backward launch is and how it is cut (``BwdPlan``), and the running
VectorE / ScalarE load estimate that places its PSUM copies (``BwdBalance``).

Nothing here issues instructions. See attention_bwd.py for the loops these drive.

* key blocks of ``kb`` keys: S and dP of one (query tile, head) sit side by side in PSUM
  ([128, 2, kb] fp32: one bank at kb = 256, two at 512) and the block's dK | dV
  accumulators ([128, kb / 128, D + Dv] fp32) stay in PSUM while the chunk's query tiles
  stream past. 512 keys when D + Dv <= 256 (the accumulators take 2 banks), else 256:
  with the dSᵀ and dQ tiles and one of each in flight the launch stays within 8 banks.
* query chunks of ``q_chunk`` tiles: the query side of a chunk (Qᵀ, dOᵀ, Q, dO, O rows,
  D_i, -lse and the fp32 dQ accumulators of every query head of the kv head) stays in
  SBUF while the key blocks stream (budget Q_SIDE_BUDGET); several chunks only for long
  sequences, whose dK | dV partial sums then go through an fp32 HBM scratch.
"""

from dataclasses import dataclass

import nki.isa as nisa
import nki.language as nl

from .attention_launch import P
from .engine_costs import active as active_engine_costs
from .tiling import cdiv

FP32_BYTES = 4
# Keys per block (see the module docstring): 512 when the dK | dV accumulators of 4 key
# tiles fit 2 PSUM banks (D + Dv <= 256), else 256.
KV_BLOCK_WIDE = 512
KV_BLOCK = 256
WIDE_MAX_DK_DV = 256
# Per-partition SBUF budget of a chunk's query side (trn2: 192 KiB per partition usable by
# kernels); the rest holds one key block (Kᵀ, Vᵀ, K rows: < 4 KiB at D = 256) and the
# per-block scratch (P, dS, dSᵀ, the masked-score tile: < 8 KiB), with room for the
# allocation rotation to load the next block while this one computes.
Q_SIDE_BUDGET = 112 * 1024


@dataclass(frozen=True)
class BwdPlan(nl.NKIObject):
    """Static cut of one backward launch (module docstring), from the launch's facts."""

    kb: int                  # keys per block
    n_kb: int                # key blocks
    kt: int                  # 128-key tiles per block (kb / 128)
    q_chunk: int             # query tiles per chunk
    n_chunks: int            # chunks per (batch, kv head)


def q_side_bytes(facts):
    """SBUF bytes per partition of one (query head, query tile) of a chunk: Qᵀ and dOᵀ (one
    row of 128 per head-dim piece), Q, dO and O rows, the fp32 dQ accumulator, the fp32
    dO ⊙ O product (D_i), D_i and -lse."""
    f = facts
    isz = f.itemsize
    return ((cdiv(f.D, P) + cdiv(f.Dv, P)) * P * isz + (f.D + 2 * f.Dv) * isz
            + (f.D + f.Dv) * FP32_BYTES + 2 * FP32_BYTES)


def bwd_plan(facts, q_chunk=0):
    """The ``BwdPlan`` of a launch (``facts``: attention_launch.LaunchFacts); ``q_chunk`` > 0
    forces the query tiles per chunk."""
    f = facts
    kb = KV_BLOCK_WIDE if f.D + f.Dv <= WIDE_MAX_DK_DV else KV_BLOCK
    kb = min(kb, max(1, cdiv(f.Sk, P) * P))
    n_kb = cdiv(f.Sk, kb)
    fit = max(1, Q_SIDE_BUDGET // (q_side_bytes(f) * f.G))
    chunk = min(f.n_q_tiles, q_chunk if q_chunk > 0 else fit)
    return BwdPlan(kb=kb, n_kb=n_kb, kt=cdiv(kb, P), q_chunk=max(1, chunk),
                   n_chunks=cdiv(f.n_q_tiles, max(1, chunk)))


class BwdBalance(nl.NKIObject):
    """Running VectorE / ScalarE busy-time estimates of one backward program (ns), in issue
    order, and the engine each PSUM copy goes to: the one that keeps them most even."""

    def __init__(self, facts):
        self.costs = active_engine_costs()
        self.vector_ns = 0.0
        self.scalar_ns = 0.0

    def charge(self, vector_cycles=0.0, scalar_cycles=0.0):
        """Account work that must run on VectorE / ScalarE (estimated cycles)."""
        self.vector_ns += vector_cycles / self.costs.vector_ghz
        self.scalar_ns += scalar_cycles / self.costs.scalar_ghz

    def pick(self, vector_cycles, scalar_cycles):
        """The engine (nisa.engine) for work either can do (greedy list schedule)."""
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
