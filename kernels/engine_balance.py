"""The running VectorE / ScalarE load estimate the attention kernels place work with:
``VectorScalarBalance``, held by the forward's ``EngineBalance`` (attention_plan.py) and the
backward's ``BwdBalance`` (attention_bwd_plan.py) as their ``loads`` (a member, not a base:
kernel classes derive from nl.NKIObject alone, as the 2.32 language guide's "Class Support"
asks; tests/kernels/test_language_rules.py).

Only VectorE and ScalarE read PSUM, so every PSUM -> SBUF copy can go to either. The
balance keeps an estimate of both engines' busy time (ns) over the launch, in issue order,
and gives each such copy to the one that keeps them most even (a greedy list schedule). It
also spreads a share of some repeated choice (a transpose by DMA rather than by TensorE)
evenly over the launch's successive chances. Estimates use the cost model's figures for
the generation being built for (engine_costs.active()); they steer speed, never results.
"""

import nki.isa as nisa
import nki.language as nl

from .engine_costs import active as active_engine_costs

# spread_share: after i chances, round(i * share) of them were taken (credit >= 0.5: round
# half up).
CREDIT_ROUND = 0.5


class VectorScalarBalance(nl.NKIObject):
    """Running VectorE / ScalarE busy-time estimates of one launch (ns) and the engine
    choices made from them. Mutable by design: it follows the launch's instructions in
    issue order. Created once per launch, before the first instruction."""

    def __init__(self, dma_share):
        self.costs = active_engine_costs()
        self.vector_ns = 0.0       # estimated VectorE busy time so far
        self.scalar_ns = 0.0       # estimated ScalarE busy time so far
        # share (0..1) of the launch's chances that take the DMA (spread_share)
        self.dma_share = dma_share
        self.dma_credit = 0.0

    def charge(self, vector_cycles=0.0, scalar_cycles=0.0):
        """Account work that must run on VectorE / ScalarE (estimated cycles)."""
        self.vector_ns += vector_cycles / self.costs.vector_ghz
        self.scalar_ns += scalar_cycles / self.costs.scalar_ghz

    def pick(self, vector_cycles, scalar_cycles):
        """Engine for a piece of work either can do (a PSUM -> SBUF copy): the one that keeps
        the launch's estimated VectorE and ScalarE loads most even; its load is charged."""
        tv = self.vector_ns + vector_cycles / self.costs.vector_ghz
        ts = self.scalar_ns + scalar_cycles / self.costs.scalar_ghz
        if max(tv, self.scalar_ns) <= max(self.vector_ns, ts):
            self.vector_ns = tv
            return nisa.engine.vector
        self.scalar_ns = ts
        return nisa.engine.scalar

    def copy_cycles(self, elems, sixteen):
        """(VectorE, ScalarE) cycles of a PSUM -> SBUF copy of ``elems`` per partition, by
        the cost model's rule: max(MIN_II, passes) + the engine's whole fixed cost (VectorE:
        its 16-bit performance mode with one side in PSUM when ``sixteen``; ScalarE: its
        16-bit rate, 2 elements per cycle on trn3, 1 elsewhere; until 2026-12-06 ScalarE
        was charged 1 on trn3 too)."""
        c = self.costs
        rate = c.vector_psum_copy_rate(sixteen)
        return (max(c.min_instruction_cycles, elems / rate) + c.vector_instr_cycles,
                max(c.min_instruction_cycles, elems / c.scalar_rate(sixteen)) + c.scalar_instr_cycles)

    def spread_share(self):
        """Whether this chance takes the DMA: True for a share ``dma_share`` of the launch's
        successive chances, spread evenly (never at a share of 0)."""
        self.dma_credit += self.dma_share
        if self.dma_credit >= CREDIT_ROUND:
            self.dma_credit -= 1.0
            return True
        return False
