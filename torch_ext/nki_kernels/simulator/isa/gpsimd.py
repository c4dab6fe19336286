"""GpSimd instructions: the affine patterns (``iota``, ``affine_select``), the
per-partition gather ``nc_n_gather``, the cross-partition ``tensor_partition_reduce``, the
16-partition ``local_gather`` and ``nonzero_with_count``. GpSimd reads and writes SBUF only
(never PSUM).
"""

from __future__ import annotations

import math
import numbers

import torch

from .. import dtypes as _dt
from .. import ops as _ops
from .operands import (f32, fail, free_elems, ints, is_scalar, max_rank, onchip, record, reduce_last,
                       require_generation,
                       same_free, same_partitions, signed_bits, start_partition, store)


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
    if on_true_tile.dtype == dst.dtype:
        # "If the data type of on_true_tile differs from that of dst, the input elements ...
        # are first cast to FP32" (nki.isa.affine_select, NKI 0.7): equal dtypes select the
        # bits themselves (an int32 above 2**24 keeps its low bits)
        t = on_true_tile._data.reshape(pred.shape)
        f = dst.dtype.to_bits(torch.tensor(float(on_false_value), dtype=torch.float32))
        store(I, dst, torch.where(pred, t, f.to(t.dtype)), raw=True)
    else:
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
    src = signed_bits(data._data.reshape(P, -1))  # same dtype: the gather moves bits
    idx = ints(indices).reshape(P, -1)
    n = src.shape[1]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise IndexError(f"{I}: index {int(idx.max())} out of range [0, {n}) for data {data.shape}")
    store(I, dst, torch.gather(src, 1, idx).view(data._data.dtype), raw=True)
    return record(I, "gpsimd", [("data", data), ("indices", indices)], [("dst", dst)],
                  dst.size, {})


