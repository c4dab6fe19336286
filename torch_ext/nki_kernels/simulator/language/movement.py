"""``nki.language`` data movement: ``load``, ``store``, ``load_transpose2d``,
``broadcast_to``, ``expand_dims`` and ``gather_flattened``; each is the DMA (or GpSimd
gather) instruction it stands for."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import isa as _isa
from ..context import current
from ..errors import NkiValidationError
from ..tensor import NkiTensor
from ..tensor_alloc import allocate
from .common import as_shape, check_tile, new_tile
from .constants import sbuf, uint32


def load(src, dtype=None):
    """HBM -> new SBUF tile (one dma_copy; a dtype cast happens in the DMA)."""
    if not isinstance(src, NkiTensor) or src.on_chip:
        raise NkiValidationError(
            f"load: src must be an HBM tensor, got {src!r}; on-chip tiles are copied with nl.copy")
    shape = src.shape
    if len(shape) < 2:
        raise NkiValidationError(
            f"load: src shape {shape} would make a {len(shape)}-D SBUF tile, which no engine "
            "instruction takes (tiles are [partition, free...]): index or reshape the HBM tensor first")
    parts = current().target.partitions
    if shape[0] > parts:
        raise NkiValidationError(f"load: src partition dim {shape[0]} exceeds maximum {parts}")
    out = allocate(shape, dtype or src.dtype, sbuf, "load")
    _isa.dma_copy(out, src)
    return out


def store(dst, value):
    """SBUF tile -> HBM (one dma_copy)."""
    if not isinstance(dst, NkiTensor) or dst.on_chip:
        raise NkiValidationError(f"store: dst must be an HBM tensor, got {dst!r}")
    if not isinstance(value, NkiTensor):
        raise NkiValidationError(f"store: value must be an SBUF tile, got {type(value).__name__}")
    _isa.dma_copy(dst, value)


def load_transpose2d(src, dtype=None):
    """HBM [A, B] -> new SBUF tile [B, A] (one DMA transpose; a tensor_copy for a dtype)."""
    if not isinstance(src, NkiTensor) or src.on_chip or src.ndim != 2:
        raise NkiValidationError(f"load_transpose2d: src must be a 2-D HBM tensor, got {src!r}")
    a, b = src.shape
    parts = current().target.partitions
    if b > parts:
        raise NkiValidationError(
            f"load_transpose2d: transposed partition dim {b} exceeds maximum {parts}")
    out = allocate((b, a), src.dtype, sbuf, "load_transpose2d")
    _isa.dma_transpose(out, src)
    if dtype is not None and _dt.to_nki(dtype) != src.dtype:
        cast = allocate((b, a), dtype, sbuf, "load_transpose2d")
        _isa.tensor_copy(cast, out)
        return cast
    return out


def expand_dims(x, axis):
    return x.expand_dim(axis)


def broadcast_to(x, shape, dtype=None):
    """x broadcast to ``shape`` (same rank). Free axes broadcast as a view (a tensor_copy for
    a dtype); a size-1 partition dim is replicated into a new SBUF tile by one dma_copy
    whose source pattern repeats the partition (stride 0)."""
    check_tile("broadcast_to", x)
    shape = as_shape(shape)
    if len(shape) != x.ndim:
        raise NkiValidationError(f"broadcast_to: target {shape} must have the rank of {x.shape}")
    for d, (a, b) in enumerate(zip(x.shape, shape)):
        if a != b and a != 1:
            raise NkiValidationError(f"broadcast_to: dim {d} of size {a} cannot broadcast to {b}")
    dt = _dt.to_nki(dtype) if dtype is not None else x.dtype
    if shape[0] == x.shape[0]:
        v = x.broadcast_to(shape) if shape != x.shape else x
        if dt == x.dtype:
            return v
        out = new_tile(shape, dt, "broadcast_to")
        _isa.tensor_copy(out, v)
        return out
    parts = current().target.partitions
    if shape[0] > parts:
        raise NkiValidationError(f"broadcast_to: partition dim {shape[0]} exceeds maximum {parts}")
    out = new_tile(shape, dt, "broadcast_to")
    if x._alloc.kind == "psum":
        # "x: the source tile in SBUF or PSUM" (nl.broadcast_to): the DMA engines never read
        # PSUM, so a PSUM source is first copied to SBUF
        staged = new_tile(tuple(x.shape), x.dtype, "broadcast_to")
        _isa.tensor_copy(staged, x)
        x = staged
    # A DMA access pattern may repeat a partition (stride 0); an engine operand may not, so
    # this source view exists only for the dma_copy.
    _isa.dma_copy(out, NkiTensor.of_view(x._alloc, x._data.expand(shape), x._dtype))
    return out


def gather_flattened(data, indices, axis=0, dtype=None):
    """Per-partition gather from the flattened free axes of ``data``: nisa.nc_n_gather
    (GpSimd, SBUF only, uint32 indices; other integer indices get a tensor_copy to uint32
    first, and a ``dtype`` other than data's a tensor_copy after)."""
    check_tile("gather_flattened", data, "data")
    check_tile("gather_flattened", indices, "indices")
    if not indices.dtype.is_int:
        raise NkiValidationError(
            f"nl.gather_flattened: indices must be an integer tile (nisa.nc_n_gather takes "
            f"uint32), got {indices.dtype.name}")
    if indices.dtype != uint32:
        idx = new_tile(indices.shape, uint32, "gather_indices")
        _isa.tensor_copy(idx, indices)
        indices = idx
    out = new_tile(indices.shape, data.dtype, "gather_flattened")
    _isa.nc_n_gather(out, data, indices)
    if dtype is not None and _dt.to_nki(dtype) != data.dtype:
        cast = new_tile(indices.shape, dtype, "gather_flattened")
        _isa.tensor_copy(cast, out)
        return cast
    return out
