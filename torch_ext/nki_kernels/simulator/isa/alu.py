"""ALU instructions the Vector, Scalar and GpSimd engines share: ``tensor_copy``,
``memset``, ``tensor_tensor``, ``tensor_scalar``, ``scalar_tensor_tensor``,
``tensor_reduce``.

All compute in fp32 (integer-only arithmetic exactly, bitvec ops on the bit patterns) and
round once into dst's dtype. ``engine=`` picks the engine where the instruction allows it.
"""

from __future__ import annotations

import math

import torch

from .. import ops as _ops
from ..tensor import NkiTensor
from . import enums
from .operands import (cast_copy, check_reduce_cmd, engine_of, f32, fail, free_elems, ints, is_scalar,
                       max_rank, no_psum_on_gpsimd, not_both_psum, onchip, operand_vec, record,
                       require_generation,
                       reduce_free, reduce_last, same_free, same_partitions, store, target,
                       vector_reduce_regs)


def _ints(*ts):
    return all(isinstance(t, NkiTensor) and t.dtype.is_int for t in ts)


def tensor_copy(dst, src, engine=enums.engine.unknown, name=None):
    """Copy ``src`` to ``dst`` on chip (Vector, Scalar or GpSimd); casts through fp32."""
    onchip("tensor_copy", "dst", dst)
    onchip("tensor_copy", "src", src)
    same_partitions("tensor_copy", "src", src, "dst", dst)
    same_free("tensor_copy", "src", src, "dst", dst)
    eng = engine_of("tensor_copy", engine, ("vector", "scalar", "gpsimd"), "vector")
    if eng == "gpsimd":
        no_psum_on_gpsimd("tensor_copy", ("dst", dst), ("src", src))
    if eng == "scalar":
        require_generation("tensor_copy", 3, "engine=scalar", supported=target().scalar_engine_copy,
                           source="nki.isa.tensor_copy",
                           hint="the Scalar engine cannot copy there; use nisa.activation(op=nl.copy)")
    cast_copy("tensor_copy", dst, src)
    return record("tensor_copy", eng, [("src", src)], [("dst", dst)], dst.size, {})


