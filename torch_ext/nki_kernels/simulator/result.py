"""``SimResult``: what one simulated kernel call produced (outputs, trace, memory peaks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .trace import AllocationSite, Instruction


@dataclass(frozen=True)
class SimResult:
    """What one simulated kernel call produced."""

    outputs: Any                     # as nki.simulate returns them (same array type as inputs)
    trace: list[Instruction]         # in issue order
    peak_sbuf_bytes_per_partition: int   # the largest of the cores' peaks
    peak_psum_banks: int                 # the largest of the cores' peaks
    target: str                      # target name, e.g. "trn2" (hardware.get_target(name))
    # per physical core (program id order; one entry at LNC=1): each core has its own
    # SBUF and PSUM, so each has its own peak
    core_peak_sbuf_bytes_per_partition: tuple[int, ...] = ()
    core_peak_psum_banks: tuple[int, ...] = ()
    # where every on-chip tile was allocated, in creation order (the cost model's buffers)
    allocations: list[AllocationSite] = field(default_factory=list)


def result_of(outputs, ctx) -> SimResult:
    """The ``SimResult`` of a finished run (``ctx``: its core 0 context)."""
    cores = ctx.run.cores
    return SimResult(outputs, ctx.recorder.instructions,
                     max(c.memory.sbuf_peak for c in cores),
                     max(c.memory.psum_peak for c in cores), ctx.target.name,
                     tuple(c.memory.sbuf_peak for c in cores),
                     tuple(c.memory.psum_peak for c in cores), ctx.recorder.allocations)
