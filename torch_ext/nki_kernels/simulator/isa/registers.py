"""Engine registers: ``VirtualRegister`` and ``register_alloc/move/load/store``.

The simulator runs the kernel eagerly, so a register is a plain Python int.
"""

from __future__ import annotations

import torch

from ..errors import NkiValidationError
from .operands import fail, ints, store


class VirtualRegister:
    """An engine register holding a 32-bit integer (static in the simulator)."""

    __slots__ = ("value",)

    def __init__(self, state=None, frozen=False):
        self.value = state

    def __int__(self):
        if self.value is None:
            raise NkiValidationError("a VirtualRegister was read before any value was written to it: allocate it "
                                     "with nisa.register_alloc(value), or register_load / register_move it first")
        return int(self.value)

    __index__ = __int__

    def __bool__(self):
        # `while reg:` is the documented register-bound loop (nki.isa.VirtualRegister)
        return int(self) != 0

    def _host_compare(self, other):
        # "The loop variable is a device register, not a Python int. You cannot use it in
        # host-side Python expressions (e.g., if i == 0:)" (NKI dynamic-loops deep dive): a
        # comparison would be decided while the kernel is built, not on the device. Without
        # this, == fell back to identity and was silently False.
        raise NkiValidationError(
            f"{self!r} compared with {other!r} in Python: a register's value is known only on the "
            "device; use device-side instructions for conditions on it")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _host_compare
    __hash__ = object.__hash__

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def register_alloc(x=None):
    return VirtualRegister(None if x is None else int(x))


def register_move(dst, src):
    dst.value = int(src)


def register_load(dst, src):
    if src.size != 1:
        fail(f"register_load: src must hold exactly one element, got shape {src.shape}")
    dst.value = int(ints(src).reshape(-1)[0])


def register_store(dst, src):
    if dst.size != 1:
        fail(f"register_store: dst must hold exactly one element, got shape {dst.shape}")
    store("register_store", dst, torch.tensor(int(src), dtype=torch.int64).reshape(dst.shape))
