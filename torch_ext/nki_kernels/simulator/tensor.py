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

import inspect
import math
import operator

import torch

from . import dtypes as _dt
from .context import current
from .errors import NkiValidationError, UnsupportedError
from .memory import Allocation, MemoryRegion
from .tensor_views import ShapeViews


def _no_instructions(dst, value):
    raise RuntimeError("nki_kernels.simulator.isa is not imported: tensor assignment has no "
                       "instructions to lower to")


# `t[...] = value` lowers to an instruction; isa/ (which imports this module) installs it.
_assign = _no_instructions


def install_assignment(fn) -> None:
    """Called once by isa/: ``fn(dst_view, value)`` issues the instruction of ``t[...] = value``."""
    global _assign
    _assign = fn


def _no_constructor(*args, **kwargs):
    raise RuntimeError("nki_kernels.simulator.tensor_alloc is not imported: nl.NkiTensor(shape, "
                       "dtype, storage) has no constructor to call")


# nl.NkiTensor(shape, dtype, storage, ...) builds through tensor_alloc.bind_storage, which
# installs itself (tensor_alloc imports this module).
_construct = _no_constructor


def install_constructor(fn) -> None:
    """Called once by tensor_alloc: ``fn(*args, **kwargs)`` is ``nl.NkiTensor(...)``."""
    global _construct
    _construct = fn
    NkiTensor.__signature__ = inspect.signature(fn)   # help(nl.NkiTensor) shows the documented form


_NO_ARITH = ("beta-2 NKI removed arithmetic operators on tiles ({op}); use nl.{fn}(x, y) "
             "or the nisa instruction (e.g. nisa.tensor_tensor(dst, x, y, op=nl.{fn}))")


def _no_arith(op, fn):
    def method(self, *args):
        raise UnsupportedError(_NO_ARITH.format(op=op, fn=fn))
    method.__name__ = f"__{fn}__"
    return method


