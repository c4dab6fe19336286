"""The fuzz tier's bounded slice in the default suite: SLICE_CASES seeded random cases per op
on each CPU backend against float64 (the full tier: `make fuzz`, 1000 cases per op; see
tests/fuzz/__main__.py). A failure lists every failing case with its inputs and the one
line that reproduces it."""

from __future__ import annotations

import pytest

from .ops import OPS
from .runner import BACKENDS, format_failure, run_case

# A seed of its own, so the slice and `make fuzz` (seed 13) try different cases. 100 cases
# per op and backend: ~12 s on this 2-core CPU for all of them (measured).
SLICE_SEED = 2024
SLICE_CASES = 100


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
def test_fuzz_slice(op, backend):
    failures = [format_failure(r, SLICE_SEED) for r in
                (run_case(op, SLICE_SEED, i, backend) for i in range(SLICE_CASES)) if r.problem]
    assert not failures, f"{len(failures)} of {SLICE_CASES} cases failed:\n" + "\n".join(failures)
