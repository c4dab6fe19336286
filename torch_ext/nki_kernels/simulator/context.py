"""The state of the simulated NeuronCore: which target, which run, what is live.

A stack of ``Context`` objects: ``activated()`` pushes one (for code that calls ``nl``/
``nisa`` directly), every kernel run pushes a fresh one (its own trace, memory accounting
and engine registers). The ``nl``/``nisa`` functions always act on ``current()``.
"""

from __future__ import annotations

import torch

from .hardware import DEFAULT_TARGET, Target, get_target
from .trace import Recorder


class Context:
    """One simulated run: target, trace, memory, engine accumulator registers, grid."""

    def __init__(self, target: str | Target = DEFAULT_TARGET, grid: int = 1, bracketed: bool = False):
        from .memory import Memory  # memory imports context for current(); avoid a cycle

        self.target: Target = get_target(target)
        self.recorder = Recorder()
        self.memory = Memory(self.target)
        self.grid = grid
        self.bracketed = bracketed
        self.program_id = 0
        self.in_kernel = False
        # 128 per-lane accumulators of ScalarE (activation) and VectorE (select_reduce,
        # tensor_scalar_reduce, ...). Poisoned with NaN: hardware leaves them undefined.
        self.scalar_regs = torch.full((self.target.partitions,), float("nan"))
        self.vector_regs = torch.full((self.target.partitions,), float("nan"))
        # kernel[2]: the n-th shared_hbm allocation of every core is the same tensor.
        self.shared_hbm: list = []
        self.shared_cursor = 0
        self.generator = torch.Generator().manual_seed(0)


_stack: list[Context] = [Context()]


def current() -> Context:
    return _stack[-1]


def push(ctx: Context) -> None:
    _stack.append(ctx)


def pop(ctx: Context) -> None:
    if _stack[-1] is not ctx:
        raise RuntimeError("simulator context stack corrupted (contexts exited out of order)")
    _stack.pop()
