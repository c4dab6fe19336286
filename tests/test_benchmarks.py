"""The `kernels benchmark` files pick their workloads by host: Trainium-sized on a Trainium
host (torch has a ``neuron`` module, as kernels' runner checks), CPU-sized elsewhere, so
`kernels benchmark build` finishes in minutes on a CPU box."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SPLIT = sorted(p for p in (ROOT / "benchmarks").glob("benchmark_*.py") if "TRAINIUM_WORKLOADS" in p.read_text())


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_heavy_benchmarks_have_cpu_workloads():
    assert {p.stem for p in SPLIT} >= {"benchmark_attention", "benchmark_elementwise", "benchmark_layer_norm",
                                       "benchmark_rms_norm",
                                       "benchmark_rotary", "benchmark_silu_and_mul", "benchmark_softmax"}


@pytest.mark.parametrize("path", SPLIT, ids=lambda p: p.stem)
@pytest.mark.parametrize("trainium", [False, True])
def test_workloads_follow_the_host(path, trainium, monkeypatch):
    if trainium:
        monkeypatch.setattr(torch, "neuron", object(), raising=False)
    elif hasattr(torch, "neuron"):
        monkeypatch.delattr(torch, "neuron")
    module = _load(path)
    expected = module.TRAINIUM_WORKLOADS if trainium else module.CPU_WORKLOADS
    assert module.WORKLOADS is expected
    assert module.CPU_WORKLOADS != module.TRAINIUM_WORKLOADS
    methods = {m for cls in vars(module).values() if isinstance(cls, type)
               for m in dir(cls) if m.startswith("benchmark_")}
    assert {name for name in expected} <= {m.removeprefix("benchmark_") for m in methods}
    other = module.CPU_WORKLOADS if trainium else module.TRAINIUM_WORKLOADS
    assert not (set(other) - set(expected)) & {m.removeprefix("benchmark_") for m in methods}


@pytest.mark.parametrize("argv, message", [
    (["--only", "sofmax"], "--only ['sofmax'] unknown; choose from attention, elementwise"),
    (["--repeats", "0"], "--repeats 0: at least 1 call"),
    (["--threads", "-3"], "--threads -3: a positive count"),
], ids=["unknown-file", "no-repeats", "negative-threads"])
def test_cpu_parity_refuses_bad_arguments_before_timing(argv, message, capsys):
    # an unknown --only timed nothing and exited 0; --repeats 0 and --threads -3 failed
    # inside min() and torch.set_num_threads with messages naming neither
    parity = _load(ROOT / "benchmarks" / "cpu_parity.py")
    with pytest.raises(SystemExit):
        parity.main(argv)
    assert message in capsys.readouterr().err


def test_cpu_parity_writes_a_row_per_workload_with_the_host(tmp_path, capsys):
    parity = _load(ROOT / "benchmarks" / "cpu_parity.py")
    out = tmp_path / "sub" / "parity.csv"
    parity.main(["--only", "softmax", "--repeats", "1", "--csv", str(out)])
    import csv
    rows = list(csv.DictReader(out.open()))
    workloads = sorted(m.removeprefix("benchmark_") for m in dir(_load(ROOT / "benchmarks" / "benchmark_softmax.py")
                                                                .SoftmaxBenchmark) if m.startswith("benchmark_"))
    assert sorted(r["workload"] for r in rows) == workloads
    for r in rows:
        assert float(r["op_ms_measured_cpu"]) > 0 and float(r["eager_ms_measured_cpu"]) > 0
        assert float(r["op_over_eager"]) == pytest.approx(float(r["op_ms_measured_cpu"]) / float(r["eager_ms_measured_cpu"]))
        assert r["backend"] and int(r["threads"]) >= 1 and r["repeats"] == "1"
    assert f"wrote {out} (MEASURED on this CPU)" in capsys.readouterr().out


def test_simulator_speed_refuses_no_repeats(capsys):
    # --repeats 0 failed in statistics.median with a message naming neither
    speed = _load(ROOT / "benchmarks" / "simulator_speed.py")
    with pytest.raises(SystemExit):
        speed.main(["--repeats", "0"])
    assert "--repeats 0: at least 1 timed run per case" in capsys.readouterr().err


def _workloads(path):
    module = _load(path)
    return [(cls, m.removeprefix("benchmark_")) for cls in vars(module).values()
            if isinstance(cls, type) and cls.__module__ == module.__name__
            for m in sorted(dir(cls)) if m.startswith("benchmark_")]


@pytest.mark.parametrize("path", SPLIT, ids=lambda p: p.stem)
def test_each_cpu_workload_s_op_matches_its_eager_twin_as_the_runner_checks(path, monkeypatch):
    # `kernels benchmark` compares the op's self.out with verify_<workload>()'s eager result
    # (torch.allclose, atol=1e-2): a verify computing another function, or an op leaving
    # self.out unset, fails on the runner; here it fails first
    import nki_kernels

    if hasattr(torch, "neuron"):
        monkeypatch.delattr(torch, "neuron")
    for cls, workload in _workloads(path):
        torch.manual_seed(0)
        bench = cls()
        bench.kernel, bench.device = nki_kernels, "cpu"
        getattr(bench, f"setup_{workload}")()
        before = bench.out
        getattr(bench, f"benchmark_{workload}")()
        reference = getattr(bench, f"verify_{workload}")()
        assert bench.out is not before, (cls.__name__, workload)
        assert isinstance(reference, torch.Tensor) and reference.shape == bench.out.shape, (cls.__name__, workload)
        assert torch.allclose(bench.out.float(), reference.float(), atol=1e-2), (cls.__name__, workload)


def test_cpu_name_is_the_model_name_line_of_cpuinfo(monkeypatch):
    # the host recorded beside every measured figure: /proc/cpuinfo's "model name", not its
    # "model" (a number) nor the field's name
    support = _load(ROOT / "benchmarks" / "script_support.py")
    text = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
            "model name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz\nstepping\t: 7\n")
    monkeypatch.setattr(support, "Path", lambda p: type("P", (), {"read_text": lambda self: text})())
    assert support.cpu_name() == "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz"


def test_output_path_errors_name_what_is_in_the_way(tmp_path):
    support = _load(ROOT / "benchmarks" / "script_support.py")
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    assert support.output_path_error("--csv", str(tmp_path / "new.csv")) is None
    assert support.output_path_error("--out", str(tmp_path / "d"), folder=True) is None
    assert support.output_path_error("--out", str(tmp_path / "d" / "sub" / "deeper"), folder=True) is None
    assert "a folder is already there" in support.output_path_error("--csv", str(tmp_path / "d"))
    assert "a file is already there" in support.output_path_error("--out", str(tmp_path / "f"), folder=True)
    assert "is a file, not a folder" in support.output_path_error("--csv", str(tmp_path / "f" / "x.csv"))
