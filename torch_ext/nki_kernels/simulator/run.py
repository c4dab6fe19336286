"""``run()``: simulate one kernel call and hand back outputs, trace and memory peaks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .interpreter import run_kernel
from .modules import activated
from .params import SimParams, resolve
from .trace import AllocationSite, Instruction


@dataclass(frozen=True)
class SimResult:
    """What one simulated kernel call produced."""

    outputs: Any                     # as nki.simulate returns them (same array type as inputs)
    trace: list[Instruction]         # in issue order
    peak_sbuf_bytes_per_partition: int
    peak_psum_banks: int
    target: str                      # target name, e.g. "trn2" (hardware.get_target(name))
    # where every on-chip tile was allocated, in creation order (the cost model's buffers)
    allocations: list[AllocationSite] = field(default_factory=list)


def run(kernel, *args, target=None, params: SimParams | None = None, **kwargs) -> SimResult:
    """Run ``kernel(*args, **kwargs)`` in the simulator with ``target`` (default "trn2") or
    ``params``; ``import nki`` inside the kernel resolves to the simulator meanwhile."""
    params = resolve(target, params)
    with activated(params=params):
        outputs, ctx = run_kernel(kernel, args, kwargs, params)
    return SimResult(outputs, ctx.recorder.instructions, ctx.memory.sbuf_peak,
                     ctx.memory.psum_peak, ctx.target.name, ctx.recorder.allocations)
