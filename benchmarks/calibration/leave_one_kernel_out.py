"""Leave one kernel out: the held-out error of the kernels the fit has partly seen.

The public rows' free parameters (calibrate.FREE_PARAMETERS) are fitted on the train rows.
Some kernels give both: their engines' busy times from a profile are train rows, and the
same run's whole-kernel latency is a held-out row (NKIBench's silu, RoPE baseline, adamw and
the three RMSNorm/matmul fusions; the fused-Mamba tutorial's v1 at 256 channels). Their
latencies are not wholly held out: the fit has seen that run. This script refits the free
parameters once per such kernel with that kernel's train rows left out, and models all of the
kernel's rows at the parameters the other rows fit: an error on data no parameter saw.

    .venv/bin/python benchmarks/calibration/leave_one_kernel_out.py [--only SUBSTR] [--csv F]

Every figure is MODELED by the cost model; the measurements were taken on Trainium by their
sources (benchmarks/calibration/measurements.toml). One refit takes ~4 min on one core.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _calibrate():
    spec = importlib.util.spec_from_file_location("calibrate", HERE.parent / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def run_key(row) -> tuple:
    """Rows with the same key are read off one simulated run (one profile)."""
    return (row.kernel, json.dumps(row.args, sort_keys=True), row.target, row.lnc, row.compiler)


def kernels_in_both_splits(rows) -> dict[tuple, list]:
    """Each run that gives train rows and gated held-out rows -> all of its rows."""
    by_run: dict[tuple, list] = {}
    for r in rows:
        by_run.setdefault(run_key(r), []).append(r)
    return {k: rs for k, rs in by_run.items()
            if any(r.split == "train" for r in rs) and any(r.split == "test" and not r.known_miss for r in rs)}


def without_run(rows, key) -> list:
    """``rows`` less the train rows read off run ``key`` (its held-out rows stay; no row is
    relative to a kernel run's train row, only to the DMA curve's, which no run here gives)."""
    return [r for r in rows if not (r.split == "train" and run_key(r) == key)]


def leave_one_out(cal, rows, key, own, shipped: dict[str, float]) -> list[dict]:
    """Refit without run ``key``'s train rows; one record per row of that run (``own``)."""
    params = cal.fit(without_run(rows, key))
    left_out = cal.modeled(own, params)
    fitted = {name: getattr(cal.target_with(cal.scoped(name)[0] or "trn2", None), cal.scoped(name)[1])
              for name in cal.FREE_PARAMETERS}
    moved = {n: v for n, v in params.items() if v != fitted[n]}
    return [{"id": r.id, "split": r.split, "measured": r.measured, "unit": r.unit,
             "modeled_all_rows": shipped[r.id], "modeled_left_out": left_out[r.id],
             "error_all_rows": shipped[r.id] / r.measured - 1, "error_left_out": left_out[r.id] / r.measured - 1,
             "moved": "; ".join(f"{n} {fitted[n]:g} -> {v:g}" for n, v in moved.items()) or "none"}
            for r in own]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="only the runs whose kernel name contains this")
    ap.add_argument("--csv", default="", help="also write one line per row to this CSV file")
    args = ap.parse_args(argv)
    cal = _calibrate()
    rows = [r for r in cal.load_rows() if not r.slow]
    runs = {k: rs for k, rs in kernels_in_both_splits(rows).items() if args.only in k[0]}
    if not runs:
        print(f"no run gives both train and held-out rows with kernel matching {args.only!r}")
        return 1
    shipped = cal.modeled([r for rs in runs.values() for r in rs])   # hardware.py: the fit on all train rows
    print("MODELED by the cost model vs measured on Trainium by the rows' sources; 'left out': the free "
          "parameters refitted without this kernel's train rows\n")
    print(f"{'row':44} {'split':5} {'measured':>11} {'all rows':>9} {'left out':>9}  parameters that moved")
    records = []
    for key, own in runs.items():
        for rec in leave_one_out(cal, rows, key, own, shipped):
            records.append(rec)
            print(f"{rec['id']:44} {rec['split']:5} {cal._fmt(rec['measured'], rec['unit']):>11} "
                  f"{rec['error_all_rows']:>+9.0%} {rec['error_left_out']:>+9.0%}  {rec['moved']}", flush=True)
    held = [r for r in records if r["split"] == "test"]
    for label, col in (("all rows", "error_all_rows"), ("left out", "error_left_out")):
        errs = [abs(r[col]) for r in held]
        print(f"held-out latencies, fit on {label}: {len(errs)} rows, mean |error| {sum(errs) / len(errs):.1%}, "
              f"max {max(errs):.0%}, outside +-25 %: {sum(e > 0.25 for e in errs)}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows(records)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
