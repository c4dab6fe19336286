"""Shape views of ``NkiTensor`` (tensor.py): indexing and the methods that only re-describe
a view's shape and strides over the same storage (NkiTensor view docstrings, NKI 0.7):
``t[...]`` (indexing rules: tensor.py's docstring), reshape, permute, broadcast,
expand/squeeze/reshape/flatten dims, slice, rearrange; and ``DynamicSlice`` (``nl.ds``).

``ShapeViews`` is a mixin of ``NkiTensor``: it uses ``_view`` (a new tensor over the same
allocation), ``_data`` (the torch view), ``on_chip`` and ``shape``/``ndim``/``strides``.
On-chip tensors keep their partition dim first and whole (every method checks it).
"""

from __future__ import annotations

import math
import operator

from .errors import NkiValidationError, UnsupportedError
from .memory import MIN_ON_CHIP_DIMS


class DynamicSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    __slots__ = ("start", "size")

    def __init__(self, start, size):
        self.start = operator.index(start)
        self.size = operator.index(size)

    def __repr__(self):
        return f"nl.ds({self.start}, {self.size})"


class ShapeViews:
    """The shape-only view methods of ``NkiTensor``."""

    __slots__ = ()   # NkiTensor keeps its own slots (no per-view __dict__)

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
        # an engine register (isa/registers.py; by name, as tensor._is_dynamic: no import cycle)
        regs = [d for d, k in enumerate(key) if type(k).__name__ == "VirtualRegister"]
        if regs:
            # a register is read when the instruction runs: t[reg] is t.select(dim, reg) (the
            # NKI 0.7 language guide: "Indirect views are produced by select with a tensor
            # index ..."), with select's rules (not the partition dim on chip); operator.index
            # would freeze the value the register holds now
            others = [k for d, k in enumerate(key) if d != regs[0]]
            if len(regs) > 1 or any(k != slice(None) for k in others):
                raise UnsupportedError(
                    f"index {key!r}: a register index takes whole slices (:) in every other "
                    "dimension; use t.select(dim, register) or t.ap(..., scalar_offset=register)")
            return self.select(regs[0], key[regs[0]])
        tkey = []
        int_dims = []
        for dim, k in enumerate(key):
            n = shape[dim]
            if isinstance(k, slice):
                tkey.append(_check_slice(k, dim, n, tuple(shape)))
            elif isinstance(k, DynamicSlice):
                # nl.ds(start, 0) is an empty view (nki-library's cross_entropy gives the idle
                # core of an LNC=2 launch an empty shard); an instruction refuses it.
                if k.size < 0 or k.start < 0 or k.start + k.size > n or (k.size == 0 and k.start > n):
                    raise IndexError(
                        f"index nl.ds({k.start}, {k.size}) is out of bounds for dim {dim} "
                        f"with size {n} (shape {tuple(shape)})")
                tkey.append(slice(k.start, k.start + k.size))
            elif isinstance(k, ShapeViews):         # an NkiTensor
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
        return self._view(self._data[tuple(tkey)])

    def reshape(self, shape, *extra) -> "NkiTensor":
        # "def reshape(self, shape: tuple[int, ...])" (the nki.language stub, aws-neuron-sdk
        # nki/api/nki/language/__init__.py): one tuple, as AWS's kernels call it; the torch-style
        # reshape(a, b) is a TypeError there, so it is one here (_dims_tuple names the form)
        shape = _dims_tuple("reshape", "shape", shape, extra)
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
            least = MIN_ON_CHIP_DIMS[self._alloc.kind]
            if len(shape) < least:
                raise NkiValidationError(
                    f"reshape: on-chip {self._alloc.kind} tensor needs >= {least} dims, got {shape}")
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

    def permute(self, dims, *extra) -> "NkiTensor":
        # "def permute(self, dims: tuple[int, ...])", "t.permute((0, 2, 1))" (the nki.language
        # stub): the torch-style permute(0, 2, 1) fails there when the kernel is traced; until
        # 2026-12-07 the simulator took both, and the attention kernels used the torch form
        dims = _dims_tuple("permute", "dims", dims, extra)
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
            raise NkiValidationError(f"broadcast: dim 0 of on-chip {self.shape} is the partition dim, which a view "
                                     "cannot broadcast; use nl.broadcast_to(x, shape), which copies across partitions")
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
            raise NkiValidationError(f"expand_dim: dim 0 of on-chip {self.shape} would go before the partition dim; "
                                     "insert at 1 or later")
        return self._view(self._data.unsqueeze(dim))

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        dim = self._dim(dim, "squeeze_dim")
        if self._data.shape[dim] != 1:
            raise NkiValidationError(
                f"squeeze_dim: dim {dim} has size {self._data.shape[dim]}, must be 1")
        if self.on_chip:
            least = MIN_ON_CHIP_DIMS[self._alloc.kind]
            if dim == 0 or self.ndim <= least:
                raise NkiValidationError(
                    f"squeeze_dim: on-chip {self._alloc.kind} tensor {self.shape} must keep its partition dim "
                    f"and {least} dim{'s' if least > 1 else ''}")
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
            raise NkiValidationError(f"reshape_dim: dim 0 of on-chip {self.shape} is the partition dim; it cannot "
                                     f"be split into {shape}")
        new = self.shape[:dim] + shape + self.shape[dim + 1:]
        return self._view(self._data.unflatten(dim, shape) if new != self.shape else self._data)

    def flatten_dims(self, start_dim: int, end_dim: int) -> "NkiTensor":
        s = self._dim(start_dim, "flatten_dims")
        e = self._dim(end_dim, "flatten_dims")
        if self.on_chip and s == 0:
            raise NkiValidationError(f"flatten_dims: start_dim={start_dim} of on-chip {self.shape} takes in the "
                                     "partition dim; it must be > 0")
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

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> "NkiTensor":
        """einops-style view (NkiTensor.rearrange docstring): ``src_pattern`` names each dim
        (a tuple of names splits a dim; ``fixed_sizes`` gives sizes, one may be inferred),
        ``dst_pattern`` orders the names (a tuple merges them). On chip the partition dim
        stays first and whole."""
        sizes = dict(fixed_sizes or {})
        src = list(src_pattern)
        if len(src) != self.ndim:
            raise NkiValidationError(f"rearrange: src_pattern {src_pattern} names {len(src)} "
                                     f"dims; the tensor has {self.ndim} ({self.shape})")
        names, split_shape = [], []
        for dim, entry in enumerate(src):
            group = list(entry) if isinstance(entry, (tuple, list)) else [entry]
            n = self.shape[dim]
            known = [sizes[g] for g in group if g in sizes]
            missing = [g for g in group if g not in sizes]
            if len(missing) > 1:
                raise NkiValidationError(f"rearrange: sizes of {missing} in {entry} are unknown; "
                                         "give all but one in fixed_sizes")
            if missing:
                k = math.prod(known)
                if k == 0 or n % k:
                    raise NkiValidationError(f"rearrange: dim {dim} of size {n} cannot split "
                                             f"into {entry} with {sizes}")
                sizes[missing[0]] = n // k
            if math.prod(sizes[g] for g in group) != n:
                raise NkiValidationError(f"rearrange: {entry} multiplies to "
                                         f"{math.prod(sizes[g] for g in group)}, dim {dim} is {n}")
            for g in group:
                if g in names:
                    raise NkiValidationError(f"rearrange: name {g!r} appears twice")
                names.append(g)
                split_shape.append(sizes[g])
        order = []
        for entry in dst_pattern:
            order += list(entry) if isinstance(entry, (tuple, list)) else [entry]
        if sorted(order) != sorted(names):
            raise NkiValidationError(f"rearrange: dst_pattern {dst_pattern} must use the names "
                                     f"of src_pattern {src_pattern} once each")
        if self.on_chip and (order[0] != names[0] or split_shape[0] != self.shape[0]
                             or not isinstance(dst_pattern[0], str)):
            raise NkiValidationError(f"rearrange: {src_pattern} -> {dst_pattern} moves or splits the partition dim "
                                     f"of on-chip {self.shape}; it must stay first and whole")
        try:
            d = self._data.view(split_shape) if tuple(split_shape) != self.shape else self._data
            d = d.permute([names.index(n) for n in order])
            merged = []
            for entry in dst_pattern:
                group = list(entry) if isinstance(entry, (tuple, list)) else [entry]
                merged.append(math.prod(sizes[g] for g in group))
            d = d.view(merged) if tuple(merged) != tuple(d.shape) else d
        except RuntimeError:
            raise NkiValidationError(f"rearrange: {src_pattern} -> {dst_pattern} is not a view "
                                     f"of this layout (shape {self.shape}, strides "
                                     f"{self.strides})") from None
        return self._view(d)

    def _dim(self, dim, what):
        d = int(dim)
        if d < 0:
            d += self.ndim
        if not 0 <= d < self.ndim:
            raise IndexError(f"{what}: dim {dim} out of range for shape {self.shape}")
        return d


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
    if 0 <= start and start == stop <= n:
        # (an empty view on purpose is nl.ds(start, 0), which AWS's kernels use for an idle core)
        raise IndexError(f"index [{s0}:{s1}] selects no element of dim {dim} (size {n}, shape {shape}); "
                         "an empty view is written nl.ds(start, 0)")
    if not (0 <= start < stop <= n):
        raise IndexError(
            f"index [{s0}:{s1}] is out of bounds for dim {dim} with size {n} (shape {shape})")
    return slice(start, stop, step)


def _dims_tuple(method: str, role: str, value, extra=()) -> tuple:
    """``value`` as a tuple of ints: the one tuple (or list) argument of ``reshape`` /
    ``permute`` in the nki.language stub's signatures. torch's separate ints (``extra``) or
    an int alone are a TypeError, as they are when AWS's toolchain traces the kernel."""
    if extra or not isinstance(value, (tuple, list)):
        example = "(0, 2, 1)" if method == "permute" else "(128, 4, 64)"
        given = ", ".join(repr(v) for v in (value,) + tuple(extra))
        raise TypeError(f"{method}({role}): {role} must be one tuple of ints, e.g. t.{method}({example}); got "
                        f"{method}({given}) (the nki.language signature takes one tuple, not torch's separate ints)")
    return tuple(operator.index(v) for v in value)
