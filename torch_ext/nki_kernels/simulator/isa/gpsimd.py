"""GpSimd instructions: the affine patterns (``iota``, ``affine_select``), the
per-partition gather ``nc_n_gather``, the cross-partition ``tensor_partition_reduce`` and
``core_barrier``. GpSimd reads and writes SBUF only (never PSUM).
"""

from __future__ import annotations

import math

import torch

from .. import dtypes as _dt
from .. import ops as _ops
from .operands import (f32, fail, free_elems, ints, is_scalar, onchip, record, reduce_last, same_free,
                       same_partitions, store)


def _pattern_values(I, dst, pattern, offset, channel_multiplier):
    if not isinstance(pattern, (list, tuple)) or not pattern or len(pattern) > 4:
        fail(f"{I}: pattern must be a list of 1 to 4 [step, num] pairs, got {pattern!r}")
    P = dst.shape[0]
    nums = []
    v = torch.full((P,), int(offset), dtype=torch.int64) + \
        torch.arange(P, dtype=torch.int64) * int(channel_multiplier)
    v = v.reshape(P, *([1] * len(pattern)))
    for i, pair in enumerate(pattern):
        step, num = (int(x) for x in pair)
        nums.append(num)
        shape = [1] * (len(pattern) + 1)
        shape[i + 1] = num
        v = v + (torch.arange(num, dtype=torch.int64) * step).reshape(shape)
    if math.prod(nums) != free_elems(dst):
        fail(f"{I}: pattern covers {math.prod(nums)} elements per partition but dst has "
             f"{free_elems(dst)}")
    return v.reshape(P, -1)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, i...] = offset + p*channel_multiplier + sum(step_k * i_k)`` on GpSimd (int32 math)."""
    I = "iota"
    onchip(I, "dst", dst, psum=False, why=" (iota writes SBUF)")
    v = _pattern_values(I, dst, pattern, offset, channel_multiplier)
    v = _dt.int32.round(v)  # generated in 32-bit integer arithmetic
    store(I, dst, v.to(torch.float32) if dst.dtype.is_float else v)
    return record(I, "gpsimd", [], [("dst", dst)], dst.size, {})


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
                  cmp_op=_ops.equal, offset=0, name=None):
    """``dst = where(cmp_op(affine_value, 0), on_true_tile, on_false_value)`` on GpSimd."""
    I = "affine_select"
    onchip(I, "dst", dst, psum=False, why=" (affine_select writes SBUF)")
    onchip(I, "on_true_tile", on_true_tile, psum=False, why=" (GpSimd reads SBUF)")
    same_partitions(I, "on_true_tile", on_true_tile, "dst", dst)
    same_free(I, "on_true_tile", on_true_tile, "dst", dst)
    if not is_scalar(on_false_value):
        fail(f"{I}: on_false_value must be a scalar, got {type(on_false_value).__name__}")
    c = _ops.resolve(cmp_op, "cmp_op")
    if not c.compare:
        fail(f"{I}: cmp_op {c!r} must be a comparison (nl.equal, nl.less, ...)")
    v = _pattern_values(I, dst, pattern, offset, channel_multiplier)
    pred = c.alu(v, torch.zeros((), dtype=torch.int64)) != 0
    t = f32(on_true_tile).reshape(pred.shape)
    store(I, dst, torch.where(pred, t, torch.tensor(float(on_false_value))))
    return record(I, "gpsimd", [("on_true_tile", on_true_tile)], [("dst", dst)],
                  dst.size, {"cmp_op": c.name})


def nc_n_gather(dst, data, indices, name=None):
    """Per-partition gather over the flattened free axes of ``data`` on GpSimd."""
    I = "nc_n_gather"
    onchip(I, "dst", dst, psum=False)
    onchip(I, "data", data, psum=False)
    onchip(I, "indices", indices, psum=False)
    same_partitions(I, "data", data, "indices", indices)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "indices", indices, "dst", dst)
    if indices.dtype.name != "uint32":
        fail(f"{I}: indices must be uint32, got {indices.dtype.name}")
    if dst.dtype != data.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    P = data.shape[0]
    src = data._data.reshape(P, -1)  # same dtype: the gather moves bits
    idx = ints(indices).reshape(P, -1)
    n = src.shape[1]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise IndexError(f"{I}: index {int(idx.max())} out of range [0, {n}) for data {data.shape}")
    store(I, dst, torch.gather(src, 1, idx), raw=True)
    return record(I, "gpsimd", [("data", data), ("indices", indices)], [("dst", dst)],
                  dst.size, {})


def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce across partitions on GpSimd: dst[1, F] = op over data[P, F]."""
    I = "tensor_partition_reduce"
    onchip(I, "dst", dst, psum=False)
    onchip(I, "data", data, psum=False)
    o = _ops.resolve(op)
    name_ = "average" if o.name in ("average", "mean") else _ops.alu_of(o, I, "op").name
    if name_ not in ("add", "average", "maximum", "bitwise_or", "bitwise_and"):
        fail(f"{I}: op {o!r} is not supported (add, average, maximum, bitwise_or, bitwise_and)")
    if dst.shape[0] != 1 or free_elems(dst) != free_elems(data):
        fail(f"{I}: dst must be [1, {free_elems(data)}], got {dst.shape}")
    v = ints(data).reshape(data.shape[0], -1) if data.dtype.is_int else None
    if name_ in ("bitwise_or", "bitwise_and"):
        r = reduce_last(name_, v.t())
    else:
        v = f32(data).reshape(data.shape[0], -1)
        r = v.mean(0) if name_ == "average" else reduce_last(name_, v.t())
    store(I, dst, r)
    return record(I, "gpsimd", [("data", data)], [("dst", dst)], data.size,
                  {"op": name_})
