"""Eager simulator of AWS's beta-2 NKI language (NKI 0.6/0.7) on CPU torch, and the cost
model that turns its instruction traces into modeled time.

    from nki_kernels import simulator
    with simulator.activated(target="trn2"):
        import nki, nki.language as nl, nki.isa as nisa
        out = nki.simulate(kernel)(x, y)
    result = simulator.run(kernel, x, y)        # outputs, trace, memory peaks
    est = simulator.estimate(kernel)(x, y)      # cost model (cost/), modeled time
    simulator.run(kernel, x, params=simulator.SimParams(target="trn3", logical_cores=2))

This module composes the two halves: the interpreter (run) and the cost model (cost/,
which consumes traces and never imports the interpreter). See docs/simulator.md for the
supported names, the rules enforced, the options and the threading guarantees, and
docs/cost-model.md for the model.
"""

from __future__ import annotations

from .context import current as _current
from .errors import CapacityError, NkiValidationError, SimulatorError, UnsupportedError
from .modules import activated, install_aws_harness, nki_modules
from .params import SimParams, resolve
from .result import SimResult
from .run import run
from .trace import Instruction

__all__ = ["activated", "run", "estimate", "SimResult", "SimParams", "nki_modules",
           "install_aws_harness", "current_trace", "SimulatorError", "NkiValidationError", "CapacityError",
           "UnsupportedError"]


def estimate(kernel, target=None, params: SimParams | None = None):
    """``estimate(kernel, target)(*args, **kwargs)`` -> ``cost.Estimate``: runs ``kernel`` in
    the simulator (``run``) and models the trace it issued on the target ("trn2" default)."""
    params = resolve(target, params)

    def run_and_estimate(*args, **kwargs):
        from .cost import estimate_trace  # lazy: the cost model needs numpy (regions.py)

        result = run(kernel, *args, params=params, **kwargs)
        return estimate_trace(result.trace, params.target, outputs=result.outputs,
                              allocations=result.allocations)

    run_and_estimate.__name__ = f"estimate_{getattr(kernel, '__name__', 'kernel')}"
    return run_and_estimate


def current_trace() -> list[Instruction]:
    """The instructions recorded so far by the calling thread's innermost ``activated()``
    block or kernel run (for code that calls ``nl``/``nisa`` directly)."""
    return _current().recorder.instructions
