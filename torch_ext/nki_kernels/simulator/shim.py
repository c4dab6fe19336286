"""The ``nki``, ``nki.language`` and ``nki.isa`` module objects, ``nki.jit``,
``nki.simulate`` and ``activated()``.

The three modules are built once (singletons): a kernel source imported while
``activated()`` is in force binds them for good, and later runs reuse them. ``activated``
swaps ``sys.modules`` entries in and restores exactly the previous ones on exit (a real
installed ``nki`` is untouched outside the block; nesting works).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types

import torch

from . import dtypes as _dt
from . import isa as _isa
from . import language as _language
from .context import Context, current, pop, push
from .errors import NkiValidationError, UnsupportedError
from .hardware import DEFAULT_TARGET
from .memory import MemoryRegion
from .tensor import NkiTensor, from_torch

# Module-level helpers of language.py that are not part of nki.language.
_HELPERS = {"annotations", "builtins", "contextlib", "math", "operator", "torch", "f32",
            "free_elems", "record", "current", "kind_of", "to_region", "allocate",
            "from_torch", "DynamicSlice", "Op", "UnsupportedError", "NkiValidationError",
            "reduce_axes"}

LANGUAGE_NAMES = tuple(sorted(
    n for n, obj in vars(_language).items()
    if not n.startswith("_") and n not in _HELPERS and not isinstance(obj, types.ModuleType)))
ISA_NAMES = tuple(_isa.__all__)

# ======================================================================= jit / simulate


class Kernel:
    """A kernel decorated with the simulator's ``nki.jit``. ``kernel[2]`` binds the
    logical-core degree (LNC); calling it runs the body in the simulator."""

    def __init__(self, fn, grid=None, options=None):
        while isinstance(fn, Kernel):
            fn = fn.fn
        self.fn = fn
        self.grid = grid
        self.options = dict(options or {})
        functools.update_wrapper(self, fn)

    def __getitem__(self, lnc):
        if isinstance(lnc, tuple):
            if len(lnc) != 1:
                raise NkiValidationError(
                    f"kernel[{lnc}]: beta-2 grids carry only the logical-core degree: kernel[1] "
                    "or kernel[2]")
            lnc = lnc[0]
        if lnc not in (1, 2):
            raise NkiValidationError(
                f"kernel[{lnc}]: the logical-core degree must be 1 or 2 (beta 2 has no "
                "arbitrary SPMD grids)")
        return Kernel(self.fn, int(lnc), self.options)

    def __call__(self, *args, **kwargs):
        if current().in_kernel:  # a jitted kernel called from inside a kernel: plain call
            return self.fn(*args, **kwargs)
        return run_kernel(self, args, kwargs)[0]

    def __repr__(self):
        g = f"[{self.grid}]" if self.grid else ""
        return f"<nki.jit kernel {getattr(self.fn, '__qualname__', self.fn)}{g} (simulator)>"


def jit(fn=None, **kwargs):
    """``@nki.jit`` / ``@nki.jit(...)``: options are accepted and ignored by the simulator."""
    if fn is None:
        return lambda f: Kernel(f, options=kwargs)
    return Kernel(fn, options=kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``: numpy or CPU torch in, same type out."""
    def call(*args, **kwargs):
        return run_kernel(kernel, args, kwargs)[0]
    return call


def _unwrap(kernel):
    if isinstance(kernel, Kernel):
        return kernel.fn, (kernel.grid or 1), kernel.grid is not None
    if callable(kernel):
        inner = getattr(kernel, "fn", None) or getattr(kernel, "func", None)
        return (kernel, 1, False) if inner is None or not callable(inner) else (inner, 1, False)
    raise TypeError(f"expected an NKI kernel (function or nki.jit object), got {kernel!r}")


def _is_numpy(x) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "shape")


class _Inputs:
    def __init__(self):
        self.kind = None
        self.pairs = []  # (caller's array, NkiTensor)

    def wrap(self, x, name, region):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                raise TypeError(f"argument {name}: the simulator takes CPU tensors, got {x.device}")
            self.kind = self.kind or "torch"
            dt = _input_dtype(x.dtype, name)
            if x.dtype == torch.float32 and x.is_contiguous():
                # zero-copy: the HBM tensor IS the caller's fp32 tensor (in-place semantics)
                t = from_torch(x.detach(), dt, region, name, alias=True)
            else:
                t = from_torch(x.detach(), dt, region, name)
            self.pairs.append((x, t))
            return t
        if _is_numpy(x):
            from .language import _numpy_to_torch

            self.kind = self.kind or "numpy"
            t = from_torch(_numpy_to_torch(x), _input_dtype(x.dtype, name), region, name)
            self.pairs.append((x, t))
            return t
        if isinstance(x, (list, tuple)) and any(
                isinstance(e, torch.Tensor) or _is_numpy(e) for e in x):
            return type(x)(self.wrap(e, f"{name}[{i}]", region) for i, e in enumerate(x))
        return x


def _input_dtype(dtype, name):
    try:
        return _dt.to_nki(dtype)
    except TypeError as err:
        raise TypeError(f"argument {name}: {err}") from None


