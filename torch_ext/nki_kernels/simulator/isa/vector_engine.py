"""VectorE instructions (beyond the shared ALU ones in alu.py): predicated copies and
selects, the accumulator-register reductions and scans, statistics (``bn_stats``,
``bn_aggr``), top-8 search, the quadrant shuffle and the random-number instructions.

The 128 per-lane VectorE accumulators live in the run's context (``vector_regs``); they
start poisoned (NaN), as the hardware leaves them undefined.
"""

from __future__ import annotations

import math
import numbers

import torch

from .. import ops as _ops
from ..context import current
from ..tensor import NkiTensor
from . import enums
from .alu import scalar_stage
from .operands import (check_reduce_cmd, engine_of, f32, fail, free_elems, ints, lanes, max_rank,
                       no_psum_on_gpsimd, not_both_psum, onchip, operand_vec, record, reduce_free,
                       require_generation,
                       same_free, same_partitions, start_partition, store, target,
                       vector_reduce_regs)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """``dst = src`` where ``predicate`` (else dst unchanged), on VectorE."""
    instr = "tensor_copy_predicated"
    onchip(instr, "dst", dst)
    onchip(instr, "predicate", predicate)
    same_partitions(instr, "dst", dst, "predicate", predicate)
    same_free(instr, "dst", dst, "predicate", predicate)
    if predicate.dtype.name not in ("uint8", "uint16", "uint32"):
        fail(f"{instr}: predicate dtype must be uint8, uint16 or uint32, got {predicate.dtype.name}")
    if isinstance(src, NkiTensor):
        onchip(instr, "src", src)
        not_both_psum(instr, "src", src, "predicate", predicate)
        same_partitions(instr, "dst", dst, "src", src)
        same_free(instr, "dst", dst, "src", src)
        if src.dtype != dst.dtype:
            fail(f"{instr}: src dtype {src.dtype.name} must equal dst dtype {dst.dtype.name}")
        sv = src._data.reshape(dst.shape)  # same dtype: bits
    else:
        sv = dst.dtype.to_bits(torch.full(dst.shape, float(src), dtype=torch.float32))
    pred = (ints(predicate) != 0).reshape(dst.shape)
    if reverse_pred:
        pred = ~pred
    store(instr, dst, torch.where(pred, sv, dst._data), raw=True)
    return record(instr, "vector", [("src", src), ("predicate", predicate)], [("dst", dst)],
                  dst.size, {})


