"""Read a DMA engine's transfer cadence off a neuron-profile screenshot.

AWS's trn1 performance guide shows a profile of tiny (4 B) DMA transfers on all 16 DMA
engines (aws-neuron-sdk @72825d50 general/nki/img/nki_perf_guide/fig29.png, Opt #9:
"DMA engine empty gaps (due to DMA overhead) are taking up more time than active DMA
transfers"). Each engine is one row of marks; this script finds every transfer's start on
every row, takes the interval from each start to the next on the same engine, and prints
their histogram and the period it repeats at (measurements.toml
``dma.tiny_transfer_interval_trn1``).

A mark is a short vertical tick; a longer transfer is drawn as two such caps joined by a bar
on the row's centre lines and counts as one transfer. The defaults are fig29's geometry:
engine rows centred at y = 33 + 27.07 k, the time axis' gridlines at x = 350 (1,150,000 ns)
and x = 1300 (1,300,000 ns).

    python benchmarks/calibration/profile_intervals.py PATH/TO/fig29.png
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np

# fig29's geometry, measured on the image (1556 x 786 px)
FIG29 = {"first_row_y": 33.0, "row_pitch": 27.07, "rows": 16, "x0": 140, "x1": 1530,
         "grid": ((350, 1_150_000.0), (1300, 1_300_000.0))}
SATURATION = 60     # a mark's colour: max - min channel above this (grey grid and text are below)
TICK_ROWS = 5       # a column belongs to a tick when at least 5 of the row's 8 pixel lines are coloured
HARMONICS = 3       # the period is read from the histogram's first three peaks


def transfer_starts(colored: np.ndarray) -> list[int]:
    """The x of each transfer's first column in one engine row (``colored``: the row's 8 pixel
    lines x columns, True where a mark is)."""
    if colored.ndim != 2 or colored.shape[0] != 8:
        raise ValueError(f"colored.shape={colored.shape}: expected the row's 8 pixel lines x columns")
    tick = colored.sum(0) >= TICK_ROWS
    centre = colored[3:5].any(0)
    runs: list[list[int]] = []
    x, n = 0, tick.size
    while x < n:
        if not tick[x]:
            x += 1
            continue
        start = x
        while x < n and tick[x]:
            x += 1
        if runs and centre[runs[-1][1]:start].all():
            runs[-1][1] = x              # a cap of the transfer before: one wide transfer
        else:
            runs.append([start, x])
    return [a for a, _ in runs]


def intervals_px(rgb: np.ndarray, geometry: dict = FIG29) -> list[int]:
    """Start-to-start intervals, in pixels, of consecutive transfers on each engine row."""
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb.shape={rgb.shape}: expected height x width x 3")
    img = rgb.astype(int)
    colored = (img.max(2) - img.min(2)) > SATURATION
    out: list[int] = []
    for k in range(geometry["rows"]):
        y = int(round(geometry["first_row_y"] + geometry["row_pitch"] * k))
        if y - 4 < 0 or y + 4 > img.shape[0]:
            raise ValueError(f"engine row {k} at y={y} is outside the image's {img.shape[0]} lines")
        starts = transfer_starts(colored[y - 4:y + 4, geometry["x0"]:geometry["x1"]])
        out.extend(int(b - a) for a, b in zip(starts, starts[1:]))
    return out


def period_px(intervals: list[int]) -> float:
    """The cadence the intervals repeat at: the first peak m (the shortest interval whose
    count is a local maximum and at least half the largest count; a queue that skips a slot
    makes the peaks at 2m, 3m, which can be taller), then each of the first ``HARMONICS``
    peaks' centre (the weighted mean of the bins within +-1 px of k x m) divided by k,
    averaged."""
    if not intervals:
        raise ValueError("intervals is empty: no engine row had two transfers")
    hist = Counter(intervals)
    top = max(hist.values())
    mode = min(v for v in hist if 2 * hist[v] >= top
               and hist[v] >= hist.get(v - 1, 0) and hist[v] >= hist.get(v + 1, 0))
    estimates = []
    for k in range(1, HARMONICS + 1):
        bins = [v for v in range(round(k * mode) - 1, round(k * mode) + 2) if hist.get(v)]
        if bins:
            centre = sum(v * hist[v] for v in bins) / sum(hist[v] for v in bins)
            estimates.append(centre / k)
    return sum(estimates) / len(estimates)


def ns_per_px(geometry: dict = FIG29) -> float:
    (xa, ta), (xb, tb) = geometry["grid"]
    if xb == xa:
        raise ValueError(f"grid={geometry['grid']}: the two gridlines must be at different x")
    return (tb - ta) / (xb - xa)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image", help="the profile screenshot (fig29.png of the perf guide)")
    args = ap.parse_args(argv)
    from PIL import Image    # pillow (the dev extra); only this script reads images
    rgb = np.asarray(Image.open(args.image).convert("RGB"))
    iv = intervals_px(rgb)
    scale = ns_per_px()
    hist = Counter(iv)
    print(f"{len(iv)} start-to-start intervals on {FIG29['rows']} engines; {scale:.1f} ns per pixel")
    for v in range(0, 31):
        print(f"{v:3d} px {v * scale / 1000:5.2f} us {hist.get(v, 0):5d} {'#' * (hist.get(v, 0) // 2)}")
    per = period_px(iv)
    print(f"period {per:.2f} px = {per * scale / 1000:.2f} us; "
          f"intervals under 7 px: {sum(1 for v in iv if v < 7)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
