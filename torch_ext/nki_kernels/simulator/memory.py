"""Buffers, allocations, NaN poisoning, explicit placement and SBUF/PSUM capacity.

Each allocation is a torch tensor of the dtype's bits (``base``, dtypes.py), filled with the
run's poison values (params.py: NaN for floats, 4 for integers, like the official
simulator), so reading memory nothing wrote shows up. Views (tensor.py) share it.

Explicit placement. ``nl.ndarray(..., address=(partition_offset, byte_offset))`` puts the
tensor at that place of the core's physical SBUF / PSUM, one byte array per core and
buffer (created on first use): two tensors placed over the same bytes share them, as on
hardware (the NKI language guide: a tensor's storage is "a buffer in memory described by
shape, dtype, memory type, and memory location"). The free offset is in bytes, as
nki-library's allocators and the SbufManager docs use it ("heap_addr =
nl.tile_size.total_available_sbuf_size - 512"); a PSUM tensor starts at a bank boundary
("The allocation for PSUM tensors must start at the beginning of each bank — the compiler
will throw an error otherwise", NKI 0.2 migration guide, "Improved allocation API").
Physical memory starts as all-ones bytes: NaN in every float dtype.

Capacity and liveness, as the compiler's allocator sees them: a tensor holds its bytes from
the first instruction that touches it to the last one (``Life``); a tensor no instruction
touches holds nothing. ``check_capacity`` sweeps these intervals after the run: live SBUF
bytes per partition (unplaced tensors' sizes plus the union of the placed tensors' byte
ranges) must stay within ``target.sbuf_bytes_per_partition``; PSUM counts banks
(ceil(bytes / bank bytes) per unplaced tensor, plus every bank a live placed tensor
touches), at most ``target.psum_banks``. The same sweep reports a placed tensor whose first
write lands on bytes another live placed tensor reads later (``PlacementConflict``): the
compiler would keep them apart, so that is a kernel bug, not aliasing.
"""

from __future__ import annotations

import itertools
import math
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
# The fewest dims an on-chip tensor or view of each kind has (dim 0 the partitions): SBUF
# takes 1-D tensors, as the v2.33 register_load / register_store examples allocate them;
# PSUM, where only engines write, keeps [partition, free...]. check_shape and the on-chip
# views (tensor_views.py reshape, squeeze_dim) read it.
MIN_ON_CHIP_DIMS = {"sbuf": 1, "psum": 2}
# the NKI 0.2 buffer strings, refused with the object to write instead (to_region)
_BUFFER_STRINGS = ("sbuf", "psum", "hbm", "private_hbm", "shared_hbm")

# torch integer dtype of each element size: PSUM accumulation state is kept in one of
# these, laid out exactly like the data it describes (see psum_state in isa/operands.py).
STATE_DTYPE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_region(buffer) -> MemoryRegion:
    if isinstance(buffer, MemoryRegion):
        return buffer
    if isinstance(buffer, str) and buffer in _BUFFER_STRINGS:
        # "nl.ndarray, nl.zeros, and other creation ops no longer accept strings for the
        # buffer parameter" (aws-neuron-sdk nki/migration/index.rst, NKI 0.3)
        raise NkiValidationError(
            f"buffer={buffer!r} is a string; NKI 0.3 and later take the memory region object "
            f"nl.{buffer} (the migration guide: creation ops no longer accept strings)")
    raise NkiValidationError(
        f"buffer={buffer!r} is not a memory region; use nl.sbuf, nl.psum, nl.hbm, "
        "nl.private_hbm or nl.shared_hbm")


def kind_of(region: MemoryRegion) -> str:
    return _KIND[region]


_ids = itertools.count(1)  # allocation ids, unique in the process (next() is atomic in CPython)


class Life:
    """When an on-chip tensor holds data: instruction indices of its first and last use,
    first write and last read (None until it happens), plus what the capacity sweep needs."""

    __slots__ = ("first", "last", "first_write", "last_read", "kind", "name", "shape", "dtype",
                 "nbytes", "placed", "core")

    def __init__(self, kind, name, shape, dtype, nbytes, placed, core):
        self.first = self.last = self.first_write = self.last_read = None
        self.kind = kind
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes          # bytes per partition
        self.placed = placed          # (p0, p1, b0, b1) for an explicit address, else None
        self.core = core

    def label(self) -> str:
        where = f" at address {(self.placed[0], self.placed[2])}" if self.placed else ""
        return f"{self.name or 'a tensor'} {self.shape} {self.dtype.name}{where}"


