"""TensorE instructions: ``nc_matmul`` and ``nc_transpose`` (TensorE or VectorE).

The matmul limits (PE array size, tile sizes, moving free size, dtypes) are the active
target's (hardware.py); PSUM accumulation follows the per-element state kept by memory.py.
"""

from __future__ import annotations

import torch

from . import enums
from .operands import (engine_of, f32, fail, free_elems, onchip, psum_state, record, store,
                       target, tensor_arg)


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=enums.matmul_perf_mode.none, name=None):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on TensorE, fp32 accumulation."""
    I = "nc_matmul"
    onchip(I, "stationary", stationary, psum=False, why=" (TensorE reads SBUF only)")
    onchip(I, "moving", moving, psum=False, why=" (TensorE reads SBUF only)")
    onchip(I, "dst", dst, sbuf=False, why=" (TensorE writes PSUM only)")
    tgt = target()
    st_dt, mv_dt, dst_dt = stationary.dtype, moving.dtype, dst.dtype
    double = perf_mode is enums.matmul_perf_mode.double_row or perf_mode == "double_row"
    sv, mv = f32(stationary), f32(moving)
    K = sv.shape[0]
    if double:
        if not tgt.matmul_double_row:
            fail(f"{I}: perf_mode double_row needs NeuronCore-v3 or newer")
        for role, t in (("stationary", stationary), ("moving", moving)):
            if not t.dtype.name.startswith("float8"):
                fail(f"{I}: perf_mode double_row needs float8 {role}, got {t.dtype.name}")
            if t.ndim < 3 or t.shape[1] != 2:
                fail(f"{I}: perf_mode double_row needs {role} shaped [K, 2, ...], got {t.shape}")
        # contraction over (partition, first free dim): flatten them
        sv = sv.reshape(K * 2, -1)
        mv = mv.reshape(K * 2, -1)
    else:
        sv = sv.reshape(K, -1)
        mv = mv.reshape(mv.shape[0], -1)
    if moving.shape[0] != K:
        fail(f"{I}: moving partition dim {moving.shape[0]} must equal stationary "
             f"partition dim {K} (the contraction dim)")
    rows, cols = tgt.matmul_rows, tgt.matmul_columns
    row_size, col_size = rows, cols
    if tile_position or tile_size:
        if not (tile_position and tile_size):
            fail(f"{I}: tile_position and tile_size must be set together")
        row_size, col_size = (int(x) for x in tile_size)
        r0, c0 = (int(x) for x in tile_position)
        sizes = tgt.matmul_tile_sizes
        if row_size not in sizes or col_size not in sizes:
            fail(f"{I}: tile_size {tuple(tile_size)} must use sizes from {sizes}")
        if r0 % row_size or c0 % col_size or r0 + row_size > rows or c0 + col_size > cols:
            fail(f"{I}: tile_position {tuple(tile_position)} must be multiples of tile_size "
                 f"{tuple(tile_size)} within the {rows}x{cols} array")
    M, N = sv.shape[1], mv.shape[1]
    if K > row_size:
        fail(f"{I}: stationary partition dim {K} exceeds maximum {row_size}")
    if M > col_size:
        fail(f"{I}: stationary free size {M} exceeds maximum {col_size}")
    n_max = tgt.matmul_moving_fmax_bf16_dst if dst_dt.name == "bfloat16" else tgt.matmul_moving_fmax
    if N > n_max:
        fail(f"{I}: moving free size {N} exceeds maximum {n_max}")
    if dst.shape[0] != M:
        fail(f"{I}: dst partition dim {dst.shape[0]} must equal stationary free size {M}")
    if free_elems(dst) != N:
        fail(f"{I}: dst has {free_elems(dst)} elements per partition but moving free size is {N}")
    names = (st_dt.name, mv_dt.name)
    if is_transpose:
        if dst_dt != st_dt:
            fail(f"{I}: is_transpose=True needs dst dtype {dst_dt.name} equal to stationary "
                 f"dtype {st_dt.name}")
    else:
        ok = tgt.matmul_dst_dtypes
        if dst_dt.name not in ok:
            fail(f"{I}: dst dtype must be {' or '.join(ok)}, got {dst_dt.name}")
    allowed = tgt.matmul_dtypes
    for role, dn in (("stationary", names[0]), ("moving", names[1])):
        if dn not in allowed and not (is_transpose and dn in tgt.matmul_transpose_dtypes):
            fail(f"{I}: {role} dtype {dn} is not supported; use one of {', '.join(allowed)}")
    f32ish = ("float32", "tfloat32")
    if (names[0] in f32ish) != (names[1] in f32ish) and not is_transpose:
        fail(f"{I}: stationary {names[0]} and moving {names[1]}: a float32/tfloat32 operand "
             "pairs only with float32/tfloat32")
    if "float8_e4m3" in names and "float8_e4m3fn" in names:
        fail(f"{I}: float8_e4m3 and float8_e4m3fn cannot be mixed in one matmul")

    exact_transpose = is_transpose and N == K and not double and torch.equal(mv, torch.eye(K))
    if exact_transpose:
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
        # 0 = never written; 2 = last written by a non-matmul instruction (memset, copy)
        bad = (state == 0) if tgt.matmul_accumulate_onto_copies else (state != 1)
        if bool(bad.any()):
            fail(f"{I}: accumulate=True onto PSUM locations of dst that no previous matmul "
                 "initialized (undefined on hardware; start with accumulate=False)")
        value = f32(dst).reshape(M, N) + prod
        mode = "accumulate"
    else:
        value = prod
        mode = "overwrite"
    if exact_transpose and value is prod:  # move the bits themselves
        store(I, dst, stationary._data.reshape(K, M).t().reshape(d.shape), matmul=True, raw=True)
    else:
        store(I, dst, value.reshape(d.shape), matmul=True)
    is_f32 = names[0] in f32ish or names[1] in f32ish
    return record(I, "tensor", [("stationary", stationary), ("moving", moving)], [("dst", dst)],
                  2 * K * (2 if double else 1) * M * N,
                  {"K": K * (2 if double else 1), "M": M, "N": N, "fp32": is_f32,
                   "is_transpose": bool(is_transpose), "accumulate": mode,
                   "dtype": names[0], "moving_dtype": names[1], "perf_mode":
                   "double_row" if double else "none"})


def nc_transpose(dst, data, engine=enums.engine.unknown, name=None):
    """2-D transpose of ``data`` (free axes flattened) on TensorE (<=128x128, SBUF->PSUM) or
    VectorE (<=32x32)."""
    I = "nc_transpose"
    tensor_arg(I, "dst", dst)
    tensor_arg(I, "data", data)
    P, F = data.shape[0], free_elems(data)
    if engine is None or engine is enums.engine.unknown:
        eng = "tensor" if (data._alloc.kind == "sbuf" and dst._alloc.kind == "psum") else "vector"
    else:
        eng = engine_of(I, engine, ("tensor", "vector"), "tensor")
    if eng == "tensor":
        onchip(I, "data", data, psum=False, why=" (TensorE transpose reads SBUF)")
        onchip(I, "dst", dst, sbuf=False, why=" (TensorE transpose writes PSUM)")
        lim = target().transpose_tensor_max
    else:
        onchip(I, "data", data)
        onchip(I, "dst", dst)
        lim = target().transpose_vector_max
    if P > lim or F > lim:
        fail(f"{I}: data shape [{P}, {F}] exceeds maximum [{lim}, {lim}] on the "
             f"{eng} engine")
    if dst.dtype != data.dtype:
        fail(f"{I}: dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    if dst.shape[0] != F or free_elems(dst) != P:
        fail(f"{I}: dst shape {dst.shape} must be [{F}, {P}] (data {data.shape} transposed)")
    store(I, dst, data._data.reshape(P, F).t(), raw=True)  # same dtype: moves bits
    return record(I, eng, [("data", data)], [("dst", dst)], P * F, {"P": P, "F": F})