class NkiTensor(ShapeViews):
    """A view of an NKI tensor on SBUF, PSUM or HBM.

    ``_data`` is a torch view of the tensor's bits (the ``storage`` dtype of ``dtype``) in
    its allocation; ``_dtype`` is set on a reinterpreting view (``view(dtype)``,
    ``ap(dtype=)``) whose dtype differs from the allocation's."""

    __slots__ = ("_alloc", "_data", "_dtype", "__weakref__")

    def __new__(cls, *args, **kwargs):
        if cls is not NkiTensor or not (args or kwargs):
            # the simulator's own view classes build themselves; copy and pickle call
            # NkiTensor.__new__(NkiTensor) and then set the slots
            return object.__new__(cls)
        # nl.NkiTensor(shape, dtype, storage, buffer=nl.sbuf, name=''): the documented
        # constructor (tensor_alloc.bind_storage)
        return _construct(*args, **kwargs)

    def __init__(self, *args, **kwargs):
        pass   # __new__ built the tensor

    @classmethod
    def of_view(cls, alloc: Allocation, data: torch.Tensor, dtype=None) -> "NkiTensor":
        """The view ``data`` (a torch view of the allocation's bits) of ``alloc``, read as
        ``dtype`` where that differs from the allocation's (the simulator's own constructor)."""
        t = object.__new__(NkiTensor)
        t._alloc = alloc
        t._data = data
        t._dtype = dtype
        return t

    # ------------------------------------------------------------------ attributes
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self):
        return self._dtype or self._alloc.dtype

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
        """Element strides of the view in its tensor's storage (on chip, the partition
        stride is the tensor's free size, wherever the tensor is placed)."""
        st = tuple(self._data.stride())
        if self._alloc.kind != "hbm" and st:
            return (self._free_size(),) + st[1:]
        return st

    @property
    def offset(self) -> int:
        """Element offset of the view's first element from the tensor's first element (in
        elements of this view's dtype; on chip, partitions count the tensor's free size)."""
        d = self._data
        a = self._alloc
        nbytes = d.storage_offset() * d.element_size() - a.base_byte_offset
        if a.kind != "hbm":
            p = nbytes // a.part_stride
            return p * self._free_size() + (nbytes - p * a.part_stride) // self.dtype.itemsize
        return nbytes // self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def address(self):
        """The (partition_offset, byte_offset) an explicitly placed tensor was allocated at
        (None: placed by the compiler)."""
        return self._alloc.address

    def values(self) -> torch.Tensor:
        """The view's values, decoded: float32 for float dtypes, int64 for integers."""
        return self.dtype.from_bits(self._data)

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
        return bool((self.values() != 0).all())

    def __array__(self, dtype=None, copy=None):
        # (tensor.numpy() needs numpy: only callers converting to numpy get here)
        out = self.values().detach().clone().numpy()
        return out.astype(dtype) if dtype is not None else out

    def __setitem__(self, key, value):
        # `t[idx] = tile` copies (tensor_copy on chip, dma_copy when HBM is involved);
        # `t[idx] = scalar` fills (memset): the instructions isa/ installs.
        _assign(self[key], value)

    # ------------------------------------------------------------------ view methods
    def _view(self, data) -> "NkiTensor":
        return NkiTensor.of_view(self._alloc, data, self._dtype)

    def select(self, dim: int, index) -> "NkiTensor":
        """Select one index of ``dim`` (removing it); a tensor or register ``index`` selects
        at run time (an indirect view, docs: "Dynamic on-chip: dim must not be 0")."""
        dim = self._dim(dim, "select")
        if _is_dynamic(index):
            if self.on_chip and dim == 0:
                raise NkiValidationError("select: a dynamic select of an on-chip tensor cannot "
                                         "select the partition dim (dim 0)")
            pattern = [[st, n] for i, (st, n) in enumerate(zip(self.strides, self.shape)) if i != dim]
            return _indirect_view(self, pattern, self.offset, scalar=index,
                                  scalar_stride=self.strides[dim], dtype=self.dtype,
                                  what=f"select(dim={dim})", extent=self.shape[dim])
        n = self._data.shape[dim]
        i = operator.index(index)
        if not 0 <= i < n:
            raise IndexError(f"select: index {i} is out of bounds for dim {dim} with size {n} "
                             f"(shape {self.shape})")
        if self.on_chip and dim == 0:
            raise NkiValidationError(
                f"select: on-chip tensor {self.shape} must keep its partition dim (dim 0)")
        if self.on_chip and self.ndim <= 2:
            # "equivalent to t[:, index, :] when dim=1"; an on-chip view is "always at least
            # 2D", so, as indexing does, the selected dim stays with size 1
            return self._view(self._data.narrow(dim, i, 1))
        return self._view(self._data.select(dim, i))

    def vector_select(self, dim: int, vector_offset) -> "NkiTensor":
        """Per-partition gather: partition w of the result is ``self[vector_offset[w]]``
        (docs: dim must be 0, HBM tensors only; the result has vector_offset.shape[0]
        partitions)."""
        if int(dim) != 0:
            raise NkiValidationError(f"vector_select: dim must be 0, got {dim}")
        if self.on_chip:
            raise NkiValidationError("vector_select: only HBM tensors can be gathered by a "
                                     f"vector of offsets; this tensor is in {self.buffer.value}")
        vo = _offset_tensor("vector_select", "vector_offset", vector_offset)
        pattern = [[self.strides[0], vo.shape[0]]] + [[st, n] for st, n in
                                                     zip(self.strides[1:], self.shape[1:])]
        return _indirect_view(self, pattern, self.offset, vector=vo,
                              vector_stride=self.strides[0], dtype=self.dtype,
                              what="vector_select", extent=self.shape[0])

    def is_contiguous(self) -> bool:
        d = self._data
        if self.on_chip:
            d = d[0]
        return d.is_contiguous()

    def get_pattern(self) -> list[list[int]]:
        return [[st, s] for st, s in zip(self.strides, self.shape)]

    def is_indirect(self) -> bool:
        return False

    # ------------------------------------------------------------------ storage layout
    def _free_size(self, dtype=None) -> int:
        """Elements (of ``dtype``, default this view's) of one partition of the tensor's
        storage: the partition stride of an access pattern on it."""
        a = self._alloc
        return math.prod(a.shape[1:]) * a.dtype.itemsize // (dtype or self.dtype).itemsize

    def _start_partition(self) -> int:
        a = self._alloc
        d = self._data
        return (d.storage_offset() * d.element_size() - a.base_byte_offset) // a.part_stride

    def _root(self, dtype) -> torch.Tensor:
        """The whole tensor's bits as ``dtype``: [partitions, free] on chip, flat on HBM."""
        a = self._alloc
        base = a.base
        if dtype.storage != base.dtype:
            if base.dim() == 0 or (base.shape[-1] > 1 and base.stride(-1) != 1):
                raise NkiValidationError(f"cannot reinterpret {a.dtype.name} storage as "
                                         f"{dtype.name}: its last dimension is not contiguous")
            if (base.shape[-1] * base.element_size()) % dtype.itemsize:
                raise NkiValidationError(
                    f"cannot reinterpret {a.dtype.name} storage of shape {a.shape} as "
                    f"{dtype.name}: {base.shape[-1] * base.element_size()} bytes in the last "
                    f"dimension are not a multiple of {dtype.itemsize}")
            base = base.view(dtype.storage)
        if self.on_chip:
            return base.reshape(base.shape[0], -1)
        return base.reshape(-1)

    # ------------------------------------------------------------------ reinterpretation
    def view(self, dtype) -> "NkiTensor":
        """Reinterpret the view's bits as ``dtype``; the last dimension scales by the ratio
        of the element sizes (docs: "The last dimension must be contiguous in memory";
        "For contraction (larger dtype): last-dim size must be divisible by the ratio")."""
        dt = _dt.to_nki(dtype)
        if dt == self.dtype:
            return self
        d = self._data
        old = self.dtype.itemsize
        if d.dim() == 0 or (d.shape[-1] > 1 and d.stride(-1) != 1):
            raise NkiValidationError(f"view({dt.name}): the last dimension of {self.shape} "
                                     f"(strides {self.strides}) must be contiguous")
        if (d.shape[-1] * old) % dt.itemsize:
            raise NkiValidationError(
                f"view({dt.name}): last dimension {d.shape[-1]} of {self.dtype.name} is "
                f"{d.shape[-1] * old} bytes, not a multiple of {dt.itemsize}")
        if d.shape[-1] == 1 and d.dim() > 0 and d.stride(-1) != 1:
            d = torch.as_strided(d, d.shape, d.stride()[:-1] + (1,), d.storage_offset())
        try:
            data = d.view(dt.storage) if dt.storage != d.dtype else d
        except RuntimeError as err:
            raise NkiValidationError(
                f"view({dt.name}): the layout of {self.shape} {self.dtype.name} (strides "
                f"{self.strides}, offset {self.offset}) cannot be reinterpreted: {err}") from None
        return NkiTensor.of_view(self._alloc, data, None if dt == self._alloc.dtype else dt)

    reinterpret_cast = view

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0,
           dtype=None) -> "NkiTensor":
        """Explicit access pattern over the tensor's storage (NKI Access Patterns deep dive;
        ``NkiTensor.ap`` docstring): element [i0, i1, ...] of the result is storage element
        ``offset + sum(step_k * i_k)`` of the tensor flattened, in elements of ``dtype``.

        * ``offset=None`` inherits this view's offset; an integer is ADDED to it (the API
          docstring: "offset=0 keeps the base, offset=N shifts by N additional elements";
          nki-library's TensorView relies on that for views with an offset; the language
          guide's "Pass an explicit integer to override" disagrees).
        * on SBUF/PSUM the first [step, num] pair is the partition axis: it walks ``num``
          consecutive physical partitions ("the access on the partition dimension must be
          contiguous"). Its step may not exceed the tensor's free size (the deep dive's
          illegal example, a step of twice the free size, would skip partitions); a SMALLER
          step still walks consecutive partitions: nki-library's TensorView gives a column
          slice of a [T, 2I] tile the slice's width I as its partition step
          (mlp_tkg_gate_up_projection.py, bias at LNC=2), and AWS's CI ran those vectors on
          trn2 (test_mlp_tkg.py:240-243, with QoR figures), so the compiler accepts it.
        * ``scalar_offset`` ((1, 1) SBUF tensor or register) adds value *
          self.strides[indirect_dim] ("indirect_dim: dimension in self.shape whose stride
          scales the indirect scalar/vector offset", NkiTensor.ap; the deep dive: the scale
          "is read from the shape of the base tensor, not from the access pattern", so a
          column slice of a [512, 512] tensor still steps 512 per row); ``vector_offset``
          ((P, 1) SBUF tensor) gives partition w the offset vector_offset[w] *
          self.strides[0], indirect_dim 0 only ("Currently, only indirect_dim=0 is
          supported"). Both are read when the
          instruction runs; an access outside the tensor raises IndexError then (dma_copy
          with oob_mode=skip skips it).
        * an access outside the tensor is an IndexError when an instruction uses the view,
          not when it is built (AWS kernels build patterns they guard later).
        """
        dt = self.dtype if dtype is None else _dt.to_nki(dtype)
        pat = _check_pattern(pattern)
        if scalar_offset is not None and vector_offset is not None:
            raise NkiValidationError("ap: scalar_offset and vector_offset are mutually exclusive")
        base_off = self.offset * self.dtype.itemsize // dt.itemsize
        start = base_off + (0 if offset is None else operator.index(offset))
        if self.on_chip:
            free = self._free_size(dt)
            if pat and pat[0][1] > 1 and not 0 < pat[0][0] <= free and vector_offset is None:
                raise NkiValidationError(
                    f"ap: the partition step {pat[0][0]} of pattern {pat} must be between 1 and "
                    f"the free size {free} of the {self.buffer.value} tensor (in {dt.name} "
                    "elements): the access walks consecutive partitions")
        ind = operator.index(indirect_dim)
        if scalar_offset is not None or vector_offset is not None:
            if not 0 <= ind < max(1, self.ndim):
                raise NkiValidationError(f"ap: indirect_dim {ind} out of range for {self.shape}")
            ratio = self.dtype.itemsize / dt.itemsize
            stride = int((self.strides[ind] if self.ndim else 1) * ratio)
            if vector_offset is not None:
                if ind != 0:
                    raise NkiValidationError(
                        f"ap: vector_offset supports indirect_dim=0 only, got {ind}")
                if self.on_chip:
                    raise NkiValidationError("ap: vector_offset indexes an HBM tensor; this "
                                             f"tensor is in {self.buffer.value}")
                vo = _offset_tensor("ap", "vector_offset", vector_offset, columns=True)
                return _indirect_view(self, pat, start, vector=vo, vector_stride=stride,
                                      dtype=dt, what="ap(vector_offset=...)",
                                      extent=self.shape[0])
            return _indirect_view(self, pat, start, scalar=scalar_offset, scalar_stride=stride,
                                  dtype=dt, what="ap(scalar_offset=...)",
                                  extent=self.shape[ind] if self.ndim else 1)
        return _static_view(self, pat, start, dt)

    def indirect(self, index, num_elem=None):
        raise UnsupportedError("indirect(): tensor indirection (NeuronCore-v4) is not supported "
                               "by the simulator")

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


