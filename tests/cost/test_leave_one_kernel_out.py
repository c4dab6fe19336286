"""benchmarks/calibration/leave_one_kernel_out.py: which runs it refits without, and what
the refit sees. The refits themselves take ~4 min each (run the script; docs/cost-model.md
"Calibration" has its figures)."""

from __future__ import annotations

import types

import pytest

from tests.cost.conftest import load_script


@pytest.fixture(scope="module")
def loko():
    return load_script("benchmarks/calibration/leave_one_kernel_out.py")


def _row(calibrate, id, kernel, split, x=1, known_miss="", measured=100.0):
    return calibrate.Row(id=id, what=id, target="trn1", measured=measured, unit="us", quantity="latency_us",
                         kernel=kernel, args={"x": [[128, x], "float32"]}, source="s", confidence="M",
                         split=split, known_miss=known_miss)


@pytest.fixture
def rows(calibrate):
    r = lambda *a, **k: _row(calibrate, *a, **k)   # noqa: E731
    return [
        r("a.lat", "k:a", "test"), r("a.busy", "k:a", "train"),              # both splits: refit without a.busy
        r("a2.lat", "k:a", "test", x=2),                                     # same kernel, other args: another run
        r("b.busy", "k:b", "train"),                                         # train only
        r("c.lat", "k:c", "test"),                                           # held out only
        r("d.lat", "k:d", "test", known_miss="why"), r("d.busy", "k:d", "train"),   # its held-out row is a known miss
    ]


def test_only_runs_with_a_train_row_and_a_gated_held_out_row_are_refitted(loko, rows):
    runs = loko.kernels_in_both_splits(rows)
    assert [[r.id for r in rs] for rs in runs.values()] == [["a.lat", "a.busy"]]


def test_a_refit_drops_exactly_that_run_s_train_rows(loko, rows):
    (key,) = loko.kernels_in_both_splits(rows)
    kept = [r.id for r in loko.without_run(rows, key)]
    assert kept == ["a.lat", "a2.lat", "b.busy", "c.lat", "d.lat", "d.busy"]


def test_the_left_out_column_is_the_model_at_the_other_rows_fit(loko, rows, calibrate):
    seen = {}

    def fit(train_rows):
        seen["fit"] = [r.id for r in train_rows]
        return {"trn1:vector_static_cycles": 200.0}

    def modeled(rs, params=None):
        # a fake model: 10 % over at hardware.py's values, 20 % under at the refit's
        return {r.id: r.measured * (0.8 if params else 1.1) for r in rs}

    cal = types.SimpleNamespace(**{k: getattr(calibrate, k) for k in ("FREE_PARAMETERS", "scoped", "target_with")},
                                fit=fit, modeled=modeled)
    ((key, own),) = loko.kernels_in_both_splits(rows).items()
    shipped = modeled(rows)
    recs = {r["id"]: r for r in loko.leave_one_out(cal, rows, key, own, shipped)}
    assert "a.busy" not in seen["fit"] and "b.busy" in seen["fit"]
    assert set(recs) == {"a.lat", "a.busy"}
    assert recs["a.lat"]["error_all_rows"] == pytest.approx(0.1)
    assert recs["a.lat"]["error_left_out"] == pytest.approx(-0.2)
    shipped_static = calibrate.target_with("trn1", None).vector_static_cycles
    assert recs["a.lat"]["moved"] == f"trn1:vector_static_cycles {shipped_static:g} -> 200"
