"""The state of the simulated NeuronCores: which options, which run, what is live.

Each thread has its own stack of ``Context`` objects (threading.local): ``activated()``
pushes one (for code that calls ``nl``/``nisa`` directly), every kernel run pushes a fresh
one. A ``Context`` is one physical core's view of a run: its program id, SBUF/PSUM
(``Memory``), engine accumulator registers and random generator; the ``Run`` it belongs
to holds what the cores of a logical core share: options, trace, shared HBM tensors and
the scheduler of an LNC=2 launch (interpreter.py runs each core in a thread of its own,
pushing that core's context). The ``nl``/``nisa`` functions act on ``current()``, the top
of the calling thread's stack; at the bottom of every thread's stack is a context with the
default ``SimParams``.
"""

from __future__ import annotations

import threading

import torch

from .errors import NkiValidationError
from .memory import Memory
from .params import SimParams
from .trace import Recorder


class Run:
    """What the cores of one logical core share during a run."""

    def __init__(self, params: SimParams, grid: int = 1, bracketed: bool = False):
        self.params = params
        self.target = params.target
        self.recorder = Recorder()
        self.grid = grid              # logical-core degree of the run (1 or 2)
        self.bracketed = bracketed    # launched as kernel[n] (nl.program_ndim() == 1)
        self.shared_hbm: list = []    # the shared_hbm tensors the kernel allocated, in order
        self.bound: dict = {}         # host storages bound by nl.NkiTensor: one allocation each
        self.cores: list[Context] = []
        self.scheduler = None         # interpreter.Lockstep for a concurrent LNC=2 run
        self.races = None             # races.RaceTracker for an LNC=2 run


class Context:
    """One physical core of a run: program id, memory, registers, random generator."""

    def __init__(self, params: SimParams | None = None, grid: int = 1, bracketed: bool = False,
                 run: Run | None = None, program_id: int = 0):
        if run is None:
            run = Run(params if params is not None else SimParams(), grid, bracketed)
        self.run = run
        self.params = run.params
        self.target = run.target
        self.recorder = run.recorder
        self.program_id = program_id
        self.memory = Memory(self.target, self.params.poison_float, self.params.poison_int,
                             core=program_id)
        self.in_kernel = False
        # 128 per-lane accumulators of ScalarE (activation) and VectorE (select_reduce,
        # tensor_scalar_reduce, ...). Poisoned with NaN: hardware leaves them undefined.
        self.scalar_regs = torch.full((self.target.partitions,), float("nan"))
        self.vector_regs = torch.full((self.target.partitions,), float("nan"))
        self.shared_cursor = 0
        self.dynamic_flow: list = []  # (loop kind, trip count) of run-time loops, in order
        # the nl.sequential_range iterations the kernel is in, outermost first: (loop, iteration)
        self.sequential_iterations: list[tuple[int, int]] = []
        self.sequential_loops_seen = 0
        self.no_reorder_depth = 0     # nested nl.no_reorder() blocks open on this core
        # each core's engines have their own random state; core 0 starts from the seed (core
        # 1 from the next 64-bit seed, wrapping: SimParams allows any seed below 2**64)
        self.generator = torch.Generator().manual_seed((self.params.seed + program_id) % (1 << 64))
        run.cores.append(self)

    @property
    def grid(self) -> int:
        return self.run.grid

    @property
    def bracketed(self) -> bool:
        return self.run.bracketed

    @property
    def shared_hbm(self) -> list:
        return self.run.shared_hbm

    def shared_hbm_tensor(self, shape, dtype, region, name, fill):
        """This core's next shared_hbm allocation: the same tensor as the other core's
        allocation of the same rank (created by whichever core gets there first)."""
        i = self.shared_cursor
        self.shared_cursor += 1
        shared = self.run.shared_hbm
        if i < len(shared):
            alloc = shared[i]
            if alloc.shape != tuple(shape) or alloc.dtype != dtype:
                raise NkiValidationError(
                    f"ndarray: core {self.program_id}'s shared_hbm tensor #{i} {tuple(shape)} "
                    f"{dtype.name} differs from core {alloc.core}'s {alloc.shape} "
                    f"{alloc.dtype.name} (both cores must allocate the same shared tensors)")
            return alloc
        alloc = self.memory.allocate(shape, dtype, region, name, fill)
        shared.append(alloc)
        return alloc


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
