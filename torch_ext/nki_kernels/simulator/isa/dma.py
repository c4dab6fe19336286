"""DMA instructions: ``dma_copy``, ``dma_transpose``, ``dma_compute``.

The DMA engines move data between HBM and SBUF (and SBUF to SBUF, HBM to HBM); they never
touch PSUM. A copy between different dtypes casts through fp32; equal dtypes copy bits.
"""

from __future__ import annotations

import torch

from .. import ops as _ops
from . import enums
from ..tensor import IndirectView, _gather_bits
from .operands import (cast_copy, convert_bits, f32, fail, record, require_generation, store, target,
                       tensor_arg)


def _dma_check(instr, role, t):
    tensor_arg(instr, role, t)
    if t.size == 0:
        fail(f"{instr}: {role} is empty (shape {t.shape}); a DMA needs elements")
    if t._alloc.kind == "psum":
        fail(f"{instr}: {role} is in PSUM; DMA reads and writes only HBM and SBUF "
             "(copy PSUM to SBUF with nisa.tensor_copy first)")


def _direction(dst, src):
    return f"{'hbm' if src._alloc.kind == 'hbm' else 'sbuf'}_to_" \
           f"{'hbm' if dst._alloc.kind == 'hbm' else 'sbuf'}"


def _dge_mode(instr, dge_mode) -> enums.dge_mode:
    """``dge_mode`` as a ``nisa.dge_mode`` member; AWS's nki-library passes the members' int
    values (``_DGE_MODE_NONE = 3``, core/subkernels/norm_tkg_utils.py @d2ad3a5)."""
    if isinstance(dge_mode, enums.dge_mode):
        return dge_mode
    if isinstance(dge_mode, int) and not isinstance(dge_mode, bool):
        try:
            return enums.dge_mode(dge_mode)
        except ValueError:
            pass
    fail(f"{instr}: dge_mode={dge_mode!r} is not a nisa.dge_mode member "
         f"({', '.join(f'{m.name}={m.value}' for m in enums.dge_mode)})")


def _dma_options(instr, priority, dge_mode, engine) -> None:
    """The options' documented limits (NKI 0.7 dma_copy / dma_transpose docstrings):
    ``priority`` "0-3 ... (NeuronCore-v4+ only)"; ``engine`` "the engine to use for HWDGE
    descriptor generation: nki.isa.engine.sync or nki.isa.engine.scalar. Only valid when
    dge_mode=nisa.dge_mode.hwdge"."""
    if dge_mode is enums.dge_mode.hwdge:
        # dge_mode: "Hardware based DGE is only supported for NeuronCore-v3 or newer"
        require_generation(instr, 3, "dge_mode=hwdge", source=f"nki.isa.{instr}")
    if priority is not None:
        require_generation(instr, 4, f"priority={priority!r}", source=f"nki.isa.{instr}")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 3:
            fail(f"{instr}: priority={priority!r} must be an int in 0..3")
    if engine is not None and engine is not enums.engine.unknown:
        if dge_mode is not enums.dge_mode.hwdge:
            fail(f"{instr}: engine={engine!r} is only valid with dge_mode=nisa.dge_mode.hwdge, "
                 f"got {dge_mode!r}")
        if engine not in (enums.engine.sync, enums.engine.scalar):
            fail(f"{instr}: engine={engine!r} must be nisa.engine.sync or nisa.engine.scalar for HWDGE")


