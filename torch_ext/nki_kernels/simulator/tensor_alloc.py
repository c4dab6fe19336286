"""Creating ``NkiTensor``s: ``allocate`` (a new SBUF/PSUM/HBM tensor in the current core's
memory, with the allocation site the cost model's finite buffering reads), ``from_torch``
(an HBM tensor holding host data, stored as the dtype's bits) and ``bind_storage`` (the
documented ``nl.NkiTensor(shape, dtype, storage, buffer, name)`` constructor)."""

from __future__ import annotations

import numbers
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
      docstring): an ``UnmaterializedTensor`` with the shape rules of ``nl.ndarray``,
      refused by every instruction and view;
    * a writable host torch tensor (or numpy array) of an HBM tensor's bits, the "test
      fixture" case: the tensor aliases it (kernel writes land in it), so its torch dtype
      must be the NKI dtype's storage dtype (bfloat16 for nl.bfloat16, uint8 for fp8 codes,
      ...), its shape ``shape``, and it must be contiguous; nothing is converted. A host
      storage bound more than once in a launch (e.g. by both cores of an LNC=2 launch) is
      one tensor, so the race check sees both cores' accesses to it.

    The simulator has no on-chip storage handle a kernel can hold, so an SBUF/PSUM tensor
    with a storage is refused (allocate it with ``nl.ndarray``)."""
    if not isinstance(shape, (tuple, list)) or not shape or any(
            isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in shape):
        raise NkiValidationError(f"NkiTensor: shape must be a tuple of positive integers, got {shape!r}")
    dt = _dt.to_nki(dtype)
    region = to_region(buffer)
    name = name or ""
    ctx = current()
    shape = ctx.memory.check_shape(shape, dt, region, name, what="NkiTensor")
    if storage is None:
        base = torch.empty(shape, dtype=dt.storage, device="meta")
        return UnmaterializedTensor.of(Allocation(region, dt, name, base, core=ctx.memory.core), shape,
                                       f"{name or 'NkiTensor'} {shape} {dt.name} in {region.value}")
    if kind_of(region) != "hbm":
        raise UnsupportedError(
            f"NkiTensor: storage for buffer={region.value}: the simulator has no on-chip storage "
            "handle a kernel can hold; allocate SBUF/PSUM tensors with nl.ndarray")
    storage = _host_bits(storage, dt, shape)
    run = ctx.run
    key = (storage.data_ptr(), shape, dt.name, region)
    alloc = run.bound.get(key) if run is not None else None
    if alloc is None:
        alloc = ctx.memory.wrap_hbm(storage, dt, region, name)
        if run is not None:
            run.bound[key] = alloc
    return NkiTensor.of_view(alloc, alloc.base)


def _host_bits(storage, dt, shape) -> torch.Tensor:
    """``storage`` as a torch tensor sharing its memory, checked to hold ``shape`` elements of
    ``dt``'s bits that a kernel may read and write in place."""
    if not isinstance(storage, torch.Tensor):
        if getattr(storage, "ndim", 0) < 1 or not hasattr(storage, "flags") or not hasattr(storage, "dtype"):
            raise UnsupportedError(
                f"NkiTensor: storage must be None (a signature placeholder) or a host torch "
                f"tensor / numpy array of the tensor's bits, got {type(storage).__name__}")
        if not storage.flags.writeable:
            raise NkiValidationError("NkiTensor: the numpy storage is read-only; the kernel may write "
                                     "the tensor in place, so bind a writable array")
        if not storage.flags.c_contiguous:
            raise NkiValidationError("NkiTensor: the numpy storage is not C-contiguous (strides "
                                     f"{storage.strides}); bind a contiguous array")
        if not storage.dtype.isnative:
            raise NkiValidationError(f"NkiTensor: the numpy storage's dtype {storage.dtype} is not in "
                                     "this machine's byte order")
        try:
            storage = torch.from_numpy(storage)   # shares the array's memory
        except TypeError as err:
            raise NkiValidationError(
                f"NkiTensor: numpy dtype {storage.dtype} has no torch counterpart to alias ({err}); "
                f"bind a torch tensor of dtype {dt.storage}, e.g. torch.from_numpy(a.view(<an "
                f"unsigned integer of the same size>)).view({dt.storage})") from None
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
    if storage.is_inference():
        raise NkiValidationError("NkiTensor: the storage was made in torch.inference_mode and cannot "
                                 "be written in place outside it; bind a normal tensor")
    bad = _dt.invalid_bits(dt, storage)
    if bad:
        raise NkiValidationError(f"NkiTensor: the storage holds {bad}")
    return storage.detach()   # the same memory; a kernel's in-place writes bypass autograd


install_constructor(bind_storage)