class Allocation:
    """One allocated tensor: buffer, name, dtype, identity and the torch tensor of its bits.

    ``base`` is the whole tensor (storage dtype of ``dtype``); ``base_byte_offset`` its first
    byte within the torch storage under it and ``part_stride`` its partition stride in
    bytes (on chip), so views of any dtype locate themselves (tensor.py). ``state`` (PSUM
    only) is the tensor's accumulation state, one int8 per byte laid out [partitions,
    bytes per partition] (0 = not written, 1 = last written by a matmul, 2 = by another
    instruction). It belongs to the tensor, not to the bytes: a matmul with
    accumulate=None into a newly placed tensor overwrites, whatever an earlier tensor at
    that address left (nki.isa.nc_matmul: "auto-detect based on whether this PSUM location
    was previously written", a property of the tensor the compiler tracks).
    """

    __slots__ = ("alloc_id", "region", "kind", "dtype", "name", "base", "base_offset",
                 "base_byte_offset", "part_stride", "shape", "state", "written", "life",
                 "address", "core", "__weakref__")

    def __init__(self, region, dtype, name, base, state=None, address=None, core=0):
        self.alloc_id = next(_ids)
        self.region = region
        self.kind = _KIND[region]
        self.dtype = dtype
        self.name = name
        self.base = base
        self.base_offset = base.storage_offset()
        self.base_byte_offset = self.base_offset * base.element_size()
        self.part_stride = base.stride(0) * base.element_size() if base.dim() else 0
        self.shape = tuple(base.shape)
        if self.kind == "psum":
            row = math.prod(self.shape[1:]) * base.element_size()
            state = torch.zeros((self.shape[0], row), dtype=torch.int8)
        self.state = state
        self.written = False  # HBM: did the kernel write it (inputs are copied back if so)
        self.life = None      # on chip: a Life
        self.address = address
        self.core = core


