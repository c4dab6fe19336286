"""``run()``: simulate one kernel call and hand back outputs, trace and memory peaks."""

from __future__ import annotations

from .interpreter import run_kernel
from .modules import activated
from .params import SimParams, resolve
from .result import SimResult, result_of


def run(kernel, *args, target=None, params: SimParams | None = None, **kwargs) -> SimResult:
    """Run ``kernel(*args, **kwargs)`` in the simulator with ``target`` (default "trn2") or
    ``params``; ``import nki`` inside the kernel resolves to the simulator meanwhile."""
    params = resolve(target, params)
    with activated(params=params):
        outputs, ctx = run_kernel(kernel, args, kwargs, params)
    return result_of(outputs, ctx)
