"""Argument checks and tile allocation shared by the ``nl`` helpers."""

from __future__ import annotations

import operator

from ..errors import NkiValidationError
from ..memory import MemoryRegion
from ..tensor import NkiTensor
from ..tensor_alloc import allocate


def as_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(operator.index(s) for s in shape)


def check_tile(fn: str, x, role: str = "x") -> NkiTensor:
    """``x`` must be an on-chip tile (nl helpers compute on SBUF/PSUM only)."""
    if not isinstance(x, NkiTensor):
        raise NkiValidationError(f"nl.{fn}: {role} must be a tile, got {type(x).__name__}")
    if not x.on_chip:
        raise NkiValidationError(
            f"nl.{fn}: {role} is in HBM; load it into SBUF first (nl.load / nisa.dma_copy)")
    return x


def new_tile(shape, dtype, name: str) -> NkiTensor:
    """A new SBUF tile (what every nl helper returns unless it says otherwise)."""
    return allocate(shape, dtype, MemoryRegion.sbuf, name)