def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce across partitions on GpSimd: dst[1, F] = op over data[P, F]."""
    I = "tensor_partition_reduce"
    onchip(I, "dst", dst, psum=False)
    onchip(I, "data", data, psum=False)
    o = _ops.resolve(op)
    name_ = "average" if o.name in ("average", "mean") else _ops.alu_of(o, I, "op").name
    # "op - the reduction operator (add, mean, max, bitwise_or, bitwise_and, bitwise_xor)"
    # (nki.isa.tensor_partition_reduce, NKI 0.7)
    bitwise = ("bitwise_or", "bitwise_and", "bitwise_xor")
    if name_ not in ("add", "average", "maximum") + bitwise:
        fail(f"{I}: op {o!r} is not supported (add, mean, maximum, bitwise_or, bitwise_and, "
             f"bitwise_xor)")
    if name_ in bitwise and not (data.dtype.is_int and dst.dtype.is_int):
        fail(f"{I}: op {name_} takes integer data and dst (bit patterns), got data "
             f"{data.dtype.name} and dst {dst.dtype.name}")
    # "The data and dst tiles can have at most four free dimensions (maximum rank 5)"
    max_rank(I, 5, ("data", data), ("dst", dst))
    if dst.shape[0] != 1 or free_elems(dst) != free_elems(data):
        fail(f"{I}: dst must be [1, {free_elems(data)}], got {dst.shape}")
    v = ints(data).reshape(data.shape[0], -1) if data.dtype.is_int else None
    if name_ in bitwise:
        r = reduce_last(name_, v.t())
    else:
        v = f32(data).reshape(data.shape[0], -1)
        r = v.mean(0) if name_ == "average" else reduce_last(name_, v.t())
    store(I, dst, r)
    return record(I, "gpsimd", [("data", data)], [("dst", dst)], data.size,
                  {"op": name_})


# GpSimd has eight cores, each wired to 16 contiguous SBUF partitions (nki.isa.local_gather,
# nki.isa.nonzero_with_count: "Each of the eight GpSimd cores connects to 16 contiguous SBUF
# partitions")
_CORE_PARTITIONS = 16
_LOCAL_GATHER_ELEMS = (1, 2, 4, 8, 16, 32)  # local_gather: num_elem_per_idx choices
_LOCAL_GATHER_MAX_INDICES = 4096            # "indices for gather per core ... <= 4096"


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Per GpSimd core (16 partitions): the core's ``index`` slice flattened partition-first
    gives element offsets into each of its partitions' free elements; ``num_elem_per_idx``
    contiguous elements are read at each (the docstring's numpy semantics: ``np.take`` of
    ``index[core].flatten(order='F')[:num_valid_indices]``). No dtype conversion."""
    I = "local_gather"
    onchip(I, "dst", dst, psum=False, why=" (GpSimd)")
    onchip(I, "src_buffer", src_buffer, psum=False, why=" (GpSimd)")
    onchip(I, "index", index, psum=False, why=" (GpSimd)")
    P = src_buffer.shape[0]
    if index.shape[0] != P or P % _CORE_PARTITIONS:
        fail(f"{I}: src_buffer and index must have the same partition count, a multiple of "
             f"{_CORE_PARTITIONS}; got {P} and {index.shape[0]}")
    same_partitions(I, "src_buffer", src_buffer, "dst", dst)
    if index.dtype.name != "uint16":
        fail(f"{I}: index must be uint16, got {index.dtype.name}")
    if dst.dtype != src_buffer.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal src_buffer dtype "
             f"{src_buffer.dtype.name} (no dtype conversion)")
    if num_elem_per_idx not in _LOCAL_GATHER_ELEMS:
        fail(f"{I}: num_elem_per_idx={num_elem_per_idx} must be one of {_LOCAL_GATHER_ELEMS}")
    per_core = free_elems(index) * _CORE_PARTITIONS
    n = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 1 <= n <= min(per_core, _LOCAL_GATHER_MAX_INDICES):
        fail(f"{I}: num_valid_indices={n} must be between 1 and "
             f"{min(per_core, _LOCAL_GATHER_MAX_INDICES)} (the indices of one core's 16 "
             f"partitions, at most {_LOCAL_GATHER_MAX_INDICES})")
    if free_elems(dst) != n * num_elem_per_idx:
        fail(f"{I}: dst has {free_elems(dst)} elements per partition; {n} indices x "
             f"{num_elem_per_idx} elements need {n * num_elem_per_idx}")
    src = signed_bits(src_buffer._data.reshape(P, -1))  # bits: a gather moves them unchanged
    F = src.shape[1]
    idx = ints(index).reshape(P, -1)
    out = torch.empty((P, n * num_elem_per_idx), dtype=src.dtype)
    span = torch.arange(num_elem_per_idx, dtype=torch.int64)
    for c in range(P // _CORE_PARTITIONS):
        rows = slice(c * _CORE_PARTITIONS, (c + 1) * _CORE_PARTITIONS)
        flat = idx[rows].t().reshape(-1)[:n]  # partition-first (order='F')
        offs = (flat.unsqueeze(1) + span).reshape(-1)
        if offs.numel() and (int(offs.min()) < 0 or int(offs.max()) >= F):
            raise IndexError(f"{I}: core {c} gathers element {int(offs.max())} of {F} per "
                             "partition (out of range: undefined on hardware)")
        out[rows] = src[rows][:, offs]
    store(I, dst, out.reshape(dst.shape).view(src_buffer._data.dtype), raw=True)
    return record(I, "gpsimd", [("src_buffer", src_buffer), ("index", index)], [("dst", dst)],
                  out.numel(), {"num_elem_per_idx": num_elem_per_idx, "num_valid_indices": n})


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """On partitions 0, 16, ..., 112 (each GpSimd core's 0-th partition): the indices of
    src's nonzero elements plus ``index_offset``, then ``padding_val``, then the count (dst
    has one more element per partition than src). Other dst partitions are not modified."""
    I = "nonzero_with_count"
    require_generation(I, 3, source="nki.isa.nonzero_with_count")
    onchip(I, "dst", dst, psum=False, why=" (GpSimd)")
    onchip(I, "src", src, psum=False, why=" (GpSimd)")
    same_partitions(I, "src", src, "dst", dst)
    if src.dtype.name not in ("float32", "int32"):
        fail(f"{I}: src dtype must be float32 or int32, got {src.dtype.name}")
    if dst.dtype.name != "int32":
        fail(f"{I}: dst dtype must be int32, got {dst.dtype.name}")
    F = free_elems(src)
    if free_elems(dst) != F + 1:
        fail(f"{I}: dst must have one more element per partition than src ({F + 1}), got "
             f"{free_elems(dst)}")
    for role, v in (("index_offset", index_offset), ("padding_val", padding_val)):
        integral = isinstance(v, numbers.Integral) and not isinstance(v, bool)  # numpy ints too
        if not integral or not -(1 << 31) <= int(v) < (1 << 31):
            fail(f"{I}: {role}={v!r} must be an int32")
    P = src.shape[0]
    s0 = start_partition(src)
    values = f32(src).reshape(P, F) if src.dtype.name == "float32" else ints(src).reshape(P, F)
    out = ints(dst).reshape(P, F + 1).clone()
    for p in range(P):
        if (s0 + p) % _CORE_PARTITIONS:
            continue
        nz = torch.nonzero(values[p] != 0).reshape(-1)
        row = torch.full((F + 1,), int(padding_val), dtype=torch.int64)
        row[:nz.numel()] = nz + int(index_offset)
        row[F] = nz.numel()
        out[p] = row
    store(I, dst, out.reshape(dst.shape))
    return record(I, "gpsimd", [("src", src)], [("dst", dst)], P * F, {})


def sequence_bounds(dst, segment_ids, name=None):
    """Per element of ``segment_ids`` [1, n]: [start, end) of its segment (a run of equal
    ids), as dst [1, 2, n]; id 0 is padding: start n, end -1 (nki.isa.sequence_bounds and
    its numpy example)."""
    I = "sequence_bounds"
    onchip(I, "dst", dst, psum=False, why=" (GpSimd)")
    onchip(I, "segment_ids", segment_ids, psum=False, why=" (GpSimd)")
    for role, t in (("dst", dst), ("segment_ids", segment_ids)):
        if t.dtype.name not in ("float32", "int32"):
            fail(f"{I}: {role} dtype must be float32 or int32, got {t.dtype.name}")
    if segment_ids.shape[0] != 1 or dst.shape[0] != 1:
        fail(f"{I}: the partition dim must be 1, got segment_ids {segment_ids.shape}, dst "
             f"{dst.shape}")
    n = free_elems(segment_ids)
    if free_elems(dst) != 2 * n:
        fail(f"{I}: dst must hold 2 x {n} elements per partition (start and end of each), got "
             f"{free_elems(dst)}")
    seq = f32(segment_ids).reshape(-1).tolist()
    negative = next((i for i, v in enumerate(seq) if v < 0), None)
    if negative is not None:
        fail(f"{I}: segment_ids element {negative} is {seq[negative]:g}; segment ids must be >= 0")
    start, end = [0] * n, [0] * n
    for i in range(n):
        if seq[i] == 0:
            start[i] = n
        elif i > 0 and seq[i] == seq[i - 1]:
            start[i] = start[i - 1]
        else:
            start[i] = i
    for i in range(n - 1, -1, -1):
        if seq[i] == 0:
            end[i] = -1
        elif i < n - 1 and seq[i] == seq[i + 1]:
            end[i] = end[i + 1]
        else:
            end[i] = i + 1
    store(I, dst, torch.tensor([start, end], dtype=torch.float32).reshape(dst.shape))
    return record(I, "gpsimd", [("segment_ids", segment_ids)], [("dst", dst)], n, {})
