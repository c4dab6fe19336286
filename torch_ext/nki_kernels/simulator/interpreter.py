"""Running a kernel: ``nki.jit`` kernels, ``nki.simulate`` and ``run_kernel``.

A run gets a fresh ``Run`` (context.py) built from its ``SimParams``, wraps the host arrays
as HBM tensors (host.py), runs the kernel body once per physical core and hands back the
outputs. Runs are independent: several threads may run kernels at once (each thread has its
own context stack).

The degree (LNC) of a launch, as AWS documents it for ``nki.jit`` in Neuron 2.33: "Configure
the LNC (Logical NeuronCore) degree by setting the NEURON_LOGICAL_NC_CONFIG environment
variable to 1 or 2 before invoking the kernel. If the LNC degree is not explicitly set, the
default is LNC=1." (nki.jit reference), and "via bracket syntax at the kernel call site"
(Using Logical NeuronCores); the two must agree ("The LNC value must match the
NEURON_LOGICAL_NC_CONFIG environment variable ... Mismatching the two will cause a runtime
error", 2.31/2.32 nki.jit). ``nki.simulate(kernel)`` and calling a jitted kernel resolve the
degree that way (``launch_degree``); ``simulator.run`` takes it from ``SimParams``.

The two programs of an LNC=2 launch run CONCURRENTLY (``Lockstep``): each in a thread of its
own with its own core context, one thread at a time. A core runs until it finishes or waits
on the other (``sendrecv``, ``core_barrier``: isa/sync.py), then the other runs. The
interleaving depends only on the kernel, so runs are deterministic; a core that waits for
something the other core will never do is a ``DeadlockError`` naming both cores' states.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import torch

from . import kernel_rules
from .context import Context, Run, current, pop, push
from .errors import DeadlockError, NkiValidationError
from .host import Inputs
from .memory import MemoryRegion
from .params import SimParams

LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"


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
        return run_kernel(self, args, kwargs, launch=True)[0]

    def __repr__(self):
        g = f"[{self.grid}]" if self.grid else ""
        return f"<nki.jit kernel {getattr(self.fn, '__qualname__', self.fn)}{g} (simulator)>"


def jit(fn=None, **kwargs):
    """``@nki.jit`` / ``@nki.jit(...)``: options are accepted and ignored by the simulator.
    ``platform_target`` too: the migration guide says passing it "raises an error in NKI
    0.3.0", but AWS's own beta-2 MX tutorial passes it (nki-samples
    src/nki_samples/tutorials/mxfp-matmul/mx_kernels.py, ``@nki.jit(platform_target="trn3")``),
    so the simulator follows the kernel AWS ships."""
    if fn is None:
        return lambda f: Kernel(f, options=kwargs)
    return Kernel(fn, options=kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)``: numpy or CPU torch in, same type out. The run takes
    the options of the calling thread's innermost ``activated()`` block (defaults outside)
    and the launch degree of ``launch_degree``."""
    def call(*args, **kwargs):
        return run_kernel(kernel, args, kwargs, launch=True)[0]
    return call


def _unwrap(kernel):
    """(function, kernel[n] degree or None) of a jitted kernel or a plain function."""
    if isinstance(kernel, Kernel):
        return kernel.fn, kernel.grid
    if callable(kernel):
        inner = getattr(kernel, "fn", None) or getattr(kernel, "func", None)
        return (kernel, None) if inner is None or not callable(inner) else (inner, None)
    raise TypeError(f"expected an NKI kernel (function or nki.jit object), got {kernel!r}")


def launch_degree(bracket: int | None) -> int | None:
    """The LNC degree a launch asks for: ``kernel[n]``, else NEURON_LOGICAL_NC_CONFIG, else
    None (the run's default). Both given: they must agree."""
    raw = os.environ.get(LNC_ENV)
    if raw is None or raw.strip() == "":
        return bracket
    try:
        env = int(raw)
    except ValueError:
        env = None
    if env not in (1, 2):
        raise ValueError(f"{LNC_ENV}={raw!r}: the logical-core degree must be 1 or 2")
    if bracket is not None and bracket != env:
        raise NkiValidationError(
            f"kernel[{bracket}]: the launch degree differs from {LNC_ENV}={env} (AWS: \"The LNC "
            "value must match the NEURON_LOGICAL_NC_CONFIG environment variable\")")
    return env


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


