"""``run()``: simulate one kernel call and hand back outputs, trace and memory peaks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .interpreter import run_kernel
from .modules import activated
from .params import SimParams, resolve
from .trace import Instruction


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


def run(kernel, *args, target=None, params: SimParams | None = None, **kwargs) -> SimResult:
    """Run ``kernel(*args, **kwargs)`` in the simulator with ``target`` (default "trn2") or
    ``params``; ``import nki`` inside the kernel resolves to the simulator meanwhile."""
    params = resolve(target, params)
    with activated(params=params):
        outputs, ctx = run_kernel(kernel, args, kwargs, params)
    return result_of(outputs, ctx)


def result_of(outputs, ctx) -> SimResult:
    """The ``SimResult`` of a finished run (``ctx``: its core 0 context)."""
    cores = ctx.run.cores
    return SimResult(outputs, ctx.recorder.instructions,
                     max(c.memory.sbuf_peak for c in cores),
                     max(c.memory.psum_peak for c in cores), ctx.target.name,
                     tuple(c.memory.sbuf_peak for c in cores),
                     tuple(c.memory.psum_peak for c in cores))
