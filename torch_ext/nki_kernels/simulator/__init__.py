"""Eager simulator of AWS's beta-2 NKI language (NKI 0.6/0.7) on CPU torch.

    from nki_kernels import simulator
    with simulator.activated(target="trn2"):
        import nki, nki.language as nl, nki.isa as nisa
        out = nki.simulate(kernel)(x, y)
    result = simulator.run(kernel, x, y)        # outputs, trace, memory peaks
    est = simulator.estimate(kernel)(x, y)      # cost model (simulator/cost/)

See docs/simulator.md for the supported names, the rules enforced and the precision model.
"""

from __future__ import annotations

from .errors import CapacityError, NkiValidationError, SimulatorError, UnsupportedError
from .run import SimResult, run
from .shim import activated

__all__ = ["activated", "run", "SimResult", "estimate", "SimulatorError", "NkiValidationError",
           "CapacityError", "UnsupportedError"]


def estimate(kernel, target="trn2"):
    """Cost-model estimate (implemented in simulator/cost/)."""
    from .cost import estimate as _e

    return _e(kernel, target)


def nki_modules():
    """The simulated ``nki``, ``nki.language`` and ``nki.isa`` module objects, by name."""
    from .shim import MODULES

    return dict(MODULES)
