"""The acceptance run's choices that tests/neuron/test_acceptance.py does not pin: the
check's relative tolerance and its per-output verdict, the seeds (the main job's), the
references' compute dtypes, which timing lands in which column, the degree and target of
the modeled columns, the profile captures, ``--quick`` / ``--ops`` / ``--target``.
Run on a CPU stand-in for the device (the plumbing, not any speed)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from nki_kernels import _dispatch, _neuron, acceptance, registry, simulator
from nki_kernels.ops._workloads import randn

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- the check

def test_the_check_is_relative_to_the_reference():
    # bf16 outputs 1.5% above references of 4..8: within CHECK_TOL's rtol of 2%, but up to
    # 0.15 off, beyond its atol of 0.06 alone (the bound is atol + rtol * |reference|)
    ref = torch.rand(64, dtype=torch.float64) * 4 + 4
    out = (ref * 1.015).to(torch.bfloat16)
    atol, rtol = acceptance.CHECK_TOL[torch.bfloat16]
    assert float((out.double() - ref).abs().max()) > atol
    err, ok = acceptance.max_abs_err_and_check(out, ref, torch.bfloat16)
    assert ok and err == pytest.approx(float((out.double() - ref).abs().max()))
    assert not acceptance.max_abs_err_and_check(-out, ref, torch.bfloat16)[1]


def test_a_wrong_first_output_fails_and_sets_the_worst_error():
    ref = (torch.randn(5, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    out = [ref[0].clone(), ref[1].clone()]
    out[0][2] += 0.5                                   # the first output wrong, the last exact
    err, ok = acceptance.max_abs_err_and_check(tuple(out), ref, torch.float32)
    assert not ok and err == pytest.approx(0.5)


def test_a_zero_latency_gives_no_ratio():
    # a 0 µs time (a broken clock, an empty record) is no measurement: "—" and left out of
    # the geometric means, never a division by zero or a log of zero
    unmeasured = acceptance.Row("gelu", "w", "bfloat16", 2, kernel_p50_us=0.0, eager_p50_us=10.0,
                                modeled_kernel_us=4.0, modeled_eager_us=5.0)
    unmodeled = acceptance.Row("silu", "w", "bfloat16", 2, kernel_p50_us=10.0, eager_p50_us=10.0,
                               modeled_kernel_us=0.0, modeled_eager_us=5.0)
    assert math.isnan(unmeasured.measured_speedup) and math.isnan(unmeasured.kernel_model_error)
    assert math.isnan(unmodeled.modeled_speedup)
    summary = acceptance.model_error_summary([unmeasured, unmodeled])
    assert summary["rows"] == 2 and math.isnan(summary["kernel_modeled_over_measured_geomean"])
    assert math.isnan(summary["speedup_modeled_over_measured_geomean"])
    assert "—" in acceptance.format_table([unmeasured, unmodeled])
    acceptance.format_summary([unmeasured, unmodeled])


# ---------------------------------------------------------------------------- one case, CPU stand-in

def _spec(name="gelu", workloads=None, **changes):
    spec = registry.get(name)
    if workloads is None:
        if name == "gelu":
            workloads = (registry.Workload("small [5, 300]", lambda g: ((randn(g, 5, 300),), {})),)
        else:
            workloads = (registry.Workload("small [3, 40]",
                                           lambda g: ((randn(g, 3, 40), (40,), randn(g, 40)), {"eps": 1e-6})),)
    return dataclasses.replace(spec, workloads=workloads, **changes)


def _run_case(spec, target="trn2", lnc=2, **kw):
    kw = {"device": "cpu", "sync": lambda: None, "warmup": 0, "repeats": 1, "batch": 0, **kw}
    return acceptance.run_case(spec, spec.workloads[0], target, lnc, **kw)


def _load_model_report():
    spec = importlib.util.spec_from_file_location("model_report_for_acceptance", ROOT / "benchmarks" / "model_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


def test_inputs_are_the_main_job_s_for_the_case(reference_backend):
    # "makes the main job's inputs (same seeds)": the generator benchmarks/model_report.py
    # seeds for the same (op, workload)
    seeds = []
    base = _spec()
    work = dataclasses.replace(base.workloads[0], make=lambda g: seeds.append(g.initial_seed())
                               or base.workloads[0].make(g))
    spec = dataclasses.replace(base, workloads=(work,))
    row = _run_case(spec)
    assert row.status == "ok", row.note
    case = _load_model_report().Case(spec, work, False)
    assert seeds == [zlib.crc32(case.slug.encode())]


def test_the_check_reference_is_float64_on_cpu_and_eager_runs_in_the_input_dtype(reference_backend):
    seen = []
    base = _spec()
    real = base.reference

    def reference(*args, compute_dtype=None, **kwargs):
        seen.append((compute_dtype, args[0].dtype))
        return real(*args, compute_dtype=compute_dtype, **kwargs)

    work = dataclasses.replace(base.workloads[0], dtype=torch.bfloat16)
    spec = dataclasses.replace(base, reference=reference, workloads=(work,))
    row = _run_case(spec, repeats=2)
    assert row.status == "ok", row.note
    # the check: once, at the workload's reference dtype (float64 unless declared);
    # eager: every timed call, in the input dtype
    assert seen[0] == (torch.float64, torch.bfloat16)
    assert seen[1:] == [(torch.bfloat16, torch.bfloat16)] * 2


def test_each_timing_lands_in_its_own_column(monkeypatch, reference_backend):
    # the kernel (the op) takes 10, 20, ... µs per call, eager (the twin) 7 µs, on a fake
    # clock that only these calls advance
    now = [0.0]
    kernel_calls = []
    base = _spec()

    def function(*args, **kwargs):
        kernel_calls.append(1)
        now[0] += 10e-6 * len(kernel_calls)
        return base.function(*args, **kwargs)

    def reference(*args, compute_dtype=None, **kwargs):
        if compute_dtype != torch.float64:          # the timed eager calls, not the check
            now[0] += 7e-6
        return base.reference(*args, compute_dtype=compute_dtype, **kwargs)

    real_time_call = acceptance.time_call
    monkeypatch.setattr(acceptance, "time_call",
                        lambda fn, sync, warmup, repeats, batch: real_time_call(fn, sync, warmup, repeats, batch,
                                                                                clock=lambda: now[0]))
    spec = dataclasses.replace(base, function=function, reference=reference)
    row = _run_case(spec, repeats=9, batch=4)
    assert row.status == "ok", row.note
    samples = [10.0 * n for n in range(2, 11)]        # call 1 is the check, calls 2-10 the samples
    assert row.kernel_p10_us == pytest.approx(np.percentile(samples, 10))
    assert row.kernel_p50_us == pytest.approx(np.percentile(samples, 50))
    assert row.kernel_p90_us == pytest.approx(np.percentile(samples, 90))
    assert row.kernel_back_to_back_us == pytest.approx(10.0 * (11 + 12 + 13 + 14) / 4)
    assert row.eager_p50_us == pytest.approx(7.0) and row.eager_back_to_back_us == pytest.approx(7.0)


@pytest.mark.parametrize("target, lnc", [("trn3", 1), ("trn3", 2), ("trn2", 1)])
def test_the_modeled_columns_are_at_the_run_s_degree_and_target(reference_backend, target, lnc):
    spec = _spec("rms_norm", workloads=(registry.Workload(
        "[512, 4096]", lambda g: ((randn(g, 512, 4096), (4096,), randn(g, 4096)), {"eps": 1e-6})),))
    row = _run_case(spec, target=target, lnc=lnc)
    assert row.lnc == lnc
    args, kwargs = spec.workloads[0].make(torch.Generator().manual_seed(0))
    call = spec.kernel_call(*args, **kwargs)
    est = simulator.estimate(_dispatch.simulator_kernel(call)[lnc], target)(*call.tensors, **call.static)
    # another degree or target models another time (else this test could not tell them apart)
    other = simulator.estimate(_dispatch.simulator_kernel(call)[3 - lnc], target)(*call.tensors, **call.static)
    other_target = simulator.estimate(_dispatch.simulator_kernel(call)[lnc], {"trn2": "trn3", "trn3": "trn2"}[target])(
        *call.tensors, **call.static)
    assert other.latency_us != pytest.approx(est.latency_us) or other_target.latency_us != pytest.approx(est.latency_us)
    assert row.modeled_kernel_us == pytest.approx(est.latency_us)
    assert row.modeled_eager_us == pytest.approx(spec.roofline(*args, **kwargs, lnc=lnc, target=target).eager_us)


# ---------------------------------------------------------------------------- the command

@pytest.fixture
def stand_in(monkeypatch, reference_backend):
    """main() on the CPU stand-in, with gelu (a quick and a full workload) and rms_norm."""
    monkeypatch.setattr(_neuron, "device_available", lambda: (True, ""))
    monkeypatch.setattr(_neuron, "synchronize", lambda: None)
    monkeypatch.setattr(acceptance, "DEVICE", "cpu")
    for var in (_neuron.LNC_ENV, _neuron.CC_FLAGS_ENV, _neuron.RT_CORE_SIZE_ENV):
        monkeypatch.delenv(var, raising=False)
    gelu = _spec(workloads=(
        registry.Workload("quick [4, 64]", lambda g: ((randn(g, 4, 64),), {}), quick=True),
        registry.Workload("full [6, 96]", lambda g: ((randn(g, 6, 96),), {}))))
    monkeypatch.setattr(registry, "_OPS", {"gelu": gelu, "rms_norm": _spec("rms_norm")})
    profiled = []
    monkeypatch.setattr(acceptance, "profile_call", lambda fn, out: profiled.append(out) or str(out))

    def run(tmp_path, *extra):
        code = acceptance.main(["--out", str(tmp_path), "--warmup", "0", "--repeats", "1", "--batch", "0", *extra])
        data = json.loads((tmp_path / "acceptance.json").read_text())
        return code, data, [(r["op"], r["workload"]) for r in data["rows"]]
    run.profiled = profiled
    return run


def test_quick_and_ops_select_the_cases(stand_in, tmp_path):
    code, _, cases = stand_in(tmp_path / "all", "--target", "trn2", "--no-profile")
    assert code == 0 and cases == [("gelu", "quick [4, 64]"), ("gelu", "full [6, 96]"), ("rms_norm", "small [3, 40]")]
    _, _, cases = stand_in(tmp_path / "quick", "--target", "trn2", "--no-profile", "--quick")
    assert cases == [("gelu", "quick [4, 64]")]
    _, _, cases = stand_in(tmp_path / "ops", "--target", "trn2", "--no-profile", "--ops", "rms_norm")
    assert cases == [("rms_norm", "small [3, 40]")]


def test_the_target_option_wins_over_the_environment(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv(acceptance.TARGET_ENV, "trn3")
    _, data, _ = stand_in(tmp_path, "--target", "trn2", "--no-profile", "--ops", "gelu", "--quick")
    assert data["meta"]["target"] == "trn2"


def test_each_case_is_profiled_into_its_own_directory_unless_told_not_to(stand_in, tmp_path):
    _, data, _ = stand_in(tmp_path / "p", "--target", "trn2", "--ops", "rms_norm")
    want = tmp_path / "p" / "profiles" / acceptance.case_slug("rms_norm", "small [3, 40]")
    assert stand_in.profiled == [want] and data["rows"][0]["profile"] == str(want)
    _, data, _ = stand_in(tmp_path / "n", "--target", "trn2", "--ops", "rms_norm", "--no-profile")
    assert stand_in.profiled == [want] and data["rows"][0]["profile"] == ""