def reciprocal(dst, data, name=None):
    """``1 / data`` on VectorE (more precise than activation(nl.reciprocal))."""
    I = "reciprocal"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    # v2.33 nki.isa.reciprocal: "at most four free dimensions (maximum rank 5)"
    max_rank(I, 5, ("data", data), ("dst", dst))
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    store(I, dst, torch.reciprocal(f32(data)))
    return record(I, "vector", [("data", data)], [("dst", dst)], dst.size, {})


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=enums.reduce_cmd.reset_reduce, reduce_init=None,
                         reduce_res_negate=False, name=None):
    """``dst = data op0 operand0`` plus its free-axis reduction into the VectorE accumulators
    (read out into ``reduce_res``)."""
    I = "tensor_scalar_reduce"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    o0 = _ops.alu_of(_ops.resolve(op0, "op0"), I, "op0")
    if o0.bitvec:
        fail(f"{I}: op0 must be an arithmetic operator, got bitvec {o0!r}")
    ro = _ops.alu_of(_ops.resolve(reduce_op, "reduce_op"), I, "reduce_op")
    if ro.name not in ("add", "multiply", "maximum", "minimum"):
        fail(f"{I}: reduce_op {ro!r} is not supported (add, multiply, max, min)")
    # NKI 0.7 docstring: reverse0 "(not supported yet)"; reduce_cmd "Supported: reset_reduce
    # (default), reduce, load_reduce"; reduce_init "should only be set when reduce_cmd is
    # load_reduce", "Supported dtypes: float32"; v2.33 page: "at most three free dimensions"
    if reverse0:
        fail(f"{I}: reverse0=True is not supported (the NKI 0.7 docstring: 'not supported yet')")
    max_rank(I, 4, ("data", data), ("dst", dst))
    cmd = check_reduce_cmd(I, reduce_cmd)
    ok_cmds = (enums.reduce_cmd.reset_reduce, enums.reduce_cmd.reduce, enums.reduce_cmd.load_reduce)
    if cmd not in ok_cmds:
        fail(f"{I}: reduce_cmd={cmd!r} is not supported (reset_reduce, reduce, load_reduce)")
    if cmd is enums.reduce_cmd.load_reduce and reduce_init is None:
        fail(f"{I}: reduce_cmd load_reduce needs reduce_init")
    if cmd is not enums.reduce_cmd.load_reduce and reduce_init is not None:
        fail(f"{I}: reduce_init is only for reduce_cmd=load_reduce, got {cmd!r}")
    v = scalar_stage(I, o0, operand0, reverse0, f32(data), data)
    store(I, dst, v)
    init = None
    if reduce_init is not None:
        init = operand_vec(I, "reduce_init", reduce_init, data, need_f32=True)
        init = init.reshape(-1) if isinstance(init, torch.Tensor) else init
    vector_reduce_regs(I, ro.name, cmd, reduce_free(ro.name, v), data, reduce_res, init,
                       reduce_res_negate)
    return record(I, "vector", [("data", data), ("operand0", operand0)],
                  [("dst", dst), ("reduce_res", reduce_res)], dst.size,
                  {"op0": o0.name, "reduce_op": ro.name, "reduce_cmd": cmd.name,
                   "reduce": reduce_res is not None})


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None,
                             reduce_cmd=enums.reduce_cmd.reset_reduce, name=None):
    """Running ``reg = op1(op0(src[i], imm0), reg)``; ``dst[i] = reg`` along the free axes."""
    I = "tensor_scalar_cumulative"
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_partitions(I, "src", src, "dst", dst)
    same_free(I, "src", src, "dst", dst)
    # NKI 0.7 docstring: "Scalar operation (op0) must be an arithmetic op", "Reduction
    # operation (op1) is limited to add, subtract, mult, max, min", "INT32/UINT32 are not
    # supported as input/output dtypes (ISA limitation)", imm0 and imm1 "Must be FP32 datatype".
    # The comparisons are arithmetic operators too (the "Supported Math Operators for NKI ISA"
    # table, nki.api.shared: only the bitvec ones are not), as tensor_scalar_reduce takes them
    o0 = _ops.alu_of(_ops.resolve(op0, "op0"), I, "op0")
    o1 = _ops.alu_of(_ops.resolve(op1, "op1"), I, "op1")
    if o0.bitvec:
        fail(f"{I}: op0 {o0!r} must be an arithmetic operator (e.g. nl.add, nl.multiply), not a bitvec one")
    if o1.name not in ("add", "subtract", "multiply", "maximum", "minimum"):
        fail(f"{I}: op1 {o1!r} must be add, subtract, multiply, maximum or minimum")
    for role, t in (("src", src), ("dst", dst)):
        if t.dtype.name in ("int32", "uint32"):
            fail(f"{I}: {role} dtype {t.dtype.name} is not supported (INT32/UINT32 are an ISA "
                 f"limitation of this instruction)")
    # its pseudo-code and "Accumulator behavior" name reset_reduce, load_reduce and reduce only
    # (reset and idle would leave the register as the last instruction left it: refused)
    cmd = check_reduce_cmd(I, reduce_cmd)
    ok_cmds = (enums.reduce_cmd.reset_reduce, enums.reduce_cmd.reduce, enums.reduce_cmd.load_reduce)
    if cmd not in ok_cmds:
        fail(f"{I}: reduce_cmd={cmd!r} is not supported (reset_reduce, reduce, load_reduce)")
    v = scalar_stage(I, o0, imm0, False, f32(src), src).reshape(src.shape[0], -1)
    ctx = current()
    sl = lanes(src)
    if cmd is enums.reduce_cmd.reset_reduce:
        ctx.vector_regs[sl] = {"add": 0.0, "subtract": 0.0, "multiply": 1.0,
                               "maximum": -math.inf, "minimum": math.inf}[o1.name]
    elif cmd is enums.reduce_cmd.load_reduce:
        init = operand_vec(I, "imm1", imm1, src, need_f32=True)
        ctx.vector_regs[sl] = init.reshape(-1) if isinstance(init, torch.Tensor) else init
    start = ctx.vector_regs[sl].unsqueeze(1)
    cat = torch.cat([start, v], dim=1)
    if o1.name in ("add", "subtract", "multiply"):
        # reg = op1(op0(x[i], imm0), reg), one step per element with the fp32 register
        # rounded at each step (VectorE computes "in float32 math"; torch's CPU cumsum and
        # cumprod carry the sum in float64 and round only the output, which drifts from the
        # register's value on long rows); subtract is also not associative: x'[i] - reg
        step = {"add": torch.add, "multiply": torch.mul, "subtract": torch.sub}[o1.name]
        out = cat.clone()
        for i in range(1, cat.shape[1]):
            out[:, i] = step(cat[:, i], out[:, i - 1])
    elif o1.name == "maximum":
        out = torch.cummax(cat, 1).values
    else:
        out = torch.cummin(cat, 1).values
    out = out[:, 1:]
    ctx.vector_regs[sl] = out[:, -1]
    store(I, dst, out)
    return record(I, "vector", [("src", src)], [("dst", dst)], dst.size,
                  {"op0": o0.name, "op1": o1.name})


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False,
                       name=None):
    """``res[:, i] = op1(op0(data0[:, i], res[:, i-1]), data1[:, i])`` along the free axis."""
    I = "tensor_tensor_scan"
    for role, t in (("dst", dst), ("data0", data0), ("data1", data1)):
        onchip(I, role, t)
    not_both_psum(I, "data0", data0, "data1", data1)
    same_partitions(I, "data0", data0, "data1", data1)
    same_partitions(I, "data0", data0, "dst", dst)
    same_free(I, "data0", data0, "data1", data1)
    same_free(I, "data0", data0, "dst", dst)
    o0 = _ops.alu_of(_ops.resolve(op0, "op0"), I, "op0")
    o1 = _ops.alu_of(_ops.resolve(op1, "op1"), I, "op1")
    # "Both op0 and op1 can be any binary arithmetic operator" (NKI 0.7 docstring)
    for role, o in (("op0", o0), ("op1", o1)):
        if o.bitvec or o.unary:
            fail(f"{I}: {role} {o!r} must be a binary arithmetic operator (e.g. nl.add, nl.multiply)")
    P = data0.shape[0]
    a = f32(data0).reshape(P, -1)
    b = f32(data1).reshape(P, -1)
    init = operand_vec(I, "initial", initial, data0)
    prev = init.reshape(P) if isinstance(init, torch.Tensor) else torch.full((P,), init)
    out = torch.empty_like(a)
    for i in range(a.shape[1]):  # a true recurrence: one step per free element
        t = o0.alu(prev, a[:, i]) if reverse0 else o0.alu(a[:, i], prev)
        prev = o1.alu(b[:, i], t) if reverse1 else o1.alu(t, b[:, i])
        out[:, i] = prev
    store(I, dst, out)
    return record(I, "vector", [("data0", data0), ("data1", data1)], [("dst", dst)],
                  2 * dst.size, {"op0": o0.name, "op1": o1.name})


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None,
                  reduce_cmd=enums.reduce_cmd.idle, reduce_op=_ops.maximum, reverse_pred=False,
                  name=None):
    """``dst = where(predicate, on_true, on_false)`` on VectorE, optional max into the
    accumulators (read out into ``reduce_res``)."""
    I = "select_reduce"
    onchip(I, "dst", dst)
    onchip(I, "predicate", predicate)
    onchip(I, "on_true", on_true)
    not_both_psum(I, "on_true", on_true, "predicate", predicate)
    same_partitions(I, "on_true", on_true, "dst", dst)
    same_partitions(I, "on_true", on_true, "predicate", predicate)
    same_free(I, "on_true", on_true, "dst", dst)
    same_free(I, "on_true", on_true, "predicate", predicate)
    if on_true.dtype.name in ("tfloat32", "int32", "uint32"):
        fail(f"{I}: on_true dtype {on_true.dtype.name} is not supported (its docstring excludes tfloat32, int32 "
             "and uint32)")
    if predicate.dtype.name not in ("int8", "uint8", "int16", "uint16"):
        fail(f"{I}: predicate dtype must be int8, uint8, int16 or uint16, got {predicate.dtype.name}")
    ro = _ops.alu_of(_ops.resolve(reduce_op, "reduce_op"), I, "reduce_op")
    if ro.name != "maximum":
        fail(f"{I}: reduce_op {ro!r} is not supported; only nl.maximum")
    cmd = check_reduce_cmd(I, reduce_cmd)
    shape = on_true.shape
    if reduce_res is not None and not reduce_res.dtype.is_float:
        # "reduce_res dtype must [be] of float type" (its docstring)
        fail(f"{I}: reduce_res dtype {reduce_res.dtype.name} must be a float type")
    pred = (ints(predicate) != 0).reshape(shape)
    if reverse_pred:
        pred = ~pred
    f = operand_vec(I, "on_false", on_false, on_true)
    f = torch.tensor(f) if isinstance(f, float) else f.expand(shape)
    v = torch.where(pred, f32(on_true), f)
    store(I, dst, v)
    if cmd is not enums.reduce_cmd.idle or reduce_res is not None:
        r = reduce_free("maximum", v)
        vector_reduce_regs(I, "maximum", cmd, r, on_true, reduce_res)
    return record(I, "vector", [("predicate", predicate), ("on_true", on_true),
                                ("on_false", on_false)], [("dst", dst), ("reduce_res", reduce_res)],
                  dst.size, {"reduce": reduce_res is not None, "reduce_cmd": cmd.name})


