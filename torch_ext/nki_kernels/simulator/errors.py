"""The simulator's one error family.

* ``SimulatorError``: base of everything the simulator raises on purpose.
* ``NkiValidationError``: a hardware rule was broken (also an ``AssertionError``, like the
  official simulator's, and exported as ``nki.isa.NkiValidationError``). Messages name the
  instruction, the operand and the limit: "nc_matmul: stationary partition dim 256 exceeds
  maximum 128".
* ``CapacityError``: live SBUF bytes per partition or PSUM banks exceed the target.
* ``UnsupportedError``: a beta-2 feature the simulator does not model, or a beta-1 habit
  (tile arithmetic operators, ``mask=``) that beta 2 removed.

Out-of-bounds indexing raises the built-in ``IndexError`` (never clipped).
"""

from __future__ import annotations


class SimulatorError(Exception):
    """Base class of every error the NKI simulator raises on purpose."""


class NkiValidationError(SimulatorError, AssertionError):
    """An instruction or allocation breaks a hardware rule."""


class CapacityError(NkiValidationError):
    """Live on-chip allocations exceed the target's SBUF or PSUM capacity."""


class UnsupportedError(SimulatorError, TypeError):
    """A feature the simulator does not model, or an API beta 2 removed."""


class DeadlockError(SimulatorError):
    """The cores of an LNC=2 launch wait for each other (or for a core that has finished)."""


class RaceError(NkiValidationError):
    """The cores of an LNC=2 launch access the same bytes of a shared tensor without an
    ordering (core_barrier / sendrecv) between the accesses."""