def _to_torch(t: NkiTensor) -> torch.Tensor:
    # After the run nothing writes the simulator's storage again: fp32 outputs are returned
    # without a copy (a fresh HBM allocation, or the caller's own aliased input).
    d = t._data
    dt = t.dtype
    if dt.is_bool:
        return d != 0
    return d.to(_dt.torch_output_dtype(dt))


def _to_numpy(t: NkiTensor):
    d = t._data
    dt = t.dtype
    if dt.is_float:
        return d.to(torch.float32).numpy().astype(_dt.numpy_output_dtype(dt))
    return d.numpy().astype(_dt.numpy_output_dtype(dt))


def _convert(result, kind, index=0):
    if isinstance(result, NkiTensor):
        if result.on_chip:
            raise NkiValidationError(
                f"kernel output {index} is in {result.buffer.value}; kernel outputs must be "
                "HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm)) written with nl.store / "
                "nisa.dma_copy")
        return _to_numpy(result) if kind == "numpy" else _to_torch(result)
    if isinstance(result, (tuple, list)):
        return tuple(_convert(r, kind, i) for i, r in enumerate(result))
    if isinstance(result, dict):
        return {k: _convert(v, kind, k) for k, v in result.items()}
    return result


def run_kernel(kernel, args, kwargs, target=None):
    """Run ``kernel`` once (per logical core) on fresh HBM copies of the arrays in
    ``args``/``kwargs``. Returns (outputs, Context)."""
    fn, grid, bracketed = _unwrap(kernel)
    ctx = Context(target or current().target, grid, bracketed)
    # Tiles are small: torch's intra-op threads only add latency (and stall badly when
    # another process holds a core), so a run uses one thread and restores the setting.
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    push(ctx)
    try:
        region = MemoryRegion.shared_hbm if grid > 1 else MemoryRegion.private_hbm
        code = getattr(fn, "__code__", None)
        names = code.co_varnames[:code.co_argcount] if code else ()
        inputs = _Inputs()
        wargs = [inputs.wrap(a, names[i] if i < len(names) else f"arg{i}", region)
                 for i, a in enumerate(args)]
        wkwargs = {k: inputs.wrap(v, k, region) for k, v in kwargs.items()}
        result = None
        ctx.in_kernel = True
        try:
            for pid in range(grid):
                ctx.program_id = pid
                ctx.shared_cursor = 0
                if grid > 1:
                    ctx.recorder.core = pid
                r = fn(*wargs, **wkwargs)
                if pid == 0:
                    result = r
        finally:
            ctx.in_kernel = False
        outputs = _convert(result, inputs.kind or "torch")
        for orig, t in inputs.pairs:  # inputs the kernel wrote are updated in place
            if t._alloc.written and not (isinstance(orig, torch.Tensor)
                                         and orig.data_ptr() == t._alloc.base.data_ptr()):
                if isinstance(orig, torch.Tensor):
                    with torch.no_grad():
                        orig.copy_(_to_torch(t).to(orig.dtype))
                else:
                    orig[...] = _to_numpy(t).astype(orig.dtype)
        return outputs, ctx
    finally:
        pop(ctx)
        if threads != 1:
            torch.set_num_threads(threads)


# ======================================================================= modules


def _module(name, names, source, doc):
    m = types.ModuleType(name, doc)
    for n in names:
        setattr(m, n, getattr(source, n))
    m.__all__ = list(names)
    return m


def _build():
    nl = _module("nki.language", LANGUAGE_NAMES, _language,
                 "nki.language (beta 2), simulated by nki_kernels.simulator")
    nisa = _module("nki.isa", ISA_NAMES, _isa, "nki.isa (beta 2), simulated by nki_kernels.simulator")
    nisa.NkiValidationError = NkiValidationError
    nki = types.ModuleType("nki", "nki (beta 2) as simulated by nki_kernels.simulator")
    nki.__path__ = []  # a package, so `import nki.language` resolves through sys.modules
    nki.language = nl
    nki.isa = nisa
    nki.jit = jit
    nki.simulate = simulate
    nki.Kernel = Kernel
    nki.__version__ = "0.7-simulated"
    nki.__simulator__ = True
    for m in (nl, nisa):
        m.__package__ = "nki"
    return {"nki": nki, "nki.language": nl, "nki.isa": nisa}


MODULES = _build()

_MISSING = object()


@contextlib.contextmanager
def activated(target=DEFAULT_TARGET):
    """Make ``import nki`` / ``nki.language`` / ``nki.isa`` resolve to the simulator for the
    block; restores the previous ``sys.modules`` entries exactly afterwards."""
    ctx = Context(target)
    saved = {name: sys.modules.get(name, _MISSING) for name in MODULES}
    sys.modules.update(MODULES)
    push(ctx)
    try:
        yield MODULES["nki"]
    finally:
        pop(ctx)
        for name, old in saved.items():
            if old is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


__all__ = ["activated", "jit", "simulate", "Kernel", "run_kernel", "MODULES", "UnsupportedError"]
