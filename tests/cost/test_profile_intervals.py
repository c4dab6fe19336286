"""benchmarks/calibration/profile_intervals.py: reading a DMA engine's cadence off a profile
screenshot (the trn1 row dma.tiny_transfer_interval_trn1). Checked on images drawn here with
fig29's geometry, where the transfers' starts are known."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cost.conftest import load_script


@pytest.fixture(scope="module")
def pi():
    return load_script("benchmarks/calibration/profile_intervals.py")


def _draw(pi, starts_per_row, wide=()):
    """A white 786 x 1556 image with a red tick (2 px wide, the row's 8 lines) at each start,
    and each (row, x0, x1) of ``wide`` drawn as two caps joined by a bar on the centre lines."""
    g = pi.FIG29
    img = np.full((786, 1556, 3), 255, dtype=np.uint8)
    red = (200, 20, 60)
    for k, starts in enumerate(starts_per_row):
        y = int(round(g["first_row_y"] + g["row_pitch"] * k))
        for x in starts:
            img[y - 4:y + 4, g["x0"] + x:g["x0"] + x + 2] = red
    for k, x0, x1 in wide:
        y = int(round(g["first_row_y"] + g["row_pitch"] * k))
        img[y - 4:y + 4, g["x0"] + x0:g["x0"] + x0 + 2] = red
        img[y - 4:y + 4, g["x0"] + x1 - 2:g["x0"] + x1] = red
        img[y - 1:y + 1, g["x0"] + x0:g["x0"] + x1] = red
    return img


def test_intervals_and_period_of_a_drawn_cadence(pi):
    rng = np.random.default_rng(7)
    period = 8
    rows = []
    for _ in range(16):
        # a queued stream: mostly one slot apart, some slots skipped (two or three periods)
        steps = rng.choice([period, 2 * period, 3 * period], size=60, p=[0.4, 0.45, 0.15])
        rows.append(list(int(rng.integers(0, 6)) + np.cumsum(steps) - steps[0]))
    rows = [[x for x in r if x < 1380] for r in rows]
    iv = pi.intervals_px(_draw(pi, rows))
    expected = [b - a for r in rows for a, b in zip(r, r[1:])]
    assert sorted(iv) == sorted(expected)
    # the second peak is the tallest here; the period is still the first
    assert abs(pi.period_px(iv) - period) < 0.05


def test_a_wide_transfer_counts_once(pi):
    rows = [[] for _ in range(16)]
    rows[3] = [10, 40]
    iv = pi.intervals_px(_draw(pi, rows, wide=[(3, 60, 75)]))
    # starts 10, 40 and the wide transfer's 60: two intervals, not three
    assert sorted(iv) == [20, 30]


def test_scale_is_fig29_s_axis(pi):
    assert pi.ns_per_px() == pytest.approx(150_000 / 950)


def test_bad_inputs_are_named(pi):
    with pytest.raises(ValueError, match=r"rgb.shape=\(10, 10\)"):
        pi.intervals_px(np.zeros((10, 10)))
    with pytest.raises(ValueError, match="outside the image"):
        pi.intervals_px(np.zeros((100, 1556, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="intervals is empty"):
        pi.period_px([])
    with pytest.raises(ValueError, match="8 pixel lines"):
        pi.transfer_starts(np.zeros((5, 40), dtype=bool))
    with pytest.raises(ValueError, match="different x"):
        pi.ns_per_px({**pi.FIG29, "grid": ((350, 0.0), (350, 1.0))})
