"""Creating ``NkiTensor``s: ``allocate`` (a new SBUF/PSUM/HBM tensor in the current core's
memory, with the allocation site the cost model's finite buffering reads), ``from_torch``
(an HBM tensor holding host data, stored as the dtype's bits) and ``bind_storage`` (the
documented ``nl.NkiTensor(shape, dtype, storage, buffer, name)`` constructor)."""

from __future__ import annotations

import sys

import torch

from . import dtypes as _dt
from .context import current
from .errors import NkiValidationError, UnsupportedError
from .memory import Allocation, MemoryRegion, kind_of, to_region
from .tensor import NkiTensor, UnmaterializedTensor, install_constructor


def allocate(shape, dtype, buffer, name="", fill=None, address=None) -> NkiTensor:
    """A new tensor in the current context (poisoned unless ``fill`` is given; placed at
    ``address`` = (partition, byte offset) if given, see memory.py)."""
    region = to_region(buffer)
    dt = _dt.to_nki(dtype)
    if isinstance(shape, int):
        shape = (shape,)
    ctx = current()
    if region is MemoryRegion.shared_hbm and ctx.in_kernel and ctx.grid > 1:
        # LNC=2: both cores run the same allocations; core A's n-th shared_hbm allocation is
        # core B's n-th one, whichever core reaches it first.
        alloc = ctx.shared_hbm_tensor(shape, dt, region, name, fill)
        return NkiTensor.of_view(alloc, alloc.base)
    alloc = ctx.memory.allocate(shape, dt, region, name, fill, address)
    if alloc.kind != "hbm":
        ctx.recorder.note_allocation(alloc.alloc_id, alloc.kind, _call_site(),
                                     ctx.program_id if ctx.grid > 1 else None, alloc.life.placed,
                                     alloc.life.nbytes)
    return NkiTensor.of_view(alloc, alloc.base)


# the interpreter's frames that call the kernel: run_kernel (LNC=1) and each core's thread
# body of an LNC=2 launch (_run_cores.body)
_KERNEL_ENTRIES = ("run_kernel", "body")
_SITE_DEPTH = 48  # frames kept: deeper kernel call paths share a site (fewer, larger families)


def _call_site() -> tuple:
    """(filename, line) of every frame from allocate's caller up to the kernel entry (the
    interpreter's run_kernel or core thread), innermost first: tiles allocated by one line on one call
    path (e.g. in successive loop iterations) share a site."""
    f = sys._getframe(2)
    site = []
    while f is not None and len(site) < _SITE_DEPTH:
        code = f.f_code
        if code.co_name in _KERNEL_ENTRIES and code.co_filename.endswith("interpreter.py"):
            break
        site.append((code.co_filename, f.f_lineno))
        f = f.f_back
    return tuple(site)


def from_torch(data: torch.Tensor, dtype, buffer, name="", alias=False) -> NkiTensor:
    """An HBM tensor holding ``data``'s values in ``dtype`` (its bits: dtypes.py; with
    ``alias``, a contiguous fp32 ``data`` is used as the storage itself)."""
    region = to_region(buffer)
    dt = _dt.to_nki(dtype)
    if kind_of(region) != "hbm":
        raise NkiValidationError("only HBM tensors can be created from host data")
    if alias and dt.name == "float32" and data.dtype == torch.float32 and data.is_contiguous():
        base = data
    elif data.dtype == dt.storage:
        base = data.clone()  # already this dtype's bits (e.g. bf16 from torch): bit-exact
    elif dt.is_packed:
        raise NkiValidationError(
            f"{name or 'input'}: host data cannot be converted to packed {dt.name}; pass its "
            "bits (e.g. uint8) and view them in the kernel (t.view(nl." + dt.name + "))")
    else:
        base = dt.to_bits(data.to(torch.float32) if dt.is_float else data.to(torch.int64))
    base = base.contiguous()
    alloc = current().memory.wrap_hbm(base, dt, region, name)
    return NkiTensor.of_view(alloc, alloc.base)


def bind_storage(shape, dtype, storage, buffer=MemoryRegion.sbuf, name="") -> NkiTensor:
    """``nl.NkiTensor(shape, dtype, storage, buffer=nl.sbuf, name='')``: a tensor "bound to an
    existing storage handle" (NKI 0.7 ``nki.language.NkiTensor.__init__``; aws-neuron-sdk
    81ce03ae ``nki/api/nki/language/__init__.py``). The handle is backend-specific; in this
    simulator it is

    * ``None``: "the tensor is used as a signature placeholder and never materialized" (the
      docstring): an ``UnmaterializedTensor``, refused by every instruction and view;
    * a host torch tensor (or numpy array) of an HBM tensor's bits, the "test fixture" case:
      the tensor aliases it (kernel writes land in it), so its torch dtype must be the NKI
      dtype's storage dtype (bfloat16 for nl.bfloat16, uint8 for fp8, ...), its shape
      ``shape``, and it must be contiguous; nothing is converted.

    The simulator has no on-chip storage handle a kernel can hold, so an SBUF/PSUM tensor
    with a storage is refused (allocate it with ``nl.ndarray``)."""
    if isinstance(shape, int) or not isinstance(shape, (tuple, list)) or not shape or any(
            isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in shape):
        raise NkiValidationError(f"NkiTensor: shape must be a tuple of positive integers, got {shape!r}")
    shape = tuple(shape)
    dt = _dt.to_nki(dtype)
    region = to_region(buffer)
    label = name or "NkiTensor"
    if storage is None:
        base = torch.empty(shape, dtype=dt.storage, device="meta")
        alloc = Allocation(region, dt, name, base, core=current().memory.core)
        t = UnmaterializedTensor()
        t._alloc, t._dtype, t._shape = alloc, None, list(shape)
        t._what = f"{label} {shape} {dt.name} in {region.value}"
        return t
    if kind_of(region) != "hbm":
        raise UnsupportedError(
            f"NkiTensor: storage for buffer={region.value}: the simulator has no on-chip storage "
            "handle a kernel can hold; allocate SBUF/PSUM tensors with nl.ndarray")
    if not isinstance(storage, torch.Tensor):
        if not hasattr(storage, "__array_interface__"):
            raise UnsupportedError(
                f"NkiTensor: storage must be None (a signature placeholder) or a host torch "
                f"tensor / numpy array of the tensor's bits, got {type(storage).__name__}")
        storage = torch.from_numpy(storage)   # shares the array's memory
    if tuple(storage.shape) != shape:
        raise NkiValidationError(f"NkiTensor: storage has shape {tuple(storage.shape)}, "
                                 f"the tensor's shape is {shape}")
    if storage.dtype != dt.storage:
        raise NkiValidationError(
            f"NkiTensor: storage of dtype {storage.dtype} cannot hold {dt.name} without a "
            f"conversion; pass the bits as {dt.storage} (the binding aliases, it never converts)")
    if storage.device.type != "cpu" or not storage.is_contiguous():
        raise NkiValidationError(f"NkiTensor: storage must be a contiguous CPU tensor "
                                 f"(device {storage.device}, contiguous {storage.is_contiguous()})")
    alloc = current().memory.wrap_hbm(storage, dt, region, name)
    return NkiTensor.of_view(alloc, alloc.base)


install_constructor(bind_storage)
