"""The cost model against public hardware measurements (benchmarks/calibration/).

Every held-out row must stay within the stated band (calibrate.HELD_OUT_BAND) and every
group of kernel variants must be ordered as measured. The default run covers the rows not
marked slow; ``-m sweep`` covers them all and re-fits the free parameters."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from nki_kernels.simulator.hardware import TARGETS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def calibrate():
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("calibrate", None)


def _check(calibrate, rows):
    values = calibrate.modeled(rows)
    errs = calibrate.errors(rows, values)
    rows = calibrate.gated(rows)
    held = [r for r in rows if r.split == "test"]
    outside = {r.id: f"{errs[r.id]:+.0%}" for r in held if abs(errs[r.id]) > calibrate.HELD_OUT_BAND}
    assert not outside, f"held-out rows outside +-{calibrate.HELD_OUT_BAND:.0%}: {outside}"
    mean = sum(abs(errs[r.id]) for r in held) / len(held)
    assert mean <= calibrate.HELD_OUT_MEAN_BAND, f"held-out mean |error| {mean:.0%}"
    wrong = [(g, m, o) for g, m, o, same in calibrate.rankings(rows, values) if not same]
    assert not wrong, f"variants ordered differently from the measurements: {wrong}"
    return values


def test_every_row_has_a_source_a_kernel_and_a_known_quantity(calibrate):
    rows = calibrate.load_rows()
    assert len(rows) >= 25
    assert {r.split for r in rows} == {"train", "test"}
    for r in rows:
        assert r.source and r.what and r.confidence in ("M", "M?", "P"), r.id
        assert r.quantity.partition(":")[0] in ("latency_us", "dma_slot_us", "dma_stream_gbps", "op_slot_us",
                                                "chain_interval_us", "consumer_start_us", "busy_us"), r.id
        assert (ROOT / "benchmarks" / "calibration" / "kernels" / f"{r.kernel.partition(':')[0]}.py").exists(), r.id
    assert any(r.rank_group for r in rows)


def test_bad_measurement_files_are_rejected_naming_the_row(calibrate, tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text('[[measurement]]\nid = "x"\nwhat = "w"\ntarget = "trn9"\nmeasured = 1.0\nunit = "us"\n'
                   'quantity = "latency_us"\nkernel = "micro:activation"\nargs = {}\nsource = "s"\n'
                   'confidence = "M"\nsplit = "train"\n')
    with pytest.raises(ValueError, match="x: target='trn9'"):
        calibrate.load_rows(bad)
    bad.write_text(bad.read_text().replace('"trn9"', '"trn2"').replace('split = "train"', 'split = "dev"'))
    with pytest.raises(ValueError, match="split='dev'"):
        calibrate.load_rows(bad)


def test_known_misses_are_few_and_say_why(calibrate):
    rows = calibrate.load_rows()
    misses = [r for r in rows if r.known_miss]
    assert len(misses) <= 2 and all(len(r.known_miss) > 40 for r in misses)
    assert not any(r.split == "train" for r in misses)


def test_the_model_stays_within_the_band_on_the_held_out_measurements(calibrate):
    rows = [r for r in calibrate.load_rows() if not r.slow]
    values = _check(calibrate, rows)
    # the check can fail: the same rows with a badly wrong overhead leave the band
    wrong = calibrate.modeled(rows, {"static_overhead_cycles": 1200.0})
    errs = calibrate.errors(rows, wrong)
    assert any(abs(errs[r.id]) > calibrate.HELD_OUT_BAND for r in rows if r.split == "test")
    assert values


@pytest.mark.sweep
def test_every_measurement_including_the_slow_ones(calibrate):
    _check(calibrate, calibrate.load_rows())


@pytest.mark.sweep
def test_the_fitted_parameters_are_the_ones_in_hardware_py(calibrate):
    rows = [r for r in calibrate.load_rows() if not r.slow]
    fitted = calibrate.fit(rows)
    for name, value in fitted.items():
        assert getattr(TARGETS["trn2"], name) == pytest.approx(value), name
    for t in TARGETS.values():   # shared by every generation: no per-target value
        assert all(getattr(t, n) == getattr(TARGETS["trn2"], n) for n in fitted)
    assert dataclasses.fields(TARGETS["trn2"])
