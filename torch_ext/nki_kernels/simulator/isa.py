"""``nki.isa`` (beta 2): one function per instruction, destination first.

Each function validates the hardware rules (messages name instruction, operand, limit),
computes in fp32 on whole tiles, rounds ONCE into the destination dtype, records one
trace Instruction per hardware instruction and returns an ``NkiInstruction`` handle.
Where the simulator differs from numpy or from the hardware, a one-line comment says so.
"""

from __future__ import annotations

import math
from enum import Enum

import torch

from . import dtypes as _dt
from . import ops as _ops
from ._engine import (ENGINE_NAME, NkiInstruction, engine, engine_of, f32, fail, free_elems,
                      is_scalar, lanes, no_psum_on_gpsimd, not_both_psum, onchip, operand_vec,
                      psum_state, record, reduce_cmd, reduce_free, reduce_last, same_free,
                      same_partitions, start_partition, store, tensor_arg, update_regs)
from .context import current
from .errors import NkiValidationError, UnsupportedError
from .tensor import NkiTensor

__all__ = [
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version",
    "dma_engine", "NkiInstruction", "NkiValidationError", "VirtualRegister",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    "get_nc_version", "get_nc_sub_version",
    "dma_copy", "dma_transpose", "dma_compute", "tensor_copy", "tensor_copy_predicated", "memset",
    "nc_matmul", "nc_transpose", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor",
    "tensor_reduce", "tensor_partition_reduce", "tensor_scalar_reduce", "tensor_scalar_cumulative",
    "tensor_tensor_scan", "activation", "activation_reduce", "iota", "affine_select",
    "select_reduce", "range_select", "reciprocal", "bn_stats", "bn_aggr", "nc_n_gather",
    "max8", "nc_find_index8", "nc_match_replace8", "nc_stream_shuffle", "dropout", "rng",
    "set_rng_seed", "core_barrier", "register_alloc", "register_move", "register_load",
    "register_store",
]


class dge_mode(Enum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(Enum):  # noqa: N801
    error = 0
    skip = 1


class matmul_perf_mode(Enum):  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(Enum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(Enum):  # noqa: N801
    dma = 1
    gpsimd_dma = 2


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown

_NC = {"v2": nc_version.gen2, "v3": nc_version.gen3, "v4": nc_version.gen4}


def get_nc_version():
    return _NC[current().target.neuron_core]


def get_nc_sub_version():
    return 0


def _gen() -> int:
    return int(current().target.neuron_core[1:])


# ======================================================================= data movement


def _dma_check(instr, role, t):
    tensor_arg(instr, role, t)
    if t._alloc.kind == "psum":
        fail(f"{instr}: {role} is in PSUM; DMA reads and writes only HBM and SBUF "
             "(copy PSUM to SBUF with nisa.tensor_copy first)")


def _direction(dst, src):
    return f"{'hbm' if src._alloc.kind == 'hbm' else 'sbuf'}_to_" \
           f"{'hbm' if dst._alloc.kind == 'hbm' else 'sbuf'}"


def _cast_copy(instr, dst, src_values, src_dtype):
    # DMA/copy casts through fp32 when dtypes differ; identical dtypes copy bits.
    if src_dtype == dst._alloc.dtype:
        store(instr, dst, src_values, exact=True)
    elif not src_dtype.is_float and not dst._alloc.dtype.is_float:
        store(instr, dst, src_values)
    else:
        store(instr, dst, src_values.to(torch.float32))


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             engine=engine.unknown, name=None):
    """Copy ``src`` to ``dst`` with the DMA engines (HBM<->SBUF, SBUF<->SBUF, HBM<->HBM)."""
    _dma_check("dma_copy", "dst", dst)
    _dma_check("dma_copy", "src", src)
    n_dst, n_src = dst._data.numel(), src._data.numel()
    if n_dst != n_src:
        fail(f"dma_copy: dst has {n_dst} elements {dst.shape} but src has {n_src} {src.shape}")
    _cast_copy("dma_copy", dst, src._data, src._alloc.dtype)
    return record("dma_copy", "dma", [("src", src)], [("dst", dst)], 0,
                  {"bytes": n_dst * dst._alloc.dtype.itemsize,
                   "src_bytes": n_src * src._alloc.dtype.itemsize,
                   "direction": _direction(dst, src)})


_DMA_T_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown,
                  oob_mode=oob_mode.error, name=None):
    """Transpose ``src`` (HBM or SBUF) into SBUF ``dst`` with the DMA engines."""
    _dma_check("dma_transpose", "dst", dst)
    _dma_check("dma_transpose", "src", src)
    if dst._alloc.kind != "sbuf":
        fail("dma_transpose: dst must be in SBUF")
    nd = src._data.dim()
    perm = _DMA_T_AXES.get(nd)
    if perm is None:
        fail(f"dma_transpose: src must be 2-D, 3-D or 4-D, got shape {src.shape}")
    if axes is not None and tuple(axes) != perm:
        fail(f"dma_transpose: axes {tuple(axes)} not supported for {nd}-D src; use {perm}")
    if src._alloc.dtype != dst._alloc.dtype:
        fail(f"dma_transpose: dst dtype {dst.dtype.name} must equal src dtype {src.dtype.name}")
    out = src._data.permute(perm)
    if tuple(out.shape) != tuple(dst._data.shape):
        fail(f"dma_transpose: dst shape {dst.shape} must be {tuple(out.shape)} (src {src.shape} "
             f"permuted by {perm})")
    store("dma_transpose", dst, out)
    n = dst._data.numel() * dst._alloc.dtype.itemsize
    return record("dma_transpose", "dma", [("src", src)], [("dst", dst)], 0,
                  {"bytes": n, "src_bytes": n, "direction": _direction(dst, src),
                   "transpose": True})


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error,
                name=None):
    """``dst = reduce_op(srcs[0]*scales[0], ...)`` in the DMA engines (only nl.add, scales 1.0)."""
    op = _ops.resolve(reduce_op, "reduce_op")
    if op.name != "add":
        fail(f"dma_compute: reduce_op {op!r} is not supported; only nl.add")
    if scales is not None and any(float(s) != 1.0 for s in scales):
        fail("dma_compute: all scales must be 1.0")
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16:
        fail(f"dma_compute: {len(srcs)} sources; between 1 and 16 are allowed")
    _dma_check("dma_compute", "dst", dst)
    acc = None
    for i, s in enumerate(srcs):
        _dma_check("dma_compute", f"srcs[{i}]", s)
        if s._data.numel() != dst._data.numel():
            fail(f"dma_compute: srcs[{i}] has {s._data.numel()} elements, dst has {dst._data.numel()}")
        v = f32(s).reshape(-1)
        acc = v.clone() if acc is None else acc + v
    store("dma_compute", dst, acc)
    n = dst._data.numel() * dst._alloc.dtype.itemsize
    return record("dma_compute", "dma", [(f"srcs[{i}]", s) for i, s in enumerate(srcs)],
                  [("dst", dst)], dst._data.numel() * (len(srcs) - 1),
                  {"bytes": n, "src_bytes": n * len(srcs), "direction": "compute"})


