"""Trace records: one ``Instruction`` per hardware instruction a kernel issues.

The dataclasses are the contract with the cost model (docs/ARCHITECTURE.md); do not
change their fields without changing ``cost/``. ``Recorder`` collects them for one run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Operand:
    role: str            # argument name: "dst", "src", "stationary", "moving", "data", "bias", ...
    alloc_id: int        # identity of the underlying allocation (views share it)
    buffer: str          # "hbm" | "sbuf" | "psum"
    shape: tuple[int, ...]
    dtype: str           # NKI dtype name, e.g. "bfloat16"
    partitions: int      # shape[0] for sbuf/psum operands; 1 for hbm
    free_elems: int      # elements per partition (prod(shape[1:])), total elements for hbm
    nbytes: int          # total bytes of this operand
    span: tuple[int, int]  # [lo, hi) element offsets covered in the allocation (dependency tracking)
    # The exact footprint: element offset of the view's first element in the allocation
    # and the view's element strides. Two column slices of one tile have overlapping
    # spans but disjoint footprints; the cost model uses these to avoid false dependencies.
    offset: int = 0
    strides: tuple[int, ...] = ()

    @property
    def itemsize(self) -> int:
        """Bytes per element of this operand's dtype (at least 1)."""
        return max(1, self.nbytes // max(1, math.prod(self.shape)))


@dataclass(frozen=True)
class Instruction:
    index: int
    op: str              # ISA name: "nc_matmul", "nc_transpose", "activation", "tensor_tensor",
                         # "tensor_scalar", "tensor_reduce", "tensor_copy", "dma_copy", "iota", ...
    engine: str          # "tensor" | "vector" | "scalar" | "gpsimd" | "dma"
    reads: tuple[Operand, ...]
    writes: tuple[Operand, ...]
    flops: int           # 2*K*M*N for matmul; elements for elementwise; 0 for DMA
    attrs: dict          # op-specific facts the cost model needs


ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")  # the values of Instruction.engine


@dataclass(frozen=True)
class AllocationSite:
    """Where an on-chip tile was allocated: the cost model's finite buffering gives tiles
    of one site (same source lines on the kernel's call path, same core) a bounded number
    of physical buffers, as the compiler's address rotation does (cost/schedule.py)."""

    alloc_id: int
    buffer: str          # "sbuf" | "psum"
    site: tuple          # ((filename, line), ...) from the allocating call up to the kernel entry
    core: int | None     # program id of a kernel[2] run, else None
    # explicit placement (nl.ndarray(..., address=)): (first partition, end partition, first
    # byte, end byte) of the core's physical SBUF / PSUM partition, else None. A placed tile
    # takes no part in buffer rotation: its bytes are where the kernel put them, and tiles
    # placed over the same bytes depend on each other (cost/schedule.py).
    placed: tuple | None = None
    # bytes per partition the allocation holds (None in hand-built traces): the cost model
    # keeps the live tiles of each on-chip memory within its capacity (cost/schedule.py)
    nbytes: int | None = None


def capture(role: str, t) -> tuple:
    """What the trace needs of tensor view ``t`` (cheap, holds no tensor or allocation, so
    recording never keeps memory alive); ``build_operand`` turns it into an ``Operand``.

    Offsets and strides are in elements of the allocation's dtype. A view that reinterprets
    the bits as another element size, or whose offset is read at run time, is recorded by
    the range of the allocation it may touch (no strides: the cost model then assumes it
    touches all of that range)."""
    a = t._alloc
    dt = t._dtype or a.dtype
    if type(t).__name__ != "NkiTensor":  # IndirectView / OutOfBoundsView: data-dependent
        return (role, a.alloc_id, a.kind, dt, tuple(t.shape), None,
                (0, a.base.numel()))
    d = t._data
    if dt.itemsize == a.dtype.itemsize:
        return (role, a.alloc_id, a.kind, dt, d.shape, d.stride(),
                d.storage_offset() - a.base_offset)
    es = d.element_size()
    lo = d.storage_offset() * es - a.base_byte_offset
    hi = lo + es * (1 + sum((s - 1) * st for s, st in zip(d.shape, d.stride())))
    isz = a.base.element_size()
    return (role, a.alloc_id, a.kind, dt, d.shape, None, (lo // isz, -(-hi // isz)))


def build_operand(raw: tuple) -> Operand:
    role, alloc_id, kind, dtype, shape, stride, lo = raw
    shape = tuple(shape)
    n = 1
    for s in shape:
        n *= s
    if kind == "hbm":
        parts, free = 1, n
    else:
        parts = shape[0] if shape else 1
        free = n // parts if parts else 0
    if stride is None:  # a range of the allocation, no exact footprint
        return Operand(role, alloc_id, kind, shape, dtype.name, parts, free, n * dtype.itemsize,
                       tuple(lo), lo[0], ())
    hi = lo + 1
    for s, st in zip(shape, stride):
        hi += (s - 1) * st
    return Operand(role, alloc_id, kind, shape, dtype.name, parts, free, n * dtype.itemsize,
                   (lo, hi), lo, tuple(stride))


class Recorder:
    """The instructions of one run, in issue order. Recording appends raw tuples (a few
    hundred nanoseconds); ``instructions`` builds the dataclasses on first access."""

    __slots__ = ("_done", "_pending", "allocations")

    def __init__(self):
        self._done: list[Instruction] = []
        self._pending: list[tuple] = []
        self.allocations: list[AllocationSite] = []  # on-chip allocations, in creation order

    def note_allocation(self, alloc_id: int, buffer: str, site: tuple, core: int | None,
                        placed: tuple | None = None, nbytes: int | None = None) -> None:
        """Record where on-chip allocation ``alloc_id`` was made (for the cost model);
        ``core``: the program id in an LNC=2 run, else None; ``placed``: its physical
        (p0, p1, b0, b1) when the kernel gave an address; ``nbytes``: bytes per partition."""
        self.allocations.append(AllocationSite(alloc_id, buffer, site, core, placed, nbytes))

    def record(self, op, engine, reads, writes, flops, attrs, core=None) -> int:
        """Append one instruction (``reads``/``writes``: ``capture`` tuples; ``core``: the
        program id in an LNC=2 run, recorded as ``attrs["core"]``); returns its index."""
        if core is not None:
            attrs["core"] = core
        self._pending.append((op, engine, reads, writes, flops, attrs))
        return len(self._done) + len(self._pending) - 1

    @property
    def instructions(self) -> list[Instruction]:
        if self._pending:
            done = self._done
            for op, engine, reads, writes, flops, attrs in self._pending:
                done.append(Instruction(
                    len(done), op, engine, tuple(build_operand(r) for r in reads),
                    tuple(build_operand(w) for w in writes), int(flops), attrs))
            self._pending.clear()
        return self._done

    def __len__(self):
        return len(self._done) + len(self._pending)
