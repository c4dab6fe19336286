"""Ops called from several threads at once (a data-loader thread, a serving thread pool)
give each caller its own correct result, on both CPU backends."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import nki_kernels
from nki_kernels import references
from tests._helpers import TOLERANCES

THREADS = 4


def _calls(seed: int):
    """A few ops on fresh inputs; each returns (result, float64 reference, dtype)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 96, generator=g).to(torch.bfloat16)
    w = torch.randn(96, generator=g)
    q = torch.randn(1, 2, 19, 32, generator=g)
    k = torch.randn(1, 2, 23, 32, generator=g)
    v = torch.randn(1, 2, 23, 32, generator=g)
    return [
        lambda: (nki_kernels.gelu(x), references.gelu(x.double(), compute_dtype=torch.float64), x.dtype),
        lambda: (nki_kernels.rms_norm(x, (96,), w.to(x.dtype), 1e-6),
                 references.rms_norm(x.double(), (96,), w.to(x.dtype).double(), 1e-6, compute_dtype=torch.float64),
                 x.dtype),
        lambda: (nki_kernels.softmax(x, dim=-1), references.softmax(x.double(), -1, compute_dtype=torch.float64),
                 x.dtype),
        lambda: (nki_kernels.scaled_dot_product_attention(q, k, v),
                 references.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                         compute_dtype=torch.float64), q.dtype),
    ]


def _work(seed: int):
    return [call() for call in _calls(seed)]


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_ops_from_several_threads(monkeypatch, backend):
    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)
    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(_work, range(THREADS * 2)))   # 8 jobs, 4 at a time
    for per_thread in results:
        for out, expected, dtype in per_thread:
            atol, rtol = TOLERANCES[dtype]
            torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)


# Every op of the registry, from several threads at once: the fuzz tier's seeded cases (odd
# shapes, every dtype, masks, views), each checked against float64 with its derived bound.
THREAD_SEED = 7
CASES_PER_OP = 4


@pytest.mark.parametrize("backend", ["reference", "simulator"])
def test_every_op_from_several_threads(monkeypatch, backend):
    from tests.fuzz.ops import OPS
    from tests.fuzz.runner import build, check, reproduction

    monkeypatch.setenv("NKI_KERNELS_CPU_BACKEND", backend)

    def job(op_index):
        op, index = op_index
        args, kwargs, desc = build(op, THREAD_SEED, index)
        problem = check(op, args, kwargs, OPS[op].run(args, kwargs), backend)
        return None if problem is None else f"{op} [{desc}]: {problem}\n  {reproduction(op, THREAD_SEED, index, backend)}"

    jobs = [(op, i) for i in range(CASES_PER_OP) for op in OPS]     # ops interleaved
    with ThreadPoolExecutor(THREADS) as pool:
        problems = [p for p in pool.map(job, jobs) if p]
    assert not problems, "\n".join(problems)