def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """Copy ``src`` to ``dst`` on chip (Vector, Scalar or GpSimd); casts through fp32."""
    onchip("tensor_copy", "dst", dst)
    onchip("tensor_copy", "src", src)
    same_partitions("tensor_copy", "src", src, "dst", dst)
    same_free("tensor_copy", "src", src, "dst", dst)
    eng = engine_of("tensor_copy", engine, ("vector", "scalar", "gpsimd"), "vector")
    if eng == "gpsimd":
        no_psum_on_gpsimd("tensor_copy", ("dst", dst), ("src", src))
    if eng == "scalar" and _gen() == 2:
        fail("tensor_copy: the Scalar engine cannot copy on NeuronCore-v2; use "
             "nisa.activation(op=nl.copy)")
    _cast_copy("tensor_copy", dst, src._data, src._alloc.dtype)
    return record("tensor_copy", eng, [("src", src)], [("dst", dst)], dst._data.numel(), {})


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
        sv = src._data.reshape(dst._data.shape)
    else:
        sv = torch.full(dst._data.shape, float(src), dtype=torch.float32)
    pred = (predicate._data != 0).reshape(dst._data.shape)
    if reverse_pred:
        pred = ~pred
    store(instr, dst, torch.where(pred, sv.to(dst._data.dtype), dst._data))
    return record(instr, "vector", [("src", src), ("predicate", predicate)], [("dst", dst)],
                  dst._data.numel(), {})