# ---------------------------------------------------------------------- access patterns


def _is_dynamic(x) -> bool:
    """A run-time index: an SBUF tensor or an engine register (isa/registers.py)."""
    return isinstance(x, NkiTensor) or type(x).__name__ == "VirtualRegister"


def _offset_tensor(fn, role, t, columns=False) -> NkiTensor:
    """An SBUF tile of integer offsets, shape (P, 1); with ``columns`` (``ap``'s
    vector_offset) also (P, N): dma_transpose's 2-D indices, read column by column
    (IndirectView.vector_rows)."""
    if not isinstance(t, NkiTensor) or not t.on_chip:
        raise NkiValidationError(f"{fn}: {role} must be an SBUF tensor of per-partition "
                                 f"offsets, shape (P, 1); got {t!r}")
    if not t.dtype.is_int:
        raise NkiValidationError(f"{fn}: {role} must hold integer offsets, got {t.dtype.name}")
    if columns and len(t.shape) == 2:
        return t
    if math.prod(t.shape[1:]) != 1:
        raise NkiValidationError(f"{fn}: {role} must have shape (P, 1){' or (P, N)' if columns else ''}, "
                                 f"got {t.shape}")
    return t


def _scalar_index(what, x) -> int:
    """The run-time value of a scalar offset: a register, or a tensor of one element."""
    if isinstance(x, NkiTensor):
        if x.size != 1:
            raise NkiValidationError(f"{what}: a scalar offset tensor must hold one element, "
                                     f"got shape {x.shape}")
        if not x.dtype.is_int:
            raise NkiValidationError(f"{what}: a scalar offset tensor must be an integer "
                                     f"dtype, got {x.dtype.name}")
        return int(x.values().reshape(-1)[0])
    return operator.index(x)


