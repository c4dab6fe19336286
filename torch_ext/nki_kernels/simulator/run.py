"""``run()``: simulate one kernel call and hand back outputs, trace and memory peaks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .hardware import DEFAULT_TARGET
from .shim import activated, run_kernel
from .trace import Instruction


@dataclass(frozen=True)
class SimResult:
    """What one simulated kernel call produced."""

    outputs: Any                     # as nki.simulate returns them (same array type as inputs)
    trace: list[Instruction]         # in issue order
    peak_sbuf_bytes_per_partition: int
    peak_psum_banks: int
    target: str                      # target name, e.g. "trn2" (hardware.get_target(name))


def run(kernel, *args, target: str = DEFAULT_TARGET, **kwargs) -> SimResult:
    """Activate the simulator for ``target``, run ``kernel(*args, **kwargs)``, deactivate."""
    with activated(target):
        outputs, ctx = run_kernel(kernel, args, kwargs)
    return SimResult(outputs, ctx.recorder.instructions, ctx.memory.sbuf_peak,
                     ctx.memory.psum_peak, ctx.target.name)
