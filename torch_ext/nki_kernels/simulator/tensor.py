"""``NkiTensor``: the one tensor-view class (NKI's ``ndarray`` / tile).

A tensor is an allocation (memory.py) plus a torch *view* into the allocation's storage.
Indexing and the view methods return new views sharing storage; nothing is copied.
Beta 2 removed arithmetic operators on tiles: they raise ``UnsupportedError``.

Indexing rules (beta-2 docstrings):
* ints (negative allowed), slices with positive steps, ``...``, ``nl.ds(start, size)``;
* on SBUF/PSUM an int on dim 0 keeps a size-1 partition dim; an int on a free dim drops it
  unless the result would fall below 2-D (then the last int-indexed dims stay as size 1);
* on HBM ints drop their dims (a result stays at least 1-D);
* any index outside the tensor raises ``IndexError`` naming index, dim and shape.
"""

from __future__ import annotations

import math
import operator
import sys

import torch

from . import dtypes as _dt
from .context import current
from .errors import NkiValidationError, UnsupportedError
from .memory import Allocation, MemoryRegion, kind_of, to_region


def _no_instructions(dst, value):
    raise RuntimeError("nki_kernels.simulator.isa is not imported: tensor assignment has no "
                       "instructions to lower to")


# `t[...] = value` lowers to an instruction; isa/ (which imports this module) installs it.
_assign = _no_instructions


def install_assignment(fn) -> None:
    """Called once by isa/: ``fn(dst_view, value)`` issues the instruction of ``t[...] = value``."""
    global _assign
    _assign = fn


class DynamicSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    __slots__ = ("start", "size")

    def __init__(self, start, size):
        self.start = operator.index(start)
        self.size = operator.index(size)

    def __repr__(self):
        return f"nl.ds({self.start}, {self.size})"


_NO_ARITH = ("beta-2 NKI removed arithmetic operators on tiles ({op}); use nl.{fn}(x, y) "
             "or the nisa instruction (e.g. nisa.tensor_tensor(dst, x, y, op=nl.{fn}))")


def _no_arith(op, fn):
    def method(self, *args):
        raise UnsupportedError(_NO_ARITH.format(op=op, fn=fn))
    method.__name__ = f"__{fn}__"
    return method