def _check_pattern(pattern) -> list[list[int]]:
    try:
        pat = [[operator.index(st), operator.index(n)] for st, n in pattern]
    except (TypeError, ValueError):
        raise NkiValidationError(f"ap: pattern {pattern!r} must be a list of [step, num] "
                                 "pairs") from None
    if not pat:
        raise NkiValidationError("ap: pattern must have at least one [step, num] pair")
    for st, n in pat:
        if n < 1:
            raise NkiValidationError(f"ap: pattern {pat}: every num must be >= 1, got {n}")
        if st < 0:
            raise UnsupportedError(f"ap: pattern {pat}: negative steps are not supported by "
                                   "the simulator")
    return pat


def _static_view(t: NkiTensor, pat, start, dt) -> NkiTensor:
    root = t._root(dt)
    shape = [n for _, n in pat]
    steps = [st for st, _ in pat]
    span = sum((n - 1) * st for st, n in pat[1:])
    what = (f"ap(pattern={pat}, offset {start}) of {t.name or 'a tensor'} "
            f"{t._alloc.shape} {t._alloc.dtype.name} (as {dt.name})")
    if t.on_chip:
        parts, free = root.shape
        p0, f0 = divmod(start, free) if start >= 0 else (-1, 0)
        if start < 0 or p0 + pat[0][1] > parts or f0 + span >= free:
            return OutOfBoundsView(t._alloc, shape, dt, f"{what} reaches outside the tensor's "
                                   f"{parts} partitions x {free} elements")
        strides = [root.stride(0)] + steps[1:]
        where = root.storage_offset() + p0 * root.stride(0) + f0
    else:
        n = root.numel()
        hi = start + (pat[0][1] - 1) * pat[0][0] + span
        if start < 0 or hi >= n:
            return OutOfBoundsView(t._alloc, shape, dt, f"{what} reaches elements {start}..{hi} "
                                   f"of a tensor of {n}")
        strides = steps
        where = root.storage_offset() + start
    data = torch.as_strided(root, shape, strides, where)
    return NkiTensor.of_view(t._alloc, data, None if dt == t._alloc.dtype else dt)