def dma_copy(dst, src, priority=None, oob_mode=enums.oob_mode.error,
             dge_mode=enums.dge_mode.unknown, engine=enums.engine.unknown, name=None):
    """Copy ``src`` to ``dst`` with the DMA engines (HBM<->SBUF, SBUF<->SBUF, HBM<->HBM)."""
    _dma_check("dma_copy", "dst", dst)
    _dma_check("dma_copy", "src", src)
    dge_mode = _dge_mode("dma_copy", dge_mode)
    _dma_options("dma_copy", priority, dge_mode, engine)
    n_dst, n_src = dst.size, src.size
    if n_dst != n_src:
        fail(f"dma_copy: dst has {n_dst} elements {dst.shape} but src has {n_src} {src.shape}")
    if not isinstance(oob_mode, enums.oob_mode):
        fail(f"dma_copy: oob_mode={oob_mode!r} is not a nisa.oob_mode member")
    for role, t in (("src", src), ("dst", dst)):
        if isinstance(t, IndirectView) and t.vector_columns() > 1:
            # 2-D index tiles are documented for dma_transpose only (nki.isa.dma_transpose's
            # "Indirect transpose example with 2D indices"); a copy gathers one row per partition
            fail(f"dma_copy: {role}'s vector_offset has shape {tuple(t._vector.shape)}; a copy takes one "
                 "offset per partition, shape (P, 1) (2-D indices are a dma_transpose feature)")
    if isinstance(src, IndirectView) or isinstance(dst, IndirectView):
        _indirect_copy(dst, src, skip=oob_mode is enums.oob_mode.skip)
    else:
        cast_copy("dma_copy", dst, src)
    return record("dma_copy", "dma", [("src", src)], [("dst", dst)], 0,
                  {"bytes": n_dst * dst.dtype.itemsize,
                   "src_bytes": n_src * src.dtype.itemsize,
                   "direction": _direction(dst, src)})


def _indirect_copy(dst, src, skip):
    """dma_copy with a run-time offset on either side (docs: "out-of-bound address checking
    is turned on automatically during execution. By default a runtime error is raised ...
    oob_mode=oob_mode.skip" makes the DMA "skip the DMA transfer for a given dynamic address
    or index when it is out of bound"): elements whose row is out of range are not moved."""
    n = dst.size
    valid = torch.ones(n, dtype=torch.bool)
    if isinstance(src, IndirectView):
        storage, idx, row_ok = src.resolve()
        if not skip and not bool(row_ok.all()):
            raise IndexError(src._oob_message(row_ok) + " (dma_copy oob_mode=error)")
        bits = _gather_bits(storage, idx)
        valid &= row_ok.reshape((-1,) + (1,) * (idx.dim() - 1)).expand(idx.shape).reshape(-1)
    else:
        bits = src._data
    new = convert_bits(bits, src.dtype, dst.dtype).reshape(-1)
    if isinstance(dst, IndirectView):
        _, didx, drow = dst.resolve()
        if not skip and not bool(drow.all()):
            raise IndexError(dst._oob_message(drow) + " (dma_copy oob_mode=error)")
        rows = drow.reshape((-1,) + (1,) * (didx.dim() - 1)).expand(didx.shape).reshape(-1)
        keep = (valid & rows).reshape(didx.shape)
        dst._store_bits(new.reshape(didx.shape), keep=keep)
        return
    old = dst._data.reshape(-1) if dst._data.is_contiguous() else dst._data.contiguous().reshape(-1)
    store("dma_copy", dst, torch.where(valid, new, old).reshape(dst.shape), raw=True)


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=enums.dge_mode.unknown,
                  oob_mode=enums.oob_mode.error, name=None):
    """Transpose ``src`` (HBM or SBUF) into SBUF ``dst`` with the DMA engines."""
    _dma_check("dma_transpose", "dst", dst)
    _dma_check("dma_transpose", "src", src)
    dge_mode = _dge_mode("dma_transpose", dge_mode)
    _dma_options("dma_transpose", priority, dge_mode, None)
    if dst._alloc.kind != "sbuf":
        fail(f"dma_transpose: dst must be in SBUF, got {dst._alloc.kind.upper()}")
    _transpose_dge_rules(src, dge_mode, oob_mode)
    nd = src.ndim
    perm = next((p for p in target().dma_transpose_axes if len(p) == nd), None)
    if perm is None:
        fail(f"dma_transpose: src must be 2-D, 3-D or 4-D, got shape {src.shape}")
    if axes is not None and tuple(axes) != perm:
        fail(f"dma_transpose: axes {tuple(axes)} not supported for {nd}-D src; use {perm}")
    if src.dtype != dst.dtype:
        fail(f"dma_transpose: dst dtype {dst.dtype.name} must equal src dtype {src.dtype.name}")
    out = src._data.permute(perm)  # bits: the transpose moves them unchanged
    if tuple(out.shape) != tuple(dst.shape):
        fail(f"dma_transpose: dst shape {dst.shape} must be {tuple(out.shape)} (src {src.shape} "
             f"permuted by {perm})")
    store("dma_transpose", dst, out, raw=True)
    n = dst.size * dst.dtype.itemsize
    return record("dma_transpose", "dma", [("src", src)], [("dst", dst)], 0,
                  {"bytes": n, "src_bytes": n, "direction": _direction(dst, src),
                   "transpose": True})


