"""Buffers, allocations, NaN poisoning and SBUF/PSUM capacity accounting.

Each allocation is one torch tensor (``base``) in the storage format of dtypes.py,
filled with the run's poison values (params.py: NaN for floats, 4 for integers, like the
official simulator), so reading memory nothing wrote shows up. Views (tensor.py) share it.

Capacity (per target, from hardware.py): live SBUF bytes per partition, i.e. the sum over
live SBUF allocations of prod(shape[1:]) * itemsize, must stay within
``target.sbuf_bytes_per_partition``; each PSUM allocation takes
ceil(bytes per partition / bank bytes) banks, at most ``target.psum_banks`` in all.
An allocation is live until its Python object is garbage-collected (weakref.finalize), so
a tile allocated inside a loop body is freed when the next iteration rebinds its name.
(The new tile is allocated before the old one is dropped: a loop body's tile counts twice
at the moment of rebinding, as the compiler's double buffering would.)
"""

from __future__ import annotations

import itertools
import math
import weakref
from enum import Enum

import torch

from .errors import CapacityError, NkiValidationError


class MemoryRegion(Enum):
    """Memory region constants for NKI tensors (``nl.sbuf``, ``nl.psum``, ``nl.hbm``...)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.value}"


_KIND = {
    MemoryRegion.sbuf: "sbuf", MemoryRegion.psum: "psum",
    MemoryRegion.private_hbm: "hbm", MemoryRegion.shared_hbm: "hbm",
}
_BY_STR = {"sbuf": MemoryRegion.sbuf, "psum": MemoryRegion.psum, "hbm": MemoryRegion.private_hbm,
           "private_hbm": MemoryRegion.private_hbm, "shared_hbm": MemoryRegion.shared_hbm}


def to_region(buffer) -> MemoryRegion:
    if isinstance(buffer, MemoryRegion):
        return buffer
    if isinstance(buffer, str) and buffer in _BY_STR:
        return _BY_STR[buffer]
    raise NkiValidationError(
        f"buffer={buffer!r} is not a memory region; use nl.sbuf, nl.psum, nl.hbm, "
        "nl.private_hbm or nl.shared_hbm")


def kind_of(region: MemoryRegion) -> str:
    return _KIND[region]


_ids = itertools.count(1)  # allocation ids, unique in the process (next() is atomic in CPython)


class Allocation:
    """One allocated tensor: buffer, name, dtype, identity and backing torch storage."""

    __slots__ = ("alloc_id", "region", "kind", "dtype", "name", "base", "base_offset",
                 "shape", "psum_state", "written", "__weakref__")

    def __init__(self, region, dtype, name, base):
        self.alloc_id = next(_ids)
        self.region = region
        self.kind = _KIND[region]
        self.dtype = dtype
        self.name = name
        self.base = base
        self.base_offset = base.storage_offset()
        self.shape = tuple(base.shape)
        # PSUM only: per element, 0 = not written, 1 = last written by a matmul (an
        # accumulation group is open), 2 = last written by another instruction.
        self.psum_state = (torch.zeros(self.shape, dtype=torch.int8)
                           if self.kind == "psum" else None)
        self.written = False  # HBM: did the kernel write it (inputs are copied back if so)


class Memory:
    """Live SBUF bytes per partition and PSUM banks of one run, with their peaks."""

    def __init__(self, target, poison_float: float, poison_int: int):
        self.target = target
        self.poison_float = poison_float
        self.poison_int = poison_int
        self.sbuf_live = 0
        self.sbuf_peak = 0
        self.psum_live = 0
        self.psum_peak = 0

    def _free_sbuf(self, nbytes):
        self.sbuf_live -= nbytes

    def _free_psum(self, banks):
        self.psum_live -= banks

    def allocate(self, shape, dtype, region, name="", fill=None) -> Allocation:
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise NkiValidationError(f"ndarray: shape {shape} must have positive sizes")
        kind = _KIND[region]
        t = self.target
        if kind != "hbm":
            if len(shape) < 2:
                raise NkiValidationError(
                    f"ndarray: {kind} tensor {name or ''} shape {shape} must be at least 2-D "
                    "(dim 0 is the partition dim)")
            if shape[0] > t.partitions:
                raise NkiValidationError(
                    f"ndarray: {kind} tensor partition dim {shape[0]} exceeds maximum "
                    f"{t.partitions}")
        per_part = math.prod(shape[1:]) * dtype.itemsize if kind != "hbm" else 0
        if kind == "sbuf":
            limit = t.sbuf_bytes_per_partition
            if self.sbuf_live + per_part > limit:
                raise CapacityError(
                    f"sbuf: allocating {name or 'a tensor'} {shape} {dtype.name} needs "
                    f"{per_part} bytes per partition with {self.sbuf_live} in use; limit "
                    f"{limit} bytes per partition on {t.name}")
        elif kind == "psum":
            banks = -(-per_part // t.psum_bank_bytes)
            if self.psum_live + banks > t.psum_banks:
                raise CapacityError(
                    f"psum: allocating {name or 'a tensor'} {shape} {dtype.name} needs "
                    f"{per_part} bytes ({banks} banks) per partition with {self.psum_live} "
                    f"banks in use; limit {t.psum_banks} banks of {t.psum_bank_bytes} bytes "
                    f"on {t.name}")
        if fill is None:
            fill = self.poison_float if dtype.is_float else self.poison_int
        base = torch.full(shape, fill, dtype=dtype.storage)
        alloc = Allocation(region, dtype, name, base)
        if kind == "sbuf":
            self.sbuf_live += per_part
            self.sbuf_peak = max(self.sbuf_peak, self.sbuf_live)
            weakref.finalize(alloc, self._free_sbuf, per_part)
        elif kind == "psum":
            self.psum_live += banks
            self.psum_peak = max(self.psum_peak, self.psum_live)
            weakref.finalize(alloc, self._free_psum, banks)
        return alloc

    def wrap_hbm(self, data: torch.Tensor, dtype, region, name="") -> Allocation:
        """An HBM allocation holding ``data`` (already in storage format)."""
        return Allocation(region, dtype, name, data)
