"""Hand-built instruction traces for the cost-model tests (the simulator's record types).

Each helper returns ``trace.Operand``/``trace.Instruction`` records exactly as the
simulator would record them, so the cost model is tested without running any kernel.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from nki_kernels.simulator.trace import Instruction, Operand

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "uint8": 1,
            "float8_e4m3": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint16": 2}
_ids = itertools.count(10_000)


def new_alloc() -> int:
    return next(_ids)


def _operand(role, alloc, buffer, shape, dtype, offset=0, strides=None):
    n = math.prod(shape)
    if strides is None:  # contiguous
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    hi = offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    if buffer == "hbm":
        parts, free = 1, n
    else:
        parts, free = shape[0], n // shape[0]
    fields = dict(role=role, alloc_id=alloc, buffer=buffer, shape=tuple(shape), dtype=dtype,
                  partitions=parts, free_elems=free, nbytes=n * ITEMSIZE[dtype], span=(offset, hi))
    # offset/strides are optional trace fields (exact footprints); pass them when supported.
    if "strides" in Operand.__dataclass_fields__:
        fields.update(offset=offset, strides=tuple(strides))
    return Operand(**fields)


def hbm(role, alloc, shape, dtype="bfloat16", offset=0, strides=None):
    return _operand(role, alloc, "hbm", shape, dtype, offset, strides)


def sbuf(role, alloc, shape, dtype="bfloat16", offset=0, strides=None):
    return _operand(role, alloc, "sbuf", shape, dtype, offset, strides)


def psum(role, alloc, shape, dtype="float32", offset=0, strides=None):
    return _operand(role, alloc, "psum", shape, dtype, offset, strides)


class TraceBuilder:
    """Appends instructions with consecutive indices."""

    def __init__(self):
        self.trace: list[Instruction] = []

    def _add(self, name, engine, reads, writes, flops=0, **attrs):
        ins = Instruction(len(self.trace), name, engine, tuple(reads), tuple(writes), int(flops), dict(attrs))
        self.trace.append(ins)
        return ins

    def dma(self, dst, src):
        return self._add("dma_copy", "dma", [replace(src, role="src")], [replace(dst, role="dst")],
                         bytes=dst.nbytes)

    def matmul(self, dst, stationary, moving):
        k, m = stationary.shape[0], stationary.free_elems
        n = moving.free_elems
        fp32 = "float32" in (stationary.dtype, moving.dtype)
        return self._add("nc_matmul", "tensor", [stationary, moving], [dst], 2 * k * m * n,
                         K=k, M=m, N=n, fp32=fp32)

    def activation(self, dst, data, func="exp", reduce_res=None):
        writes = [dst] + ([reduce_res] if reduce_res is not None else [])
        return self._add("activation", "scalar", [data], writes, data.free_elems * data.partitions, func=func)

    def tensor_tensor(self, dst, a, b, op="add", engine="vector"):
        return self._add("tensor_tensor", engine, [a, b], [dst], a.free_elems * a.partitions, op=op)

    def tensor_copy(self, dst, src, engine="vector"):
        return self._add("tensor_copy", engine, [src], [dst], src.free_elems * src.partitions)

    def tensor_reduce(self, dst, data, op="add"):
        return self._add("tensor_reduce", "vector", [data], [dst], data.free_elems * data.partitions, op=op)

    def iota(self, dst):
        return self._add("iota", "gpsimd", [], [dst], 0)