def memset(dst, value, engine=engine.unknown, name=None):
    """Fill ``dst`` with a constant (Vector or GpSimd)."""
    onchip("memset", "dst", dst)
    eng = engine_of("memset", engine, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        no_psum_on_gpsimd("memset", ("dst", dst))
    if not is_scalar(value):
        fail(f"memset: value must be a compile-time scalar, got {type(value).__name__}")
    dt = dst._alloc.dtype
    if dt.is_int and isinstance(value, float) and not float(value).is_integer():
        fail(f"memset: value {value} does not match integer dst dtype {dt.name}")
    v = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
    store("memset", dst, v.to(torch.float32) if dt.is_float else v.expand(dst._data.shape))
    return record("memset", eng, [], [("dst", dst)], dst._data.numel(), {"value": value})


# ======================================================================= Tensor Engine

_MM_DTYPES = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=matmul_perf_mode.none, name=None):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on TensorE, fp32 accumulation."""
    I = "nc_matmul"
    onchip(I, "stationary", stationary, psum=False, why=" (TensorE reads SBUF only)")
    onchip(I, "moving", moving, psum=False, why=" (TensorE reads SBUF only)")
    onchip(I, "dst", dst, sbuf=False, why=" (TensorE writes PSUM only)")
    gen = _gen()
    st_dt, mv_dt, dst_dt = stationary._alloc.dtype, moving._alloc.dtype, dst._alloc.dtype
    double = perf_mode is matmul_perf_mode.double_row or perf_mode == "double_row"
    sv, mv = f32(stationary), f32(moving)
    K = sv.shape[0]
    if double:
        if gen < 3:
            fail(f"{I}: perf_mode double_row needs NeuronCore-v3 or newer")
        for role, t in (("stationary", stationary), ("moving", moving)):
            if not t.dtype.name.startswith("float8"):
                fail(f"{I}: perf_mode double_row needs float8 {role}, got {t.dtype.name}")
            if t._data.dim() < 3 or t._data.shape[1] != 2:
                fail(f"{I}: perf_mode double_row needs {role} shaped [K, 2, ...], got {t.shape}")
        # contraction over (partition, first free dim): flatten them
        sv = sv.reshape(K * 2, -1)
        mv = mv.reshape(K * 2, -1)
    else:
        sv = sv.reshape(K, -1)
        mv = mv.reshape(mv.shape[0], -1)
    if moving._data.shape[0] != K:
        fail(f"{I}: moving partition dim {moving._data.shape[0]} must equal stationary "
             f"partition dim {K} (the contraction dim)")
    row_size, col_size = 128, 128
    if tile_position or tile_size:
        if not (tile_position and tile_size):
            fail(f"{I}: tile_position and tile_size must be set together")
        row_size, col_size = (int(x) for x in tile_size)
        r0, c0 = (int(x) for x in tile_position)
        sizes = (32, 64, 128) if gen >= 3 else (64, 128)
        if row_size not in sizes or col_size not in sizes:
            fail(f"{I}: tile_size {tuple(tile_size)} must use sizes from {sizes}")
        if r0 % row_size or c0 % col_size or r0 + row_size > 128 or c0 + col_size > 128:
            fail(f"{I}: tile_position {tuple(tile_position)} must be multiples of tile_size "
                 f"{tuple(tile_size)} within the 128x128 array")
    M, N = sv.shape[1], mv.shape[1]
    if K > row_size:
        fail(f"{I}: stationary partition dim {K} exceeds maximum {row_size}")
    if M > col_size:
        fail(f"{I}: stationary free size {M} exceeds maximum {col_size}")
    n_max = 512 if gen <= 3 else (8192 if dst_dt.name == "bfloat16" else 4096)
    if N > n_max:
        fail(f"{I}: moving free size {N} exceeds maximum {n_max}")
    if dst._data.shape[0] != M:
        fail(f"{I}: dst partition dim {dst._data.shape[0]} must equal stationary free size {M}")
    if free_elems(dst) != N:
        fail(f"{I}: dst has {free_elems(dst)} elements per partition but moving free size is {N}")
    names = (st_dt.name, mv_dt.name)
    if is_transpose:
        if dst_dt != st_dt:
            fail(f"{I}: is_transpose=True needs dst dtype {dst_dt.name} equal to stationary "
                 f"dtype {st_dt.name}")
    else:
        ok = ("float32",) if gen <= 3 else ("float32", "bfloat16")
        if dst_dt.name not in ok:
            fail(f"{I}: dst dtype must be {' or '.join(ok)}, got {dst_dt.name}")
    allowed = _MM_DTYPES + (("float8_e4m3fn",) if gen >= 4 else ())
    for role, dn in (("stationary", names[0]), ("moving", names[1])):
        if dn not in allowed and not (is_transpose and dn in ("uint8", "int8", "bfloat16")):
            fail(f"{I}: {role} dtype {dn} is not supported; use one of {', '.join(allowed)}")
    f32ish = ("float32", "tfloat32")
    if (names[0] in f32ish) != (names[1] in f32ish) and not is_transpose:
        fail(f"{I}: stationary {names[0]} and moving {names[1]}: a float32/tfloat32 operand "
             "pairs only with float32/tfloat32")
    if "float8_e4m3" in names and "float8_e4m3fn" in names:
        fail(f"{I}: float8_e4m3 and float8_e4m3fn cannot be mixed in one matmul")

    if is_transpose and N == K and torch.equal(mv, torch.eye(K)):
        prod = sv.t()  # bit-accurate transpose (NaN/Inf pass through), as on NeuronCore-v3+
    else:
        prod = sv.t() @ mv  # fp32 products and fp32 accumulation
    state = psum_state(dst)
    d = dst._data
    if accumulate is None:
        # the first matmul write to a PSUM location overwrites, later ones add
        acc = (state == 1).reshape(M, N)
        if bool(acc.all()):
            value = f32(dst).reshape(M, N) + prod
        elif bool(acc.any()):
            value = torch.where(acc, f32(dst).reshape(M, N) + prod, prod)
        else:
            value = prod
        mode = "auto"
    elif accumulate:
        bad = (state == 0) if gen >= 4 else (state != 1)
        if bool(bad.any()):
            fail(f"{I}: accumulate=True onto PSUM locations of dst that no previous matmul "
                 "initialized (undefined on hardware; start with accumulate=False)")
        value = f32(dst).reshape(M, N) + prod
        mode = "accumulate"
    else:
        value = prod
        mode = "overwrite"
    store(I, dst, value.reshape(d.shape), matmul=True)
    is_f32 = names[0] in f32ish or names[1] in f32ish
    return record(I, "tensor", [("stationary", stationary), ("moving", moving)], [("dst", dst)],
                  2 * K * (2 if double else 1) * M * N,
                  {"K": K * (2 if double else 1), "M": M, "N": N, "fp32": is_f32,
                   "is_transpose": bool(is_transpose), "accumulate": mode,
                   "dtype": names[0], "moving_dtype": names[1], "perf_mode":
                   "double_row" if double else "none"})


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """2-D transpose of ``data`` (free axes flattened) on TensorE (<=128x128, SBUF->PSUM) or
    VectorE (<=32x32)."""
    I = "nc_transpose"
    tensor_arg(I, "dst", dst)
    tensor_arg(I, "data", data)
    P, F = data._data.shape[0], free_elems(data)
    if engine is None or engine is globals()["engine"].unknown:
        eng = "tensor" if (data._alloc.kind == "sbuf" and dst._alloc.kind == "psum") else "vector"
    else:
        eng = engine_of(I, engine, ("tensor", "vector"), "tensor")
    if eng == "tensor":
        onchip(I, "data", data, psum=False, why=" (TensorE transpose reads SBUF)")
        onchip(I, "dst", dst, sbuf=False, why=" (TensorE transpose writes PSUM)")
        lim = 128
    else:
        onchip(I, "data", data)
        onchip(I, "dst", dst)
        lim = 32
    if P > lim or F > lim:
        fail(f"{I}: data shape [{P}, {F}] exceeds maximum [{lim}, {lim}] on the "
             f"{eng} engine")
    if dst._alloc.dtype != data._alloc.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    if dst._data.shape[0] != F or free_elems(dst) != P:
        fail(f"{I}: dst shape {dst.shape} must be [{F}, {P}] (data {data.shape} transposed)")
    store(I, dst, data._data.reshape(P, F).t())
    return record(I, eng, [("data", data)], [("dst", dst)], P * F, {"P": P, "F": F})


# ======================================================================= Vector / GpSimd ALU


def _alu_compute(op, a, b=None):
    return op.alu(a) if op.unary else op.alu(a, b)


def _ints(*ts):
    return all(isinstance(t, NkiTensor) and t._alloc.dtype.is_int for t in ts)


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """Elementwise ``op(data1, data2)`` on VectorE (or GpSimd), in fp32."""
    I = "tensor_tensor"
    onchip(I, "dst", dst)
    onchip(I, "data1", data1)
    onchip(I, "data2", data2)
    op = _ops.alu_of(_ops.resolve(op), I, "op")
    if op.unary:
        fail(f"{I}: op {op!r} is unary; use nisa.tensor_scalar")
    not_both_psum(I, "data1", data1, "data2", data2)
    same_partitions(I, "data1", data1, "data2", data2)
    same_partitions(I, "data1", data1, "dst", dst)
    s1, s2 = start_partition(data1), start_partition(data2)
    if s1 != s2:  # the inputs' base partitions must align (nki-library copies to realign)
        fail(f"{I}: data1 starts at partition {s1} but data2 at partition {s2}; both inputs "
             "must start at the same partition")
    same_free(I, "data1", data1, "data2", data2)
    same_free(I, "data1", data1, "dst", dst)
    # Default engine (beta-2 docstring): GpSimd for power, and for all-int32/uint32
    # operands unless one of them is in PSUM (GpSimd cannot reach PSUM); else VectorE.
    int32_only = all(t.dtype.name in ("int32", "uint32") for t in (data1, data2, dst))
    in_psum = any(t._alloc.kind == "psum" for t in (data1, data2, dst))
    default = "gpsimd" if op.name == "power" or (int32_only and not in_psum) else "vector"
    eng = engine_of(I, engine, ("vector", "gpsimd"), default)
    if eng == "gpsimd":
        no_psum_on_gpsimd(I, ("dst", dst), ("data1", data1), ("data2", data2))
    b_shape = data1._data.shape
    if op.bitvec:
        if not _ints(data1, data2, dst):
            fail(f"{I}: bitvec op {op!r} needs integer data1, data2 and dst")
        value = op.alu(data1._data, data2._data.reshape(b_shape))
    elif _ints(data1, data2, dst) and op.name in _INT_EXACT:
        value = op.alu(data1._data, data2._data.reshape(b_shape))  # exact integer arithmetic
    else:
        value = op.alu(f32(data1), f32(data2).reshape(b_shape))
    store(I, dst, value)
    return record(I, eng, [("data1", data1), ("data2", data2)], [("dst", dst)],
                  dst._data.numel(), {"op": op.name})


_INT_EXACT = ("add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal",
              "greater", "greater_equal", "less", "less_equal")


def _scalar_stage(instr, op, operand, reverse, data_v, data):
    if op.unary:
        if operand is not None and not (is_scalar(operand) and float(operand) == 0.0):
            fail(f"{instr}: operand of unary op {op!r} must be None or 0")
        return op.alu(data_v)
    o = operand_vec(instr, "operand", operand, data, need_f32=not op.bitvec)
    if op.bitvec:
        o = int(o) if isinstance(o, float) else o.to(torch.int64)
    elif not isinstance(o, float):
        o = o.expand_as(data_v)
    if isinstance(o, (int, float)):
        o = torch.tensor(o, dtype=data_v.dtype)
    return op.alu(o, data_v) if reverse else op.alu(data_v, o)


_SCALAR_ENGINE_COMBOS = {("multiply", "add"), ("multiply", None), ("add", None)}


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None,
                  reverse1=False, engine=engine.unknown, name=None):
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
        v = data._data
    else:
        v = f32(data)
    v = _scalar_stage(I, o0, operand0, reverse0, v, data)
    if o1 is not None:
        v = _scalar_stage(I, o1, operand1, reverse1, v, data)
    store(I, dst, v)
    return record(I, eng, [("data", data), ("operand0", operand0), ("operand1", operand1)],
                  [("dst", dst)], dst._data.numel(),
                  {"op0": o0.name, "op1": o1.name if o1 else None})


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False,
                         reverse1=False, name=None):
    """``(data op0 operand0) op1 operand1``: operand0 scalar/(P,1), operand1 a full tile."""
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
    if o0.bitvec or o1.bitvec:
        fail(f"{I}: bitvec operators are not supported; op0 and op1 must be arithmetic")
    v = _scalar_stage(I, o0, operand0, reverse0, f32(data), data)
    t = f32(operand1).reshape(v.shape)
    v = o1.alu(t, v) if reverse1 else o1.alu(v, t)
    store(I, dst, v)
    return record(I, "vector", [("data", data), ("operand0", operand0), ("operand1", operand1)],
                  [("dst", dst)], 2 * dst._data.numel(), {"op0": o0.name, "op1": o1.name})


def _axes(instr, axis, ndim):
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
    nd = data._data.dim()
    axes = _axes(I, axis, nd)
    keep = data._data.shape[:axes[0]]
    n_out = math.prod(keep[1:])
    if free_elems(dst) != n_out:
        fail(f"{I}: dst has {free_elems(dst)} elements per partition; reducing axes "
             f"{tuple(axes)} of {data.shape} leaves {n_out}")
    if op.bitvec:
        if not _ints(data, dst):
            fail(f"{I}: bitvec op {op!r} needs integer data and dst")
        v = data._data
    else:
        v = f32(data)
    r = reduce_last(op.name, v.reshape(tuple(keep) + (-1,)))
    if negate:
        if op.bitvec:
            fail(f"{I}: negate applies only to arithmetic operators")
        r = -r
    store(I, dst, r)
    return record(I, "vector", [("data", data)], [("dst", dst)], data._data.numel(),
                  {"op": op.name, "axis": tuple(axes), "negate": bool(negate)})


def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce across partitions on GpSimd: dst[1, F] = op over data[P, F]."""
    I = "tensor_partition_reduce"
    onchip(I, "dst", dst, psum=False)
    onchip(I, "data", data, psum=False)
    o = _ops.resolve(op)
    name_ = "average" if o.name in ("average", "mean") else _ops.alu_of(o, I, "op").name
    if name_ not in ("add", "average", "maximum", "bitwise_or", "bitwise_and"):
        fail(f"{I}: op {o!r} is not supported (add, average, maximum, bitwise_or, bitwise_and)")
    if dst._data.shape[0] != 1 or free_elems(dst) != free_elems(data):
        fail(f"{I}: dst must be [1, {free_elems(data)}], got {dst.shape}")
    v = data._data.reshape(data._data.shape[0], -1)
    if name_ in ("bitwise_or", "bitwise_and"):
        r = reduce_last(name_, v.t())
    else:
        v = f32(data).reshape(v.shape)
        r = v.mean(0) if name_ == "average" else reduce_last(name_, v.t())
    store(I, dst, r)
    return record(I, "gpsimd", [("data", data)], [("dst", dst)], data._data.numel(),
                  {"op": name_})


