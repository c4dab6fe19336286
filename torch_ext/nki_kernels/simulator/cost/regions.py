"""Which elements of an allocation an operand touches, for dependency tracking.

An operand is a strided view of one allocation. Its exact footprint is a set of
contiguous runs of element offsets: the innermost contiguous dimensions form one run,
the outer dimensions repeat it. Two accesses conflict when a run of one overlaps a run of
the other. When the trace gives no ``offset``/``strides`` (older trace records), or the
view would need more than ``MAX_RUNS`` runs, the footprint falls back to the hull
``span = [first, last + 1)``, which can only add (never lose) dependencies.
"""

from __future__ import annotations

import numpy as np

MAX_RUNS = 4096


class Region:
    """Sorted, disjoint ``[start, end)`` runs of element offsets plus their hull.

    A view with one strided dimension over contiguous runs (a 2-D tile or HBM slice, the
    common case) also keeps that pattern, ``runs = [lo + k * stride, lo + k * stride + run)``
    for ``k < count``: two such regions with the same stride are compared in closed form."""

    __slots__ = ("lo", "hi", "starts", "ends", "pattern")

    def __init__(self, lo: int, hi: int, starts=None, ends=None, pattern=None):
        self.lo = lo
        self.hi = hi
        self.starts = starts  # None: a single run [lo, hi)
        self.ends = ends
        self.pattern = pattern  # (stride, count, run) of a regular region, else None

    @property
    def single(self) -> bool:
        return self.starts is None

    def covers(self, other: "Region") -> bool:
        """True if every element of ``other`` is in ``self`` (conservative: hull test for runs)."""
        if self.single:
            return self.lo <= other.lo and other.hi <= self.hi
        if other.single:
            i = np.searchsorted(self.ends, other.lo, side="right")
            return i < len(self.starts) and self.starts[i] <= other.lo and other.hi <= self.ends[i]
        return False

    def overlaps(self, other: "Region") -> bool:
        if self.hi <= other.lo or other.hi <= self.lo:
            return False
        if self.single and other.single:
            return True
        a, b = self.pattern, other.pattern
        if a is not None and b is not None and a[0] == b[0]:
            # runs [lo1 + k S, + r1) and [lo2 + j S, + r2) meet iff some m = k - j with
            # d - r1 < m S < d + r2 (d = lo2 - lo1), -(c2 - 1) <= m <= c1 - 1
            stride, c1, r1 = a
            _, c2, r2 = b
            d = other.lo - self.lo
            m_lo = max(-(c2 - 1), (d - r1) // stride + 1)
            m_hi = min(c1 - 1, -((-(d + r2)) // stride) - 1)
            return m_lo <= m_hi
        a, b = (self, other) if not self.single else (other, self)
        # a has runs; test b's runs (or b's single run) against a's sorted runs.
        if b.single:
            b_starts = np.array([b.lo], dtype=np.int64)
            b_ends = np.array([b.hi], dtype=np.int64)
        else:
            b_starts, b_ends = b.starts, b.ends
        j = np.searchsorted(a.ends, b_starts, side="right")  # first run of a ending after each b start
        ok = j < len(a.starts)
        if not ok.any():
            return False
        return bool(np.any(a.starts[j[ok]] < b_ends[ok]))


def region_of(operand) -> Region:
    """The footprint of ``operand`` in its allocation."""
    lo, hi = operand.span
    strides = getattr(operand, "strides", None)
    offset = getattr(operand, "offset", None)
    shape = operand.shape
    if not strides or offset is None or len(strides) != len(shape):
        return Region(lo, hi)
    dims = [(s, st) for s, st in zip(shape, strides) if s != 1]
    if any(s == 0 for s in shape):
        return Region(lo, lo)
    if any(st <= 0 for _, st in dims):
        return Region(lo, hi)  # broadcast (stride 0) or negative strides: hull
    dims.sort(key=lambda d: d[1], reverse=True)
    # Merge the innermost dimensions into one contiguous run while they nest exactly.
    run = 1
    while dims and dims[-1][1] == run:
        size, _ = dims.pop()
        run *= size
    if not dims:
        return Region(offset, offset + run)
    count = 1
    for size, _ in dims:
        count *= size
    if count > MAX_RUNS:
        return Region(lo, hi)
    if len(dims) == 1 and dims[0][1] >= run:
        count, stride = dims[0]
        starts = offset + np.arange(count, dtype=np.int64) * stride
        return Region(offset, offset + (count - 1) * stride + run, starts, starts + run,
                      pattern=(stride, count, run))
    starts = np.full(1, offset, dtype=np.int64)
    for size, st in dims:
        starts = (starts[:, None] + np.arange(size, dtype=np.int64)[None, :] * st).reshape(-1)
    starts.sort()
    ends = starts + run
    # Runs of a strided view never overlap each other unless strides alias; merge touching
    # or overlapping runs so the searchsorted tests stay exact.
    if len(starts) > 1 and np.any(starts[1:] <= ends[:-1]):
        merged_s, merged_e = [int(starts[0])], [int(ends[0])]
        for s, e in zip(starts[1:].tolist(), ends[1:].tolist()):
            if s <= merged_e[-1]:
                merged_e[-1] = max(merged_e[-1], e)
            else:
                merged_s.append(s)
                merged_e.append(e)
        starts = np.array(merged_s, dtype=np.int64)
        ends = np.array(merged_e, dtype=np.int64)
    if len(starts) == 1:
        return Region(int(starts[0]), int(ends[0]))
    return Region(int(starts[0]), int(ends[-1]), starts, ends)