class Memory:
    """One physical core's SBUF and PSUM: allocations, placement, liveness and capacity."""

    def __init__(self, target, poison_float: float, poison_int: int, core: int = 0):
        self.target = target
        self.poison_float = poison_float
        self.poison_int = poison_int
        self.core = core
        self.lives: list[Life] = []
        self.phys: dict[str, torch.Tensor] = {}        # kind -> uint8 [partitions, bytes]
        self.sbuf_peak = 0
        self.psum_peak = 0
        self._checked = 0  # lives already swept

    # ------------------------------------------------------------------ allocation
    def check_shape(self, shape, dtype, region, name="", what="ndarray") -> tuple[int, ...]:
        """``shape`` as a tuple of ints, checked against the rules every tensor of ``region``
        obeys: positive sizes; in SBUF at least 1-D, in PSUM 2-D; dim 0 (the partitions) <=
        the target's partitions, and one partition's bytes within the memory. A 1-D SBUF
        tensor holds one element per partition: the v2.33 register_load / register_store
        examples allocate one (``nl.ones([1], dtype=nl.int32, buffer=nl.sbuf)``; both pages
        say "HBM or SBUF"); the engines take it only as a [partition, free] view
        (isa/operands.py onchip)."""
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise NkiValidationError(f"{what}: shape {shape} must have positive sizes")
        kind = _KIND[region]
        if kind == "hbm":
            return shape
        if len(shape) < MIN_ON_CHIP_DIMS[kind]:
            raise NkiValidationError(
                f"{what}: {kind} tensor {name or ''} shape {shape} needs at least "
                f"{'one dim' if kind == 'sbuf' else '2 dims (1-D: SBUF only)'} (dim 0 is the partition dim)")
        if shape[0] > self.target.partitions:
            raise NkiValidationError(
                f"{what}: {kind} tensor partition dim {shape[0]} exceeds maximum "
                f"{self.target.partitions}")
        self._fits_alone(kind, name, shape, dtype, math.prod(shape[1:]) * dtype.itemsize)
        return shape

    def allocate(self, shape, dtype, region, name="", fill=None, address=None) -> Allocation:
        shape = self.check_shape(shape, dtype, region, name)
        kind = _KIND[region]
        if kind == "hbm":
            if address is not None:
                # v2.33 nl.ndarray: "for HBM it is a 1-tuple (free_offset,)"; placing HBM
                # tensors (and aliasing those placed together) is not simulated: refused,
                # never ignored
                raise NkiValidationError(
                    f"ndarray: address={address!r} given for HBM tensor {name or ''}: explicit HBM "
                    "placement (a 1-tuple (free_offset,), nl.ndarray) is not supported by this "
                    "simulator; it places SBUF and PSUM tensors only")
            return Allocation(region, dtype, name, self._fresh(shape, dtype, fill), core=self.core)
        per_part = math.prod(shape[1:]) * dtype.itemsize
        if address is None:
            alloc = Allocation(region, dtype, name, self._fresh(shape, dtype, fill), core=self.core)
            placed = None
        else:
            alloc, placed = self._place(kind, region, shape, dtype, name, per_part, address)
        alloc.life = Life(kind, name, shape, dtype, per_part, placed, self.core)
        self.lives.append(alloc.life)
        return alloc

    def wrap_hbm(self, data: torch.Tensor, dtype, region, name="") -> Allocation:
        """An HBM allocation holding ``data`` (already the dtype's bits)."""
        return Allocation(region, dtype, name, data, core=self.core)

    def _fresh(self, shape, dtype, fill):
        if fill is None:
            fill = self.poison_float if dtype.is_float or dtype.is_packed else self.poison_int
        if dtype.is_packed:
            return torch.full(shape, -1, dtype=torch.int64).to(dtype.storage)  # all-ones bits
        if dtype.storage == dtype.torch_dtype:
            return torch.full(shape, fill, dtype=dtype.storage)
        return dtype.to_bits(torch.tensor([fill], dtype=dtype.compute)).expand(shape).clone()

    def _fits_alone(self, kind, name, shape, dtype, per_part):
        t = self.target
        if kind == "sbuf" and per_part > t.sbuf_bytes_per_partition:
            raise CapacityError(
                f"sbuf: {name or 'a tensor'} {shape} {dtype.name} needs {per_part} bytes per "
                f"partition; limit {t.sbuf_bytes_per_partition} bytes per partition on {t.name}")
        if kind == "psum" and per_part > t.psum_banks * t.psum_bank_bytes:
            raise CapacityError(
                f"psum: {name or 'a tensor'} {shape} {dtype.name} needs {per_part} bytes per "
                f"partition; PSUM has {t.psum_banks} banks of {t.psum_bank_bytes} bytes on "
                f"{t.name}")

    def _place(self, kind, region, shape, dtype, name, per_part, address):
        t = self.target
        try:
            p0, b0 = (int(a) for a in address)
        except (TypeError, ValueError):
            raise NkiValidationError(
                f"ndarray: address={address!r} must be (partition_offset, byte_offset)") from None
        width = t.sbuf_bytes_per_partition if kind == "sbuf" else t.psum_banks * t.psum_bank_bytes
        label = f"ndarray: {kind} tensor {name or ''} {shape} {dtype.name} at address {(p0, b0)}"
        if p0 < 0 or p0 + shape[0] > t.partitions:
            raise NkiValidationError(f"{label}: partitions {p0}..{p0 + shape[0] - 1} exceed the "
                                     f"{t.partitions} partitions")
        if b0 < 0 or b0 + per_part > width:
            raise NkiValidationError(f"{label}: bytes {b0}..{b0 + per_part - 1} exceed the "
                                     f"{width} bytes of a {kind} partition on {t.name}")
        if kind == "psum" and b0 % t.psum_bank_bytes:
            raise NkiValidationError(f"{label}: a PSUM tensor must start at a bank boundary "
                                     f"(a multiple of {t.psum_bank_bytes} bytes)")
        if b0 % dtype.itemsize:
            raise NkiValidationError(f"{label}: byte offset {b0} is not a multiple of the "
                                     f"{dtype.itemsize}-byte element size")
        phys = self.phys.get(kind)
        if phys is None:
            # all-ones bytes: NaN in every float dtype, -1 / max in the integers
            phys = self.phys[kind] = torch.full((t.partitions, width), 255, dtype=torch.uint8)
        raw = phys[p0:p0 + shape[0], b0:b0 + per_part]
        base = raw.view(dtype.storage).view(shape)
        alloc = Allocation(region, dtype, name, base, address=(p0, b0), core=self.core)
        return alloc, (p0, p0 + shape[0], b0, b0 + per_part)

    # ------------------------------------------------------------------ liveness sweep
    def check_capacity(self, describe=lambda i: f"#{i}") -> None:
        """Sweep the live intervals recorded so far: peaks, capacity, placement conflicts.
        ``describe(i)`` names instruction i in messages."""
        lives = [lf for lf in self.lives if lf.first is not None]
        for kind in ("sbuf", "psum"):
            self._sweep(kind, [lf for lf in lives if lf.kind == kind], describe)

    def _usage(self, kind, active):
        t = self.target
        plain = 0
        spans = []
        for lf in active:
            if lf.placed is None:
                plain += lf.nbytes if kind == "sbuf" else -(-lf.nbytes // t.psum_bank_bytes)
            else:
                spans.append(lf.placed)
        if not spans:
            return plain
        if kind == "psum":
            banks = set()
            for _, _, b0, b1 in spans:
                banks.update(range(b0 // t.psum_bank_bytes, (b1 - 1) // t.psum_bank_bytes + 1))
            return plain + len(banks)
        # SBUF: the union of byte ranges in the fullest partition
        edges = sorted({p for s in spans for p in (s[0], s[1])})
        most = 0
        for lo, hi in zip(edges, edges[1:]):
            ranges = sorted((b0, b1) for p0, p1, b0, b1 in spans if p0 <= lo and hi <= p1)
            covered, end = 0, -1
            for b0, b1 in ranges:
                if b1 > end:
                    covered += b1 - max(b0, end)
                    end = b1
            most = max(most, covered)
        return plain + most

    def _sweep(self, kind, lives, describe):
        t = self.target
        limit = t.sbuf_bytes_per_partition if kind == "sbuf" else t.psum_banks
        lives.sort(key=lambda lf: lf.first)
        active: list[Life] = []
        peak = 0
        for lf in lives:
            now = lf.first
            active = [a for a in active if a.last >= now]
            if lf.placed is not None:
                _check_conflicts(lf, active, describe)
            active.append(lf)
            used = self._usage(kind, active)
            if used > limit:
                before = self._usage(kind, active[:-1])
                raise CapacityError(_capacity_message(kind, t, lf, used, before, now, describe))
            peak = max(peak, used)
        if kind == "sbuf":
            self.sbuf_peak = max(self.sbuf_peak, peak)
        else:
            self.psum_peak = max(self.psum_peak, peak)


def _check_conflicts(lf: Life, active, describe):
    """``lf`` (placed) starts while ``active`` tensors are live: its first write must not
    land on bytes a placed tensor reads afterwards."""
    if lf.first_write is None:
        return
    p0, p1, b0, b1 = lf.placed
    for other in active:
        if other.placed is None or other is lf:
            continue
        q0, q1, c0, c1 = other.placed
        if q0 < p1 and p0 < q1 and c0 < b1 and b0 < c1 and other.last_read is not None \
                and other.first is not None and other.first <= lf.first_write < other.last_read:
            raise PlacementConflict(
                f"placement conflict: {lf.label()} is first written at instruction "
                f"{describe(lf.first_write)}, over bytes of {other.label()}, which is read again "
                f"at instruction {describe(other.last_read)}; partitions "
                f"{max(p0, q0)}..{min(p1, q1) - 1}, bytes {max(b0, c0)}..{min(b1, c1) - 1} "
                "overlap while both hold data")


def _capacity_message(kind, t, lf, used, before, now, describe):
    if kind == "sbuf":
        return (f"sbuf: {lf.label()} needs {lf.nbytes} bytes per partition at instruction "
                f"{describe(now)} with {before} in use by live tensors; limit "
                f"{t.sbuf_bytes_per_partition} bytes per partition on {t.name}")
    banks = -(-lf.nbytes // t.psum_bank_bytes)
    return (f"psum: {lf.label()} needs {lf.nbytes} bytes ({banks} banks) per partition at "
            f"instruction {describe(now)} with {before} banks in use by live tensors; limit "
            f"{t.psum_banks} banks of {t.psum_bank_bytes} bytes on {t.name}")


class PlacementConflict(NkiValidationError):
    """Two explicitly placed tensors hold data in the same bytes at the same time."""
