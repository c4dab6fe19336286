"""The interpreter's options for one simulated run, in one frozen, validated object.

    SimParams(target="trn2", logical_cores=None, poison_float=nan, poison_int=4, seed=0)

* ``target``: the NeuronCore generation (hardware.py): "trn1", "trn2" (default), "trn3",
  or a ``hardware.Target``; stored as the ``Target``.
* ``logical_cores``: the logical-core degree (LNC) the run is compiled for, 1 or 2 (LNC=2
  needs Trainium2 or newer: trn1 allows 1 only). ``None`` (default): the kernel's own
  degree, ``kernel[2]`` or 1 without brackets. When both are given they must agree, as the
  compiler requires (docs: "Using Logical NeuronCores (LNC) with NKI").
* ``poison_float`` / ``poison_int``: what every new allocation is filled with, so a read of
  memory nothing wrote shows up; NaN and 4 are the official simulator's values.
  ``poison_int`` must fit every integer dtype (0..127).
* ``seed``: seed of the run's random generator (nisa.rng / dropout / nl.rand) until the
  kernel calls ``nl.random_seed`` / ``nisa.set_rng_seed``.

A run reads its options from its context (context.py), never from module globals. Errors
name the argument, the value and the limit.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .errors import NkiValidationError
from .hardware import DEFAULT_TARGET, Target, get_target

_POISON_INT_RANGE = (0, 127)  # fits int8, uint8 and every wider integer dtype
_SEED_LIMIT = 1 << 64         # torch.Generator.manual_seed takes a 64-bit seed


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class SimParams:
    """Options of one simulated run (see the module docstring)."""

    target: Target = DEFAULT_TARGET  # a name is accepted and stored as its Target
    logical_cores: int | None = None
    poison_float: float = math.nan
    poison_int: int = 4
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "target", get_target(self.target))
        lnc = self.logical_cores
        if lnc is not None:
            if not _is_int(lnc) or lnc not in (1, 2):
                raise ValueError(f"logical_cores={lnc!r}: the logical-core degree must be 1 or 2 "
                                 "(or None: the kernel's own kernel[n], default 1)")
            limit = self.target.max_logical_cores
            if lnc > limit:
                raise ValueError(f"logical_cores={lnc} exceeds the maximum {limit} of "
                                 f"{self.target.name} (LNC=2 needs Trainium2 or newer)")
            object.__setattr__(self, "logical_cores", int(lnc))
        if not isinstance(self.poison_float, numbers.Real) or isinstance(self.poison_float, bool):
            raise ValueError(f"poison_float={self.poison_float!r} must be a real number (NaN is "
                             "the default)")
        object.__setattr__(self, "poison_float", float(self.poison_float))
        lo, hi = _POISON_INT_RANGE
        if not _is_int(self.poison_int) or not lo <= self.poison_int <= hi:
            raise ValueError(f"poison_int={self.poison_int!r} must be an integer in [{lo}, {hi}] "
                             "(it must fit every integer dtype, int8 and uint8 included)")
        if not _is_int(self.seed) or not 0 <= self.seed < _SEED_LIMIT:
            raise ValueError(f"seed={self.seed!r} must be an integer in [0, 2**64)")

    def lnc_for(self, kernel_degree: int | None) -> int:
        """The logical-core degree of a run of a kernel launched as ``kernel[kernel_degree]``
        (``None``: no brackets). Raises if it disagrees with ``logical_cores`` or the target."""
        if kernel_degree is not None and self.logical_cores is not None \
                and kernel_degree != self.logical_cores:
            raise NkiValidationError(
                f"kernel[{kernel_degree}]: the kernel's logical-core degree must equal the "
                f"run's logical_cores={self.logical_cores} (the compiler's LNC)")
        degree = kernel_degree or self.logical_cores or 1
        limit = self.target.max_logical_cores
        if degree > limit:
            raise NkiValidationError(
                f"kernel[{degree}]: logical-core degree {degree} exceeds the maximum {limit} of "
                f"{self.target.name} (LNC=2 needs Trainium2 or newer)")
        return degree


def resolve(target=None, params: SimParams | None = None) -> SimParams:
    """The params of a call given ``target=`` and/or ``params=`` (both: an error)."""
    if params is None:
        return SimParams(DEFAULT_TARGET if target is None else target)
    if not isinstance(params, SimParams):
        raise TypeError(f"params={params!r} must be a simulator.SimParams")
    if target is not None:
        raise ValueError(f"target={target!r} and params=... both given; put the target in "
                         "params (SimParams(target=...))")
    return params
