"""``nki.language`` allocation: ``ndarray``, the filled and random constructors, and the
HBM constants (``shared_constant``, ``shared_identity_matrix``).

Every value a helper puts in memory is written by the ``nisa`` instruction that would write
it on hardware: ``memset`` fills on-chip tiles; HBM tensors are filled by staging the values
in an SBUF tile and moving them with ``dma_copy`` (engines never write HBM); ``rand`` draws
bits with ``nisa.rng`` and scales them with ``tensor_scalar``. Only ``shared_constant`` (and
the identity matrix it stands behind) holds host data, loaded with the kernel as the
compiler embeds constants, with no instruction.
"""

from __future__ import annotations

import operator

import torch

from .. import dtypes as _dt
from .. import isa as _isa
from .. import ops as _ops
from ..context import current
from ..host import numpy_to_torch
from ..tensor import NkiTensor
from ..tensor_alloc import allocate, from_torch
from .common import as_shape
from .constants import sbuf, shared_hbm, uint8, uint16

# Staging tile for HBM fills: at most this many elements per partition (8 KiB of fp32), so a
# fill of any HBM size stays far inside SBUF while each DMA still moves >= 2 KiB per
# partition, the size the DMA guide recommends for efficient transfers.
_STAGING_COLS = 2048
# nl.rand: 16 random bits per element (nisa.rng truncates its 32 bits to dst's dtype), scaled
# by 2^-16 into [0, 1): the normalisation the nisa.rng docstring describes for uint16 bits,
# kept below 1.0 as numpy/torch's uniform generators do.
_RAND_BITS_DTYPE = uint16
_RAND_SCALE = 2.0 ** -16


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """A new, uninitialised tensor (poisoned: NaN / 4 by default) of ``shape`` on ``buffer``;
    ``address=(partition_offset, byte_offset)`` places it explicitly (memory.py)."""
    return allocate(as_shape(shape), dtype, buffer, name, address=address)


def _hbm_blocks(t: NkiTensor) -> list[NkiTensor]:
    """A fresh (contiguous) HBM tensor as [rows, cols] views covering its elements in order:
    full-partition row blocks of at most _STAGING_COLS columns, then one row for the rest."""
    parts = current().target.partitions
    n = t.size
    flat = t.reshape((n,))
    body, tail = divmod(n, parts)
    blocks = []
    if body:
        rows = flat[0:parts * body].reshape((parts, body))
        for c in range(0, body, _STAGING_COLS):
            blocks.append(rows[:, c:min(body, c + _STAGING_COLS)])
    if tail:
        blocks.append(flat[parts * body:n].reshape((1, tail)))
    return blocks


def _staging_shape(blocks) -> tuple[int, int]:
    return max(b.shape[0] for b in blocks), max(b.shape[1] for b in blocks)


def _filled(shape, value, dtype, buffer, name):
    t = allocate(as_shape(shape), dtype, buffer, name)
    if t.on_chip:
        # a 1-D tile (one element per partition) is set through its [P, 1] view
        _isa.memset(t if len(t.shape) > 1 else t.reshape((t.shape[0], 1)), value)
        return t
    # HBM: one memset of an SBUF staging tile, then one dma_copy per block
    blocks = _hbm_blocks(t)
    stage = allocate(_staging_shape(blocks), t.dtype, sbuf, f"{name or 'fill'}_staging")
    _isa.memset(stage, value)
    for b in blocks:
        _isa.dma_copy(b, stage[:b.shape[0], :b.shape[1]])
    return t


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _filled(shape, fill_value, dtype, buffer, name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, sbuf if buffer is None else buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, x.buffer if buffer is None else buffer, name)


def _uniform(dst: NkiTensor) -> None:
    """dst (on chip) = uniform [0, 1) values: nisa.rng bits, scaled by tensor_scalar."""
    bits = allocate(dst.shape, _RAND_BITS_DTYPE, sbuf, "rand_bits")
    _isa.rng(bits)
    _isa.tensor_scalar(dst, bits, _ops.multiply, _RAND_SCALE)


def rand(shape, dtype, buffer=sbuf, name=""):
    """Uniform [0, 1) values in steps of 2^-16, from the run's generator (see
    nl.random_seed): nisa.rng + tensor_scalar per tile; HBM through SBUF staging + dma_copy."""
    t = allocate(as_shape(shape), dtype, buffer, name)
    if t.on_chip:
        _uniform(t)
        return t
    for b in _hbm_blocks(t):
        stage = allocate(b.shape, t.dtype, sbuf, f"{name or 'rand'}_staging")
        _uniform(stage)
        _isa.dma_copy(b, stage)
    return t


def random_seed(seed):
    _isa.set_rng_seed(seed)


def shared_constant(constant):
    """A shared_hbm tensor holding ``constant`` (numpy array, torch tensor or .npy path),
    loaded with the kernel (no instruction), as the compiler embeds constants."""
    if isinstance(constant, str):
        import numpy as np  # lazy

        constant = np.load(constant)
    if isinstance(constant, torch.Tensor):
        data = constant.detach().cpu()
        dt = _dt.to_nki(data.dtype)
    else:
        dt = _dt.to_nki(constant.dtype)
        data = numpy_to_torch(constant)
    return from_torch(data, dt, shared_hbm, "shared_constant")


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An n x n identity matrix in SBUF: a shared constant (as ``shared_constant``) loaded
    with one dma_copy into ``dst`` or a new SBUF tile."""
    n = operator.index(n)
    const = from_torch(torch.eye(n, dtype=torch.float32), dtype, shared_hbm, "identity_constant")
    out = dst if dst is not None else allocate((n, n), dtype, sbuf, "identity")
    _isa.dma_copy(out, const)
    return out
