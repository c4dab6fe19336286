"""Helpers shared by the test modules (imported as ``from tests._helpers import ...``)."""

from __future__ import annotations

import contextlib

import torch

# (atol, rtol) per dtype, and why:
# * float32: engines compute in fp32; errors come from fp32 rounding of a few operations
#   and ScalarE transcendentals, ~1e-6 relative -> 1e-5 / 1e-4 as peers use.
# * bfloat16: 8 significant bits; one final rounding is <= 2**-8 = 3.9e-3 relative, and a
#   bf16 input rounding feeds through -> 2e-2 as peers use for bf16 kernels.
# * float16: 11 significant bits, rounding <= 2**-11 -> 2e-3 / 2e-3 with the same margin.
TOLERANCES = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64."""
    a, e = actual.double(), expected.double()
    return float((a - e).norm() / e.norm().clamp_min(1e-300))


def _elements(operand) -> set[int]:
    """The element offsets an HBM operand covers in its allocation."""
    idx = torch.tensor([operand.offset])
    for size, stride in zip(operand.shape, operand.strides):
        idx = (idx[:, None] + torch.arange(size)[None, :] * stride).reshape(-1)
    return set(idx.tolist())


def hbm_races(trace) -> list[str]:
    """Races between the cores of a kernel[2] trace: HBM elements written by both cores, or
    written by one core and read by the other (``[]`` when there are none)."""
    written = {0: {}, 1: {}}
    read = {0: {}, 1: {}}
    for ins in trace:
        core = ins.attrs.get("core")
        if core not in (0, 1):
            continue
        for ops, acc in ((ins.writes, written), (ins.reads, read)):
            for o in ops:
                if o.buffer == "hbm":
                    acc[core].setdefault(o.alloc_id, set()).update(_elements(o))
    races = []
    for alloc in set(written[0]) | set(written[1]):
        w0, w1 = written[0].get(alloc, set()), written[1].get(alloc, set())
        if w0 & w1:
            races.append(f"allocation {alloc}: {len(w0 & w1)} elements written by both cores")
        for a, b in ((0, 1), (1, 0)):
            crossed = written[a].get(alloc, set()) & read[b].get(alloc, set())
            if crossed:
                races.append(f"allocation {alloc}: {len(crossed)} elements core {a} writes and core {b} reads")
    return races


def attention_registries() -> dict[str, dict]:
    """transformers' process-wide attention registries, by name: the class-wide name ->
    function tables of AttentionInterface and AttentionMaskInterface (``register`` writes
    there) and the local tables of their module instances ALL_ATTENTION_FUNCTIONS and
    ALL_MASK_ATTENTION_FUNCTIONS (item assignment writes there)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return {"AttentionInterface": AttentionInterface._global_mapping,
            "AttentionMaskInterface": AttentionMaskInterface._global_mapping,
            "ALL_ATTENTION_FUNCTIONS (local)": ALL_ATTENTION_FUNCTIONS._local_mapping,
            "ALL_MASK_ATTENTION_FUNCTIONS (local)": ALL_MASK_ATTENTION_FUNCTIONS._local_mapping}


@contextlib.contextmanager
def attention_registries_restored():
    """Register attention functions inside this block; on leaving it, transformers'
    registries (``attention_registries``) hold exactly what they held before, restored in
    place (every instance reads the class-wide tables)."""
    saved = [(table, dict(table)) for table in attention_registries().values()]
    try:
        yield
    finally:
        for table, before in saved:
            table.clear()
            table.update(before)