_VIEW_METHODS = ("reshape", "permute", "broadcast", "broadcast_to", "expand_dim", "squeeze_dim",
                 "reshape_dim", "flatten_dims", "slice", "select", "vector_select", "view",
                 "reinterpret_cast", "indirect", "rearrange", "__getitem__", "__setitem__")


class _PatternOnly(NkiTensor):
    """A view known only by its pattern until an instruction uses it."""

    __slots__ = ("_shape", "_what")

    @property
    def shape(self):
        return tuple(self._shape)

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def size(self):
        return math.prod(self._shape)

    def __len__(self):
        return self._shape[0]

    def __repr__(self):
        return f"<{type(self).__name__} {self._what} shape={self.shape} dtype={self.dtype.name}>"


def _no_view(name):
    def method(self, *args, **kwargs):
        raise UnsupportedError(
            f"{name}() of {self._what}: views of a dynamic or out-of-range access pattern are "
            "not supported by the simulator; build the whole pattern in one .ap() call")
    method.__name__ = name
    return method


for _m in _VIEW_METHODS:
    setattr(_PatternOnly, _m, _no_view(_m))


class OutOfBoundsView(_PatternOnly):
    """An access pattern reaching outside its tensor: legal to build, an IndexError to use."""

    __slots__ = ()

    def __init__(self, alloc, shape, dtype, what):
        self._alloc = alloc
        self._dtype = None if dtype == alloc.dtype else dtype
        self._shape = list(shape)
        self._what = what

    @property
    def _data(self):
        raise IndexError(self._what)

    def _start_partition(self):
        raise IndexError(self._what)

    def _store_bits(self, bits, keep=None):
        # a write through the pattern (dma_copy into HBM stores through here, not _data)
        raise IndexError(self._what)

    @property
    def strides(self):
        raise IndexError(self._what)

    @property
    def offset(self):
        raise IndexError(self._what)