def reciprocal(dst, data, name=None):
    """``1 / data`` on VectorE (more precise than activation(nl.reciprocal))."""
    I = "reciprocal"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    store(I, dst, torch.reciprocal(f32(data)))
    return record(I, "vector", [("data", data)], [("dst", dst)], dst._data.numel(), {})


def _vector_reduce_regs(instr, reduce_op, cmd, r, data, reduce_res, init=None, negate=False):
    ctx = current()
    sl = lanes(data)
    update_regs(ctx.vector_regs, sl, cmd, reduce_op, r, init)
    if reduce_res is not None:
        onchip(instr, "reduce_res", reduce_res)
        same_partitions(instr, "data", data, "reduce_res", reduce_res)
        if free_elems(reduce_res) != 1:
            fail(f"{instr}: reduce_res must be ({data._data.shape[0]}, 1), got {reduce_res.shape}")
        out = ctx.vector_regs[sl].reshape(reduce_res._data.shape)
        store(instr, reduce_res, -out if negate else out)


def _cmd(instr, c):
    if isinstance(c, reduce_cmd):
        return c
    fail(f"{instr}: reduce_cmd={c!r} is not a nisa.reduce_cmd member")


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None,
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
    cmd = _cmd(I, reduce_cmd)
    if cmd is globals()["reduce_cmd"].load_reduce and reduce_init is None:
        fail(f"{I}: reduce_cmd load_reduce needs reduce_init")
    v = _scalar_stage(I, o0, operand0, reverse0, f32(data), data)
    store(I, dst, v)
    init = None
    if reduce_init is not None:
        init = operand_vec(I, "reduce_init", reduce_init, data)
        init = init.reshape(-1) if isinstance(init, torch.Tensor) else init
    _vector_reduce_regs(I, ro.name, cmd, reduce_free(ro.name, v), data, reduce_res, init,
                        reduce_res_negate)
    return record(I, "vector", [("data", data), ("operand0", operand0)],
                  [("dst", dst), ("reduce_res", reduce_res)], dst._data.numel(),
                  {"op0": o0.name, "reduce_op": ro.name, "reduce_cmd": cmd.name,
                   "reduce": reduce_res is not None})


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None,
                             reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """Running ``reg = op1(op0(src[i], imm0), reg)``; ``dst[i] = reg`` along the free axes."""
    I = "tensor_scalar_cumulative"
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_partitions(I, "src", src, "dst", dst)
    same_free(I, "src", src, "dst", dst)
    o0 = _ops.alu_of(_ops.resolve(op0, "op0"), I, "op0")
    o1 = _ops.alu_of(_ops.resolve(op1, "op1"), I, "op1")
    if o1.name not in ("add", "multiply", "maximum", "minimum"):
        fail(f"{I}: op1 {o1!r} is not supported by the simulator (add, multiply, maximum, minimum)")
    cmd = _cmd(I, reduce_cmd)
    v = _scalar_stage(I, o0, imm0, False, f32(src), src).reshape(src._data.shape[0], -1)
    ctx = current()
    sl = lanes(src)
    if cmd is globals()["reduce_cmd"].reset_reduce:
        ctx.vector_regs[sl] = {"add": 0.0, "multiply": 1.0, "maximum": -math.inf,
                               "minimum": math.inf}[o1.name]
    elif cmd is globals()["reduce_cmd"].load_reduce:
        init = operand_vec(I, "imm1", imm1, src)
        ctx.vector_regs[sl] = init.reshape(-1) if isinstance(init, torch.Tensor) else init
    start = ctx.vector_regs[sl].unsqueeze(1)
    cat = torch.cat([start, v], dim=1)
    if o1.name == "add":
        out = torch.cumsum(cat, 1)
    elif o1.name == "multiply":
        out = torch.cumprod(cat, 1)
    elif o1.name == "maximum":
        out = torch.cummax(cat, 1).values
    else:
        out = torch.cummin(cat, 1).values
    out = out[:, 1:]
    ctx.vector_regs[sl] = out[:, -1]
    store(I, dst, out)
    return record(I, "vector", [("src", src)], [("dst", dst)], dst._data.numel(),
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
    P = data0._data.shape[0]
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
                  2 * dst._data.numel(), {"op0": o0.name, "op1": o1.name})