def _transpose_dge_rules(src, dge_mode, oob_mode=enums.oob_mode.error) -> None:
    """The DGE constraints of nki.isa.dma_transpose (NKI 0.7 docstring, "DMA Direct Transpose
    Constraints" / "DMA Indirect Transpose Constraints"). A direct transpose's only valid
    dge_modes "are unknown and hwdge"; with hwdge: "For 2-d input tiles, src.shape[0] == 16.
    For 3-d/4-d input tiles, src.shape[0] must be in {1, 2, 4, 8, 16} and (src.shape[0] *
    src.shape[-2]) % 16 == 0", "src.shape[-1] <= 128", "src.dtype is 2 bytes". An indirect
    one (src indexed by an SBUF vector) is lowered to a software DGE transpose: only unknown
    and swdge, "When src is 4D: len(src[1]) or len(src[2]) must be 1" (read as src.shape[1]
    or src.shape[2]), "src.shape[-1] <= 128", "src.dtype is 2 bytes", "src tensor must be on
    HBM", "TRN2+ only", and of its indices (the view's vector_offset): "must be 2-d", "indices.shape[0]
    must be in [16, 128] and divisible by 16", "indices.dtype is np.uint32", "must be on SBUF",
    "indices.shape[0] * indices.shape[1] must be >= src.shape[0]", "src.shape[0] must be
    divisible by 16", "When indices.shape[1] > 1: indices.shape[0] must be exactly 128" (the
    flat indices are then read column by column: IndirectView.vector_rows); ``oob_mode.skip`` "Only valid when src uses indirect indexing". With
    dge_mode unknown the compiler picks the lowering, so a direct
    transpose's hwdge rules are not checked then. AWS's own nki-library issues direct
    transposes with dge_mode none (core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py @d2ad3a5,
    "Use STATIC DMA mode", the bias and dequant-scale loads of mlp_tkg, which has hardware
    QoR rows), so a direct transpose takes none too: only swdge is refused there."""
    I = "dma_transpose"
    modes = enums.dge_mode
    indirect = isinstance(src, IndirectView) and src._vector is not None
    allowed = (modes.unknown, modes.swdge) if indirect else (modes.unknown, modes.hwdge, modes.none)
    if dge_mode not in allowed:
        fail(f"{I}: dge_mode={dge_mode!r} is not valid for {'an indirect' if indirect else 'a direct'} "
             f"transpose; use {' or '.join(f'nisa.dge_mode.{m.name}' for m in allowed)}")
    shape, item = tuple(src.shape), src.dtype.itemsize
    if indirect or dge_mode is modes.hwdge:
        what = "an indirect transpose" if indirect else "a hwdge transpose"
        if item != 2:
            fail(f"{I}: {what} needs a 2-byte src dtype, got {src.dtype.name}")
        if shape[-1] > 128:
            fail(f"{I}: {what} needs src.shape[-1] <= 128, got src shape {shape}")
    if not indirect and oob_mode is enums.oob_mode.skip:
        fail(f"{I}: oob_mode=skip is only valid when src uses indirect indexing (a vector_offset)")
    if indirect:
        if src._alloc.kind != "hbm":
            fail(f"{I}: an indirect transpose reads src from HBM, got {src._alloc.kind}")
        require_generation(I, 3, "an indirect transpose", source="nki.isa.dma_transpose")
        if len(shape) == 4 and shape[1] != 1 and shape[2] != 1:
            fail(f"{I}: a 4-D indirect transpose needs src.shape[1] or src.shape[2] to be 1, got src shape "
                 f"{shape}")
        idx = src._vector
        ishape = tuple(idx.shape)
        if len(ishape) != 2:
            fail(f"{I}: the indices (vector_offset) must be 2-D, got shape {ishape}")
        if not (16 <= ishape[0] <= 128 and ishape[0] % 16 == 0):
            fail(f"{I}: the indices' partitions must be in [16, 128] and a multiple of 16, got shape {ishape}")
        if idx.dtype.name != "uint32":
            fail(f"{I}: the indices' dtype must be uint32, got {idx.dtype.name}")
        if idx._alloc.kind != "sbuf":
            fail(f"{I}: the indices must be in SBUF, got {idx._alloc.kind.upper()}")
        if ishape[1] > 1 and ishape[0] != 128:
            fail(f"{I}: indices of {ishape[1]} columns need exactly 128 partitions (\"When indices.shape[1] > 1: "
                 f"indices.shape[0] must be exactly 128\"), got shape {ishape}")
        if shape[0] % 16 or ishape[0] * ishape[1] < shape[0]:
            fail(f"{I}: an indirect transpose needs src.shape[0] a multiple of 16 and at most "
                 f"indices.shape[0] * indices.shape[1] ({ishape[0] * ishape[1]}), got src shape {shape}")
    elif dge_mode is modes.hwdge:
        if len(shape) == 2 and shape[0] != 16:
            fail(f"{I}: a 2-D hwdge transpose needs src.shape[0] == 16, got src shape {shape}")
        if len(shape) in (3, 4) and (shape[0] not in (1, 2, 4, 8, 16) or shape[0] * shape[-2] % 16):
            fail(f"{I}: a {len(shape)}-D hwdge transpose needs src.shape[0] in (1, 2, 4, 8, 16) "
                 f"and src.shape[0] * src.shape[-2] a multiple of 16, got src shape {shape}")


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True,
                oob_mode=enums.oob_mode.error, name=None):
    """``dst = reduce_op(srcs[0]*scales[0], ...)`` in the DMA engines (only nl.add, scales 1.0)."""
    op = _ops.resolve(reduce_op, "reduce_op")
    if op.name != "add":
        fail(f"dma_compute: reduce_op {op!r} is not supported; only nl.add")
    for i, s in enumerate(scales or ()):
        if float(s) != 1.0:
            fail(f"dma_compute: scales[{i}]={s}; every scale must be 1.0")
    srcs = list(srcs)
    most = target().dma_compute_max_sources
    if not 1 <= len(srcs) <= most:
        fail(f"dma_compute: {len(srcs)} sources; between 1 and {most} are allowed")
    _dma_check("dma_compute", "dst", dst)
    acc = None
    for i, s in enumerate(srcs):
        _dma_check("dma_compute", f"srcs[{i}]", s)
        if s.size != dst.size:
            fail(f"dma_compute: srcs[{i}] has {s.size} elements, dst has {dst.size}")
        v = f32(s).reshape(-1)
        acc = v.clone() if acc is None else acc + v
    store("dma_compute", dst, acc)
    n = dst.size * dst.dtype.itemsize
    # every source is read at its own dtype (the engines cast to fp32 inside: the
    # dma_compute docstring), so fp32 sources into a bf16 dst read 4 B per element each
    src_bytes = sum(s.size * s.dtype.itemsize for s in srcs)
    return record("dma_compute", "dma", [(f"srcs[{i}]", s) for i, s in enumerate(srcs)],
                  [("dst", dst)], dst.size * (len(srcs) - 1),
                  {"bytes": n, "src_bytes": src_bytes, "direction": "compute"})