class UnmaterializedTensor(_PatternOnly):
    """``nl.NkiTensor(shape, dtype, None, ...)``: "a signature placeholder and never
    materialized" (the constructor's docstring). Its shape, dtype, buffer and name read as
    given; an instruction or a view that uses it raises ``NkiValidationError``."""

    __slots__ = ()

    @classmethod
    def of(cls, alloc: Allocation, shape, what: str) -> "UnmaterializedTensor":
        """A placeholder of ``shape`` over ``alloc`` (its buffer, dtype and name; storage on
        torch's meta device), described in errors as ``what``."""
        t = object.__new__(cls)
        t._alloc, t._dtype, t._shape, t._what = alloc, None, list(shape), what
        return t

    def _refuse(self, *args, **kwargs):
        raise NkiValidationError(
            f"{self._what}: created with storage=None, a signature placeholder that is never "
            "materialized; allocate a tensor an instruction can use with nl.ndarray")

    _data = property(_refuse)
    _start_partition = _refuse
    _store_bits = _refuse
    resolve = _refuse

    @property
    def strides(self):
        return tuple(self._alloc.base.stride())   # row-major, as a fresh tensor's

    @property
    def offset(self):
        return 0


for _m in _VIEW_METHODS + ("ap", "_root"):
    setattr(UnmaterializedTensor, _m, UnmaterializedTensor._refuse)


