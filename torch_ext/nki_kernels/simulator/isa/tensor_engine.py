"""TensorE instructions: ``nc_matmul`` and ``nc_transpose`` (TensorE or VectorE).

The matmul limits (PE array size, tile sizes, moving free size, dtypes) are the active
target's (hardware.py); PSUM accumulation follows the per-element state kept by memory.py.
"""

from __future__ import annotations

import torch

from . import enums
from .operands import (engine_of, f32, fail, free_elems, onchip, psum_state, record, require_generation,
                       require_one_psum_bank, store,
                       target, tensor_arg)


def _tile(instr, tile_position, tile_size):
    """(row size, column size, first row, first column) of a TensorE tile given by both
    arguments; refused when only one is set."""
    if not (tile_position and tile_size):
        fail(f"{instr}: tile_position={tile_position!r} and tile_size={tile_size!r}: both or neither must be set")
    row_size, col_size = (int(x) for x in tile_size)
    r0, c0 = (int(x) for x in tile_position)
    return row_size, col_size, r0, c0


def _refuse_uninitialized(instr, bad, dst, what):
    """Refuse accumulating onto the PSUM locations ``bad`` marks (never initialized by a
    ``what``): how many, and the first, in dst's shape."""
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        fail(f"{instr}: accumulate=True onto {int(bad.sum())} PSUM locations of dst {tuple(dst.shape)} (the first "
             f"at {first}) that no previous {what} initialized (undefined on hardware; start with accumulate=False)")


def _columns_alone(a, b):
    """``a @ b`` for fp32 ``a`` [M, K] and ``b`` [K, N] with each output element as TensorE
    makes it, from its own row of ``a`` and column of ``b`` alone: the products summed in
    float64 (exactly, for K <= 512 fp32 products: each has at most 48 significant bits) and
    rounded once to fp32. torch's fp32 product blocks its sums by the matrices' shapes, so
    an output column's bits depended on how many columns the moving tile had (a kernel
    splitting rows over two programs gave other bits at LNC=2 than at LNC=1: [128, 128]
    stationary against 7 moving columns or 1, found in a review, 2026-12-07)."""
    return (a.double() @ b.double()).float()


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
        require_generation(I, 3, "perf_mode double_row", supported=tgt.matmul_double_row,
                           source="nki.isa.nc_matmul")
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
        row_size, col_size, r0, c0 = _tile(I, tile_position, tile_size)
        sizes = tgt.matmul_tile_sizes
        if row_size not in sizes or col_size not in sizes:
            fail(f"{I}: tile_size {tuple(tile_size)} must use sizes from {sizes}")
        if r0 % row_size or c0 % col_size or r0 + row_size > rows or c0 + col_size > cols:
            fail(f"{I}: tile_position {tuple(tile_position)} must be multiples of tile_size "
                 f"{tuple(tile_size)} within the {rows}x{cols} array")
        # "double_row performance mode cannot be combined with Tensor Engine column tiling
        # mode" (nki.isa.nc_matmul, NKI 0.7)
        if double and (col_size != cols or c0 != 0):
            fail(f"{I}: perf_mode double_row cannot be combined with column tiling: tile_size "
                 f"{tuple(tile_size)} / tile_position {tuple(tile_position)} must span all "
                 f"{cols} columns from column 0")
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
    if (names[0] in f32ish) != (names[1] in f32ish):
        fail(f"{I}: stationary {names[0]} and moving {names[1]}: a float32/tfloat32 operand "
             "pairs only with float32/tfloat32")
    if "float8_e4m3" in names and "float8_e4m3fn" in names:
        fail(f"{I}: float8_e4m3 and float8_e4m3fn cannot be mixed in one matmul")

    require_one_psum_bank(I, "dst", dst)
    exact_transpose = is_transpose and N == K and not double and torch.equal(mv, torch.eye(K))
    if exact_transpose:
        prod = sv.t()  # bit-accurate transpose (NaN/Inf pass through), as on NeuronCore-v3+
    else:
        prod = _columns_alone(sv.t(), mv)
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
        _refuse_uninitialized(I, bad, dst, "matmul")
        value = f32(dst).reshape(M, N) + prod
        mode = "accumulate"
    else:
        value = prod
        mode = "overwrite"
    if exact_transpose and value is prod:  # move the bits themselves
        store(I, dst, stationary._data.reshape(K, M).t().reshape(d.shape), matmul=True, raw=True)
    else:
        store(I, dst, value.reshape(d.shape), matmul=True)
    # four passes for float32 only: "max(min(64, N_stationary), N_moving)" for "float8_e4m3/
    # float8_e5m2/bfloat16/float16/tfloat32", "4 * ..." for "float32" [S] nc_matmul
    is_f32 = "float32" in (names[0], names[1])
    return record(I, "tensor", [("stationary", stationary), ("moving", moving)], [("dst", dst)],
                  2 * K * (2 if double else 1) * M * N,
                  {"K": K * (2 if double else 1), "M": M, "N": N, "fp32": is_f32,
                   "is_transpose": bool(is_transpose), "accumulate": mode,
                   "dtype": names[0], "moving_dtype": names[1], "perf_mode":
                   "double_row" if double else "none",
                   # the PE tile the matmul runs on (tiling mode: matmuls on disjoint tiles
                   # run in parallel, cost/schedule.py); the whole array when not tiled
                   "tile": (r0, c0, row_size, col_size) if tile_position else (0, 0, rows, cols)})


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
    if eng == "tensor":
        require_one_psum_bank(I, "dst", dst)
    store(I, dst, data._data.reshape(P, F).t(), raw=True)  # same dtype: moves bits
    return record(I, eng, [("data", data)], [("dst", dst)], P * F, {"P": P, "F": F})