@contextlib.contextmanager
def _plain_torch_modes():
    """The simulator computes with plain CPU tensors whatever torch modes its caller is in.
    torch's inference mode, grad mode and autocast state are per thread, and an LNC=2
    launch runs each core in a thread of its own, which starts without them, while LNC=1
    runs in the caller's thread: without this, a run under ``torch.inference_mode()`` made
    inference tensors that the core threads could not write in place (a RuntimeError at
    LNC=2), and a run under ``torch.autocast("cpu")`` computed its fp32 matmuls in bf16 at
    LNC=1 only (another result than LNC=2's). So the caller's thread and every core thread
    run with inference mode off, no autograd recording and CPU autocast off."""
    with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
        yield


# ---------------------------------------------------------------------------- LNC=2 cores
class _Aborted(BaseException):
    """Unwinds a core whose partner failed (never reaches the caller)."""


class Lockstep:
    """The programs of an LNC=2 launch, one thread per core, run one at a time.

    The running core keeps going until it finishes or ``wait``s for a condition only the
    other core can make true; then the other core runs. When neither can run, that is a
    deadlock. Only one thread touches the simulator at any moment, so the shared trace and
    HBM need no locks, and the interleaving (hence every result) is deterministic."""

    def __init__(self, n: int):
        self.n = n
        self.cv = threading.Condition()
        self.turn = 0
        self.done = [False] * n
        self.waiting: list = [None] * n     # (predicate, description) while blocked
        self.errors: list = [None] * n
        self.results: list = [None] * n
        self.abort = False

    def _switch(self, me: int) -> None:
        """Hand the baton to the next core that can run (called holding ``cv``)."""
        for k in range(1, self.n + 1):
            other = (me + k) % self.n
            if self.done[other]:
                continue
            w = self.waiting[other]
            if other == me or w is None or w[0]():
                self.turn = other
                self.cv.notify_all()
                return
        # nobody can make progress: wake a blocked core, which finds the deadlock and reports it
        blocked = [c for c in range(self.n) if not self.done[c]]
        self.turn = blocked[0] if blocked else None
        self.cv.notify_all()

    def wait(self, me: int, ready, what: str) -> None:
        """Block core ``me`` until ``ready()`` (another core's progress makes it true)."""
        with self.cv:
            while not ready():
                blocked = []
                for other in range(self.n):
                    if other == me:
                        continue
                    w = self.waiting[other]
                    if self.done[other]:
                        blocked.append(f"core {other} has finished")
                    elif w is not None and not w[0]():
                        blocked.append(f"core {other} waits for {w[1]}")
                    else:
                        blocked = None
                        break
                if blocked is not None:
                    raise DeadlockError(f"LNC=2 deadlock: core {me} waits for {what}, but "
                                        f"{'; '.join(blocked)}")
                self.waiting[me] = (ready, what)
                self._switch(me)
                while self.turn != me and not self.abort:
                    self.cv.wait()
                self.waiting[me] = None
                if self.abort:
                    raise _Aborted()

    def run(self, body) -> list:
        """Run ``body(pid)`` for every core; returns their results, raises the first error."""
        def thread_main(pid):
            with self.cv:
                while self.turn != pid and not self.abort:
                    self.cv.wait()
            try:
                if self.abort:
                    raise _Aborted()
                self.results[pid] = body(pid)
            except _Aborted:
                pass
            except BaseException as err:  # noqa: BLE001 (re-raised by the caller)
                self.errors[pid] = err
                self.abort = True
            finally:
                with self.cv:
                    self.done[pid] = True
                    if self.abort:
                        self.cv.notify_all()
                    else:
                        self._switch(pid)

        threads = [threading.Thread(target=thread_main, args=(p,), daemon=True,
                                    name=f"nki-core-{p}") for p in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        first = next((e for e in self.errors if e is not None), None)
        if first is not None:
            raise first
        return self.results


# ---------------------------------------------------------------------------- one run
def run_kernel(kernel, args, kwargs, params: SimParams | None = None, launch: bool = False):
    """Run ``kernel`` once per logical core on fresh HBM copies of the arrays in
    ``args``/``kwargs`` with ``params`` (default: the calling thread's current options).
    ``launch``: resolve the degree as an ``nki.jit`` launch does (``launch_degree``).
    Returns (outputs, Context of core 0)."""
    fn, degree = _unwrap(kernel)
    if launch:
        degree = launch_degree(degree)
    kernel_rules.check_kernel(fn, args, kwargs)  # NKI 0.7 language rules (kernel_rules.py)
    params = params if params is not None else current().params
    grid = params.lnc_for(degree)
    with _one_torch_thread(), _plain_torch_modes():
        # the run's state (core 0's registers included) is made in the plain modes too
        run = Run(params, grid, bracketed=degree is not None)
        ctx = Context(run=run, program_id=0)
        push(ctx)
        try:
            region = MemoryRegion.shared_hbm if grid > 1 else MemoryRegion.private_hbm
            code = getattr(fn, "__code__", None)
            names = code.co_varnames[:code.co_argcount] if code else ()
            inputs = Inputs()
            wargs = [inputs.wrap(a, names[i] if i < len(names) else f"arg{i}", region)
                     for i, a in enumerate(args)]
            wkwargs = {k: inputs.wrap(v, k, region) for k, v in kwargs.items()}
            if grid == 1:
                ctx.in_kernel = True
                try:
                    result = fn(*wargs, **wkwargs)
                finally:
                    ctx.in_kernel = False
            else:
                result = _run_cores(run, fn, wargs, wkwargs)
            describe = _describer(run)
            _check_dynamic_flow(run)
            for core in run.cores:
                core.memory.check_capacity(describe)
            if run.races is not None:
                run.races.check(describe)
            outputs = inputs.outputs(result)
            inputs.copy_back()
            return outputs, ctx
        finally:
            pop(ctx)


def _run_cores(run: Run, fn, wargs, wkwargs):
    from .races import RaceTracker

    run.scheduler = Lockstep(run.grid)
    run.races = RaceTracker(run)
    contexts = [run.cores[0]] + [Context(run=run, program_id=p) for p in range(1, run.grid)]

    def body(pid):
        c = contexts[pid]
        push(c)
        c.in_kernel = True
        try:
            with _plain_torch_modes():      # this core's own thread: the same plain modes
                return fn(*wargs, **wkwargs)
        except BaseException as err:
            if isinstance(err, Exception) and run.grid > 1 and hasattr(err, "add_note"):
                err.add_note(f"(raised by core {pid} of the LNC={run.grid} launch)")
            raise
        finally:
            c.in_kernel = False
            pop(c)

    results = run.scheduler.run(body)
    if run.grid > 1:
        _check_lnc_outputs(results)
    return results[0]


def _check_lnc_outputs(results) -> None:
    """The cores of an LNC launch return one result: "the inputs and outputs of the kernel
    should be stored in the Shared HBM" (NKI LNC guide); nl.private_hbm is "only visible to
    each individual kernel instance". A private_hbm output, or cores that return different
    tensors, would leave all but core 0's result unseen."""
    from .memory import MemoryRegion
    from .tensor import NkiTensor

    def flat(r):
        return list(r) if isinstance(r, (tuple, list)) else [r]

    first = flat(results[0])
    for pid, r in enumerate(results):
        outs = flat(r)
        for i, t in enumerate(outs):
            if isinstance(t, NkiTensor) and t.buffer is MemoryRegion.private_hbm:
                raise NkiValidationError(
                    f"output {i} of core {pid} is in private_hbm; an LNC={len(results)} kernel's "
                    "outputs must be in nl.shared_hbm (the LNC guide), where both cores write one tensor")
        if len(outs) != len(first) or any(
                isinstance(a, NkiTensor) and (not isinstance(b, NkiTensor) or a._alloc is not b._alloc)
                for a, b in zip(first, outs)):
            raise NkiValidationError(
                f"core {pid} returns different outputs from core 0; the cores of an LNC launch "
                "return the same shared_hbm tensors")


def _check_dynamic_flow(run: Run) -> None:
    """The cores of a launch must take the same dynamic control flow (control.py)."""
    if len(run.cores) < 2:
        return
    flows = [c.dynamic_flow for c in run.cores]
    for k, steps in enumerate(zip(*flows)):
        if len(set(steps)) > 1:
            detail = "; ".join(f"core {c.program_id}: {c.dynamic_flow[k][0]} ran "
                               f"{c.dynamic_flow[k][1]} iterations" for c in run.cores)
            raise NkiValidationError(
                f"dynamic control flow differs between the cores at run-time loop #{k} "
                f"({detail}); AWS: \"if you use dynamic control flow, and this control-flow is "
                "different on the different cores, then the behavior is undefined\"")
    if len({len(f) for f in flows}) > 1:
        raise NkiValidationError(
            "dynamic control flow differs between the cores: they ran "
            f"{' and '.join(str(len(f)) for f in flows)} run-time loops (AWS: differing "
            "dynamic control flow between the cores is undefined behavior)")


def _describer(run: Run):
    def describe(i: int) -> str:
        try:
            ins = run.recorder.instructions[i]
        except IndexError:
            return f"#{i}"
        core = ins.attrs.get("core")
        return f"#{i} ({ins.op}{'' if core is None else f', core {core}'})"
    return describe