# ======================================================================= Scalar Engine


def _bias_scale(I, data, bias, scale):
    if isinstance(scale, NkiTensor):
        s = operand_vec(I, "scale", scale, data, need_f32=True)
    elif is_scalar(scale):
        s = float(scale)
    else:
        fail(f"{I}: scale must be a float or a (P, 1) float32 tile, got {type(scale).__name__}")
    if bias is None:
        b = 0.0
    elif isinstance(bias, NkiTensor):
        if bias.dtype.name == "tfloat32":
            fail(f"{I}: bias dtype tfloat32 is not supported")
        b = operand_vec(I, "bias", bias, data)
    else:
        if _gen() == 2:
            fail(f"{I}: bias must be a (P, 1) tile on NeuronCore-v2 (scalar bias needs v3+)")
        b = operand_vec(I, "bias", bias, data)
    return s, b


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op(data * scale + bias)`` on ScalarE, with optional free-axis reduction of the
    result into the 128 per-lane accumulator registers, read out into ``reduce_res``."""
    I = "activation"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    f = _ops.resolve(op)
    if f.act is None:
        fail(f"{I}: op {f!r} is not an activation function (supported: "
             f"{', '.join(_ops.ACTIVATIONS)})")
    cmd = _cmd(I, reduce_cmd)
    s, b = _bias_scale(I, data, bias, scale)
    x = f32(data)
    if not (isinstance(s, float) and s == 1.0):
        x = x * s
    if not (isinstance(b, float) and b == 0.0):
        x = x + b
    y = f.act(x)
    store(I, dst, y)
    reduces = cmd is not globals()["reduce_cmd"].idle or reduce_res is not None
    if reduces:
        ro = "add" if reduce_op is None else _ops.alu_of(
            _ops.resolve(reduce_op, "reduce_op"), I, "reduce_op").name
        # ScalarE's reduction registers can only sum (NKI 0.7 / Neuron 2.33 docs of
        # nisa.activation): max/min need a separate tensor_reduce (or activate2 on v4+).
        if ro != "add":
            fail(f"{I}: reduce_op {ro} is not supported; the Scalar engine's reduction "
                 "registers only sum (use nl.add, or a separate nisa.tensor_reduce)")
        ctx = current()
        sl = lanes(data)
        # the reduction sees the fp32 activation output, before the cast to dst's dtype
        r = reduce_free(ro, y) if cmd in (globals()["reduce_cmd"].reduce,
                                          globals()["reduce_cmd"].reset_reduce) else None
        update_regs(ctx.scalar_regs, sl, cmd, ro, r)
        if reduce_res is not None:
            onchip(I, "reduce_res", reduce_res)
            same_partitions(I, "data", data, "reduce_res", reduce_res)
            if free_elems(reduce_res) != 1:
                fail(f"{I}: reduce_res must be ({data._data.shape[0]}, 1), got {reduce_res.shape}")
            store(I, reduce_res, ctx.scalar_regs[sl].reshape(reduce_res._data.shape))
    return record(I, "scalar", [("data", data), ("bias", bias), ("scale", scale)],
                  [("dst", dst), ("reduce_res", reduce_res)], dst._data.numel(),
                  {"func": f.name, "reduce": reduce_res is not None, "reduce_cmd": cmd.name})


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` with reduce_cmd=reset_reduce, reading the result into ``reduce_res``."""
    return activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=globals()["reduce_cmd"].reset_reduce)