class IndirectView(_PatternOnly):
    """An access pattern whose offset is read at run time (``scalar_offset``: one value for
    the whole access; ``vector_offset``: one per partition of the result). Every instruction
    that reads ``_data`` resolves the offsets afresh, so the values the kernel wrote last
    count; writes (``store``) scatter. Out-of-range accesses raise IndexError when used,
    except where dma_copy(oob_mode=skip) skips them (``resolve``)."""

    __slots__ = ("_root_of", "_pattern", "_start", "_scalar", "_sstride", "_vector", "_vstride",
                 "_extent")

    def __init__(self, t, pattern, start, dtype, what, scalar=None, sstride=0, vector=None,
                 vstride=0, extent=0):
        self._alloc = t._alloc
        self._dtype = None if dtype == t._alloc.dtype else dtype
        self._root_of = t
        self._pattern = pattern
        self._shape = [n for _, n in pattern]
        self._start = start
        self._scalar = scalar
        self._sstride = sstride
        self._vector = vector
        self._vstride = vstride
        self._extent = extent
        self._what = what

    def is_indirect(self) -> bool:
        return True

    def vector_columns(self) -> int:
        """Columns of the vector_offset tile (1 for a (P, 1) tile; 0 without one)."""
        if self._vector is None:
            return 0
        return math.prod(self._vector.shape[1:])

    def vector_rows(self) -> torch.Tensor:
        """The offsets, one per row of dim 0, as int64: a (P, N) tile read column by column
        ("flat_indices = indices.T.flatten()", nki.isa.dma_transpose; "Hardware uses
        column-major flattening"), which for (P, 1) is the tile's order."""
        v = self._vector.values().to(torch.int64)
        return v.reshape(v.shape[0], -1).t().reshape(-1)

    def _start_partition(self) -> int:
        t = self._root_of
        return max(0, self._start) // t._free_size(self.dtype) if t.on_chip else 0

    @property
    def strides(self):
        return tuple(st for st, _ in self._pattern)

    @property
    def offset(self):
        return self._start

    def resolve(self):
        """(storage, index, row_ok): the flat storage of the tensor's bits (this view's
        dtype), the storage index of every element (shape of the view; out-of-range
        elements point at element 0), and which rows (dim 0) lie inside the tensor."""
        t = self._root_of
        dt = self.dtype
        root = t._root(dt)
        pat = self._pattern
        idx = torch.tensor(self._start, dtype=torch.int64)
        rest = pat[1:] if self._vector is not None else pat
        for st, n in rest:
            idx = idx.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st
        if self._vector is not None:
            rows = self.vector_rows()[:pat[0][1]]
            if rows.numel() < pat[0][1]:
                raise NkiValidationError(
                    f"{self._what}: vector_offset has {rows.numel()} offsets for "
                    f"{pat[0][1]} partitions")
            idx = (rows * self._vstride).reshape((-1,) + (1,) * len(rest)) + idx.unsqueeze(0)
        elif self._scalar is not None:
            idx = idx + _scalar_index(self._what, self._scalar) * self._sstride
        if t.on_chip:
            parts, free = root.shape
            n = parts * free
        else:
            n = root.numel()
        inside = (idx >= 0) & (idx < n)
        row_ok = inside.reshape(inside.shape[0], -1).all(1) if inside.dim() else inside.reshape(1)
        if self._vector is None:
            row_ok = row_ok.all().expand(row_ok.shape)  # one offset: all or nothing
        ok = row_ok.reshape((-1,) + (1,) * (idx.dim() - 1)).expand(idx.shape)
        idx = torch.where(ok, idx, torch.zeros_like(idx))
        if t.on_chip:
            idx = (idx // free) * root.stride(0) + idx % free
        idx = idx + root.storage_offset()
        total = root.untyped_storage().nbytes() // root.element_size()
        storage = torch.as_strided(root, (total,), (1,), 0)
        return storage, idx, row_ok

    def rows(self):
        """(row starts, row_ok, inner shape, inner strides) of an HBM view: element i of row
        w is at ``starts[w] + sum(inner_strides * i)`` (elements of this view's dtype from
        the tensor's start); a scalar offset gives one row: the whole pattern."""
        _, _, row_ok = self.resolve()
        pat = self._pattern
        if self._vector is not None:
            vo = self.vector_rows()[:pat[0][1]]
            starts = self._start + vo * self._vstride
            inner = pat[1:]
        else:
            off = 0 if self._scalar is None else _scalar_index(self._what, self._scalar) * self._sstride
            starts = torch.tensor([self._start + off], dtype=torch.int64)
            inner = pat
            row_ok = row_ok[:1]
        return starts, row_ok, [n for _, n in inner], [st for st, _ in inner]

    def _oob_message(self, row_ok) -> str:
        bad = (~row_ok).nonzero().reshape(-1).tolist()
        t = self._root_of
        where = f"rows {bad[:8]}{'...' if len(bad) > 8 else ''} of " if self._vector is not None \
            else ""
        return (f"{self._what}: the run-time offset puts {where}the access outside "
                f"{t.name or 'the tensor'} {t._alloc.shape} {t._alloc.dtype.name}")

    @property
    def _data(self):
        storage, idx, row_ok = self.resolve()
        if not bool(row_ok.all()):
            raise IndexError(self._oob_message(row_ok))
        return _gather_bits(storage, idx)

    def _store_bits(self, bits: torch.Tensor, keep=None) -> None:
        """Scatter ``bits`` (this view's shape, storage dtype) into the tensor; an access
        outside it is an IndexError, unless ``keep`` (elements to write) leaves it out."""
        storage, idx, ok = self.resolve()
        races = current().run.races if self._alloc.kind == "hbm" else None
        old = _gather_bits(storage, idx) if races is not None else None
        flat = _signed(storage)
        bits = _signed(bits.contiguous())
        if keep is None:
            if not bool(ok.all()):
                raise IndexError(self._oob_message(ok))
            flat[idx.reshape(-1)] = bits.reshape(-1)
        else:
            flat[idx[keep]] = bits.reshape(idx.shape)[keep]
        if self._alloc.kind == "hbm":
            self._alloc.written = True
            if races is not None:
                races.after_store_indirect(self, old, _gather_bits(storage, idx))


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _signed(bits: torch.Tensor) -> torch.Tensor:
    """A same-size signed-integer view of ``bits`` (torch's index kernels take these for
    every element type; uint32, fp8 and others lack some)."""
    return bits.view(_SIGNED[bits.element_size()])


def _gather_bits(storage: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return _signed(storage)[idx].view(storage.dtype)


def _indirect_view(t, pattern, start, dtype, what, scalar=None, scalar_stride=0, vector=None,
                   vector_stride=0, extent=0) -> IndirectView:
    if t.is_indirect():
        raise NkiValidationError(f"{what}: the view is already indirect; only one dynamic "
                                 "offset per access (docs: no chaining)")
    if scalar is not None and not _is_dynamic(scalar):
        # a Python int offset is static: fold it in
        return _static_view(t, pattern, start + operator.index(scalar) * scalar_stride, dtype)
    return IndirectView(t, pattern, start, dtype, what, scalar=scalar, sstride=scalar_stride,
                        vector=vector, vstride=vector_stride, extent=extent)
