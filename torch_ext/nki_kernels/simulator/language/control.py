"""``nki.language`` indexing, loops, launch grid and ``device_print``.

Beta-2 loops are ordinary Python loops at specialisation time, so the simulator runs them as
``range``; ``fori_loop``/``while_loop`` (and ``dynamic_range`` with a register bound) pass a
``VirtualRegister`` like the hardware loops.

Loops whose trip count is only known at run time (``fori_loop``, ``while_loop``, and the
deprecated ``dynamic_range`` with a register bound) are dynamic control flow: each core of an
LNC=2 launch records its trip counts, and the run checks the cores agree ("if you use dynamic
control flow, and this control-flow is different on the different cores, then the behavior
is undefined", Using Logical NeuronCores). Control flow fixed when the kernel is specialised
(Python ``if nl.program_id(0) == 0:``) may differ: each core is specialised on its own.
"""

from __future__ import annotations

import contextlib
import numbers
import operator

from .. import isa as _isa
from ..context import current
from ..errors import NkiValidationError
from ..memory import MemoryRegion
from ..tensor import NkiTensor
from ..tensor_views import DynamicSlice


def ds(start, size):
    """Dynamic slice ``start:start+size`` for indexing."""
    return DynamicSlice(start, size)


def _range(start, stop=None, step=1):
    if stop is None:
        return range(operator.index(start))
    return range(operator.index(start), operator.index(stop), operator.index(step))


affine_range = _range
static_range = _range


class sequential_range:
    """``nl.sequential_range``: in NKI 0.7 a deprecated alias of ``range`` (the same
    iterations, the same meaning to the compiler). The simulator also marks every instruction
    issued in an iteration (``attrs["sequential"]``: (loop, iteration) pairs, outermost
    first) so that the cost model can give ports of beta-1 kernels the beta-1 compiler's
    meaning of the loop (hardware.py ``Target.beta1_sequential_loops``); nothing else reads
    the marks. Our kernels may not use it (tests/kernels/test_language_rules.py)."""

    def __init__(self, start, stop=None, step=1):
        self._range = _range(start, stop, step)

    def __len__(self):
        return len(self._range)

    def __getitem__(self, i):
        # as range's: an index, or a slice as another (marked) sequential_range
        got = self._range[i]
        return sequential_range(got.start, got.stop, got.step) if isinstance(got, range) else got

    def __contains__(self, value):
        return value in self._range

    def __iter__(self):
        return self._marked(self._range)

    def __reversed__(self):
        return self._marked(reversed(self._range))

    def _marked(self, values):
        ctx = current()
        loop = ctx.sequential_loops_seen
        ctx.sequential_loops_seen += 1
        for k, i in enumerate(values):
            ctx.sequential_iterations.append((loop, k))
            try:
                yield i
            finally:
                ctx.sequential_iterations.pop()


def _dynamic(kind: str, count: int) -> None:
    """Record a dynamic loop's trip count for the cross-core check (interpreter.py)."""
    current().dynamic_flow.append((kind, count))


def _check_step(what: str, step) -> None:
    # "step: step size, must be a compile-time positive integer (not VirtualRegister)"
    # (nl.dynamic_range, NKI 0.7)
    if (isinstance(step, (bool, _isa.VirtualRegister)) or not isinstance(step, numbers.Integral)
            or step < 1):
        raise NkiValidationError(f"{what}: step={step!r} must be a compile-time positive int "
                                 "(not a register)")


def _no_dynamic_loop_in_no_reorder(what: str) -> None:
    # "Register-based dynamic loops (nl.fori_loop, nl.while_loop) are not supported inside a
    # no_reorder block" (nl.no_reorder, NKI 0.7)
    if current().no_reorder_depth:
        raise NkiValidationError(f"{what}: a register-based dynamic loop is not supported inside "
                                 "an nl.no_reorder() block")


def dynamic_range(start, stop=None, step=1):
    """Python ints for compile-time bounds (the v2.33 page: "an iterator yielding integer
    values"); with a register bound, the run-time loop's variable is a register ("The loop
    variable is a device register, not a Python int", the dynamic-loops deep dive; as
    fori_loop's ``i`` "will be a VirtualRegister" when a bound is one), so host-side uses of
    it (``if i == 0:``) are refused and ``t[i]`` reads it when the instruction runs."""
    _check_step("dynamic_range", step)
    r = _range(start, stop, step)
    if any(isinstance(b, _isa.VirtualRegister) for b in (start, stop)):
        _no_dynamic_loop_in_no_reorder("dynamic_range")
        _dynamic("dynamic_range", len(r))
        return (_isa.VirtualRegister(i) for i in r)
    return r


def fori_loop(lower, upper, body_fun, step=1):
    _check_step("fori_loop", step)
    _no_dynamic_loop_in_no_reorder("fori_loop")
    r = range(operator.index(lower), operator.index(upper), operator.index(step))
    _dynamic("fori_loop", len(r))
    for i in r:
        body_fun(_isa.VirtualRegister(i))


def while_loop(init, body_fun):
    _no_dynamic_loop_in_no_reorder("while_loop")
    r = init
    n = 0
    while int(r) != 0:
        r = body_fun(r)
        n += 1
    _dynamic("while_loop", n)


@contextlib.contextmanager
def no_reorder():
    # the simulator executes in program order anyway; the block only refuses dynamic loops
    ctx = current()
    ctx.no_reorder_depth += 1
    try:
        yield
    finally:
        ctx.no_reorder_depth -= 1


def program_id(axis=0):
    if axis != 0:
        raise NkiValidationError(f"program_id: axis {axis}; beta-2 grids have only axis 0")
    return current().program_id


def num_programs(axes=0):
    if axes not in (0, None, (0,), [0]):
        raise NkiValidationError(f"num_programs: axes {axes}; beta-2 grids have only axis 0")
    return current().grid


def program_ndim():
    return 1 if current().bracketed else 0


def device_print(print_prefix, tensor):
    """Print ``print_prefix`` and the tensor's values now ("In CPU simulation, this prints
    immediately to stdout"). The v2.33 docstring: print_prefix "must be a constant string",
    tensor an NkiTensor that "Can be in SBUF or HBM"."""
    if not isinstance(print_prefix, str):
        raise NkiValidationError(f"device_print: print_prefix={print_prefix!r} must be a constant string")
    if not isinstance(tensor, NkiTensor):
        raise NkiValidationError(f"device_print: tensor must be an NKI tensor, got {type(tensor).__name__}")
    if tensor.buffer is MemoryRegion.psum:
        raise NkiValidationError("device_print: tensor is in PSUM; it can be in SBUF or HBM (copy it "
                                 "to SBUF first)")
    print(print_prefix, tensor.values().clone())