# ======================================================================= GpSimd patterns


def _pattern_values(I, dst, pattern, offset, channel_multiplier):
    if not isinstance(pattern, (list, tuple)) or not pattern or len(pattern) > 4:
        fail(f"{I}: pattern must be a list of 1 to 4 [step, num] pairs, got {pattern!r}")
    P = dst._data.shape[0]
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
    return record(I, "gpsimd", [], [("dst", dst)], dst._data.numel(), {})


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
                  dst._data.numel(), {"cmp_op": c.name})


# ======================================================================= selection


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None,
                  reduce_cmd=reduce_cmd.idle, reduce_op=_ops.maximum, reverse_pred=False,
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
        fail(f"{I}: on_true dtype {on_true.dtype.name} is not supported")
    if predicate.dtype.name not in ("int8", "uint8", "int16", "uint16"):
        fail(f"{I}: predicate dtype must be int8, uint8, int16 or uint16, got {predicate.dtype.name}")
    ro = _ops.alu_of(_ops.resolve(reduce_op, "reduce_op"), I, "reduce_op")
    if ro.name != "maximum":
        fail(f"{I}: reduce_op {ro!r} is not supported; only nl.maximum")
    cmd = _cmd(I, reduce_cmd)
    shape = on_true._data.shape
    pred = (predicate._data != 0).reshape(shape)
    if reverse_pred:
        pred = ~pred
    f = operand_vec(I, "on_false", on_false, on_true)
    f = torch.tensor(f) if isinstance(f, float) else f.expand(shape)
    v = torch.where(pred, f32(on_true), f)
    store(I, dst, v)
    if cmd is not globals()["reduce_cmd"].idle or reduce_res is not None:
        r = reduce_free("maximum", v)
        _vector_reduce_regs(I, "maximum", cmd, r, on_true, reduce_res)
    return record(I, "vector", [("predicate", predicate), ("on_true", on_true),
                                ("on_false", on_false)], [("dst", dst), ("reduce_res", reduce_res)],
                  dst._data.numel(), {"reduce": reduce_res is not None, "reduce_cmd": cmd.name})


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1,
                 reduce_cmd=reduce_cmd.reset_reduce, reduce_res=None, reduce_op=_ops.maximum,
                 range_start=0, on_false_value=-3.4028235e38, name=None):
    """Keep elements whose free index (+range_start) satisfies both comparisons with the
    per-partition bounds; others become on_false_value. Max-reduces into the accumulators."""
    I = "range_select"
    if _gen() < 3:
        fail(f"{I}: needs NeuronCore-v3 or newer")
    onchip(I, "dst", dst)
    onchip(I, "on_true_tile", on_true_tile)
    same_partitions(I, "on_true_tile", on_true_tile, "dst", dst)
    same_free(I, "on_true_tile", on_true_tile, "dst", dst)
    if not on_true_tile.dtype.is_float:
        fail(f"{I}: on_true_tile must be a float dtype, got {on_true_tile.dtype.name}")
    c0 = _ops.resolve(comp_op0, "comp_op0")
    c1 = _ops.resolve(comp_op1, "comp_op1")
    for role, c in (("comp_op0", c0), ("comp_op1", c1)):
        if c.name not in ("equal", "less", "less_equal", "greater", "greater_equal"):
            fail(f"{I}: {role} {c!r} must be one of equal, less, less_equal, greater, greater_equal")
    b0 = operand_vec(I, "bound0", bound0, on_true_tile, need_f32=True)
    b1 = operand_vec(I, "bound1", bound1, on_true_tile, need_f32=True)
    P = on_true_tile._data.shape[0]
    x = f32(on_true_tile).reshape(P, -1)
    idx = (torch.arange(x.shape[1], dtype=torch.float32) + float(range_start)).expand(P, -1)
    b0 = b0.reshape(P, 1) if isinstance(b0, torch.Tensor) else b0
    b1 = b1.reshape(P, 1) if isinstance(b1, torch.Tensor) else b1
    mask = (c0.alu(idx, b0) != 0) & (c1.alu(idx, b1) != 0)
    v = torch.where(mask, x, torch.tensor(float(on_false_value)))
    store(I, dst, v)
    cmd = _cmd(I, reduce_cmd)
    _vector_reduce_regs(I, "maximum", cmd, v.amax(1), on_true_tile, reduce_res)
    return record(I, "vector", [("on_true_tile", on_true_tile), ("bound0", bound0),
                                ("bound1", bound1)], [("dst", dst), ("reduce_res", reduce_res)],
                  dst._data.numel(), {"reduce": reduce_res is not None})