_FP32_MIN = float(torch.finfo(torch.float32).min)    # -3.4028234663852886e+38


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1,
                 reduce_cmd=enums.reduce_cmd.reset_reduce, reduce_res=None, reduce_op=_ops.maximum,
                 range_start=0, on_false_value=-3.4028235e38, name=None):
    """Keep elements whose free index (+range_start) satisfies both comparisons with the
    per-partition bounds; others become on_false_value. Max-reduces into the accumulators."""
    I = "range_select"
    require_generation(I, 3, supported=target().has_range_select, source="nki.isa.range_select")
    onchip(I, "dst", dst)
    onchip(I, "on_true_tile", on_true_tile)
    same_partitions(I, "on_true_tile", on_true_tile, "dst", dst)
    same_free(I, "on_true_tile", on_true_tile, "dst", dst)
    if not on_true_tile.dtype.is_float:
        fail(f"{I}: on_true_tile must be a float dtype, got {on_true_tile.dtype.name}")
    # "Due to hardware constraints, this must be FP32_MIN (-3.4028235e+38)" (its docstring)
    if float(torch.tensor(float(on_false_value), dtype=torch.float32)) != _FP32_MIN:   # as fp32
        fail(f"{I}: on_false_value={on_false_value!r} must be FP32_MIN ({_FP32_MIN!r})")
    c0 = _ops.resolve(comp_op0, "comp_op0")
    c1 = _ops.resolve(comp_op1, "comp_op1")
    for role, c in (("comp_op0", c0), ("comp_op1", c1)):
        if c.name not in ("equal", "less", "less_equal", "greater", "greater_equal"):
            fail(f"{I}: {role} {c!r} must be one of equal, less, less_equal, greater, greater_equal")
    # its docstring: reduce_op "Currently only nl.maximum is supported"; bound0 / bound1 "tile
    # with one element per partition"; range_start "must be a compile-time integer"
    ro = _ops.resolve(reduce_op, "reduce_op")
    if ro.name != "maximum":
        fail(f"{I}: reduce_op {ro!r}: only nl.maximum is supported")
    for role, bound in (("bound0", bound0), ("bound1", bound1)):
        if not isinstance(bound, NkiTensor):
            fail(f"{I}: {role} must be a (P, 1) tile with one element per partition, got {type(bound).__name__} "
                 f"{bound!r}")
    if isinstance(range_start, bool) or not isinstance(range_start, numbers.Integral):
        fail(f"{I}: range_start={range_start!r} must be a compile-time integer")
    b0 = operand_vec(I, "bound0", bound0, on_true_tile, need_f32=True)
    b1 = operand_vec(I, "bound1", bound1, on_true_tile, need_f32=True)
    P = on_true_tile.shape[0]
    x = f32(on_true_tile).reshape(P, -1)
    idx = (torch.arange(x.shape[1], dtype=torch.float32) + float(range_start)).expand(P, -1)
    b0 = b0.reshape(P, 1) if isinstance(b0, torch.Tensor) else b0
    b1 = b1.reshape(P, 1) if isinstance(b1, torch.Tensor) else b1
    mask = (c0.alu(idx, b0) != 0) & (c1.alu(idx, b1) != 0)
    v = torch.where(mask, x, torch.tensor(float(on_false_value)))
    store(I, dst, v)
    cmd = check_reduce_cmd(I, reduce_cmd)
    vector_reduce_regs(I, "maximum", cmd, v.amax(1), on_true_tile, reduce_res)
    return record(I, "vector", [("on_true_tile", on_true_tile), ("bound0", bound0),
                                ("bound1", bound1)], [("dst", dst), ("reduce_res", reduce_res)],
                  dst.size, {"reduce": reduce_res is not None})