def memset(dst, value, engine=enums.engine.unknown, name=None):
    """Fill ``dst`` with a constant (Vector or GpSimd)."""
    onchip("memset", "dst", dst)
    # v2.33 nki.isa.memset: "at most four free dimensions (maximum rank 5)"
    max_rank("memset", 5, ("dst", dst))
    eng = engine_of("memset", engine, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        no_psum_on_gpsimd("memset", ("dst", dst))
    if not is_scalar(value):
        fail(f"memset: value must be a compile-time scalar, got {type(value).__name__}")
    dt = dst.dtype
    if dt.is_packed:
        # "For x4 packed types (float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4), only
        # value=0 is supported" (nki.isa.memset, NKI 0.7): zero bits are four zeros
        if float(value) != 0.0:
            fail(f"memset: value {value!r} on packed dtype {dt.name}; only value=0 is supported")
        store("memset", dst, torch.zeros((), dtype=dst._data.dtype), raw=True)
        return record("memset", eng, [], [("dst", dst)], dst.size, {"value": value})
    if dt.is_int and isinstance(value, float) and not float(value).is_integer():
        fail(f"memset: value {value} does not match integer dst dtype {dt.name}")
    v = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
    store("memset", dst, v.to(torch.float32) if dt.is_float else v.expand(dst.shape))
    return record("memset", eng, [], [("dst", dst)], dst.size, {"value": value})


def tensor_tensor(dst, data1, data2, op, engine=enums.engine.unknown, name=None):
    """Elementwise ``op(data1, data2)`` on VectorE (or GpSimd), in fp32."""
    I = "tensor_tensor"
    onchip(I, "dst", dst)
    onchip(I, "data1", data1)
    onchip(I, "data2", data2)
    op = _ops.alu_of(_ops.resolve(op), I, "op")
    if op.unary:
        fail(f"{I}: op {op!r} is unary; use nisa.tensor_scalar")
    not_both_psum(I, "data1", data1, "data2", data2)
    # "The two tiles must have the same partition axis size and the same number of
    # elements per partition" (nki.isa.tensor_tensor): no rule on where each starts (each
    # operand's own start-partition rule is checked by onchip()).
    same_partitions(I, "data1", data1, "data2", data2)
    same_partitions(I, "data1", data1, "dst", dst)
    same_free(I, "data1", data1, "data2", data2)
    same_free(I, "data1", data1, "dst", dst)
    # Default engine (beta-2 docstring): GpSimd for power, and for all-int32/uint32
    # operands unless one of them is in PSUM (GpSimd cannot reach PSUM); else VectorE.
    int32_only = all(t.dtype.name in ("int32", "uint32") for t in (data1, data2, dst))
    in_psum = any(t._alloc.kind == "psum" for t in (data1, data2, dst))
    default = "gpsimd" if op.name == "power" or (int32_only and not in_psum) else "vector"
    eng = engine_of(I, engine, ("vector", "gpsimd"), default)
    if op.name == "power":
        # v2.33 nki.isa.tensor_tensor: power "runs on the GpSimd engine", and the tiles
        # "cannot be in PSUM if op is nl.power"
        if eng != "gpsimd":
            fail(f"{I}: op power runs on the GpSimd engine only; got engine={eng}")
        if in_psum:
            fail(f"{I}: op power cannot take tiles in PSUM (data1, data2 and dst must be in SBUF)")
    if eng == "gpsimd":
        no_psum_on_gpsimd(I, ("dst", dst), ("data1", data1), ("data2", data2))
    b_shape = data1.shape
    if op.bitvec:
        if not _ints(data1, data2, dst):
            fail(f"{I}: bitvec op {op!r} needs integer data1, data2 and dst")
        value = op.alu(ints(data1), ints(data2).reshape(b_shape))
    elif _ints(data1, data2, dst) and op.name in _INT_EXACT:
        value = op.alu(ints(data1), ints(data2).reshape(b_shape))  # exact integer arithmetic
    else:
        value = op.alu(f32(data1), f32(data2).reshape(b_shape))
    store(I, dst, value)
    return record(I, eng, [("data1", data1), ("data2", data2)], [("dst", dst)],
                  dst.size, {"op": op.name})


_INT_EXACT = ("add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal",
              "greater", "greater_equal", "less", "less_equal")


def scalar_stage(instr, op, operand, reverse, data_v, data, need_f32=True):
    if op.unary:
        if operand is not None and not (is_scalar(operand) and float(operand) == 0.0):
            fail(f"{instr}: operand of unary op {op!r} must be None or 0")
        return op.alu(data_v)
    o = operand_vec(instr, "operand", operand, data, need_f32=need_f32 and not op.bitvec)
    if op.bitvec:
        o = int(o) if isinstance(o, float) else o.to(torch.int64)
    elif not isinstance(o, float):
        o = o.expand_as(data_v)
    if isinstance(o, (int, float)):
        o = torch.tensor(o, dtype=data_v.dtype)
    return op.alu(o, data_v) if reverse else op.alu(data_v, o)


_SCALAR_ENGINE_COMBOS = {("multiply", "add"), ("multiply", None), ("add", None)}


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=enums.engine.unknown, name=None):
    """``(data op0 operand0) op1 operand1`` with scalar or (P, 1) operands broadcast along
    the free axes (Vector, Scalar or GpSimd), in fp32."""
    I = "tensor_scalar"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    o0 = _ops.alu_of(_ops.resolve(op0, "op0"), I, "op0")
    o1 = None if op1 is None else _ops.alu_of(_ops.resolve(op1, "op1"), I, "op1")
    if o1 is None and operand1 is not None:
        fail(f"{I}: operand1 is given but op1 is None")
    if o1 is not None and o0.bitvec != o1.bitvec:
        fail(f"{I}: op0 {o0!r} and op1 {o1!r} must both be bitvec or both arithmetic")
    eng = engine_of(I, engine, ("vector", "scalar", "gpsimd"), "vector")
    if o0.bitvec and eng != "vector":
        # "If bitvec operators are used, the tensor_scalar instruction must run on Vector
        # Engine" (NKI 0.7 docstring)
        fail(f"{I}: bitvec op {o0!r} must run on the Vector engine, got engine={eng}")
    if eng == "gpsimd":
        no_psum_on_gpsimd(I, ("dst", dst), ("data", data), ("operand0", operand0),
                          ("operand1", operand1))
    if eng == "scalar":
        combo = (o0.name, o1.name if o1 else None)
        if combo not in _SCALAR_ENGINE_COMBOS:
            fail(f"{I}: the Scalar engine supports only (multiply, add), (multiply, None), "
                 f"(add, None); got {combo}")
    if o0.bitvec:
        if not _ints(data, dst):
            fail(f"{I}: bitvec op {o0!r} needs integer data and dst")
        v = ints(data)
    else:
        v = f32(data)
    v = scalar_stage(I, o0, operand0, reverse0, v, data)
    if o1 is not None:
        v = scalar_stage(I, o1, operand1, reverse1, v, data)
    store(I, dst, v)
    return record(I, eng, [("data", data), ("operand0", operand0), ("operand1", operand1)],
                  [("dst", dst)], dst.size,
                  {"op0": o0.name, "op1": o1.name if o1 else None})


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False,
                         reverse1=False, reduce_cmd=enums.reduce_cmd.reset_reduce, reduce_op=...,
                         reduce_res=None, name=None):
    """``(data op0 operand0) op1 operand1``: operand0 scalar/(P,1), operand1 a full tile; with
    ``reduce_op`` (v2.33 signature: ``reduce_cmd=reset_reduce, reduce_op=..., reduce_res=None``)
    also the result's free-axis reduction into the VectorE accumulators, read out into
    ``reduce_res``, as tensor_scalar_reduce's (the v2.33 page's constraints on it lie past
    what we could read: the ops and commands taken are tensor_scalar_reduce's, less
    load_reduce, which needs a reduce_init this signature lacks)."""
    I = "scalar_tensor_tensor"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    onchip(I, "operand1", operand1)
    not_both_psum(I, "data", data, "operand1", operand1)
    same_partitions(I, "data", data, "dst", dst)
    same_partitions(I, "data", data, "operand1", operand1)
    same_free(I, "data", data, "dst", dst)
    same_free(I, "data", data, "operand1", operand1)
    o0 = _ops.alu_of(_ops.resolve(op0, "op0"), I, "op0")
    o1 = _ops.alu_of(_ops.resolve(op1, "op1"), I, "op1")
    for role, o in (("op0", o0), ("op1", o1)):
        if o.bitvec:
            fail(f"{I}: {role}={o!r} is a bitvec operator; op0 and op1 must be arithmetic")
    # "All input tiles can be any supported NKI data type" (nki.isa.scalar_tensor_tensor):
    # unlike tensor_scalar's, operand0 need not be float32.
    v = scalar_stage(I, o0, operand0, reverse0, f32(data), data, need_f32=False)
    t = f32(operand1).reshape(v.shape)
    v = o1.alu(t, v) if reverse1 else o1.alu(v, t)
    writes, attrs = [("dst", dst)], {"op0": o0.name, "op1": o1.name}
    if reduce_op is not ... and reduce_op is not None:
        ro = _ops.alu_of(_ops.resolve(reduce_op, "reduce_op"), I, "reduce_op")
        if ro.name not in ("add", "multiply", "maximum", "minimum"):
            fail(f"{I}: reduce_op {ro!r} is not supported (add, multiply, max, min)")
        cmd = check_reduce_cmd(I, reduce_cmd)
        if cmd not in (enums.reduce_cmd.reset_reduce, enums.reduce_cmd.reduce):
            fail(f"{I}: reduce_cmd={cmd!r} is not supported with a reduction (reset_reduce, reduce)")
        store(I, dst, v)
        vector_reduce_regs(I, ro.name, cmd, reduce_free(ro.name, v), data, reduce_res)
        writes.append(("reduce_res", reduce_res))
        attrs.update(reduce_op=ro.name, reduce_cmd=cmd.name, reduce=reduce_res is not None)
    elif reduce_res is not None:
        fail(f"{I}: reduce_res is given but reduce_op is not; name the reduction (nl.add, "
             "nl.multiply, nl.maximum or nl.minimum)")
    else:
        store(I, dst, v)
    return record(I, "vector", [("data", data), ("operand0", operand0), ("operand1", operand1)],
                  writes, 2 * dst.size, attrs)