# ======================================================================= statistics


def bn_stats(dst, data, name=None):
    """Per partition: [count, mean, var*count] of the even and of the odd elements (6 values)."""
    I = "bn_stats"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    F = free_elems(data)
    if F > 512:
        fail(f"{I}: data has {F} elements per partition, exceeds maximum 512 "
             "(nl.tile_size.bn_stats_fmax)")
    if free_elems(dst) != 6:
        fail(f"{I}: dst must have 6 elements per partition, got {free_elems(dst)}")
    P = data._data.shape[0]
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
    return record(I, "vector", [("data", data)], [("dst", dst)], data._data.numel(), {})


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
    P = data._data.shape[0]
    x = f32(data).reshape(P, F // 3, 3)
    c, m, m2 = x[..., 0], x[..., 1], x[..., 2]
    n = c.sum(1)
    safe_n = torch.where(n > 0, n, torch.ones_like(n))
    mean = (c * m).sum(1) / safe_n
    var = (m2.sum(1) + (c * (m - mean[:, None]) ** 2).sum(1)) / safe_n
    store(I, dst, torch.stack([mean, var], 1))
    return record(I, "vector", [("data", data)], [("dst", dst)], data._data.numel(), {})


# ======================================================================= gathers / misc


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
    P = data._data.shape[0]
    src = data._data.reshape(P, -1)
    idx = indices._data.reshape(P, -1)
    n = src.shape[1]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise IndexError(f"{I}: index {int(idx.max())} out of range [0, {n}) for data {data.shape}")
    store(I, dst, torch.gather(src, 1, idx))
    return record(I, "gpsimd", [("data", data), ("indices", indices)], [("dst", dst)],
                  dst._data.numel(), {})


def max8(dst, src, name=None):
    """The 8 largest values per partition, descending, on VectorE."""
    I = "max8"
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_partitions(I, "src", src, "dst", dst)
    F = free_elems(src)
    if not 8 <= F <= 16384:
        fail(f"{I}: src has {F} elements per partition; between 8 and 16384 are allowed")
    if free_elems(dst) != 8:
        fail(f"{I}: dst must have 8 elements per partition, got {free_elems(dst)}")
    v = f32(src).reshape(src._data.shape[0], -1)
    store(I, dst, torch.topk(v, 8, dim=1).values)
    return record(I, "vector", [("src", src)], [("dst", dst)], src._data.numel(), {})


def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of 8 values per partition (0xFFFFFFFF if absent)."""
    I = "nc_find_index8"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    onchip(I, "vals", vals)
    if free_elems(vals) != 8 or free_elems(dst) != 8:
        fail(f"{I}: vals and dst must have 8 elements per partition")
    P = data._data.shape[0]
    x = f32(data).reshape(P, 1, -1)
    v = f32(vals).reshape(P, 8, 1)
    eq = x == v
    first = eq.to(torch.int64).argmax(2)
    sentinel = 0xFFFF if dst.dtype.name == "uint16" else 0xFFFFFFFF
    store(I, dst, torch.where(eq.any(2), first, torch.tensor(sentinel)))
    return record(I, "vector", [("data", data), ("vals", vals)], [("dst", dst)],
                  data._data.numel(), {})


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """Replace the first occurrence of each of 8 values with ``imm`` (vals in reverse order)."""
    I = "nc_match_replace8"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    onchip(I, "vals", vals)
    same_free(I, "data", data, "dst", dst)
    P = data._data.shape[0]
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
                  data._data.numel(), {})


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Cross-partition move within each 32-partition quadrant: dst[i] = src[mask[i]]."""
    I = "nc_stream_shuffle"
    onchip(I, "dst", dst)
    onchip(I, "src", src)
    same_free(I, "src", src, "dst", dst)
    if dst.dtype != src.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal src dtype {src.dtype.name}")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32:
        fail(f"{I}: shuffle_mask must have 32 entries, got {len(mask)}")
    Ps, Pd = src._data.shape[0], dst._data.shape[0]
    sv = src._data.reshape(Ps, -1)
    out = dst._data.reshape(Pd, -1).clone()
    for i in range(Pd):
        m = mask[i % 32]
        if m == 255:
            continue
        j = (i // 32) * 32 + m
        if j >= Ps:
            raise IndexError(f"{I}: shuffle_mask[{i % 32}]={m} reads partition {j} of a "
                             f"{Ps}-partition src")
        out[i] = sv[j]
    store(I, dst, out)
    return record(I, "vector", [("src", src)], [("dst", dst)], dst._data.numel(), {})


def dropout(dst, data, prob, name=None):
    """Zero each element with probability ``prob`` (scalar or (P, 1)) on VectorE."""
    I = "dropout"
    onchip(I, "dst", dst)
    onchip(I, "data", data)
    same_partitions(I, "data", data, "dst", dst)
    same_free(I, "data", data, "dst", dst)
    if dst.dtype != data.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    p = operand_vec(I, "prob", prob, data)
    x = f32(data)
    u = torch.rand(x.shape, generator=current().generator)
    store(I, dst, torch.where(u < p, torch.zeros_like(x), x))  # no rescaling, as documented
    return record(I, "vector", [("data", data), ("prob", prob)], [("dst", dst)],
                  dst._data.numel(), {})


def rng(dst, engine=engine.vector, name=None):
    """32 random bits per element, truncated to dst's integer dtype."""
    I = "rng"
    onchip(I, "dst", dst)
    eng = engine_of(I, engine, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        no_psum_on_gpsimd(I, ("dst", dst))
    if not dst.dtype.is_int or dst.dtype.is_bool:
        fail(f"{I}: dst must be an integer dtype, got {dst.dtype.name}")
    bits = torch.randint(0, 1 << 32, dst._data.shape, generator=current().generator,
                         dtype=torch.int64)
    store(I, dst, bits)
    return record(I, eng, [], [("dst", dst)], dst._data.numel(), {})


def set_rng_seed(src_seeds, name=None):
    """Seed the engine PRNG from a [1, 1] 32-bit tensor."""
    I = "set_rng_seed"
    onchip(I, "src_seeds", src_seeds)
    if src_seeds._data.numel() != 1:
        fail(f"{I}: src_seeds must be a [1, 1] tensor, got {src_seeds.shape}")
    current().generator.manual_seed(int(src_seeds._data.reshape(-1)[0]) & 0xFFFFFFFF)
    return record(I, "vector", [("src_seeds", src_seeds)], [], 0, {})


def core_barrier(data, cores, engine=engine.gpsimd, name=None):
    """Barrier between the logical cores. kernel[2] runs the cores one after the other, so a
    barrier cannot be honoured: core 0 would wait for core 1 forever."""
    if current().grid > 1:
        raise UnsupportedError(
            "core_barrier: the simulator runs kernel[2]'s cores sequentially and cannot "
            "model a barrier between them")
    return None


# ======================================================================= registers


class VirtualRegister:
    """An engine register holding a 32-bit integer (static in the simulator)."""

    __slots__ = ("value",)

    def __init__(self, state=None, frozen=False):
        self.value = state

    def __int__(self):
        if self.value is None:
            raise NkiValidationError("VirtualRegister read before it was written")
        return int(self.value)

    __index__ = __int__

    def __bool__(self):
        return int(self) != 0

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def register_alloc(x=None):
    return VirtualRegister(None if x is None else int(x))


def register_move(dst, src):
    dst.value = int(src)


def register_load(dst, src):
    if src._data.numel() != 1:
        fail(f"register_load: src must hold exactly one element, got shape {src.shape}")
    dst.value = int(src._data.reshape(-1)[0])


def register_store(dst, src):
    if dst._data.numel() != 1:
        fail(f"register_store: dst must hold exactly one element, got shape {dst.shape}")
    store("register_store", dst, torch.tensor(int(src), dtype=torch.int64).reshape(dst._data.shape))


def _unsupported(name):
    def fn(*args, **kwargs):
        raise UnsupportedError(f"nisa.{name} is not supported by the simulator")
    fn.__name__ = name
    return fn


for _n in ("nc_matmul_mx", "quantize_mx", "activate2", "exponential", "rand2", "local_gather",
           "sequence_bounds", "sendrecv", "nonzero_with_count", "topk", "rand_set_state",
           "rand_get_state"):
    globals()[_n] = _unsupported(_n)

ENGINES = ENGINE_NAME
