"""The main job (benchmarks/model_report.py) on one small op: files, labels, skips."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from nki_kernels import _dispatch
from nki_kernels.simulator.hardware import TARGETS

REPORT = Path(__file__).resolve().parents[2] / "benchmarks" / "model_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("model_report", REPORT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["model_report"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("model_report", None)


def test_report_writes_table_csv_markdown_plot_and_traces(report, tmp_path, capsys, monkeypatch):
    # which accuracy check each row takes: element-wise for the forward, scaled to the
    # output's magnitude for the backward's summed gradients (_check_scaled)
    checked = []
    for name in ("_check", "_check_scaled"):
        real = getattr(report, name)
        monkeypatch.setattr(report, name, lambda out, ref, dtype, _real=real, _name=name:
                            checked.append(_name) or _real(out, ref, dtype))
    assert report.main(["--ops", "gelu", "--quick", "--out", str(tmp_path)]) == 0
    assert checked == ["_check", "_check_scaled"]
    printed = capsys.readouterr().out
    assert "modeled (trn2)" in printed and "measured (CPU)" in printed
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    # an op's name selects its forward row and, right after it, its backward row
    assert [r["op"] for r in rows] == ["gelu", "gelu backward"]
    assert float(rows[1]["kernel_us_modeled_trn2"]) >= float(rows[1]["limit_us_modeled_trn2"]) > 0
    row = rows[0]
    assert row["status"] in ("ok", "below target")
    assert float(row["kernel_us_modeled_trn2"]) >= float(row["limit_us_modeled_trn2"]) > 0
    assert 0 < float(row["efficiency_modeled_trn2"]) <= 1
    # the error bar brackets the central value, for the time and for the speedup
    low, mid, high = (float(row[f"kernel_{k}us_modeled_trn2"]) for k in ("low_", "", "high_"))
    assert low <= mid <= high and low < high
    s_low, s_mid, s_high = (float(row[f"speedup{k}_modeled_trn2"]) for k in ("_low", "", "_high"))
    assert s_low <= s_mid <= s_high
    assert row["kernel_range_us_modeled_trn2"] == f"{low:.1f}-{high:.1f}"
    assert row["speedup_range_modeled_trn2"] == f"{s_low:.2f}x-{s_high:.2f}x"
    # the LNC=1 column is the one-core run, and the ratio is of the two
    lnc1 = float(row["kernel_us_lnc1_modeled_trn2"])
    assert lnc1 != mid and float(row["lnc_ratio_modeled_trn2"]) == pytest.approx(mid / lnc1, rel=1e-3)
    # and its efficiency is against the one-core limit (the workload's shapes set it)
    from nki_kernels import registry

    spec = registry.get("gelu")
    work = next(w for w in spec.workloads if w.name == row["workload"])
    args, kwargs = work.make(torch.Generator().manual_seed(0))
    one_core, two_cores = (spec.roofline(*args, **kwargs, lnc=n, target="trn2").limit_us for n in (1, 2))
    assert one_core != pytest.approx(two_cores, rel=0.05)
    assert float(row["efficiency_lnc1_modeled_trn2"]) == pytest.approx(one_core / lnc1, rel=1e-6)
    # an element-wise kernel moves its input and its output through HBM about once: in MB
    x = args[0]
    compulsory_mb = 2 * x.numel() * x.element_size() / 1e6
    assert compulsory_mb <= float(row["hbm_mb_modeled_trn2"]) < 1.5 * compulsory_mb
    assert f"{lnc1:.1f}" in printed
    assert float(row["max_abs_err_measured_cpu"]) < 0.1
    md = (tmp_path / "report.md").read_text()
    assert "modeled (trn2)" in md and "Where the time goes" in md
    assert (tmp_path / "report.png").stat().st_size > 1000
    traces = list((tmp_path / "traces").glob("*.json"))
    assert len(traces) == 2 and all(json.loads(t.read_text())["traceEvents"] for t in traces)


def test_a_failing_kernel_becomes_an_error_row_and_a_failed_run(report, tmp_path, monkeypatch, capsys):
    # the report survives a broken kernel: the row says what failed, the others still run
    from dataclasses import replace

    real_grid = report.grid

    def broken_call(*args, **kwargs):
        raise RuntimeError("kernel launch exploded")

    def grid(quick):
        cases = [c for c in real_grid(True) if c.op == "gelu"]
        ghost = report.Case(replace(cases[0].spec, kernel_call=broken_call), cases[0].workload)
        return cases + [ghost]

    monkeypatch.setattr(report, "grid", grid)
    assert report.main(["--ops", "gelu", "--out", str(tmp_path), "--no-traces"]) == 1
    out = capsys.readouterr().out
    assert "kernel launch exploded" in out
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "error"]


def test_a_speedup_counts_only_where_the_low_end_clears_it(report):
    assert report.speedup_claimed(2.5, 2.4) and not report.speedup_claimed(2.3, 2.4)
    assert not report.speedup_claimed(float("nan"), 1.0)


def test_each_end_of_the_speedup_compares_kernel_and_eager_on_the_same_hardware(report):
    # eager's limits move with the achieved DMA bandwidth (x0.9 at the pessimistic end)
    from nki_kernels import registry, simulator
    from nki_kernels.simulator.cost import estimate_trace, variant

    spec = registry.get("gelu")
    x = torch.randn(512, 1024, dtype=torch.bfloat16)
    seen = []

    def eager_on(tgt):
        seen.append(tgt)
        return spec.roofline(x, lnc=2, target=tgt).eager_us

    central = eager_on(TARGETS["trn2"])
    scale = dict((n, (o, p)) for n, o, p in TARGETS["trn2"].cost_ranges)["dma_bytes_per_s_scale"]
    # two cores' DMA, capped by the HBM stack they share (which caps the central value too)
    two_cores, stack = 2 * TARGETS["trn2"].dma_bytes_per_s, TARGETS["trn2"].hbm_stack_bytes_per_s
    assert eager_on(variant("trn2", "pessimistic")) == pytest.approx(
        central * min(two_cores, stack) / min(two_cores * scale[1], stack))
    call = spec.kernel_call(x)
    est = simulator.estimate(_dispatch.simulator_kernel(call)[2], "trn2")(*call.tensors, **call.static)
    seen.clear()
    bars = report.error_bars(est, eager_on)
    # the low end: fixed costs pessimistic, the bandwidth at whichever end gives the lower
    # ratio; each candidate is kernel and eager on one hardware variant, the kernel's time
    # widened by the model-error band's pessimistic factor (eager is a limit: not widened)
    pes, opt = variant("trn2", "pessimistic"), variant("trn2", "optimistic")
    mixed = dataclasses.replace(pes, dma_bytes_per_s=opt.dma_bytes_per_s)
    widen = TARGETS["trn2"].model_error_band[1]
    assert widen > 1.0
    candidates = [eager_on(t) / (estimate_trace(est.trace, t, allocations=est.allocations).latency_us * widen)
                  for t in (pes, mixed)] + [central / est.latency_us]
    assert bars["speedup_low"] == pytest.approx(min(candidates))
    assert bars["speedup_low"] <= central / est.latency_us <= bars["speedup_high"]
    assert bars["speedup_low"] < central / bars["modeled_high_us"] * 1.2
    assert {t.dma_bytes_per_s for t in seen} == {pes.dma_bytes_per_s, opt.dma_bytes_per_s,
                                                   TARGETS["trn2"].dma_bytes_per_s}


def test_unknown_op_is_an_error_naming_the_choices(report, tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main(["--ops", "nope", "--out", str(tmp_path)])
    assert "--ops ['nope'] unknown; choose from" in capsys.readouterr().err


@pytest.mark.parametrize("ops, message", [("silu", "selects no workload (silu and gelu_and_mul have no quick"),
                                          (",", "--ops ',' names no op")], ids=["no-quick-workload", "empty"])
def test_a_selection_of_no_workload_is_an_error_before_the_run(report, tmp_path, capsys, ops, message):
    # silu has no quick workload: the report used to run nothing, then fail writing its CSV
    with pytest.raises(SystemExit):
        report.main(["--ops", ops, "--quick", "--out", str(tmp_path / "out")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_out_folder_that_cannot_be_made_is_an_error_before_the_run(report, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    for out, message in ((tmp_path / "a_file", "a file is already there"),
                         (tmp_path / "a_file" / "report", "a_file is a file, not a folder")):
        with pytest.raises(SystemExit):
            report.main(["--ops", "gelu", "--quick", "--out", str(out)])
        assert message in capsys.readouterr().err


def test_an_lnc1_report_says_its_columns_are_one_cores(report, tmp_path):
    report.main(["--ops", "gelu", "--quick", "--lnc", "1", "--out", str(tmp_path), "--no-traces"])
    md = (tmp_path / "report.md").read_text()
    assert "The main columns are at LNC=1: the kernel runs on one NeuronCore" in md
    assert "runs on both cores" not in md


def test_where_the_time_goes_headings_carry_the_table_status(report, tmp_path):
    # layer_norm's quick ViT-B row is modeled below its 0.6 efficiency target (README): its
    # heading must say so, not the accuracy check's "ok"
    report.main(["--ops", "layer_norm", "--quick", "--out", str(tmp_path), "--no-traces"])
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    md = (tmp_path / "report.md").read_text()
    assert rows and any(r["status"] == "below target" for r in rows)
    for r in rows:
        assert f"**{r['op']} — {r['workload']}** ({r['status']}; target {r['goal']})" in md
        # the goal as numbers too (the plot marks them per row): layer_norm has no speedup goal
        assert r["goal"] == f"eff>={float(r['efficiency_goal']):g}" and r["speedup_low_goal"] == "nan"


# ----------------------------------------------------------------------------- rows without a run
# What a row claims, built from the registry's own cases and stated numbers (no simulation).

def _case(report, op, workload_name=None, backward=False, pick=None):
    from nki_kernels import registry

    spec = registry.get(op)
    work = next(w for w in spec.workloads if (pick(w) if pick else w.name == workload_name))
    return report.Case(spec, work, backward)


def test_a_row_meets_a_speedup_goal_only_where_the_low_end_of_its_bar_clears_it(report):
    # ViT-B/16 attention must reach 2.4x: a central speedup above it with a bar reaching
    # below it is no claim; a low end exactly at the goal clears it (">=", as the goal says)
    case = _case(report, "scaled_dot_product_attention", pick=lambda w: w.speedup_target is not None)
    goal = case.speedup_target
    assert goal is not None and not case.backward

    def row(**kw):
        return report.Row(case, efficiency=0.95, **kw)

    central_only = row(speedup=goal * 1.5, speedup_low=goal * 0.9, speedup_high=goal * 2)
    assert central_only.meets is False
    assert report._record(central_only)["status"] == "below target"
    assert row(speedup=goal * 1.5, speedup_low=goal, speedup_high=goal * 2).meets is True
    assert report.speedup_claimed(goal, goal)
    assert f"speedup low end>={goal:g}x" in central_only.target_text
    # an errored row claims nothing either way, and keeps its status
    broken = report.Row(case, status="error", note="boom")
    assert broken.meets is None and report._record(broken)["status"] == "error"


def test_each_row_s_efficiency_goal_follows_its_shape_its_bound_and_its_direction(report):
    large = _case(report, "layer_norm", pick=lambda w: w.large)
    small = _case(report, "layer_norm", pick=lambda w: not w.large)
    # large memory-bound shapes aim higher; the same shape bound elsewhere, or a small one, does not
    assert report.Row(large, limit_bound="dma").efficiency_target == report.EFFICIENCY_TARGET_LARGE_MEMORY_BOUND
    assert report.Row(large, limit_bound="pe").efficiency_target == report.EFFICIENCY_TARGET
    assert report.Row(small, limit_bound="dma").efficiency_target == report.EFFICIENCY_TARGET
    # a backward row takes its own efficiency goal where the op sets one
    back = report.Case(large.spec, large.workload, backward=True)
    assert large.spec.backward.efficiency_target is not None
    assert report.Row(back, limit_bound="dma").efficiency_target == large.spec.backward.efficiency_target
    # and its speedup goal from Backward.speedup_targets, not the forward workload's
    attn = _case(report, "scaled_dot_product_attention", pick=lambda w: w.speedup_target is not None)
    attn_back = report.Case(attn.spec, attn.workload, backward=True)
    assert attn_back.speedup_target == attn.spec.backward.speedup_targets[attn.workload.name]
    assert attn_back.speedup_target != attn.speedup_target


def test_a_record_labels_each_figure_modeled_or_measured_and_keeps_the_bar_in_order(report):
    case = _case(report, "gelu", pick=lambda w: w.quick)
    row = report.Row(case, max_abs_err=1e-3, sim_wall_s=0.5, eager_cpu_ms=2.0, modeled_us=12.0,
                     modeled_us_lnc1=20.0, imbalance=0.25, limit_us=9.0, limit_bound="dma", efficiency=0.75,
                     modeled_low_us=10.0, modeled_high_us=15.0, speedup=3.0, speedup_low=2.5, speedup_high=3.5)
    rec = report._record(row)
    meas, mod = "measured_cpu", "modeled_trn2"
    for key in ("max_abs_err", "sim_wall_s", "eager_cpu_ms"):       # on this CPU
        assert f"{key}_{meas}" in rec and f"{key}_{mod}" not in rec, key
    for key in ("kernel_us", "limit_us", "efficiency", "eager_us", "speedup", "hbm_mb", "kernel_us_lnc1"):
        assert f"{key}_{mod}" in rec and f"{key}_{meas}" not in rec, key
    assert rec[f"lnc_ratio_{mod}"] == pytest.approx(12.0 / 20.0)     # LNC=2 over LNC=1
    assert rec[f"core_imbalance_{mod}"] == 0.25 and rec["unbalanced"] is True
    assert report._record(dataclasses.replace(row, imbalance=0.05))["unbalanced"] is False
    assert rec[f"kernel_range_us_{mod}"] == "10.0-15.0" and rec[f"speedup_range_{mod}"] == "2.50x-3.50x"
    # at LNC=1 there is no second core: no ratio, no idle core
    one = report._record(dataclasses.replace(row, lnc=1))
    assert math.isnan(one[f"lnc_ratio_{mod}"]) and math.isnan(one[f"core_imbalance_{mod}"])
    assert one["unbalanced"] is False
    # every labelled column of the table reads a record key carrying that same label, and the
    # measured columns are exactly the CPU's
    measured_cols = set()
    for label, _, key, _ in report._columns():
        if label:
            full = next(k for k in rec if k == key or k.startswith(key + "_"))
            assert full.endswith("_" + report._slug(label)), (label, key, full)
            if label == report.MEASURED:
                measured_cols.add(key)
    assert measured_cols == {"max_abs_err", "sim_wall_s", "eager_cpu_ms"}


def test_the_markdown_says_modeled_for_the_kernel_and_measured_for_the_wall_time(report, tmp_path):
    case = _case(report, "gelu", pick=lambda w: w.quick)
    busy = {e: 1.0 for e in ("tensor", "vector", "scalar", "gpsimd", "dma")}
    rows = [report.Row(case, status=status, note=note, max_abs_err=0.5, sim_wall_s=0.5, modeled_us=12.0,
                       modeled_low_us=10.0, modeled_high_us=15.0, limit_us=9.0, limit_bound="dma",
                       efficiency=0.75, bound_by="dma", bound_busy=0.9, busy_us=busy, hbm_mb=1.0,
                       hot=["dma_copy x3 (16 queues): 5.0 us"])
            for status, note in (("ok", ""), ("mismatch", "max |kernel - reference| = 0.5 exceeds"))]
    path = tmp_path / "report.md"
    report.write_markdown(rows, [report._record(r) for r in rows], path, "trn2", 12.0)
    md = path.read_text()
    # the modeled kernel line, with its error bar low-high, for the ok row and for the mismatch
    assert md.count(f"- {report.MODELED}: 12.0 us (error bar 10.0-15.0 us)") == 2
    assert f"Report generated in 12 s ({report.MEASURED} wall time)" in md
    assert md.count("its largest instruction groups") == 2


def _fake_est(kernel_us_on, trn2):
    return types.SimpleNamespace(target="trn2", trace=object(), allocations=None, latency_us=kernel_us_on(trn2))


def test_the_error_bar_of_a_speedup_is_the_documented_min_and_max(report, monkeypatch):
    # error_bars on a stand-in kernel whose time is a stated function of the target: 30 us of
    # DMA at trn2's bandwidth plus 10 us of ScalarE fixed costs; eager (a limit) is 100 us of DMA
    from nki_kernels.simulator.cost import variant
    from nki_kernels.simulator.cost.uncertainty import ENDS

    trn2 = TARGETS["trn2"]

    def kernel_us(tgt):
        return 30.0 * trn2.dma_bytes_per_s / tgt.dma_bytes_per_s + 10.0 * tgt.scalar_static_cycles / trn2.scalar_static_cycles

    def eager_on(tgt):
        return 100.0 * trn2.dma_bytes_per_s / tgt.dma_bytes_per_s

    monkeypatch.setattr(report, "estimate_trace",
                        lambda trace, tgt, allocations=None: types.SimpleNamespace(latency_us=kernel_us(tgt)))
    monkeypatch.setattr(report, "end_latencies", lambda est: {e: kernel_us(variant(trn2, e)) for e in ENDS})
    opt, pes = variant(trn2, "optimistic"), variant(trn2, "pessimistic")
    band_low, band_high = trn2.model_error_band
    assert band_low < 1.0 < band_high
    bars = report.error_bars(_fake_est(kernel_us, trn2), eager_on)
    central = eager_on(trn2) / kernel_us(trn2)
    # low end: fixed costs pessimistic, the bandwidth at either end (both sides on one
    # machine), the kernel widened by the band's pessimistic factor; the high end mirrored
    low_candidates = [eager_on(t) / (kernel_us(t) * band_high)
                      for t in (pes, dataclasses.replace(pes, dma_bytes_per_s=opt.dma_bytes_per_s))]
    high_candidates = [eager_on(t) / (kernel_us(t) * band_low)
                       for t in (opt, dataclasses.replace(opt, dma_bytes_per_s=pes.dma_bytes_per_s))]
    assert bars["speedup_low"] == pytest.approx(min(low_candidates + [central]))
    assert bars["speedup_high"] == pytest.approx(max(high_candidates + [central]))
    # the mixed hypotheses decide both ends here (what the test is about)
    assert min(low_candidates) == low_candidates[1] and max(high_candidates) == high_candidates[1]
    assert bars["modeled_low_us"] == pytest.approx(kernel_us(opt) * band_low)
    assert bars["modeled_high_us"] == pytest.approx(kernel_us(pes) * band_high)
    # a kernel the bandwidth moves more than eager (its time ~ 1 / bandwidth**2): the
    # hypotheses with one end throughout decide both ends, widened the same way
    def steep_us(tgt):
        return 30.0 * (trn2.dma_bytes_per_s / tgt.dma_bytes_per_s) ** 2 + 10.0 * tgt.scalar_static_cycles / trn2.scalar_static_cycles

    monkeypatch.setattr(report, "estimate_trace",
                        lambda trace, tgt, allocations=None: types.SimpleNamespace(latency_us=steep_us(tgt)))
    monkeypatch.setattr(report, "end_latencies", lambda est: {e: steep_us(variant(trn2, e)) for e in ENDS})
    steep = report.error_bars(_fake_est(steep_us, trn2), eager_on)
    low_candidates = [eager_on(t) / (steep_us(t) * band_high)
                      for t in (pes, dataclasses.replace(pes, dma_bytes_per_s=opt.dma_bytes_per_s))]
    high_candidates = [eager_on(t) / (steep_us(t) * band_low)
                       for t in (opt, dataclasses.replace(opt, dma_bytes_per_s=pes.dma_bytes_per_s))]
    assert min(low_candidates) == low_candidates[0] and max(high_candidates) == high_candidates[0]
    assert steep["speedup_low"] == pytest.approx(min(low_candidates))
    assert steep["speedup_high"] == pytest.approx(max(high_candidates))
    # a list-scheduling anomaly (every re-schedule faster than the central one): the central
    # speedup still lies inside the bar
    monkeypatch.setattr(report, "estimate_trace",
                        lambda trace, tgt, allocations=None: types.SimpleNamespace(latency_us=1.0))
    monkeypatch.setattr(report, "end_latencies", lambda est: {e: 1.0 for e in ENDS})
    odd = report.error_bars(_fake_est(lambda t: 40.0, trn2), eager_on)
    assert odd["speedup_low"] == pytest.approx(eager_on(trn2) / 40.0)
    assert odd["speedup_low"] < odd["speedup_high"]


def test_hot_spots_are_the_groups_with_most_time_on_the_engine_in_microseconds(report):
    slot = lambda i, op, engine, a, b: types.SimpleNamespace(index=i, op=op, engine=engine, start=a, end=b)  # noqa: E731
    slots = [slot(0, "tensor_tensor", "vector", 0, 2e-6), slot(1, "tensor_tensor", "vector", 2e-6, 4e-6),
             slot(2, "activation", "vector", 4e-6, 5e-6), slot(3, "iota", "vector", 5e-6, 5.5e-6),
             slot(4, "matmul", "tensor", 0, 9e-6),
             slot(5, "dma_copy", "vector", 6e-6, 9e-6), slot(5, "dma_copy", "vector", 6e-6, 9e-6)]
    details = {i: {"rule": f"rule{i}"} for i in range(6)}
    details[1] = {"rule": "rule0"}
    sched = types.SimpleNamespace(slots=slots, detail=lambda i: details[i])
    hot = report._hot_spots(types.SimpleNamespace(schedule=sched), "vector", top=2)
    # the two tensor_tensor slots are one 4 us group; the transfer's second share counts once
    assert hot == ["tensor_tensor x2 (rule0): 4.0 us", "dma_copy x1 (rule5): 3.0 us"]


def test_the_eager_wall_time_is_the_median_call_in_milliseconds(report, monkeypatch):
    clock = iter([0.0, 0.004, 1.0, 1.002, 2.0, 2.009])     # calls of 4, 2 and 9 ms
    monkeypatch.setattr(report, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    case = types.SimpleNamespace(reference=lambda *a, **k: None,
                                 workload=types.SimpleNamespace(dtype=torch.bfloat16))
    assert report._eager_cpu_ms(case, (), {}) == pytest.approx(4.0)


def test_the_check_holds_each_output_to_its_dtype_s_tolerances(report):
    atol, rtol = report.CHECK_TOL[torch.bfloat16]
    assert atol != rtol
    ref = torch.zeros(4, 8, dtype=torch.float64)
    assert report._check(ref + 0.9 * atol, ref, torch.bfloat16)          # within atol of 0
    assert not report._check(ref + 1.1 * atol, ref, torch.bfloat16)
    big = torch.full((4, 8), 100.0, dtype=torch.float64)                # rtol dominates at 100
    assert report._check(big + 0.9 * (atol + rtol * 100), big, torch.bfloat16)
    assert not report._check(big + 1.1 * (atol + rtol * 100), big, torch.bfloat16)
    # the max error is over every output, not the last one
    outs = (ref + 0.5, ref + 0.1)
    assert report._max_abs_err(outs, (ref, ref)) == pytest.approx(0.5)
    assert report._max_abs_err(outs[::-1], (ref, ref)) == pytest.approx(0.5)


def test_the_grid_takes_quick_workloads_and_no_backward_for_inference_only_calls(report):
    from nki_kernels import registry

    quick = report.grid(True)
    every = {w.name for s in registry.ops() for w in s.workloads if w.quick}
    assert {c.workload.name for c in quick} == every
    assert all(c.workload.quick for c in quick)
    decode = [(s, w) for s in registry.ops() for w in s.workloads if w.inference_only and s.backward is not None]
    assert decode
    assert not any(report._backward_covers(s, w) for s, w in decode)


def _ok_row(report, case, **kw):
    busy = {e: 1.0 for e in ("tensor", "vector", "scalar", "gpsimd", "dma")}
    base = dict(max_abs_err=1e-3, sim_wall_s=0.1, eager_cpu_ms=1.0, modeled_us=10.0, modeled_us_lnc1=18.0,
                efficiency_lnc1=0.7, imbalance=0.01, limit_us=8.0, limit_bound="dma", efficiency=0.8,
                bound_by="dma", bound_busy=0.9, eager_us=30.0, speedup=3.0, hbm_mb=1.0, busy_us=busy,
                modeled_low_us=9.0, modeled_high_us=12.0, speedup_low=2.5, speedup_high=3.3)
    base.update(kw)
    return report.Row(case, **base)


def test_the_run_fails_on_a_mismatch_and_names_rows_below_target_and_unbalanced(report, tmp_path, monkeypatch, capsys):
    # the rows as run_case would return them (no kernel runs): one fine, one below its
    # efficiency goal with cores 30 % apart, one whose output disagreed with the reference
    cases = [c for c in report.grid(True) if c.op == "gelu"][:1] * 3
    rows = iter([_ok_row(report, cases[0]),
                 _ok_row(report, cases[0], efficiency=0.2, bound_by="vector", imbalance=0.3),
                 _ok_row(report, cases[0], status="mismatch", note="max |kernel - reference| = 1 exceeds")])
    monkeypatch.setattr(report, "grid", lambda quick: cases)
    monkeypatch.setattr(report, "run_case", lambda case, target, traces, lnc: next(rows))
    # a run of some ops keeps the traces of the others
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "softmax_other.json").write_text("{}")
    assert report.main(["--ops", "gelu", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "1 row(s) below target: gelu [" in out and "bound by vector" in out
    name = cases[0].name
    assert f"1 row(s) with cores unbalanced by more than 10%: gelu [{name}] 30%" in out
    statuses = [r["status"] for r in csv.DictReader((tmp_path / "report.csv").open())]
    assert statuses == ["ok", "below target", "mismatch"]
    assert (tmp_path / "traces" / "softmax_other.json").exists()
    # a report whose every row is below target still plots them (the bars say so in colour)
    below = [r for r in csv.DictReader((tmp_path / "report.csv").open())][1]
    record = report._record(_ok_row(report, cases[0], efficiency=0.2))
    assert record["status"] == below["status"] == "below target"
    assert report.write_plot([record], tmp_path / "below.png", "trn2") is True
    assert (tmp_path / "below.png").stat().st_size > 1000