def reduce_axes(instr, axis, ndim):
    if isinstance(axis, int):
        axis = (axis,)
    axes = sorted(a + ndim if a < 0 else a for a in (int(x) for x in axis))
    if not axes or axes[0] == 0:
        fail(f"{instr}: axis {tuple(axis)} must name free axes only (axis 0 is the partition dim)")
    if axes != list(range(axes[0], ndim)):
        fail(f"{instr}: axis {tuple(axis)} must be the last contiguous free axes of a "
             f"{ndim}-D tile (e.g. {tuple(range(ndim - 1, ndim))} or {tuple(range(1, ndim))})")
    return axes


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce the trailing free ``axis`` of ``data`` with ``op`` on VectorE (fp32)."""
    I = "tensor_reduce"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    op = _ops.alu_of(_ops.resolve(op), I, "op")
    if not op.reducible:
        fail(f"{I}: op {op!r} is not a legal reduction operator")
    nd = data.ndim
    axes = reduce_axes(I, axis, nd)
    keep = data.shape[:axes[0]]
    n_out = math.prod(keep[1:])
    if free_elems(dst) != n_out:
        fail(f"{I}: dst has {free_elems(dst)} elements per partition; reducing axes "
             f"{tuple(axes)} of {data.shape} leaves {n_out}")
    if op.bitvec:
        if not _ints(data, dst):
            fail(f"{I}: bitvec op {op!r} needs integer data and dst")
        v = ints(data)
    else:
        v = f32(data)
    r = reduce_last(op.name, v.reshape(tuple(keep) + (-1,)))
    if negate:
        if op.bitvec:
            fail(f"{I}: negate=True with the bitvec op {op!r}; negate applies only to arithmetic operators")
        r = -r
    store(I, dst, r)
    return record(I, "vector", [("data", data)], [("dst", dst)], data.size,
                  {"op": op.name, "axis": tuple(axes), "negate": bool(negate)})
