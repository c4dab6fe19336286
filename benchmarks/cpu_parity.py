#!/usr/bin/env python
"""Is the CPU default path as fast as eager torch? Every workload of the `kernels benchmark`
files (benchmarks/benchmark_*.py, the CPU_WORKLOADS on a CPU host), timed here with the op
and its eager twin INTERLEAVED, best of N each.

`kernels benchmark` reports the mean of 100 op calls against ONE timed eager call, so on a
shared machine a single scheduler stall (10-20 ms) decides its ratio; the best of N
interleaved calls is what each path costs when it is not interrupted. MEASURED on this CPU;
nothing here says anything about Trainium.

Usage: python benchmarks/cpu_parity.py [--repeats 15] [--only attention,rms_norm] [--threads N]
       [--csv out/cpu_parity.csv]
(the table is printed; the CSV, one row per workload with the host's CPU, threads and backend,
is the file a plot is made from)
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
import time
from pathlib import Path

import torch

import nki_kernels

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))                   # benchmarks/: its shared script support
import script_support  # noqa: E402
# Workloads whose op keeps a stricter contract than eager's composition (one fp32 rounding
# where eager rounds after every op; references.py): parity is not expected there.
SINGLE_ROUNDING = {"SiluAndMulBenchmark", "GeluAndMulBenchmark", "RotaryBenchmark"}


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_parity_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(cls, workload: str, repeats: int) -> tuple[float, float, str]:
    bench = cls()
    bench.kernel, bench.device = nki_kernels, "cpu"
    getattr(bench, f"setup_{workload}")()
    op, eager = getattr(bench, f"benchmark_{workload}"), getattr(bench, f"verify_{workload}")
    op(), eager()   # warm up both
    op_times, eager_times = [], []
    for _ in range(repeats):
        op_times.append(_once(op))
        eager_times.append(_once(eager))
    dtype = str(getattr(bench, "x", getattr(bench, "q", None)).dtype).removeprefix("torch.")
    return min(op_times) * 1e3, min(eager_times) * 1e3, dtype


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15, help="interleaved calls of each (best is kept)")
    ap.add_argument("--only", default="", help="comma-separated benchmark files, e.g. attention,rms_norm")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--csv", default="out/cpu_parity.csv", help="where the measured rows go (default out/cpu_parity.csv)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1 call of each is timed")
    if args.threads < 0:
        ap.error(f"--threads {args.threads}: a positive count, or 0 for torch's default")
    if args.threads:
        torch.set_num_threads(args.threads)
    only = {o.strip() for o in args.only.split(",") if o.strip()}
    files = sorted(p.stem.removeprefix("benchmark_") for p in HERE.glob("benchmark_*.py"))
    if only - set(files):
        ap.error(f"--only {sorted(only - set(files))} unknown; choose from {', '.join(files)}")
    problem = script_support.output_path_error("--csv", args.csv)
    if problem:
        ap.error(problem)
    print(f"CPU default path vs eager torch, MEASURED on this CPU ({torch.get_num_threads()} threads), "
          f"best of {args.repeats} interleaved calls; backend={nki_kernels.cpu_backend()}")
    print(f"{'benchmark':<26} {'workload':<28} {'dtype':<9} {'op ms':>8} {'eager ms':>9} {'op/eager':>9}")
    worst, records = [], []
    host = {"cpu": script_support.cpu_name(), "threads": torch.get_num_threads(),
            "backend": nki_kernels.cpu_backend(), "repeats": args.repeats}
    for path in sorted(HERE.glob("benchmark_*.py")):
        if only and path.stem.removeprefix("benchmark_") not in only:
            continue
        module = _load(path)
        for cls in [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__
                    and any(m.startswith("benchmark_") for m in dir(c))]:
            for method in sorted(m for m in dir(cls) if m.startswith("benchmark_")):
                workload = method.removeprefix("benchmark_")
                op_ms, eager_ms, dtype = measure(cls, workload, args.repeats)
                ratio = op_ms / eager_ms
                note = ""
                if ratio > 1.1:
                    note = "  one fp32 rounding (contract)" if cls.__name__ in SINGLE_ROUNDING and dtype != "float32" \
                        else "  above 10%"
                    worst.append((cls.__name__, workload, ratio, note.strip()))
                print(f"{cls.__name__:<26} {workload:<28} {dtype:<9} {op_ms:8.2f} {eager_ms:9.2f} {ratio:9.2f}{note}")
                records.append({"benchmark": cls.__name__, "workload": workload, "dtype": dtype,
                                "op_ms_measured_cpu": op_ms, "eager_ms_measured_cpu": eager_ms,
                                "op_over_eager": ratio, "note": note.strip(), **host})
    out = Path(args.csv)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["benchmark", "workload", "dtype", "op_ms_measured_cpu",
                                           "eager_ms_measured_cpu", "op_over_eager", "note", "cpu", "threads",
                                           "backend", "repeats"])
        w.writeheader()
        w.writerows(records)
    print(f"wrote {out} (MEASURED on this CPU)")
    unexplained = [w for w in worst if w[3] == "above 10%"]
    print(f"\n{len(worst)} workload(s) above 1.10x eager, {len(unexplained)} of them unexplained")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
