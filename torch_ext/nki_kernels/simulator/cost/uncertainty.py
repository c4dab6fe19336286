"""Error bars: the model at the optimistic and the pessimistic end of its uncertain numbers.

A modeled time rests on a few numbers the public record pins down only to a range (the
per-instruction overhead, the DMA latency and transfer gap, the achieved DMA bandwidth,
TensorE's pipeline latency, how many buffers the compiler rotates). ``Target.cost_ranges`` lists each with its optimistic and its
pessimistic value and their sources (simulator/hardware.py). Every one of them moves a
kernel's modeled time in one direction only, so the whole range of the model is spanned by
two re-schedules of the same trace: every number at its optimistic end (the low time) and
every number at its pessimistic end (the high time). The central time is the model as is.

    est = simulator.estimate(kernel, target="trn2")(x)
    low, high = time_range(est)          # modeled us at both ends (low <= est.latency_us <= high)

The parameter ranges alone do not hold what hardware measures: against public whole-kernel
latencies (benchmarks/calibrate.py) the model also errs in ways no listed number explains
(work the compiler adds, engines' behaviour the documents do not describe). So ``time_range``
widens both ends by ``Target.model_error_band`` (low x band[0], high x band[1]), the factors
fitted on hardware measurements' train rows so that 90 % of them fall inside; the held-out
rows report how many do (docs/cost-model.md "Error bars").

A speedup over a baseline is then ``baseline / high`` at the low end and ``baseline / low``
at the high end: a kernel is claimed faster only when the low end clears 1 (or the target).
"""

from __future__ import annotations

import dataclasses

from ..hardware import Target, get_target

ENDS = ("optimistic", "pessimistic")
_SCALE = "_scale"


def variant(target: str | Target, end: str) -> Target:
    """``target`` with every ``cost_ranges`` number at its ``end`` ("optimistic" or
    "pessimistic"). A name ending in ``_scale`` multiplies the field it names."""
    if end not in ENDS:
        raise ValueError(f"end={end!r}; expected one of {ENDS}")
    tgt = get_target(target)
    changes = {}
    for name, optimistic, pessimistic in tgt.cost_ranges:
        value = optimistic if end == "optimistic" else pessimistic
        field = name.removesuffix(_SCALE)
        if not hasattr(tgt, field):
            raise ValueError(f"cost_ranges of {tgt.name} names {name!r}: Target has no field {field!r}")
        current = getattr(tgt, field)
        if name.endswith(_SCALE):
            value = current * value
        elif isinstance(current, bool):
            value = bool(value)
        elif isinstance(current, int):
            value = int(value)
        changes[field] = value
    return dataclasses.replace(tgt, **changes)


def end_latencies(est, target: str | Target | None = None) -> dict[str, float]:
    """{end: modeled latency in us} of an ``Estimate``'s trace re-scheduled with every
    uncertain number at that end ("optimistic", "pessimistic"), as scheduled (not clamped
    to the central value)."""
    from .estimate import estimate_trace  # estimate.py imports nothing from here
    from .schedule import conflicts, dependencies

    if est.trace is None:
        raise ValueError("this Estimate kept no trace to re-schedule")
    tgt = get_target(target if target is not None else est.target)
    # the trace's conflicts hold at both ends: the central schedule's, else walked once here
    found = est.schedule.conflicts if est.schedule is not None else None
    found = found or conflicts(est.trace, est.allocations)
    out = {}
    for end in ENDS:
        at_end = variant(tgt, end)
        preds = dependencies(est.trace, at_end, est.allocations, found)
        out[end] = estimate_trace(est.trace, at_end, allocations=est.allocations, preds=preds).latency_us
    return out


def widened(low: float, high: float, target: str | Target) -> tuple[float, float]:
    """(low, high) widened by the target's model-error band: what the model cannot say."""
    band = get_target(target).model_error_band
    return low * band[0], high * band[1]


def time_range(est, target: str | Target | None = None, ends: dict[str, float] | None = None) -> tuple[float, float]:
    """(low, high) modeled latency in us of an ``Estimate``'s trace: re-scheduled with every
    uncertain number at its optimistic and at its pessimistic end (``ends``: the
    end_latencies already computed for it), then widened by the model-error band."""
    if ends is None:
        ends = end_latencies(est, target)
    # list scheduling can, rarely, finish a little later with less work (a different
    # order): the range always contains the central value
    low, high = min(ends["optimistic"], est.latency_us), max(ends["pessimistic"], est.latency_us)
    return widened(low, high, target if target is not None else est.target)