class NkiTensor:
    """A view of an NKI tensor on SBUF, PSUM or HBM."""

    __slots__ = ("_alloc", "_data", "__weakref__")

    def __init__(self, alloc: Allocation, data: torch.Tensor):
        self._alloc = alloc
        self._data = data

    # ------------------------------------------------------------------ attributes
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self):
        return self._alloc.dtype

    @property
    def buffer(self) -> MemoryRegion:
        return self._alloc.region

    @property
    def name(self) -> str:
        return self._alloc.name

    @property
    def ndim(self) -> int:
        return self._data.dim()

    @property
    def size(self) -> int:
        return self._data.numel()

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(self._data.stride())

    @property
    def offset(self) -> int:
        return self._data.storage_offset() - self._alloc.base_offset

    @property
    def itemsize(self) -> int:
        return self._alloc.dtype.itemsize

    @property
    def on_chip(self) -> bool:
        return self._alloc.kind != "hbm"

    def __repr__(self):
        return (f"NkiTensor(shape={self.shape}, dtype={self.dtype.name}, "
                f"buffer={self._alloc.region.value}, name={self.name!r})")

    def __len__(self):
        return self._data.shape[0]

    def __iter__(self):
        raise UnsupportedError("an NKI tensor is not iterable; index it with t[i] or nl.ds")

    def __bool__(self):
        # Beta-2 docstring examples write `assert nl.equal(a, b)`: true iff all elements nonzero.
        return bool((self._data != 0).all())

    def __array__(self, dtype=None, copy=None):
        # (tensor.numpy() needs numpy: only callers converting to numpy get here)
        arr = self._data.detach().clone()
        if self.dtype.is_float:
            arr = arr.to(torch.float32)
        out = arr.numpy()
        return out.astype(dtype) if dtype is not None else out

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, key) -> "NkiTensor":
        shape = self._data.shape
        ndim = len(shape)
        if not isinstance(key, tuple):
            key = (key,)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        n_real = len(key) - n_ell
        if n_real > ndim:
            raise IndexError(f"too many indices ({n_real}) for tensor of shape {tuple(shape)}")
        if n_ell:
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (ndim - n_real) + key[i + 1:]
        on_chip = self._alloc.kind != "hbm"
        tkey = []
        int_dims = []
        for dim, k in enumerate(key):
            n = shape[dim]
            if isinstance(k, slice):
                tkey.append(_check_slice(k, dim, n, tuple(shape)))
            elif isinstance(k, DynamicSlice):
                if k.size <= 0 or k.start < 0 or k.start + k.size > n:
                    raise IndexError(
                        f"index nl.ds({k.start}, {k.size}) is out of bounds for dim {dim} "
                        f"with size {n} (shape {tuple(shape)})")
                tkey.append(slice(k.start, k.start + k.size))
            elif isinstance(k, NkiTensor):
                raise UnsupportedError(
                    "dynamic (tensor-valued) indexing is not supported by the simulator; "
                    "use static ints/slices, nl.ds, or .ap()")
            else:
                try:
                    i = operator.index(k)
                except TypeError:
                    raise IndexError(
                        f"unsupported index {k!r} for dim {dim} (use int, slice, ..., nl.ds)"
                    ) from None
                if i < -n or i >= n:
                    raise IndexError(
                        f"index {i} is out of bounds for dim {dim} with size {n} "
                        f"(shape {tuple(shape)})")
                if i < 0:
                    i += n
                tkey.append(i)
                int_dims.append(dim)
        if int_dims:
            keep = len(key) - len(int_dims) + (ndim - len(key))
            if on_chip:
                need = 2
                # dim 0 of an on-chip tensor is never dropped
                if int_dims[0] == 0:
                    tkey[0] = slice(tkey[0], tkey[0] + 1)
                    int_dims = int_dims[1:]
                    keep += 1
            else:
                need = 1
            for dim in reversed(int_dims):
                if keep >= need:
                    break
                tkey[dim] = slice(tkey[dim], tkey[dim] + 1)
                keep += 1
        return NkiTensor(self._alloc, self._data[tuple(tkey)])

    def __setitem__(self, key, value):
        # `t[idx] = tile` copies (tensor_copy on chip, dma_copy when HBM is involved);
        # `t[idx] = scalar` fills (memset): the instructions isa/ installs.
        _assign(self[key], value)

    # ------------------------------------------------------------------ view methods
    def _view(self, data) -> "NkiTensor":
        return NkiTensor(self._alloc, data)

    def reshape(self, *shape) -> "NkiTensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        n = self._data.numel()
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or n % known:
                raise NkiValidationError(f"reshape: cannot infer -1 in {shape} for {n} elements")
            shape = tuple(n // known if s == -1 else s for s in shape)
        if math.prod(shape) != n:
            raise NkiValidationError(
                f"reshape: shape {shape} has {math.prod(shape)} elements, tensor "
                f"{self.shape} has {n}")
        if self.on_chip:
            if len(shape) < 2:
                raise NkiValidationError(
                    f"reshape: on-chip tensor needs >= 2 dims, got {shape}")
            if shape[0] != self._data.shape[0]:
                raise NkiValidationError(
                    f"reshape: on-chip tensor must keep partition dim {self._data.shape[0]}, "
                    f"got {shape}")
        try:
            return self._view(self._data.view(shape))
        except RuntimeError:
            raise NkiValidationError(
                f"reshape: the layout of this view (shape {self.shape}, strides "
                f"{self.strides}) is incompatible with shape {shape}") from None

    def permute(self, *dims) -> "NkiTensor":
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        dims = tuple(int(d) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise NkiValidationError(f"permute: {dims} is not a permutation of range({self.ndim})")
        if self.on_chip and dims[0] != 0:
            raise NkiValidationError(
                f"permute: on-chip tensor must keep the partition dim first, got dims {dims}")
        return self._view(self._data.permute(dims))

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        dim = self._dim(dim, "broadcast")
        if self._data.shape[dim] != 1:
            raise NkiValidationError(
                f"broadcast: dim {dim} has size {self._data.shape[dim]}, must be 1")
        if self.on_chip and dim == 0:
            raise NkiValidationError("broadcast: cannot broadcast the partition dim of an on-chip tensor")
        shape = list(self._data.shape)
        shape[dim] = int(size)
        return self._view(self._data.expand(shape))

    def broadcast_to(self, shape) -> "NkiTensor":
        shape = tuple(int(s) for s in shape)
        if len(shape) != self.ndim:
            raise NkiValidationError(
                f"broadcast_to: target shape {shape} must have the same rank as {self.shape}")
        for d, (a, b) in enumerate(zip(self.shape, shape)):
            if a != b and a != 1:
                raise NkiValidationError(
                    f"broadcast_to: dim {d} of size {a} cannot broadcast to {b}")
        if self.on_chip and shape[0] != self.shape[0]:
            raise NkiValidationError(
                "broadcast_to: a view cannot broadcast the partition dim; use "
                "nl.broadcast_to(x, shape), which copies across partitions")
        return self._view(self._data.expand(shape))

    def expand_dim(self, dim: int) -> "NkiTensor":
        dim = int(dim)
        if dim < 0:
            dim += self.ndim + 1
        if not 0 <= dim <= self.ndim:
            raise IndexError(f"expand_dim: dim {dim} out of range for shape {self.shape}")
        if self.on_chip and dim == 0:
            raise NkiValidationError("expand_dim: cannot insert before the partition dim")
        return self._view(self._data.unsqueeze(dim))

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        dim = self._dim(dim, "squeeze_dim")
        if self._data.shape[dim] != 1:
            raise NkiValidationError(
                f"squeeze_dim: dim {dim} has size {self._data.shape[dim]}, must be 1")
        if self.on_chip and (dim == 0 or self.ndim <= 2):
            raise NkiValidationError(
                f"squeeze_dim: on-chip tensor {self.shape} must keep its partition dim and 2 dims")
        return self._view(self._data.squeeze(dim))

    def reshape_dim(self, dim: int, shape) -> "NkiTensor":
        dim = self._dim(dim, "reshape_dim")
        shape = tuple(int(s) for s in shape)
        n = self._data.shape[dim]
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(n // known if s == -1 else s for s in shape)
        if math.prod(shape) != n:
            raise NkiValidationError(f"reshape_dim: {shape} does not multiply to dim {dim} size {n}")
        if self.on_chip and dim == 0 and len(shape) != 1:
            raise NkiValidationError("reshape_dim: cannot split the partition dim of an on-chip tensor")
        new = self.shape[:dim] + shape + self.shape[dim + 1:]
        return self._view(self._data.unflatten(dim, shape) if new != self.shape else self._data)

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        s = self._dim(start_dim, "flatten_dims")
        e = self._dim(end_dim, "flatten_dims")
        if self.on_chip and s == 0:
            raise NkiValidationError("flatten_dims: start_dim must be > 0 for an on-chip tensor")
        new = self.shape[:s] + (math.prod(self.shape[s:e + 1]),) + self.shape[e + 1:]
        try:
            return self._view(self._data.view(new))
        except RuntimeError:
            raise NkiValidationError(
                f"flatten_dims: dims {s}..{e} of {self.shape} are not contiguous in memory") from None

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        dim = self._dim(dim, "slice")
        n = self._data.shape[dim]
        if not (0 <= start < end <= n) or step < 1:
            raise IndexError(
                f"slice: [{start}:{end}:{step}] is out of bounds for dim {dim} with size {n} "
                f"(shape {self.shape})")
        key = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self._view(self._data[tuple(key)])

    def select(self, dim: int, index) -> "NkiTensor":
        if isinstance(index, NkiTensor):
            raise UnsupportedError("select: dynamic (tensor-valued) select is not supported by the simulator")
        dim = self._dim(dim, "select")
        n = self._data.shape[dim]
        i = operator.index(index)
        if not 0 <= i < n:
            raise IndexError(f"select: index {i} is out of bounds for dim {dim} with size {n} "
                             f"(shape {self.shape})")
        if self.on_chip and (dim == 0 or self.ndim <= 2):
            raise NkiValidationError(
                f"select: on-chip tensor {self.shape} must keep its partition dim and 2 dims")
        return self._view(self._data.select(dim, i))

    def is_contiguous(self) -> bool:
        d = self._data
        if self.on_chip:
            d = d[0]
        return d.is_contiguous()

    def get_pattern(self) -> list[list[int]]:
        return [[st, s] for st, s in zip(self._data.stride(), self._data.shape)]

    def is_indirect(self) -> bool:
        return False

    def view(self, dtype) -> "NkiTensor":
        dt = _dt.to_nki(dtype)
        if dt == self.dtype:
            return self
        raise UnsupportedError(
            f"view({dt.name}): reinterpreting {self.dtype.name} bits is not supported by the "
            "simulator (values are stored decoded); copy with a cast instead (nisa.tensor_copy)")

    reinterpret_cast = view

    def ap(self, *args, **kwargs):
        raise UnsupportedError("ap(): explicit access patterns are not supported by the simulator")

    def indirect(self, *args, **kwargs):
        raise UnsupportedError("indirect(): tensor indirection (NeuronCore-v4) is not supported by the simulator")

    def rearrange(self, *args, **kwargs):
        raise UnsupportedError("rearrange(): not supported by the simulator; use reshape/permute")

    def _dim(self, dim, what):
        d = int(dim)
        if d < 0:
            d += self.ndim
        if not 0 <= d < self.ndim:
            raise IndexError(f"{what}: dim {dim} out of range for shape {self.shape}")
        return d

    # ------------------------------------------------------------------ no arithmetic (beta 2)
    __add__ = __radd__ = _no_arith("+", "add")
    __sub__ = __rsub__ = _no_arith("-", "subtract")
    __mul__ = __rmul__ = _no_arith("*", "multiply")
    __truediv__ = __rtruediv__ = _no_arith("/", "divide")
    __floordiv__ = __rfloordiv__ = _no_arith("//", "divide")
    __mod__ = __rmod__ = _no_arith("%", "mod")
    __pow__ = __rpow__ = _no_arith("**", "power")
    __matmul__ = __rmatmul__ = _no_arith("@", "matmul")
    __neg__ = _no_arith("unary -", "negative")
    __abs__ = _no_arith("abs()", "abs")
    __lt__ = _no_arith("<", "less")
    __le__ = _no_arith("<=", "less_equal")
    __gt__ = _no_arith(">", "greater")
    __ge__ = _no_arith(">=", "greater_equal")
    __and__ = __rand__ = _no_arith("&", "bitwise_and")
    __or__ = __ror__ = _no_arith("|", "bitwise_or")
    __xor__ = __rxor__ = _no_arith("^", "bitwise_xor")
    __invert__ = _no_arith("~", "invert")
    __lshift__ = _no_arith("<<", "left_shift")
    __rshift__ = _no_arith(">>", "right_shift")


def _check_slice(k: slice, dim: int, n: int, shape) -> slice:
    step = 1 if k.step is None else operator.index(k.step)
    if step < 1:
        raise IndexError(f"slice step {step} on dim {dim} is not supported (steps must be >= 1)")
    start = 0 if k.start is None else operator.index(k.start)
    stop = n if k.stop is None else operator.index(k.stop)
    s0, s1 = start, stop
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    if not (0 <= start < stop <= n):
        raise IndexError(
            f"index [{s0}:{s1}] is out of bounds for dim {dim} with size {n} (shape {shape})")
    return slice(start, stop, step)


# ---------------------------------------------------------------------- construction


def allocate(shape, dtype, buffer, name="", fill=None) -> NkiTensor:
    """A new tensor in the current context (poisoned unless ``fill`` is given)."""
    region = to_region(buffer)
    dt = _dt.to_nki(dtype)
    if isinstance(shape, int):
        shape = (shape,)
    ctx = current()
    if region is MemoryRegion.shared_hbm and ctx.in_kernel and ctx.grid > 1:
        # kernel[2]: core 1's n-th shared_hbm allocation is core 0's n-th one.
        if ctx.program_id == 0:
            alloc = ctx.memory.allocate(shape, dt, region, name, fill)
            ctx.shared_hbm.append(alloc)
        else:
            i = ctx.shared_cursor
            ctx.shared_cursor += 1
            if i >= len(ctx.shared_hbm):
                raise NkiValidationError(
                    f"ndarray: core {ctx.program_id} allocates more shared_hbm tensors than core 0")
            alloc = ctx.shared_hbm[i]
            if alloc.shape != tuple(shape) or alloc.dtype != dt:
                raise NkiValidationError(
                    f"ndarray: core {ctx.program_id}'s shared_hbm tensor #{i} {tuple(shape)} "
                    f"{dt.name} differs from core 0's {alloc.shape} {alloc.dtype.name}")
        return NkiTensor(alloc, alloc.base)
    alloc = ctx.memory.allocate(shape, dt, region, name, fill)
    if alloc.kind != "hbm":
        ctx.recorder.note_allocation(alloc.alloc_id, alloc.kind, _call_site())
    return NkiTensor(alloc, alloc.base)


_SITE_DEPTH = 48  # frames kept: deeper kernel call paths share a site (fewer, larger families)


def _call_site() -> tuple:
    """(filename, line) of every frame from allocate's caller up to the kernel entry (the
    interpreter's run_kernel), innermost first: tiles allocated by one line on one call
    path (e.g. in successive loop iterations) share a site."""
    f = sys._getframe(2)
    site = []
    while f is not None and len(site) < _SITE_DEPTH:
        code = f.f_code
        if code.co_name == "run_kernel" and code.co_filename.endswith("interpreter.py"):
            break
        site.append((code.co_filename, f.f_lineno))
        f = f.f_back
    return tuple(site)


def from_torch(data: torch.Tensor, dtype, buffer, name="", alias=False) -> NkiTensor:
    """An HBM tensor holding ``data`` (converted to ``dtype``'s storage format; with
    ``alias``, a contiguous fp32 ``data`` is used as the storage itself)."""
    region = to_region(buffer)
    dt = _dt.to_nki(dtype)
    if kind_of(region) != "hbm":
        raise NkiValidationError("only HBM tensors can be created from host data")
    if alias and dt.name == "float32" and data.dtype == torch.float32 and data.is_contiguous():
        base = data
    elif dt.is_float:
        base = dt.round(data.to(torch.float32)).clone()
    else:
        base = data.to(torch.int64).clone()
    base = base.contiguous()
    alloc = current().memory.wrap_hbm(base, dt, region, name)
    return NkiTensor(alloc, alloc.base)
