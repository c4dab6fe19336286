"""The acceptance run (``python -m nki_kernels.acceptance``): its timing protocol, its
table and model-error logic on recorded example data, its refusal on a machine without
Trainium, and its whole pipeline on a CPU stand-in for the device.

tests/neuron/data/acceptance_example.json is EXAMPLE DATA invented for these tests (no
Trainium has run this project); the CPU stand-in proves the plumbing, not any speed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nki_kernels import _dispatch, _neuron, acceptance, registry, simulator
from nki_kernels.ops._workloads import randn

EXAMPLE = Path(__file__).parent / "data" / "acceptance_example.json"


def _example_rows():
    data = json.loads(EXAMPLE.read_text())
    return [acceptance.Row.from_record(r) for r in data["rows"]], data["meta"]


# ---------------------------------------------------------------------------- timing

@pytest.mark.parametrize("samples, q, want", [
    ([3.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 50, 5.5),
    ([3.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 10, 1.9),
    ([3.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90, 9.1),
    ([7.0], 90, 7.0),
])
def test_percentile(samples, q, want):
    assert acceptance.percentile(samples, q) == pytest.approx(want)


def test_percentile_of_nothing_is_nan():
    assert math.isnan(acceptance.percentile([], 50))


def test_time_call_synchronises_around_every_timed_call():
    events, now = [], [0.0]

    def clock():
        events.append("clock")
        return now[0]

    def fn():
        events.append("call")
        now[0] += 3e-6 * (1 + events.count("call") % 2)    # 6 µs or 3 µs per call

    def sync():
        events.append("sync")
        now[0] += 1e-6                                       # the device drains: 1 µs

    t = acceptance.time_call(fn, sync, warmup=2, repeats=3, batch=4, clock=clock)
    assert events[:3] == ["call", "call", "sync"]                          # warm-up, then drain
    assert events[3:15] == ["clock", "call", "sync", "clock"] * 3         # each sample: empty queue
    assert events[15:] == ["clock"] + ["call"] * 4 + ["sync", "clock"]    # back to back
    assert t.samples_us == pytest.approx([7.0, 4.0, 7.0])       # calls 3, 4, 5 + the drain
    assert (t.p10, t.p50, t.p90) == (pytest.approx(4.6), pytest.approx(7.0), pytest.approx(7.0))
    assert t.back_to_back_us == pytest.approx((3 + 6 + 3 + 6 + 1) / 4)   # calls 6-9, one drain


# ---------------------------------------------------------------------------- table logic (example data)

def test_derived_values_of_the_example_rows():
    rows, _ = _example_rows()
    gelu, attn, rms, softmax = rows
    assert gelu.measured_speedup == pytest.approx(1.5)
    assert gelu.modeled_speedup == pytest.approx(52.6 / 80.0)
    assert gelu.kernel_model_error == pytest.approx(0.25)
    assert gelu.eager_model_error == pytest.approx(52.6 / 96.0 - 1)
    assert gelu.speedup_model_error == pytest.approx((52.6 / 80.0) / 1.5 - 1)
    assert (attn.measured_speedup, attn.modeled_speedup) == (pytest.approx(4.0), pytest.approx(4.0))
    assert attn.kernel_model_error == pytest.approx(-0.5) and attn.speedup_model_error == pytest.approx(0.0)
    assert rms.status == "mismatch" and rms.kernel_model_error == pytest.approx(98.4 / 110.0 - 1)
    assert math.isnan(softmax.kernel_model_error) and math.isnan(softmax.measured_speedup)
    assert softmax.modeled_speedup == pytest.approx(89.0 / 105.3)


def test_the_table_has_one_labelled_line_per_row():
    rows, _ = _example_rows()
    lines = acceptance.format_table(rows).splitlines()
    split = lambda line: [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # noqa: E731
    header = split(lines[0])
    assert len(lines) == 2 + len(rows)
    numeric = [h for h in header if "µs" in h or "speedup (" in h or "max err" in h]
    assert numeric and all(h.endswith("(measured)") or h.endswith("(modeled)") for h in numeric)
    cells = {row.op: split(line) for row, line in zip(rows, lines[2:])}
    col = {name: i for i, name in enumerate(header)}
    assert cells["gelu"][col["kernel p50 µs (measured)"]] == "64.0"
    assert cells["gelu"][col["kernel µs (modeled)"]] == "80.0"
    assert cells["gelu"][col["kernel model error"]] == "+25%"
    assert cells["gelu"][col["speedup (measured)"]] == "1.50x"
    assert cells["gelu"][col["speedup (modeled)"]] == "0.66x"
    assert cells["gelu"][col["kernel p10–p90 µs (measured)"]] == "60.0–80.0"
    assert cells["scaled_dot_product_attention"][col["kernel model error"]] == "-50%"
    assert cells["rms_norm"][col["check"]].startswith(r"mismatch: max \|op - reference\| 0.5")   # escaped
    assert cells["softmax"][col["kernel p50 µs (measured)"]] == "—"
    assert cells["softmax"][col["kernel µs (modeled)"]] == "105.3"
    assert cells["softmax"][col["check"]] == "error: RuntimeError: example compile failure"


def test_the_model_error_summary_counts_matching_rows_only():
    rows, _ = _example_rows()
    s = acceptance.model_error_summary(rows)
    assert s["rows"] == 2
    assert s["kernel_modeled_over_measured_geomean"] == pytest.approx(math.sqrt(1.25 * 0.5))
    assert s["kernel_median_abs_error"] == pytest.approx(0.375)
    assert s["kernel_worst_abs_error"] == pytest.approx(0.5)
    assert s["eager_modeled_over_measured_geomean"] == pytest.approx(math.sqrt(52.6 / 96.0 * 0.5))
    assert s["speedup_modeled_over_measured_geomean"] == pytest.approx(math.sqrt((52.6 / 80.0) / 1.5))
    text = acceptance.format_summary(rows)
    assert "over 2 matching rows" in text and "0.79x" in text and "median |error| +38%" in text


@pytest.mark.parametrize("statuses, code", [(["ok", "ok"], 0), (["ok", "mismatch"], 1), (["error"], 1), ([], 1)])
def test_exit_code(statuses, code):
    rows = [acceptance.Row("op", "w", "bfloat16", 2, status=s) for s in statuses]
    assert acceptance.exit_code(rows) == code


def test_outputs_round_trip(tmp_path):
    rows, meta = _example_rows()
    paths = acceptance.write_outputs(rows, meta, tmp_path)
    md = paths["md"].read_text()
    assert "MEASURED columns" in md and "MODELED columns" in md and "- launch form: env" in md
    assert acceptance.format_table(rows) in md and acceptance.format_summary(rows) in md
    back = json.loads(paths["json"].read_text())
    again = [acceptance.Row.from_record(r) for r in back["rows"]]
    assert acceptance.format_table(again) == acceptance.format_table(rows)
    assert back["rows"][0]["kernel_model_error"] == pytest.approx(0.25)
    assert paths["csv"].read_text().splitlines()[0].startswith("op,workload,dtype,lnc,status")


def test_the_check_covers_every_output():
    ref = (torch.ones(4, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    ok = (torch.ones(4, dtype=torch.bfloat16), torch.full((3,), 0.05, dtype=torch.bfloat16))
    bad = (torch.ones(4, dtype=torch.bfloat16), torch.full((3,), 0.07, dtype=torch.bfloat16))
    assert acceptance.max_abs_err_and_check(ok, ref, torch.bfloat16)[1]
    err, passed = acceptance.max_abs_err_and_check(bad, ref, torch.bfloat16)
    assert not passed and err == float(bad[1][0])      # 0.07 in bf16
    assert acceptance.max_abs_err_and_check(torch.ones(2, 2), torch.ones(4), torch.float32) == (
        pytest.approx(math.nan, nan_ok=True), False)


# ---------------------------------------------------------------------------- on a machine without Trainium

def test_without_trainium_it_says_so_in_one_line_and_exits_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nki_kernels.acceptance"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Trainium here" in lines[0] and "Running on a Trainium host" in lines[0]
    assert not (tmp_path / "out").exists()


def test_an_unknown_target_is_not_guessed(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(_neuron, "device_available", lambda: (True, ""))
    monkeypatch.delenv(acceptance.TARGET_ENV, raising=False)
    monkeypatch.setattr(acceptance, "INSTANCE_TYPE_FILE", tmp_path / "missing")
    assert acceptance.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --target trn2 or --target trn3" in err[0]


@pytest.mark.parametrize("env, instance, want", [
    ("trn3", None, "trn3"), ("", "trn2.48xlarge\n", "trn2"), ("", "trn2u.48xlarge", "trn2"),
    ("", "trn2n.48xlarge", "trn2"), ("gen3", None, "trn2"), ("GEN4", None, "trn3"), ("", "trn3pds.98xlarge", "trn3"),
    ("", "m7i.large", None), ("trn1", None, None), ("", "trn1.32xlarge", None), ("", "trn20.large", None),
    ("gen2", None, None),
])
def test_detect_target(monkeypatch, tmp_path, env, instance, want):
    monkeypatch.setenv(acceptance.TARGET_ENV, env)
    path = tmp_path / "product_name"
    if instance is not None:
        path.write_text(instance)
    monkeypatch.setattr(acceptance, "INSTANCE_TYPE_FILE", path)
    assert acceptance.detect_target() == want


def test_profile_call_says_why_there_is_none(tmp_path):
    assert acceptance.profile_call(lambda: None, tmp_path / "p").startswith("unavailable (")


# ---------------------------------------------------------------------------- the pipeline, CPU stand-in

def _small_registry(monkeypatch):
    """Two real ops of the registry with one small workload each."""
    def workload(name, make):
        return registry.Workload(name, make)

    gelu = dataclasses.replace(registry.get("gelu"), workloads=(
        workload("small [5, 33]", lambda g: ((randn(g, 5, 33),), {})),))
    rms = dataclasses.replace(registry.get("rms_norm"), workloads=(
        workload("small [3, 40]", lambda g: ((randn(g, 3, 40), (40,), randn(g, 40)), {"eps": 1e-6})),))
    monkeypatch.setattr(registry, "_OPS", {"gelu": gelu, "rms_norm": rms})
    return gelu, rms


def test_the_whole_run_on_a_cpu_stand_in(monkeypatch, tmp_path, reference_backend):
    gelu, rms = _small_registry(monkeypatch)
    syncs = []
    monkeypatch.setattr(_neuron, "device_available", lambda: (True, ""))
    monkeypatch.setattr(_neuron, "synchronize", lambda: syncs.append(1))
    monkeypatch.setattr(acceptance, "DEVICE", "cpu")
    monkeypatch.delenv(_neuron.LNC_ENV, raising=False)
    monkeypatch.delenv(_neuron.CC_FLAGS_ENV, raising=False)
    code = acceptance.main(["--target", "trn2", "--out", str(tmp_path), "--no-profile",
                            "--warmup", "1", "--repeats", "3", "--batch", "2"])
    assert code == 0
    data = json.loads((tmp_path / "acceptance.json").read_text())
    assert data["meta"]["lnc"] == 2 and data["meta"]["launch form"] == "bracket"
    rows = {r["op"]: r for r in data["rows"]}
    assert set(rows) == {"gelu", "rms_norm"}
    for spec in (gelu, rms):
        r = rows[spec.name]
        assert r["status"] == "ok" and r["max_abs_err"] < 2e-2, r
        assert 0 < r["kernel_p10_us"] <= r["kernel_p50_us"] <= r["kernel_p90_us"]
        assert r["eager_p50_us"] > 0 and r["kernel_back_to_back_us"] > 0
        # the modeled columns are the cost model on the op's own launch at LNC=2 on trn2
        gen = torch.Generator().manual_seed(
            __import__("zlib").crc32(acceptance.case_slug(spec.name, spec.workloads[0].name).encode()))
        args, kwargs = spec.workloads[0].make(gen)
        call = spec.kernel_call(*args, **kwargs)
        est = simulator.estimate(_dispatch.simulator_kernel(call)[2], "trn2")(*call.tensors, **call.static)
        assert r["modeled_kernel_us"] == pytest.approx(est.latency_us)
        assert r["modeled_eager_us"] == pytest.approx(spec.roofline(*args, **kwargs, lnc=2, target="trn2").eager_us)
    # one sync after each kernel check, warm-ups, samples and batches, for kernel and eager
    assert len(syncs) == 2 * (1 + 2 * (1 + 3 + 1))
    assert "kernel model error" in (tmp_path / "acceptance.md").read_text()


def test_a_wrong_result_is_a_mismatch_and_fails_the_run(monkeypatch, tmp_path, reference_backend):
    gelu, _ = _small_registry(monkeypatch)
    wrong = dataclasses.replace(gelu, function=lambda *a, **k: gelu.function(*a, **k) + 0.5)
    monkeypatch.setattr(registry, "_OPS", {"gelu": wrong})
    monkeypatch.setattr(_neuron, "device_available", lambda: (True, ""))
    monkeypatch.setattr(_neuron, "synchronize", lambda: None)
    monkeypatch.setattr(acceptance, "DEVICE", "cpu")
    code = acceptance.main(["--target", "trn3", "--out", str(tmp_path), "--no-profile",
                            "--warmup", "0", "--repeats", "1", "--batch", "0"])
    assert code == 1
    row = json.loads((tmp_path / "acceptance.json").read_text())["rows"][0]
    assert row["status"] == "mismatch" and "exceeds atol/rtol" in row["note"]
    assert math.isnan(row["kernel_back_to_back_us"])


def test_an_op_that_raises_is_an_error_row_and_the_run_goes_on(monkeypatch, tmp_path, reference_backend):
    gelu, rms = _small_registry(monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("example failure")

    monkeypatch.setattr(registry, "_OPS", {"gelu": dataclasses.replace(gelu, function=broken), "rms_norm": rms})
    monkeypatch.setattr(_neuron, "device_available", lambda: (True, ""))
    monkeypatch.setattr(_neuron, "synchronize", lambda: None)
    monkeypatch.setattr(acceptance, "DEVICE", "cpu")
    code = acceptance.main(["--target", "trn2", "--out", str(tmp_path), "--no-profile",
                            "--warmup", "0", "--repeats", "1", "--batch", "0"])
    assert code == 1
    rows = json.loads((tmp_path / "acceptance.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert rows[0]["note"] == "RuntimeError: example failure" and rows[0]["modeled_kernel_us"] > 0