def bn_stats(dst, data, name=None):
    """Per partition: [count, mean, var*count] of the even and of the odd elements (6 values)."""
    I = "bn_stats"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    F = free_elems(data)
    fmax = target().bn_stats_fmax
    if F > fmax:
        fail(f"{I}: data has {F} elements per partition, exceeds maximum {fmax} "
             "(nl.tile_size.bn_stats_fmax)")
    if free_elems(dst) != 6:
        fail(f"{I}: dst must have 6 elements per partition, got {free_elems(dst)}")
    P = data.shape[0]
    x = f32(data).reshape(P, F)
    outs = []
    for part in (x[:, 0::2], x[:, 1::2]):
        n = part.shape[1]
        if n:
            m = part.mean(1)
            m2 = ((part - m[:, None]) ** 2).sum(1)
        else:
            m = torch.zeros(P)
            m2 = torch.zeros(P)
        outs += [torch.full((P,), float(n)), m, m2]
    store(I, dst, torch.stack(outs, 1))
    return record(I, "vector", [("data", data)], [("dst", dst)], data.size, {})


def bn_aggr(dst, data, name=None):
    """Combine (count, mean, var*count) triples per partition into [mean, variance]
    (population variance)."""
    I = "bn_aggr"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    F = free_elems(data)
    if F % 3:
        fail(f"{I}: data must have a multiple of 3 elements per partition, got {F}")
    if free_elems(dst) != 2:
        fail(f"{I}: dst must have 2 elements per partition (mean, variance), got {free_elems(dst)}")
    P = data.shape[0]
    x = f32(data).reshape(P, F // 3, 3)
    c, m, m2 = x[..., 0], x[..., 1], x[..., 2]
    n = c.sum(1)
    safe_n = torch.where(n > 0, n, torch.ones_like(n))
    mean = (c * m).sum(1) / safe_n
    var = (m2.sum(1) + (c * (m - mean[:, None]) ** 2).sum(1)) / safe_n
    store(I, dst, torch.stack([mean, var], 1))
    return record(I, "vector", [("data", data)], [("dst", dst)], data.size, {})


def max8(dst, src, name=None):
    """The 8 largest values per partition, descending, on VectorE."""
    I = "max8"
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_partitions(I, "src", src, "dst", dst)
    # "The source tile can be up to 3-dimensional, while the output tile is always
    # 2-dimensional" (nki.isa.max8, NKI 0.7)
    max_rank(I, 3, ("src", src))
    if len(dst.shape) != 2:
        fail(f"{I}: dst must be 2-D [partitions, 8], got shape {tuple(dst.shape)}")
    F = free_elems(src)
    lo, hi = target().max8_min_elems, target().max8_max_elems
    if not lo <= F <= hi:
        fail(f"{I}: src has {F} elements per partition; between {lo} and {hi} are allowed")
    if free_elems(dst) != 8:
        fail(f"{I}: dst must have 8 elements per partition, got {free_elems(dst)}")
    v = f32(src).reshape(src.shape[0], -1)
    store(I, dst, torch.topk(v, 8, dim=1).values)
    return record(I, "vector", [("src", src)], [("dst", dst)], src.size, {})


def nc_find_index8(dst, data, vals, name=None):
    """Index of each of 8 values per partition (all ones if absent). A value repeated in
    ``vals`` takes its successive occurrences in ``data``: the k-th copy the k-th occurrence
    (AWS's simulator was fixed to this "to match hardware", Neuron 2.32 release notes, NKI
    "Bug Fixes": "Duplicate search values now advance through successive occurrences")."""
    I = "nc_find_index8"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    onchip(I, "vals", vals)
    # "The data tensor can be up to 3-dimensional, while the vals tensor must be up to
    # 3-dimensional"; dst "a 2D tile ... with shape [par_dim, 8]" (nki.isa.nc_find_index8)
    max_rank(I, 3, ("data", data), ("vals", vals))
    if len(dst.shape) != 2:
        fail(f"{I}: dst must be 2-D [partitions, 8], got shape {tuple(dst.shape)}")
    if free_elems(vals) != 8 or free_elems(dst) != 8:
        fail(f"{I}: vals has {free_elems(vals)} and dst {free_elems(dst)} elements per partition; both must "
             "have 8")
    # docstring: "between 8 and 16,384 elements per partition"; output "uint16 or uint32"
    if not 8 <= free_elems(data) <= 16384:
        fail(f"{I}: data has {free_elems(data)} elements per partition; between 8 and 16384 are allowed")
    if dst.dtype.name not in ("uint16", "uint32"):
        fail(f"{I}: dst dtype {dst.dtype.name} must be uint16 or uint32")
    P = data.shape[0]
    x = f32(data).reshape(P, 1, -1)
    v = f32(vals).reshape(P, 8, 1)
    eq = x == v                                                   # [P, 8, F]
    # the copy number of each value among the vals before it: 0 for its first copy
    same = v.reshape(P, 8, 1) == v.reshape(P, 1, 8)               # [P, 8 (j), 8 (i)]
    copy_no = torch.tril(same.to(torch.int64), diagonal=-1).sum(2, keepdim=True)
    hit = eq & (eq.to(torch.int64).cumsum(2) == copy_no + 1)
    index = hit.to(torch.int64).argmax(2)
    sentinel = 0xFFFF if dst.dtype.name == "uint16" else 0xFFFFFFFF
    store(I, dst, torch.where(hit.any(2), index, torch.tensor(sentinel)))
    return record(I, "vector", [("data", data), ("vals", vals)], [("dst", dst)],
                  data.size, {})


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """Replace the first occurrence of each of 8 values with ``imm`` (vals in reverse order)."""
    I = "nc_match_replace8"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    onchip(I, "vals", vals)
    same_free(I, "data", data, "dst", dst)
    # vals: "tensor containing the 8 values per partition to match" (nki.isa.nc_match_replace8)
    if free_elems(vals) != 8:
        fail(f"{I}: vals has {free_elems(vals)} elements per partition; it must have 8")
    P = data.shape[0]
    x = f32(data).reshape(P, -1).clone()
    v = f32(vals).reshape(P, 8)
    taken = torch.zeros_like(x, dtype=torch.bool)
    idx = torch.zeros((P, 8), dtype=torch.int64)
    for i in range(7, -1, -1):  # reverse order, as the hardware processes vals
        eq = (x == v[:, i:i + 1]) & ~taken
        j = eq.to(torch.int64).argmax(1)
        hit = eq.any(1)
        rows = torch.arange(P)[hit]
        taken[rows, j[hit]] = True
        idx[:, i] = torch.where(hit, j, torch.tensor(0xFFFFFFFF))
    x[taken] = float(imm)
    store(I, dst, x)
    if dst_idx is not None:
        onchip(I, "dst_idx", dst_idx)
        store(I, dst_idx, idx)
    return record(I, "vector", [("data", data), ("vals", vals)], [("dst", dst), ("dst_idx", dst_idx)],
                  data.size, {})


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Cross-partition move within each 32-partition quadrant: dst[i] = src[mask[i]]."""
    I = "nc_stream_shuffle"
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_free(I, "src", src, "dst", dst)
    if dst.dtype != src.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal src dtype {src.dtype.name}")
    mask = [int(m) for m in shuffle_mask]
    q = target().partition_quadrant  # the shuffle moves data within each quadrant
    if len(mask) != q:
        fail(f"{I}: shuffle_mask must have {q} entries, got {len(mask)}")
    # "shuffle_mask[i] indicates which input partition the output partition [i] copies from
    # within each 32-partition quadrant. The special value shuffle_mask[i]=255 means the
    # output tensor in partition [i] will be unmodified" (nki.isa.nc_stream_shuffle, NKI 0.7)
    for i, m in enumerate(mask):
        if not (0 <= m < q or m == 255):
            fail(f"{I}: shuffle_mask[{i}]={m} must be a partition of the quadrant (0..{q - 1}) "
                 f"or 255 (leave unchanged)")
    Ps, Pd = src.shape[0], dst.shape[0]
    # "num_active_partitions = ceil(max(src_num_partitions, dst_num_partitions)/32) * 32 ...
    # If num_active_partitions is 96/128, src_start_partition/dst_start_partition must be 0.
    # If ... 64, ... must be 0/64. If ... 32, ... must be 0/32/64/96."
    active = -(-max(Ps, Pd) // q) * q
    starts = tuple(range(0, 128, active)) if active <= 64 else (0,)
    for role, t in (("src", src), ("dst", dst)):
        if start_partition(t) not in starts:
            fail(f"{I}: {role} starts at partition {start_partition(t)}; with {active} active "
                 f"partitions (src {Ps}, dst {Pd}) src and dst must start at one of {starts}")
    sv = src._data.reshape(Ps, -1)  # same dtype: the shuffle moves bits
    out = dst._data.reshape(Pd, -1).clone()
    for i in range(Pd):
        m = mask[i % q]
        if m == 255:  # the documented "leave this partition unchanged" value
            continue
        j = (i // q) * q + m
        if j >= Ps:
            raise IndexError(f"{I}: shuffle_mask[{i % q}]={m} reads partition {j} of a "
                             f"{Ps}-partition src")
        out[i] = sv[j]
    store(I, dst, out, raw=True)
    return record(I, "vector", [("src", src)], [("dst", dst)], dst.size, {})


def dropout(dst, data, prob, name=None):
    """Zero each element with probability ``prob`` (scalar or (P, 1)) on VectorE."""
    I = "dropout"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    if dst.dtype != data.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    # "If data type of data is any of the integer types ... prob data type must be float32"
    p = operand_vec(I, "prob", prob, data, need_f32=data.dtype.is_int)
    if data.dtype.is_packed:
        data.dtype.from_bits(data._data)   # raises: packed MX words have no element values
    u = torch.rand(data.shape, generator=current().generator)
    # kept elements keep "their original values" (the docstring), no rescaling: selected on
    # the stored bits, so integers above 2**24 do not pass through fp32
    bits = data._data.reshape(data.shape)
    kept = torch.where(u < p, torch.zeros_like(bits), bits)
    store(I, dst, kept.reshape(dst.shape), raw=True)
    return record(I, "vector", [("data", data), ("prob", prob)], [("dst", dst)],
                  dst.size, {})


def rng(dst, engine=enums.engine.vector, name=None):
    """32 random bits per element, truncated to dst's integer dtype."""
    I = "rng"
    onchip(I, "dst", dst)
    eng = engine_of(I, engine, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        no_psum_on_gpsimd(I, ("dst", dst))
    if not dst.dtype.is_int or dst.dtype.is_bool:
        fail(f"{I}: dst must be an integer dtype, got {dst.dtype.name}")
    bits = torch.randint(0, 1 << 32, dst.shape, generator=current().generator,
                         dtype=torch.int64)
    store(I, dst, bits)
    return record(I, eng, [], [("dst", dst)], dst.size, {})


def set_rng_seed(src_seeds, name=None):
    """Seed the engine PRNG from a [1, 1] 32-bit tensor."""
    I = "set_rng_seed"
    onchip(I, "src_seeds", src_seeds)
    if src_seeds.size != 1:
        fail(f"{I}: src_seeds must be a [1, 1] tensor, got {src_seeds.shape}")
    current().generator.manual_seed(int(ints(src_seeds).reshape(-1)[0]) & 0xFFFFFFFF)
    return record(I, "vector", [("src_seeds", src_seeds)], [], 0, {})


# quantize_mx: "E_max ... 8 for float8_e4m3fn and 15 for float8_e5m2"
_MX_EMAX = {"float8_e4m3fn_x4": 8, "float8_e5m2_x4": 15}
_MX_ZERO_SCALE_EXP = -127  # "For an all-zero group ... X = 2^-127"


def quantize_mx(dst, src, dst_scale, name=None):
    """MXFP8 quantisation on VectorE (NeuronCore-v4): per group of 8 partitions x 4 elements,
    scale X = 2^(floor(log2(max|v|)) - (E_max - 1)) (2^-127 for an all-zero group), data =
    v / X rounded to fp8, four per x4 word (lowest byte first); one e8m0 scale per group, in
    the scale tile's rows of the group's quadrant (nki.isa.quantize_mx; MX deep dive)."""
    from .tensor_engine import mx_scale_rows

    I = "quantize_mx"
    tgt = target()
    require_generation(I, 4, supported=tgt.has_mx, source="nki.isa.quantize_mx")
    for role, t in (("dst", dst), ("src", src), ("dst_scale", dst_scale)):
        onchip(I, role, t, psum=False, why=" (all tiles in SBUF)",
               quadrant_offsets=tgt.mx_scale_quadrant_offsets if role == "dst_scale" else ())
    if src.dtype.name not in ("float16", "bfloat16"):
        fail(f"{I}: src dtype must be float16 or bfloat16, got {src.dtype.name}")
    if dst.dtype.name not in _MX_EMAX:
        fail(f"{I}: dst dtype must be float8_e5m2_x4 or float8_e4m3fn_x4, got {dst.dtype.name}")
    if dst_scale.dtype.name not in ("float8_e8m0fnu", "uint8"):
        fail(f"{I}: dst_scale dtype must be float8_e8m0fnu or uint8, got {dst_scale.dtype.name}")
    P, F = src.shape[0], free_elems(src)
    q, g = tgt.partition_quadrant, tgt.mx_group_partitions
    if P % q or P > tgt.partitions:
        fail(f"{I}: src partition dim {P} must be a multiple of {q} and at most {tgt.partitions}")
    if F % 4:
        fail(f"{I}: src has {F} elements per partition, not a multiple of 4")
    same_partitions(I, "src", src, "dst", dst)
    if free_elems(dst) != F // 4:
        fail(f"{I}: dst must have {F // 4} x4 elements per partition (src's {F} / 4), got "
             f"{free_elems(dst)}")
    rows = mx_scale_rows(P, g, q)
    need = int(rows.max()) + 1
    if dst_scale.shape[0] < need or free_elems(dst_scale) != F // 4:
        fail(f"{I}: dst_scale must cover {need} partitions x {F // 4} elements (one scale per "
             f"{g} partitions of each quadrant, per x4 column), got {dst_scale.shape}")
    x = f32(src).reshape(P // g, g, F // 4, 4)
    amax = x.abs().amax(dim=(1, 3))                       # [P/g, F/4] per group
    _, e = torch.frexp(amax)                              # amax = m * 2^e, m in [0.5, 1)
    exp = (e - 1) - (_MX_EMAX[dst.dtype.name] - 1)
    exp = torch.where(amax > 0, exp, torch.full_like(exp, _MX_ZERO_SCALE_EXP))
    scale = torch.ldexp(torch.ones_like(amax), exp)
    q8 = (x / scale[:, None, :, None]).reshape(P, F)
    fp8 = torch.float8_e4m3fn if dst.dtype.name == "float8_e4m3fn_x4" else torch.float8_e5m2
    words = q8.to(fp8).view(torch.uint8).reshape(P, F).contiguous().view(torch.uint32)
    store(I, dst, words.reshape(dst.shape), raw=True)
    codes = (exp + 127).clamp(0, 254).to(torch.uint8)    # e8m0 bits: 2^(code - 127)
    sbits = dst_scale._data.reshape(dst_scale.shape[0], -1).clone()
    sbits.view(torch.uint8)[rows.view(P // g, g)[:, 0]] = codes
    store(I, dst_scale, sbits.reshape(dst_scale.shape), raw=True)
    return record(I, "vector", [("src", src)], [("dst", dst), ("dst_scale", dst_scale)],
                  src.size, {"dtype": dst.dtype.name})


_EXP_DST = ("float8_e4m3", "float8_e5m2", "float16", "bfloat16", "float32", "tfloat32", "int8",
            "int16", "int32", "uint8", "uint16")
_EXP_SRC = ("float8_e4m3", "float8_e5m2", "float16", "bfloat16", "float32", "int8", "int16",
            "int32", "uint8", "uint16", "uint32")
_EXP_REDUCE_RES = ("float8_e4m3", "float8_e5m2", "float16", "bfloat16", "float32", "tfloat32")


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=enums.reduce_cmd.idle,
                reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` on VectorE (NeuronCore-v4), optionally summed into the
    VectorE accumulators (nki.isa.exponential: reset_reduce / reduce / load_reduce)."""
    I = "exponential"
    require_generation(I, 4, source="nki.isa.exponential")
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_partitions(I, "src", src, "dst", dst)
    same_free(I, "src", src, "dst", dst)
    if dst.dtype.name not in _EXP_DST:
        fail(f"{I}: dst dtype {dst.dtype.name} is not supported ({', '.join(_EXP_DST)})")
    if src.dtype.name not in _EXP_SRC:
        fail(f"{I}: src dtype {src.dtype.name} is not supported ({', '.join(_EXP_SRC)})")
    cmd = check_reduce_cmd(I, reduce_cmd)
    if cmd is enums.reduce_cmd.reset:
        fail(f"{I}: reduce_cmd reset is not supported (idle, reset_reduce, reduce, load_reduce)")
    if cmd is not enums.reduce_cmd.load_reduce and (
            isinstance(reduce_init, NkiTensor) or float(reduce_init) != 0.0):
        fail(f"{I}: reduce_init must be unset or 0.0 unless reduce_cmd is load_reduce")
    if reduce_res is not None and reduce_res.dtype.name not in _EXP_REDUCE_RES:
        fail(f"{I}: reduce_res dtype {reduce_res.dtype.name} is not supported "
             f"({', '.join(_EXP_REDUCE_RES)})")
    m = operand_vec(I, "max_value", max_value, src, need_f32=True)
    y = torch.exp((f32(src) - m).to(torch.float64)).to(torch.float32)
    store(I, dst, y)
    if cmd is not enums.reduce_cmd.idle:
        init = operand_vec(I, "reduce_init", reduce_init, src)
        init = init.reshape(-1) if isinstance(init, torch.Tensor) else init
        vector_reduce_regs(I, "add", cmd, reduce_free("add", y), src, reduce_res, init)
    elif reduce_res is not None:
        vector_reduce_regs(I, "add", cmd, None, src, reduce_res)
    return record(I, "vector", [("src", src), ("max_value", max_value)],
                  [("dst", dst), ("reduce_res", reduce_res)], dst.size,
                  {"reduce": reduce_res is not None, "reduce_cmd": cmd.name})
