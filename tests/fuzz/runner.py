"""Run fuzz cases: rebuild a case from (op, seed, index), run it on a CPU backend, compare
with the float64 oracle, and say how to reproduce a failure in one line."""

from __future__ import annotations

import os
import time
import traceback
import zlib
from dataclasses import dataclass

import torch

from .ops import OPS
from .tolerance import compare
from .values import DTYPE_NAMES, Draw

BACKENDS = ("reference", "simulator")
BACKEND_ENV = "NKI_KERNELS_CPU_BACKEND"


def case_seed(op: str, seed: int, index: int) -> int:
    """The seed of case ``index`` of ``op`` in run ``seed`` (stable across processes)."""
    return zlib.crc32(f"{op}:{seed}:{index}".encode())


def build(op: str, seed: int, index: int):
    """(args, kwargs, description) of one case, rebuilt bit for bit."""
    draw = Draw(case_seed(op, seed, index))
    args, kwargs = OPS[op].generate(draw)
    return args, kwargs, describe(args, kwargs, draw.notes)


def describe(args, kwargs, notes) -> str:
    def one(x):
        if isinstance(x, torch.Tensor):
            tag = DTYPE_NAMES.get(x.dtype, str(x.dtype).removeprefix("torch."))
            view = "" if x.is_contiguous() else " view"
            return f"{tag}{list(x.shape)}{view}"
        return repr(x)
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) + (f"  [{'; '.join(notes)}]" if notes else "")


def reproduction(op: str, seed: int, index: int, backend: str) -> str:
    return f".venv/bin/python -m tests.fuzz --op {op} --seed {seed} --case {index} --backend {backend}"


@dataclass
class Result:
    op: str
    index: int
    backend: str
    problem: str | None       # None: within the bounds
    description: str
    seconds: float


def run_case(op: str, seed: int, index: int, backend: str) -> Result:
    """One case on one backend (sets NKI_KERNELS_CPU_BACKEND for the call)."""
    spec = OPS[op]
    try:
        args, kwargs, desc = build(op, seed, index)
    except Exception as err:          # a bug of the generator: reported like a failure
        return Result(op, index, backend, f"generator raised {type(err).__name__}: {err}", "?", 0.0)
    previous = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = backend
    t0 = time.perf_counter()
    try:
        outs = spec.run(args, kwargs)
        problem = None
    except Exception as err:          # an error on valid input is a failure too
        outs, problem = None, f"raised {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}"
    finally:
        seconds = time.perf_counter() - t0
        if previous is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = previous
    if problem is None:
        try:
            problem = check(op, args, kwargs, outs, backend)
        except Exception as err:      # a bug of the oracle or the bounds
            problem = f"check raised {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}"
    return Result(op, index, backend, problem, desc, seconds)


def run_cases(op: str, seed: int, lo: int, hi: int, backend: str) -> list[Result]:
    """Cases lo..hi-1 of ``op`` on ``backend`` (a worker process's task)."""
    return [run_case(op, seed, i, backend) for i in range(lo, hi)]


def init_worker() -> None:
    """A worker process computes with one torch thread (two workers share two cores)."""
    torch.set_num_threads(1)


def check(op: str, args, kwargs, outs, backend: str = "simulator") -> str | None:
    """None if every output is within the op's bound (on ``backend``) of the float64 oracle."""
    spec = OPS[op]
    exact = spec.oracle(args, kwargs)
    bounds = spec.bounds(args, kwargs, exact, backend) if spec.per_backend else spec.bounds(args, kwargs, exact)
    if len(outs) != len(exact):
        return f"{len(outs)} outputs, expected {len(exact)}"
    dtype = next(a for a in args if isinstance(a, torch.Tensor)).dtype
    for i, (out, want, bound) in enumerate(zip(outs, exact, bounds)):
        name = f"output {i}" if len(outs) > 1 else "output"
        if out.dtype != dtype:
            return f"{name}: dtype {out.dtype}, expected {dtype}"
        if bound is None:             # defined bit for bit
            if out.shape != want.shape or not torch.equal(
                    torch.nan_to_num(out.double(), nan=0.125), torch.nan_to_num(want.to(dtype).double(), nan=0.125)):
                return f"{name}: not equal to the oracle rounded to {dtype}"
            continue
        problem = compare(out, want, bound, name)
        if problem:
            return problem
    return None


def format_failure(result: Result, seed: int) -> str:
    return (f"FAIL {result.op} case {result.index} on {result.backend}: {result.problem}\n"
            f"     inputs: {result.description}\n"
            f"     reproduce: {reproduction(result.op, seed, result.index, result.backend)}")
