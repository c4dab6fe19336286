"""Running a kernel: ``nki.jit`` kernels, ``nki.simulate`` and ``run_kernel``.

A run gets a fresh context (context.py) built from its ``SimParams``, wraps the host arrays
as HBM tensors (host.py), calls the kernel body once per logical core and hands back the
outputs. Runs are independent: several threads may run kernels at once (each thread has its
own context stack).
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

from . import kernel_rules
from .context import Context, current, pop, push
from .errors import NkiValidationError
from .host import Inputs
from .memory import MemoryRegion
from .params import SimParams


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
    """``nki.simulate(kernel)(*args)``: numpy or CPU torch in, same type out. The run takes
    the options of the calling thread's innermost ``activated()`` block (defaults outside)."""
    def call(*args, **kwargs):
        return run_kernel(kernel, args, kwargs)[0]
    return call


def _unwrap(kernel):
    """(function, kernel[n] degree or None) of a jitted kernel or a plain function."""
    if isinstance(kernel, Kernel):
        return kernel.fn, kernel.grid
    if callable(kernel):
        inner = getattr(kernel, "fn", None) or getattr(kernel, "func", None)
        return (kernel, None) if inner is None or not callable(inner) else (inner, None)
    raise TypeError(f"expected an NKI kernel (function or nki.jit object), got {kernel!r}")


# ---------------------------------------------------------------------------- torch threads
# Tiles are small: torch's intra-op threads only add latency (and stall badly when another
# process holds a core), so a run computes with one torch thread. torch.set_num_threads
# sets the calling thread's OpenMP team size and the process default that new threads
# start from. So each run sets its own thread to 1, and a process-wide count of active runs
# (under a lock) decides what to restore: a run that ends while others are active restores
# its thread's own setting; the last one restores the setting the first one found, so the
# process default is back where it was once no run is active.
_threads_lock = threading.Lock()
_active_runs = 0
_threads_before_runs = 0


@contextlib.contextmanager
def _one_torch_thread():
    global _active_runs, _threads_before_runs
    with _threads_lock:
        mine = torch.get_num_threads()
        if _active_runs == 0:
            _threads_before_runs = mine
        _active_runs += 1
        if mine != 1:
            torch.set_num_threads(1)
    try:
        yield
    finally:
        with _threads_lock:
            _active_runs -= 1
            restore = _threads_before_runs if _active_runs == 0 else mine
            if torch.get_num_threads() != restore:
                torch.set_num_threads(restore)


# ---------------------------------------------------------------------------- one run
def run_kernel(kernel, args, kwargs, params: SimParams | None = None):
    """Run ``kernel`` once per logical core on fresh HBM copies of the arrays in
    ``args``/``kwargs`` with ``params`` (default: the calling thread's current options).
    Returns (outputs, Context of the run)."""
    fn, degree = _unwrap(kernel)
    kernel_rules.check_kernel(fn, args, kwargs)  # NKI 0.7 language rules (kernel_rules.py)
    params = params if params is not None else current().params
    grid = params.lnc_for(degree)
    ctx = Context(params, grid, bracketed=degree is not None)
    with _one_torch_thread():
        push(ctx)
        try:
            region = MemoryRegion.shared_hbm if grid > 1 else MemoryRegion.private_hbm
            code = getattr(fn, "__code__", None)
            names = code.co_varnames[:code.co_argcount] if code else ()
            inputs = Inputs()
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
            outputs = inputs.outputs(result)
            inputs.copy_back()
            return outputs, ctx
        finally:
            pop(ctx)
