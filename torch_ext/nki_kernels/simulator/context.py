"""The state of the simulated NeuronCore: which options, which run, what is live.

Each thread has its own stack of ``Context`` objects (threading.local): ``activated()``
pushes one (for code that calls ``nl``/``nisa`` directly), every kernel run pushes a fresh
one (its own trace, memory accounting, engine registers and random generator). The
``nl``/``nisa`` functions act on ``current()``, the top of the calling thread's stack; at
the bottom of every thread's stack is a context with the default ``SimParams``.
"""

from __future__ import annotations

import threading

import torch

from .memory import Memory
from .params import SimParams
from .trace import Recorder


class Context:
    """One simulated run: options, trace, memory, engine accumulator registers, grid."""

    def __init__(self, params: SimParams | None = None, grid: int = 1, bracketed: bool = False):
        self.params = params if params is not None else SimParams()
        self.target = self.params.target
        self.recorder = Recorder()
        self.memory = Memory(self.target, self.params.poison_float, self.params.poison_int)
        self.grid = grid              # logical-core degree of the run (1 or 2)
        self.bracketed = bracketed    # launched as kernel[n] (nl.program_ndim() == 1)
        self.program_id = 0
        self.in_kernel = False
        # 128 per-lane accumulators of ScalarE (activation) and VectorE (select_reduce,
        # tensor_scalar_reduce, ...). Poisoned with NaN: hardware leaves them undefined.
        self.scalar_regs = torch.full((self.target.partitions,), float("nan"))
        self.vector_regs = torch.full((self.target.partitions,), float("nan"))
        # kernel[2]: the n-th shared_hbm allocation of every core is the same tensor.
        self.shared_hbm: list = []
        self.shared_cursor = 0
        self.generator = torch.Generator().manual_seed(self.params.seed)


_local = threading.local()


def _stack() -> list[Context]:
    try:
        return _local.stack
    except AttributeError:
        _local.stack = [Context()]
        return _local.stack


def current() -> Context:
    """The innermost context of the calling thread."""
    try:
        return _local.stack[-1]
    except AttributeError:
        return _stack()[-1]


def push(ctx: Context) -> None:
    _stack().append(ctx)


def pop(ctx: Context) -> None:
    stack = _stack()
    if stack[-1] is not ctx:
        raise RuntimeError("simulator context stack corrupted (contexts exited out of order "
                           "in one thread)")
    stack.pop()