# ---------------------------------------------------------------------------- MX (v4)
# float4_e2m1fn (OCP MX): sign, 2 exponent bits (bias 1), 1 mantissa bit
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
_MX_DATA = ("float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4")
_MX_SCALE = ("float8_e8m0fnu", "uint8")


def mx_values(t) -> torch.Tensor:
    """The values of an MX x4 tile [P, F] as fp32 [P, F, 4] (the four packed elements of each
    word, lowest byte / nibble first)."""
    d = t._data.contiguous()
    P = d.shape[0]
    if t.dtype.name == "float4_e2m1fn_x4":
        w = d.view(torch.int16).to(torch.int64) & 0xFFFF
        nib = torch.stack([(w >> (4 * i)) & 0xF for i in range(4)], -1)
        return _E2M1[nib].reshape(P, -1, 4)
    codes = d.view(torch.uint8).reshape(P, -1, 4)
    fp8 = torch.float8_e4m3fn if t.dtype.name == "float8_e4m3fn_x4" else torch.float8_e5m2
    return codes.view(fp8).to(torch.float32)


def mx_scale_rows(P: int, group: int, quadrant: int) -> torch.Tensor:
    """Scale partition (relative to the scale tile) of each of ``P`` data partitions: the
    group of ``group`` partitions it belongs to, placed in its own quadrant ("Scales must be
    placed in the quadrant from which the corresponding scaling group originated", MX deep
    dive; "for every 32 partitions of the data tensor, we get 32/8=4 partitions worth of
    scale factors", Trainium3 guide)."""
    p = torch.arange(P)
    return quadrant * (p // quadrant) + (p % quadrant) // group


def mx_scales(scale, P: int, F: int, role: str) -> torch.Tensor:
    """Scales (fp32 powers of two) of an MX data tile [P, F], per data partition [P, F]."""
    tgt = target()
    rows = mx_scale_rows(P, tgt.mx_group_partitions, tgt.partition_quadrant)
    need = int(rows.max()) + 1
    if scale.shape[0] < need or free_elems(scale) != F:
        fail(f"nc_matmul_mx: {role} must cover {need} partitions x {F} elements (one scale per "
             f"{tgt.mx_group_partitions} partitions of each quadrant, per x4 column), got "
             f"{scale.shape}")
    codes = scale._data.reshape(scale.shape[0], -1).contiguous().view(torch.uint8)
    exps = codes.to(torch.int64)[rows]  # e8m0: 2^(code - 127); 0xFF is NaN
    vals = torch.pow(2.0, (exps - 127).to(torch.float64)).to(torch.float32)
    return torch.where(exps == 255, torch.full_like(vals, float("nan")), vals)


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None,
                 tile_size=None, accumulate=None, name=None):
    """MX matmul on TensorE (NeuronCore-v4): ``dst[M, N] (+)= sum over K and the four packed
    elements of (stationary * its scale) x (moving * its scale)``, fp32 accumulation."""
    I = "nc_matmul_mx"
    tgt = target()
    require_generation(I, 4, supported=tgt.has_mx, source="nki.isa.nc_matmul_mx")
    for role, t in (("stationary", stationary), ("moving", moving),
                    ("stationary_scale", stationary_scale), ("moving_scale", moving_scale)):
        onchip(I, role, t, psum=False, why=" (TensorE reads SBUF only)",
               quadrant_offsets=tgt.mx_scale_quadrant_offsets if role.endswith("_scale") else ())
    onchip(I, "dst", dst, sbuf=False, why=" (TensorE writes PSUM only)")
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype.name not in _MX_DATA:
            fail(f"{I}: {role} dtype must be one of {', '.join(_MX_DATA)}, got {t.dtype.name}")
    for role, t in (("stationary_scale", stationary_scale), ("moving_scale", moving_scale)):
        if t.dtype.name not in _MX_SCALE:
            fail(f"{I}: {role} dtype must be float8_e8m0fnu or uint8, got {t.dtype.name}")
    if dst.dtype.name not in ("float32", "bfloat16"):
        fail(f"{I}: dst dtype must be float32 or bfloat16, got {dst.dtype.name}")
    K, M, N = stationary.shape[0], free_elems(stationary), free_elems(moving)
    q = tgt.partition_quadrant
    if moving.shape[0] != K or K % q or K > tgt.matmul_rows:
        fail(f"{I}: stationary and moving partition dims ({K}, {moving.shape[0]}) must be equal, "
             f"a multiple of {q} and at most {tgt.matmul_rows}")
    row_size = tgt.matmul_rows
    if tile_position or tile_size:
        row_size, col_size, r0, c0 = _tile(I, tile_position, tile_size)
        if col_size != tgt.matmul_columns or c0 != 0:
            fail(f"{I}: only row tiling: tile_size column must be {tgt.matmul_columns} and "
                 f"tile_position column 0, got {tuple(tile_size)} / {tuple(tile_position)}")
        if row_size not in tgt.matmul_tile_sizes or r0 % row_size or r0 + row_size > tgt.matmul_rows:
            fail(f"{I}: tile_size row {row_size} / tile_position row {r0} must be one of "
                 f"{tgt.matmul_tile_sizes} and a multiple of it within {tgt.matmul_rows}")
        if K > row_size:
            fail(f"{I}: stationary partition dim {K} exceeds the row tile {row_size}")
    if M > tgt.matmul_columns or M % 2:
        fail(f"{I}: stationary free size {M} must be even and at most {tgt.matmul_columns}")
    n_max = tgt.matmul_moving_fmax_bf16_dst if dst.dtype.name == "bfloat16" else tgt.matmul_moving_fmax
    if N > n_max:
        fail(f"{I}: moving free size {N} exceeds maximum {n_max}")
    if dst.shape[0] != M or free_elems(dst) != N:
        fail(f"{I}: dst shape {dst.shape} must be [{M}, {N}]")
    st = mx_values(stationary) * mx_scales(stationary_scale, K, M, "stationary_scale").unsqueeze(-1)
    mv = mx_values(moving) * mx_scales(moving_scale, K, N, "moving_scale").unsqueeze(-1)
    # the four packed elements extend the contraction: [K, M, 4] -> [4K, M]; fp32 math
    prod = _columns_alone(st.permute(0, 2, 1).reshape(4 * K, M).t(), mv.permute(0, 2, 1).reshape(4 * K, N))
    state = psum_state(dst)
    if accumulate is None:
        acc = (state == 1).reshape(M, N)
        value = torch.where(acc, f32(dst).reshape(M, N) + prod, prod)
    elif accumulate:
        _refuse_uninitialized(I, state == 0, dst, "write")
        value = f32(dst).reshape(M, N) + prod
    else:
        value = prod
    store(I, dst, value.reshape(dst.shape), matmul=True)
    return record(I, "tensor", [("stationary", stationary), ("moving", moving),
                                ("stationary_scale", stationary_scale),
                                ("moving_scale", moving_scale)], [("dst", dst)],
                  2 * K * 4 * M * N, {"K": K * 4, "M": M, "N": N, "fp32": False, "mx": True,
                                      "dtype": stationary.dtype.name,
                                      "moving_dtype": moving.dtype.name, "is_transpose": False,
                                      "accumulate": "auto" if accumulate is None else
                                      ("accumulate" if accumulate else "overwrite"),
                                      "perf_mode": "none"})
